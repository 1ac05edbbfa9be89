"""The node's control plane over HTTP (P2PFaaS routes): hello, load, configuration, scheduler,
peers, health and metrics. Each route is one request/reply on the node's control subjects."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker import headers as H
from broker.answers import VERSION
from broker.control import control_request
from broker.errors import NodeUnavailable
from broker.http.invoke import error

if TYPE_CHECKING:
    from broker.http_bridge import HttpBridge


def control_router(bridge: "HttpBridge") -> APIRouter:
    router = APIRouter(tags=["control"])
    subjects, node = bridge.subjects, bridge.node

    async def ask(subject: str, body: bytes = b"") -> Response:
        status, data = await control_request(bridge.nc, subject, body, bridge.control_timeout_s)
        return Response(data, status_code=status, media_type="application/json")

    @router.get("/", summary="Name and version")
    async def root() -> dict[str, str]:
        return {"name": "p2pfaas", "version": VERSION, "version_commit": "", "node": node}

    @router.get("/monitoring/load", summary="Running and queued functions (P2PFaaS headers + JSON)")
    async def load() -> Response:
        response = await ask(subjects.load(node))
        if response.status_code == 200:
            data: dict[str, Any] = orjson.loads(response.body)
            response.headers[H.LOAD] = str(data["running"])
            response.headers[H.MAXLOAD] = str(data["parallel_running_functions_max"])
            response.headers[H.QUEUE_LENGTH] = str(data["queued"])
        return response

    @router.get("/configuration", summary="Node configuration")
    async def get_configuration() -> Response:
        return await ask(subjects.config(node, "get"))

    @router.post("/configuration", summary="Change K / queue at run time (persisted)")
    async def set_configuration(request: Request) -> Response:
        return await ask(subjects.config(node, "set"), await bridge.read_body(request))

    @router.get("/configuration/scheduler", summary="Scheduling algorithm")
    async def get_scheduler() -> Response:
        return await ask(subjects.scheduler_config(node, "get"))

    @router.post("/configuration/scheduler", summary="Change the scheduling algorithm (persisted)")
    async def set_scheduler(request: Request) -> Response:
        return await ask(subjects.scheduler_config(node, "set"), await bridge.read_body(request))

    @router.get("/list", summary="Alive peers (P2PFaaS discovery format)")
    async def peer_list() -> Response:
        return await ask(subjects.peers(node))

    @router.get("/healthz", summary="Health: broker connected, node answering, its async intake pulling")
    async def healthz() -> Response:
        if not bridge.nc.is_connected:
            return error(503, "not connected to NATS")
        try:
            status, data = await control_request(bridge.nc, subjects.info(node), b"", bridge.control_timeout_s)
        except NodeUnavailable:
            return error(503, f"node {node} not answering")
        info = orjson.loads(data) if status == 200 else {}
        if info.get("intake", "ok") != "ok":
            return error(503, f"node {node}: its async intake cannot pull from JetStream")
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
