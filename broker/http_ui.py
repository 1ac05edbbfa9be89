"""The live dashboard on the HTTP bridge: ``GET /ui`` (files in broker/ui/), ``/ui/live`` (a WebSocket of
:class:`~broker.ui_feed.DashboardFeed`) and the operator controls, validated before they go to a node."""

from __future__ import annotations

import asyncio
import logging
from functools import cache
from pathlib import Path
from typing import Callable

import orjson
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, Response
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic import BaseModel, ConfigDict, Field

from broker import headers as H
from broker.codec import decode, encode
from broker.connection import request
from broker.errors import ContractError, InvalidToken, NotPermitted
from broker.messages import NodeConfiguration, PolicySwitch, ScaleCommand, SchedulerChange, SchedulerConfiguration
from broker.subjects import Subjects, check_node, check_token
from broker.ui_feed import FORWARD_WINDOW_S, GONE_AFTER, SUSPECT_AFTER, DashboardFeed, FeedClient

log = logging.getLogger(__name__)

UI_DIR = Path(__file__).with_name("ui")
STATIC_TYPES = {
    "dashboard.js": "text/javascript", "dashboard.css": "text/css",
    "vendor/uPlot.iife.min.js": "text/javascript", "vendor/uPlot.min.css": "text/css",
}
MANUAL_POLICY = "manual"             # ScaleCommand.policy of a hand-made scaling decision
WS_TRY_AGAIN_LATER = 1013


class ScaleRequest(BaseModel):
    """Body of ``POST /ui/api/pools/{node}/{pool}/scale``."""

    model_config = ConfigDict(extra="forbid")
    target_workers: int = Field(ge=0, le=10_000)


class PolicyRequest(BaseModel):
    """Body of ``POST /ui/api/pools/{node}/{pool}/policy``."""

    model_config = ConfigDict(extra="forbid")
    policy: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


@cache
def ui_file(name: str) -> bytes:
    return (UI_DIR / name).read_bytes()


class Dashboard:
    """The feed and the router of one bridge; ``node`` is the bridge's own node (shown first)."""

    def __init__(self, nc: Client, subjects: Subjects, node: str, *, history_s: float = 600.0,
                 control_timeout_s: float = 3.0, guard: list | None = None) -> None:
        """``guard``: the dependencies of the operator controls (the bridge's operator token)."""
        self.nc, self.subjects, self.node = nc, subjects, check_node(node)
        self.guard = guard or []
        self.control_timeout_s = control_timeout_s
        self.feed = DashboardFeed(nc, subjects, history_s=history_s)
        self.router = self._build_router()

    async def _relay(self, subject: str, body: bytes = b"") -> Response:
        """A node's answer to a control request, with its status; 503 when nobody answers."""
        try:
            msg = await request(self.nc, subject, body, timeout_s=self.control_timeout_s)
        except (NatsTimeout, NoRespondersError, asyncio.TimeoutError):
            return error(503, f"nobody answered on {subject}")
        except NotPermitted as exc:
            return error(500, str(exc))
        status = int((msg.headers or {}).get(H.STATUS, 200))
        return Response(msg.data, status_code=status, media_type="application/json")

    def hello(self) -> str:
        """The first message on /ui/live: what the page needs to interpret the rest."""
        return orjson.dumps({"type": "hello", "at": self.feed.clock(), "data": {
            "node": self.node, "prefix": self.subjects.prefix, "history_s": self.feed.history_s,
            "forward_window_s": FORWARD_WINDOW_S, "suspect_after": SUSPECT_AFTER, "gone_after": GONE_AFTER,
        }}).decode()

    async def _stream(self, ws: WebSocket) -> None:
        history, client = await self.feed.attach()
        try:
            await ws.send_text(self.hello())
            await ws.send_text(f'{{"type":"history","at":{self.feed.clock()!r},"data":[{",".join(history)}]}}')
            sender = asyncio.create_task(self._send_live(ws, client))
            receiver = asyncio.create_task(_until_closed(ws))
            _, pending = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            await asyncio.gather(sender, receiver, return_exceptions=True)
        finally:
            await self.feed.detach(client)

    async def _send_live(self, ws: WebSocket, client: FeedClient) -> None:
        while (text := await client.next()) is not None:
            await ws.send_text(text)
        log.info("dashboard page too slow for the live feed: asked to reconnect")
        await ws.close(code=WS_TRY_AGAIN_LATER, reason="too slow: reconnect for a fresh snapshot")

    def _build_router(self) -> APIRouter:
        router = APIRouter(tags=["dashboard"])
        ui = self

        @router.get("/ui", summary="Live dashboard: nodes, pools, scaling decisions, learners", response_class=HTMLResponse)
        async def page() -> Response:
            return HTMLResponse(ui_file("index.html"), headers={"Cache-Control": "no-cache"})

        @router.get("/ui/static/{name:path}", include_in_schema=False)
        async def static(name: str) -> Response:
            if name not in STATIC_TYPES:
                return error(404, f"no dashboard file {name!r}")
            return Response(ui_file(name), media_type=STATIC_TYPES[name], headers={"Cache-Control": "no-cache"})

        @router.websocket("/ui/live")
        async def live(ws: WebSocket) -> None:
            await ws.accept()
            await ui._stream(ws)

        @router.get("/ui/api/nodes/{node}/configuration", summary="A node's K and queue")
        async def get_configuration(node: str) -> Response:
            return await ui._control(lambda: ui.subjects.config(check_node(node), "get"))

        @router.post("/ui/api/nodes/{node}/configuration", summary="Change a node's K and queue (as POST /configuration)", dependencies=ui.guard)
        async def set_configuration(node: str, request: Request) -> Response:
            return await ui._control(lambda: ui.subjects.config(check_node(node), "set"),
                                     NodeConfiguration, await request.body())

        @router.get("/ui/api/nodes/{node}/scheduler", summary="A node's scheduling algorithm")
        async def get_scheduler(node: str) -> Response:
            return await ui._control(lambda: ui.subjects.scheduler_config(check_node(node), "get"))

        @router.post("/ui/api/nodes/{node}/scheduler", summary="Change a node's scheduler (as POST /configuration/scheduler)", dependencies=ui.guard)
        async def set_scheduler(node: str, request: Request) -> Response:
            response = await ui._control(lambda: ui.subjects.scheduler_config(check_node(node), "set"),
                                         SchedulerChange, await request.body())
            if response.status_code == 200:
                ui.feed.note_scheduler(node, decode(SchedulerConfiguration, response.body).describe())
            return response

        @router.post("/ui/api/pools/{node}/{pool}/scale", status_code=202,
                     summary="Scale a pool by hand: a ScaleCommand with policy 'manual'", dependencies=ui.guard)
        async def scale(node: str, pool: str, request: Request) -> Response:
            return await ui._scale(node, pool, await request.body())

        @router.post("/ui/api/pools/{node}/{pool}/policy", summary="Switch the scaling policy of a pool's controller", dependencies=ui.guard)
        async def policy(node: str, pool: str, request: Request) -> Response:
            try:
                wanted = decode(PolicyRequest, await request.body())
                switch = PolicySwitch(node=check_node(node), pool=check_token(pool, "pool"), policy=wanted.policy,
                                      requested_by=f"ui@{ui.node}")
            except (ContractError, InvalidToken) as exc:
                return error(400, str(exc))
            response = await ui._relay(ui.subjects.pool_policy(node, pool), encode(switch))
            if response.status_code == 503:
                return error(503, f"no controller of {node}/{pool} answers on "
                                  f"{ui.subjects.pool_policy(node, pool)}")
            return response

        return router

    async def _control(self, subject: Callable[[], str], contract: type[BaseModel] | None = None,
                       body: bytes = b"") -> Response:
        """Validate the node and the body here; the body goes on as sent (no defaults filled in)."""
        try:
            target = subject()
            if contract is not None:
                decode(contract, body)
        except (ContractError, InvalidToken) as exc:
            return error(400, str(exc))
        return await self._relay(target, body)

    async def _scale(self, node: str, pool: str, body: bytes) -> Response:
        try:
            wanted = decode(ScaleRequest, body)
            command = ScaleCommand(node=check_node(node), pool=check_token(pool, "pool"),
                                   target_workers=wanted.target_workers, reason="by hand", policy=MANUAL_POLICY)
        except (ContractError, InvalidToken) as exc:
            return error(400, str(exc))
        if (node, pool) not in self.feed.pools:
            return error(404, f"no telemetry seen from pool {node}/{pool}: open /ui first, or check the name")
        await self.nc.publish(self.subjects.scale(node, pool), encode(command))
        log.info("dashboard: %s/%s scaled by hand to %d workers", node, pool, command.target_workers)
        return JSONResponse(command.model_dump(mode="json"), status_code=202)


async def _until_closed(ws: WebSocket) -> None:
    """Read (and ignore) what the page sends until it goes away or the server shuts down."""
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass


def dashboard_router(nc: Client, subjects: Subjects, node: str, **options) -> APIRouter:
    """The router to include in a bridge's app (``history_s``, ``control_timeout_s`` as for :class:`Dashboard`)."""
    return Dashboard(nc, subjects, node, **options).router
