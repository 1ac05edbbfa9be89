"""The node's control plane over HTTP (P2PFaaS routes): hello, load, configuration, scheduler,
peers, health and metrics. Each route is one request/reply on the node's control subjects."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker import headers as H
from broker.answers import SCHEDULER_NAME, VERSION
from broker.control import control_request, node_health
from broker.errors import NodeUnavailable
from broker.http.invoke import error
from broker.messages import NodeConfiguration, SchedulerConfiguration

if TYPE_CHECKING:
    from broker.http.bridge import Bridge


def known_keys(body: bytes, contract: type[BaseModel]) -> bytes:
    """The JSON object without keys ``contract`` lacks (P2PFaaS ignores them); else unchanged."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(data, dict):
        return body
    return orjson.dumps({k: v for k, v in data.items() if k in contract.model_fields})


def control_router(bridge: "Bridge") -> APIRouter:
    router = APIRouter(tags=["control"])
    subjects, node = bridge.subjects, bridge.node

    async def ask(subject: str, body: bytes = b"") -> Response:
        status, data = await control_request(bridge.nc, subject, body, bridge.control_timeout_s)
        return Response(data, status_code=status, media_type="application/json")

    @router.get("/", summary="Name and version (the same on every node, as P2PFaaS's clients compare it)")
    async def root() -> dict[str, str]:
        return {"name": SCHEDULER_NAME, "version": VERSION, "version_commit": ""}

    @router.get("/monitoring/load", summary="Running and queued functions (P2PFaaS headers + JSON)")
    async def load() -> Response:
        response = await ask(subjects.load(node))
        if response.status_code == 200:
            data: dict[str, Any] = orjson.loads(response.body)
            # the fields of P2PFaaS's (older) JSON load answer too, which its Python scripts read
            data.update(scheduler_name=data.get("scheduler", ""), functions_running=data["running"],
                        functions_running_max=data["parallel_running_functions_max"],
                        queue_max_length=data["queue_length_max"], queue_fill=data["queued"])
            response = Response(orjson.dumps(data), media_type="application/json", headers={
                H.LOAD: str(data["running"]), H.MAXLOAD: str(data["parallel_running_functions_max"]),
                H.P2PFOG_QUEUE_LENGTH: str(data["queued"]), H.QUEUE_LENGTH: str(data["queued"])})
        return response

    @router.get("/configuration", summary="Node configuration")
    async def get_configuration() -> Response:
        return await ask(subjects.config(node, "get"))

    @router.post("/configuration", summary="Change K / queue at run time (persisted; keys not sent keep their value)",
                 dependencies=[bridge.changes_state])
    async def set_configuration(request: Request) -> Response:
        return await ask(subjects.config(node, "set"), known_keys(await bridge.read_body(request), NodeConfiguration))

    @router.get("/configuration/scheduler", summary="Scheduling algorithm")
    async def get_scheduler() -> Response:
        return await ask(subjects.scheduler_config(node, "get"))

    @router.post("/configuration/scheduler", summary="Change the scheduling algorithm (persisted)",
                 dependencies=[bridge.changes_state])
    async def set_scheduler(request: Request) -> Response:
        return await ask(subjects.scheduler_config(node, "set"),
                         known_keys(await bridge.read_body(request), SchedulerConfiguration))

    @router.get("/list", summary="Alive peers (P2PFaaS discovery format)")
    async def peer_list() -> Response:
        return await ask(subjects.peers(node))

    @router.get("/healthz", summary="Health: broker connected, node answering, its async intake pulling, its answers stored")
    async def healthz() -> Response:
        if not bridge.nc.is_connected:
            return error(503, "not connected to NATS")
        try:
            status, data = await control_request(bridge.nc, subjects.info(node), b"", bridge.control_timeout_s)
        except NodeUnavailable:
            return error(503, f"node {node} not answering")
        info, problem = node_health(node, status, data)
        if problem is not None:
            return error(503, problem)
        return JSONResponse({"status": "ok", "node": info})

    @router.get("/metrics", summary="Prometheus metrics (bridge + node)")
    async def metrics() -> Response:
        text = generate_latest(bridge.registry)
        try:
            status, data = await control_request(bridge.nc, subjects.metrics(node), b"", bridge.control_timeout_s)
            if status == 200:
                text += data
        except NodeUnavailable:
            pass  # the bridge's own metrics still help
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    return router
