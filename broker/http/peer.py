"""``POST /peer/function/{fn}``: an original P2PFaaS node forwards a job, as a forward on
``faas.<node>.forward...``, answered as P2PFaaS's ``PeerJobResponse``."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from broker import codes
from broker import headers as H
from broker.answers import Answer, error_body, status_of
from broker.connection import request as nats_request
from broker.errors import NotPermitted, Unauthorized
from broker.subjects import check_token, machine_token

if TYPE_CHECKING:
    from broker.http.bridge import Bridge

MAX_HOPS = 64


def peer_response(answer: Answer, node: str, ip: str) -> dict[str, Any]:
    """P2PFaaS's ``PeerJobResponse`` of an answer of this node (``node`` at ``ip``)."""
    names, ips = answer.peers, answer.peer_ips
    lists = {key: _floats(answer.headers.get(header)) for key, header in (
        ("total_time", H.TIMING_TOTAL), ("scheduling_time", H.TIMING_SCHEDULING), ("probing_time", H.TIMING_PROBING))}
    path = []
    for i in range(1, len(names)):   # names[0] is the P2PFaaS node that sent it
        timings = {key: values[i] for key, values in lists.items() if i < len(values)}
        if i == len(names) - 1:
            timings["execution_time"] = float(answer.headers.get(H.TIMING_EXECUTION, 0.0) or 0.0)
        path.append({"machine_id": names[i], "machine_ip": ips[i] if i < len(ips) else "", "timings": timings})
    if not path:   # refused here: P2PFaaS still lists the node that answered
        path = [{"machine_id": node, "machine_ip": ip, "timings": {}}]
    return {"peers_list": list(reversed(path)), "body": base64.b64encode(answer.body).decode(),
            "status_code": answer.status}


def _floats(text: str | None) -> list[float]:
    try:
        values = orjson.loads(text) if text else []
    except orjson.JSONDecodeError:
        return []
    return [float(v) for v in values] if isinstance(values, list) else []


def peer_router(bridge: "Bridge") -> APIRouter:
    router = APIRouter(tags=["P2PFaaS peers"])

    async def reply(status: int, body: dict[str, Any]) -> Response:
        return Response(orjson.dumps(body), status_code=status, media_type="application/json")

    @router.post("/peer/function/{fn}", summary="A job forwarded by an original P2PFaaS node (PeerJobRequest)")
    async def peer_function(fn: str, request: Request) -> Response:
        if request.headers.get(H.USER_AGENT) != H.USER_AGENT_MACHINE:   # as P2PFaaS: only nodes call it
            return await reply(500, {"code": codes.GENERIC, "message": "called from not a machine"})
        # it runs a function: the invoke token, unless P2PFaaS's ports are open (its nodes send none)
        if not bridge.p2pfaas_open and not bridge.may_invoke(request.headers.get("authorization")):
            raise Unauthorized("a peer job runs a function: it needs the invoke token (Authorization: Bearer ...), "
                               "or the P2PFaaS layout (up --loopback-hosts), whose P2PFaaS routes are open")
        check_token(fn, "function")
        try:
            job = orjson.loads(await bridge.read_body(request))
            payload = base64.b64decode(job.get("payload") or "", validate=True)
            hops = int(job.get("hops") or 1)
        except (orjson.JSONDecodeError, AttributeError, binascii.Error, TypeError, ValueError) as exc:
            return await reply(400, {"code": codes.INPUT_NOT_VALID, "message": f"not a PeerJobRequest: {exc}"})
        sender = request.client.host if request.client else ""
        headers = {H.HOPS: str(max(1, min(hops, MAX_HOPS))), H.PEERS_LIST_ID: orjson.dumps([machine_token(sender)]).decode(),
                   H.PEERS_LIST_IP: orjson.dumps([sender]).decode(), H.TIMEOUT: repr(bridge.invoke_timeout_s)}
        tracing = request.headers.get(H.TRACING_ID) or str(job.get("service_id_tracing") or "")
        if tracing:
            headers[H.TRACING_ID] = tracing[:256]
        subject = bridge.subjects.forward(bridge.node, fn, bridge.client_id, bridge.new_call_id())
        try:
            msg = await nats_request(bridge.nc, subject, payload, timeout_s=bridge.invoke_timeout_s + 5.0,
                                     headers=headers)
            status = (msg.headers or {}).get(H.STATUS, "200")
            answer = Answer(status_of(status), msg.data, msg.headers or {})
        except NoRespondersError:
            answer = Answer(503, error_body(codes.GENERIC, f"node {bridge.node} is not running"))
        except (NatsTimeout, TimeoutError):
            answer = Answer(504, error_body(codes.GENERIC, f"no answer from node {bridge.node}"))
        except NotPermitted as exc:
            answer = Answer(500, error_body(codes.GENERIC, str(exc)))
        ip = request.url.hostname or ""
        return await reply(answer.status, peer_response(answer, bridge.node, ip))

    return router
