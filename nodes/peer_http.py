"""Talking to an original P2PFaaS node over its HTTP API, as its scheduler does: the load probe
(``GET /monitoring/load``) and the forward (``POST /peer/function/{fn}``), whose reply becomes an
:class:`Answer` with the P2PFaaS headers, as from a p2pfaas peer."""

from __future__ import annotations

import base64
import binascii

import httpx
import orjson

from broker import codes
from broker import headers as H
from broker.answers import Answer, error_body, status_of
from nodes.calls import Call
PROBE_HEADERS = {H.USER_AGENT: H.USER_AGENT_MACHINE}


async def probe(http: httpx.AsyncClient, base_url: str, timeout_s: float) -> int | None:
    """Running + queued of the peer, as P2PFaaS reads it; None when it cannot be read."""
    try:
        response = await http.get(f"{base_url}/monitoring/load", headers=PROBE_HEADERS, timeout=timeout_s)
        return int(response.headers[H.LOAD]) + int(response.headers[H.P2PFOG_QUEUE_LENGTH])
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def peer_request(call: Call, request_number: int) -> bytes:
    """P2PFaaS's ``PeerJobRequest`` for ``call`` (it sends no peers list; hops count this forward)."""
    return orjson.dumps({
        "service_id_request": request_number, "service_id_tracing": call.tracing_id, "function_name": call.fn,
        "hops": call.request.hops + 1, "peers_list": [], "payload": base64.b64encode(call.payload).decode(),
        "content_type": "application/octet-stream", "headers": {},
    })


async def forward(http: httpx.AsyncClient, base_url: str, call: Call, request_number: int, *, node: str,
                  ip: str) -> Answer:
    """Run ``call`` on the peer; httpx.HTTPError when it cannot be reached."""
    headers = {H.USER_AGENT: H.USER_AGENT_MACHINE, "Content-Type": "application/json"}
    if call.tracing_id:
        headers[H.TRACING_ID] = call.tracing_id
    response = await http.post(f"{base_url}/peer/function/{call.fn}", content=peer_request(call, request_number),
                               headers=headers, timeout=call.timeout_s + 5.0)
    return answer_of(response.status_code, response.content, node=node, ip=ip)


def answer_of(status: int, content: bytes, *, node: str, ip: str) -> Answer:
    """The answer a ``PeerJobResponse`` stands for, seen from the forwarding node ``node``."""
    try:
        reply = orjson.loads(content)
        peers = reply.get("peers_list") or []
        body = base64.b64decode(reply.get("body") or "")
        status = status_of(str(reply.get("status_code") or status))
    except (orjson.JSONDecodeError, AttributeError, binascii.Error, TypeError, ValueError):
        return Answer(500, error_body(codes.PEER_RESPONSE_NIL, f"unreadable answer from a P2PFaaS peer: {content[:100]!r}"),
                      {H.STATUS: "500"})
    path = list(reversed([p for p in peers if isinstance(p, dict)]))   # it lists the executor first
    timings = [p.get("timings") or {} for p in path]
    headers = {H.STATUS: str(status)}
    if path:
        headers.update({
            H.EXECUTED_BY: str(path[-1].get("machine_id", "")), H.HOPS: str(len(path)),
            H.EXTERNALLY_EXECUTED: "True",
            H.PEERS_LIST_ID: orjson.dumps([node, *(str(p.get("machine_id", "")) for p in path)]).decode(),
            H.PEERS_LIST_IP: orjson.dumps([ip, *(str(p.get("machine_ip", "")) for p in path)]).decode(),
            H.TIMING_TOTAL: orjson.dumps([t.get("total_time") or 0.0 for t in timings]).decode(),
            H.TIMING_SCHEDULING: orjson.dumps([t.get("scheduling_time") or 0.0 for t in timings]).decode(),
            H.TIMING_PROBING: orjson.dumps([t.get("probing_time") or 0.0 for t in timings]).decode(),
            H.TIMING_EXECUTION: repr(float(timings[-1].get("execution_time") or 0.0)),
        })
    return Answer(status, body, headers)
