"""The HTTP bridge: P2PFaaS's REST APIs on NATS subjects (nothing from nodes/): the scheduler API (:18080),
and the discovery (19000) and learner (19020) APIs on their own ports (docs/compat.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import FastAPI
from nats.aio.client import Client

from broker.answers import VERSION
from broker.errors import FaasError
from broker.http.bridge import Bridge
from broker.http.control import control_router
from broker.http.invoke import FastInvoke, faas_error, invoke_router
from broker.http.discovery import discovery_app
from broker.http.learner import learner_app, learner_router
from broker.http.openfaas import openfaas_router
from broker.http.peer import peer_router
from broker.http.serving import serve_in_loop
from broker.http_ui import dashboard_router


class HttpBridge(Bridge):
    """The app for one node; ``serve()`` runs it under uvicorn inside the caller's loop."""

    def __init__(self, nc: Client, node: str, **options) -> None:
        """The options are :class:`Bridge`'s."""
        super().__init__(nc, node, **options)
        self.api = self._build_api()
        self.app = FastInvoke(self.api, self)
        self.discovery_app = discovery_app(self)
        self.learner_app = learner_app(self)

    # -- serving --------------------------------------------------------------------------
    async def serve(self, host: str, port: int, started: asyncio.Event | None = None, *,
                    reuse_port: bool = False, discovery_port: int | None = None,
                    learner_port: int | None = None, tls: tuple[str, str] | None = None) -> None:
        """Serve the scheduler API on ``port`` (the discovery and learner APIs on theirs) until shutdown."""
        apps = [(self.app, port, True)]
        apps += [(app, p, False) for app, p in ((self.discovery_app, discovery_port), (self.learner_app, learner_port))
                 if p is not None]
        await serve_in_loop(self, [(app, host, p, lifespan) for app, p, lifespan in apps], started,
                            reuse_port=reuse_port, tls=tls)

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

        api.add_exception_handler(FaasError, faas_error)   # type: ignore[arg-type]

        api.add_middleware(RequestMetrics, bridge=self)
        api.include_router(invoke_router(self))
        api.include_router(control_router(self))
        api.include_router(learner_router(self))
        api.include_router(openfaas_router(self))
        api.include_router(peer_router(self))
        api.include_router(dashboard_router(self.nc, self.subjects, self.node, guard=[self.changes_state]))
        return api


class RequestMetrics:
    """Counts and times framework-served requests per route (a plain, cheaper ASGI middleware)."""

    def __init__(self, app, bridge: Bridge) -> None:
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
