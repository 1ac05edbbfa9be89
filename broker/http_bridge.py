"""The HTTP bridge: P2PFaaS's REST APIs translated to NATS subjects.

It imports nothing from nodes/: every route is a publish or a request/reply on the node's
subjects, so a node can run anywhere its NATS reaches. ``HttpBridge.app`` is the ASGI entry of
the scheduler API (default :18080: the direct-call fast path in front of the FastAPI app ``api``,
which holds the routers, one exception handler and the lifespan that starts and stops the
bridge's NATS client). ``discovery_app`` and ``learner_app`` are P2PFaaS's discovery (19000)
and learner (19020) APIs, served by the same process on their own ports (docs/compat.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import hmac
import secrets
from typing import Collection
from urllib.parse import urlsplit

import httpx
from fastapi import Depends, FastAPI, Request
from nats.aio.client import Client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from broker.answers import VERSION, Answer, input_limit
from broker.client import FaasClient
from broker.errors import ContractError, FaasError, Forbidden, PayloadTooLarge, Unauthorized
from broker.http.control import control_router
from broker.http.invoke import FastInvoke, answer_response, faas_error, invoke_router
from broker.http.discovery import discovery_app
from broker.http.learner import learner_app, learner_router
from broker.http.openfaas import openfaas_router
from broker.http.peer import peer_router
from broker.http_ui import dashboard_router
from broker.streams import RESULT_MAX_AGE_S
from broker.subjects import Subjects, check_token

log = logging.getLogger(__name__)

# an async call's answer is POSTed to its X-Callback-Url if it comes while the results stream
# keeps it (as /result/{id} finds it), however long the call queued or ran: a direct call's
# limit (invoke_timeout_s) is no async call's
CALLBACK_WAIT_S = RESULT_MAX_AGE_S
CALLBACK_LOOK_S = 60.0    # the stored answer is looked up this often (one missed during a reconnection)
CALLBACK_POST_S = 10.0    # a callback POST, its response included, ends within this


class HttpBridge:
    """The app for one node; ``serve()`` runs it under uvicorn inside the caller's loop."""

    def __init__(self, nc: Client, node: str, *, prefix: str = "faas", max_payload_bytes: int = 1024 * 1024,
                 invoke_timeout_s: float = 60.0, control_timeout_s: float = 3.0, operator_token: str | None = None,
                 invoke_token: str | None = None, callback_hosts: Collection[str] = (), p2pfaas_open: bool = False) -> None:
        """``operator_token``: routes that change state need it (None: an open bridge, for tests
        and trusted networks); ``invoke_token``: invocation needs it too (None: open, as OpenFaaS
        by default); ``callback_hosts``: the hosts ``X-Callback-Url`` may name (none by default);
        ``p2pfaas_open``: P2PFaaS's discovery and learner ports take changes without a token."""
        self.nc = nc
        self.node = check_token(node, "node")
        self.subjects = Subjects(prefix)
        self.client_id = f"http-{node}"
        self.faas = FaasClient(nc, client=self.client_id, prefix=prefix)
        self.max_payload_bytes = input_limit(nc.max_payload, max_payload_bytes)   # what can travel on this broker
        self.invoke_timeout_s = invoke_timeout_s
        self.control_timeout_s = control_timeout_s
        self.operator_token, self.invoke_token = operator_token, invoke_token
        self.callback_hosts = frozenset(h.lower() for h in callback_hosts)
        self._background: set[asyncio.Task] = set()
        self._started = False
        self.registry = CollectorRegistry()
        self.http_requests = Counter("p2pfaas_http_requests", "HTTP requests", ["route", "status"], registry=self.registry)
        self.http_latency = Histogram("p2pfaas_http_seconds", "HTTP request latency", ["route"], registry=self.registry)
        self._metric_children: dict[tuple[str, int], tuple] = {}
        # the HTTP edge (broker/http/serving.py): what it refused or cut, and what it holds open
        self.http_refused = Counter("p2pfaas_http_refused", "HTTP connections refused or cut by the edge, by reason",
                                    ["reason"], registry=self.registry)
        self.http_edge = None   # its connection slots, once serving
        Gauge("p2pfaas_http_connections", "Open HTTP connections of this bridge process (every port)",
              registry=self.registry).set_function(lambda: self.http_edge.total if self.http_edge is not None else 0)
        # every route that changes state depends on one of these: the one place the operator check is
        self.changes_state = Depends(self.require_operator)
        self.p2pfaas_open = p2pfaas_open
        self.changes_state_p2pfaas = Depends(self.authorize_p2pfaas_change)
        self.api = self._build_api()
        self.app = FastInvoke(self.api, self)
        self.discovery_app = discovery_app(self)
        self.learner_app = learner_app(self)
        self._servers: list = []

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
                    reuse_port: bool = False, discovery_port: int | None = None,
                    learner_port: int | None = None, tls: tuple[str, str] | None = None) -> None:
        """Serve the scheduler API on ``port`` (and the discovery and learner APIs on theirs, when
        given) until :meth:`shutdown`."""
        from broker.http.serving import serve_in_loop
        apps = [(self.app, port, True)]
        apps += [(app, p, False) for app, p in ((self.discovery_app, discovery_port), (self.learner_app, learner_port))
                 if p is not None]
        await serve_in_loop(self, [(app, host, p, lifespan) for app, p, lifespan in apps], started,
                            reuse_port=reuse_port, tls=tls)

    def shutdown(self) -> None:
        for server in self._servers:
            server.should_exit = True

    # -- shared by the routers --------------------------------------------------------------
    async def authorize_p2pfaas_change(self, request: Request) -> None:
        """State changes on P2PFaaS's own discovery and learner ports (a machine registering,
        rewards, a reset): as open as in P2PFaaS when ``p2pfaas_open`` (its clients carry no token:
        keep those ports on a trusted network), else the operator token as everywhere else."""
        if not self.p2pfaas_open:
            await self.require_operator(request)

    def new_call_id(self) -> str:
        """Random, not counted: ``GET /result/{id}`` answers whoever names an id (every HTTP caller
        is the bridge's one client), so no id may follow from another caller's (docs/security.md)."""
        return secrets.token_hex(16)

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

    # -- who may do what (docs/security.md) --------------------------------------------------
    async def require_operator(self, request: Request) -> None:
        """Dependency of every route that changes state: the operator's bearer token."""
        if self.operator_token is not None and not _bearer_matches(request.headers.get("authorization"), self.operator_token):
            raise Unauthorized("this route changes state: it needs the operator token (Authorization: Bearer ...; "
                               "`p2pfaas auth operator` prints it)")

    def may_invoke(self, authorization: str | None) -> bool:
        return self.invoke_token is None or _bearer_matches(authorization, self.invoke_token) or (
            self.operator_token is not None and _bearer_matches(authorization, self.operator_token))

    def check_callback(self, url: str | None) -> None:
        """Callbacks go only to the hosts the operator allowed (a bridge must not POST anywhere)."""
        if not url:
            return
        try:
            parts = urlsplit(url)
            parts.port                       # a port that is not a number raises here
            httpx.URL(url)                   # and what httpx could not send to
        except (ValueError, httpx.InvalidURL) as exc:
            raise ContractError(f"X-Callback-Url {url[:200]!r} is not a URL: {exc}") from None
        host = (parts.hostname or "").lower()
        if parts.scheme not in ("http", "https") or host not in self.callback_hosts:
            allowed = ", ".join(sorted(self.callback_hosts)) or "none"
            raise Forbidden(f"callback to {host or url!r} not allowed (allowed hosts: {allowed}; "
                            "p2pfaas up --callback-host HOST)")

    def background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def deliver_callback(self, fut: "asyncio.Future[Answer]", call_id: str, url: str) -> None:
        """POST the answer of async call ``call_id`` to ``url`` when it comes (a call without a
        callback gets no task: its answer waits in the results stream for ``/result/{id}``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CALLBACK_WAIT_S
        try:
            answer = None
            while answer is None:
                try:
                    async with asyncio.timeout(min(CALLBACK_LOOK_S, deadline - loop.time())):
                        answer = await asyncio.shield(fut)
                except FaasError as exc:   # an answer that is no Answer: said, not a task dying silently
                    log.warning("async call %s: its answer cannot be read (%s): no callback", call_id, exc)
                    return
                except asyncio.TimeoutError:
                    with contextlib.suppress(FaasError):   # JetStream away for now: the next look
                        answer = await self.faas.stored_answer(self.client_id, call_id)
                    if answer is None and loop.time() >= deadline:
                        log.warning("async call %s got no answer within %.0f s: no callback", call_id, CALLBACK_WAIT_S)
                        return
        finally:
            self.faas.forget(call_id)
        response = answer_response(answer, call_id)
        try:
            async with httpx.AsyncClient(timeout=CALLBACK_POST_S) as client:
                # httpx's timeout is per read: a target trickling its response would hold this for ever
                async with asyncio.timeout(CALLBACK_POST_S):
                    await client.post(url, content=response.body, headers=dict(response.headers.items()))
        except Exception as exc:   # whatever goes wrong, said (the background task must not die silently)
            log.warning("callback %s for %s failed: %r", url, call_id, exc)

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

        api.add_exception_handler(FaasError, faas_error)   # type: ignore[arg-type]

        api.add_middleware(RequestMetrics, bridge=self)
        api.include_router(invoke_router(self))
        api.include_router(control_router(self))
        api.include_router(learner_router(self))
        api.include_router(openfaas_router(self))
        api.include_router(peer_router(self))
        api.include_router(dashboard_router(self.nc, self.subjects, self.node, guard=[self.changes_state]))
        return api


def _bearer_matches(authorization: str | None, token: str) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


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
