"""The HTTP bridge: P2PFaaS's REST API (default :18080) translated to NATS subjects.

It imports nothing from nodes/: every route is a publish or a request/reply on the node's
subjects, so a node can run anywhere its NATS reaches. ``HttpBridge.app`` is the ASGI entry
(the direct-call fast path in front of the FastAPI app ``api``, which holds the routers, one
exception handler and the lifespan that starts and stops the bridge's NATS client).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import OrderedDict

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from nats.aio.client import Client
from prometheus_client import CollectorRegistry, Counter, Histogram

from broker.answers import VERSION, Answer
from broker.client import FaasClient
from broker.errors import FaasError, PayloadTooLarge
from broker.http.control import control_router
from broker.http.invoke import FastInvoke, answer_response, invoke_router
from broker.http.learner import learner_router
from broker.subjects import Subjects, check_token

log = logging.getLogger(__name__)

REMEMBERED_CALLS = 100_000


class HttpBridge:
    """The app for one node; ``serve()`` runs it under uvicorn inside the caller's loop."""

    def __init__(self, nc: Client, node: str, *, prefix: str = "faas", max_payload_bytes: int = 1024 * 1024,
                 invoke_timeout_s: float = 60.0, control_timeout_s: float = 3.0) -> None:
        self.nc = nc
        self.node = check_token(node, "node")
        self.subjects = Subjects(prefix)
        self.client_id = f"http-{node}"
        self.faas = FaasClient(nc, client=self.client_id, prefix=prefix)
        self.max_payload_bytes = max_payload_bytes
        self.invoke_timeout_s = invoke_timeout_s
        self.control_timeout_s = control_timeout_s
        self.calls: OrderedDict[str, None] = OrderedDict()   # async call ids issued here
        self._background: set[asyncio.Task] = set()
        self._ids = itertools.count()
        self._id_prefix = uuid.uuid4().hex[:12]   # call ids unique across bridge processes
        self._started = False
        self.registry = CollectorRegistry()
        self.http_requests = Counter("p2pfaas_http_requests", "HTTP requests", ["route", "status"], registry=self.registry)
        self.http_latency = Histogram("p2pfaas_http_seconds", "HTTP request latency", ["route"], registry=self.registry)
        self._metric_children: dict[tuple[str, int], tuple] = {}
        self.api = self._build_api()
        self.app = FastInvoke(self.api, self)
        self._server = None

    async def start(self) -> "HttpBridge":
        if not self._started:
            await self.faas.start()
            self._started = True
        return self

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._started:
            await self.faas.stop()
            self._started = False

    # -- serving --------------------------------------------------------------------------
    async def serve(self, host: str, port: int, started: asyncio.Event | None = None, *,
                    reuse_port: bool = False) -> None:
        from broker.http.serving import serve_in_loop
        await serve_in_loop(self, host, port, started, reuse_port=reuse_port)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.should_exit = True

    # -- shared by the routers --------------------------------------------------------------
    def new_call_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids)}"

    async def read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_payload_bytes:
            raise PayloadTooLarge(f"payload of {declared} bytes exceeds the limit of {self.max_payload_bytes}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_payload_bytes:
                raise PayloadTooLarge(f"payload exceeds the limit of {self.max_payload_bytes} bytes")
        return bytes(body)

    def remember(self, call_id: str) -> None:
        self.calls[call_id] = None
        if len(self.calls) > REMEMBERED_CALLS:
            self.calls.popitem(last=False)

    def background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def deliver_callback(self, fut: "asyncio.Future[Answer]", call_id: str, url: str | None) -> None:
        try:
            answer = await asyncio.wait_for(fut, self.invoke_timeout_s)
        except asyncio.TimeoutError:
            log.warning("async call %s got no answer within %.0f s", call_id, self.invoke_timeout_s)
            return
        finally:
            self.faas.forget(call_id)
        if not url:
            return
        response = answer_response(answer, call_id)
        try:
            async with httpx.AsyncClient(timeout=10.0) as client:
                await client.post(url, content=response.body, headers=dict(response.headers.items()))
        except httpx.HTTPError as exc:
            log.warning("callback %s for %s failed: %s", url, call_id, exc)

    def count(self, route: str, status: int, seconds: float) -> None:
        """One request in the bridge's metrics (children looked up once per route and status)."""
        children = self._metric_children.get((route, status))
        if children is None:
            children = self._metric_children[(route, status)] = (
                self.http_requests.labels(route=route, status=str(status)), self.http_latency.labels(route=route))
        children[0].inc()
        children[1].observe(seconds)

    # -- the app ----------------------------------------------------------------------------
    def _build_api(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI):
            await self.start()
            try:
                yield
            finally:
                await self.stop()

        api = FastAPI(title="p2pfaas HTTP bridge", version=VERSION, lifespan=lifespan,
                      description="P2PFaaS-compatible REST entrypoint of a p2pfaas node, bridged to NATS.")

        @api.exception_handler(FaasError)
        async def faas_error(request: Request, exc: FaasError) -> JSONResponse:
            headers = {"Retry-After": "1"} if exc.http_status == 503 else None
            return JSONResponse({"code": exc.http_status, "message": str(exc)}, status_code=exc.http_status,
                                headers=headers)

        api.add_middleware(RequestMetrics, bridge=self)
        api.include_router(invoke_router(self))
        api.include_router(control_router(self))
        api.include_router(learner_router(self))
        return api


class RequestMetrics:
    """Counts and times every framework-served request per route template, as a plain ASGI
    middleware (Starlette's ``@app.middleware("http")`` costs ~4x more per request)."""

    def __init__(self, app, bridge: HttpBridge) -> None:
        self.app, self.bridge = app, bridge

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.bridge.count(path, status, time.perf_counter() - start)
