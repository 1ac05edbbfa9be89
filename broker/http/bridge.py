"""The state the HTTP bridge's routers share, below them: they import this, never the bridge that
assembles them (``broker.http_bridge``)."""

from __future__ import annotations

import asyncio
import hmac
import secrets
from typing import Collection
from urllib.parse import urlsplit

import httpx
from fastapi import Depends, Request
from nats.aio.client import Client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from broker.answers import input_limit
from broker.client import FaasClient
from broker.errors import ContractError, Forbidden, PayloadTooLarge, Unauthorized
from broker.http.limits import HttpLimits
from broker.subjects import Subjects, check_token


class Bridge:
    """What the routers share: NATS client, subjects, limits, who may do what, metrics, tasks."""

    def __init__(self, nc: Client, node: str, *, prefix: str = "faas", max_payload_bytes: int = 1024 * 1024,
                 invoke_timeout_s: float = 60.0, control_timeout_s: float = 3.0, operator_token: str | None = None,
                 invoke_token: str | None = None, callback_hosts: Collection[str] = (), p2pfaas_open: bool = False,
                 limits: HttpLimits = HttpLimits()) -> None:
        """``operator_token``: routes that change state need it; ``invoke_token``: invocation needs it too
        (None: open); ``callback_hosts``: the hosts ``X-Callback-Url`` may name (none by default);
        ``p2pfaas_open``: P2PFaaS's discovery and learner ports take changes without a token;
        ``limits``: what a client may hold and how long it is waited for."""
        self.nc = nc
        self.node = check_token(node, "node")
        self.subjects = Subjects(prefix)
        self.client_id = f"http-{node}"
        self.faas = FaasClient(nc, client=self.client_id, prefix=prefix)
        self.max_payload_bytes = input_limit(nc.max_payload, max_payload_bytes)   # what can travel on this broker
        self.invoke_timeout_s = invoke_timeout_s
        self.limits = limits
        self.control_timeout_s = control_timeout_s
        self.operator_token, self.invoke_token = operator_token, invoke_token
        self.callback_hosts = frozenset(h.lower() for h in callback_hosts)
        self._background: set[asyncio.Task] = set()
        self._started = False
        self.registry = CollectorRegistry()
        self.http_requests = Counter("p2pfaas_http_requests", "HTTP requests", ["route", "status"], registry=self.registry)
        self.http_latency = Histogram("p2pfaas_http_seconds", "HTTP request latency", ["route"], registry=self.registry)
        self._metric_children: dict[tuple[str, int], tuple] = {}
        # the HTTP edge (broker/http/edge.py): what it refused or cut, and what it holds open
        self.http_refused = Counter("p2pfaas_http_refused", "HTTP connections refused or cut by the edge, by reason",
                                    ["reason"], registry=self.registry)
        self.http_edge = None   # its connection slots, once serving
        Gauge("p2pfaas_http_connections", "Open HTTP connections of this bridge process (every port)",
              registry=self.registry).set_function(lambda: self.http_edge.total if self.http_edge is not None else 0)
        # every route that changes state depends on one of these: the one place the operator check is
        self.changes_state = Depends(self.require_operator)
        self.p2pfaas_open = p2pfaas_open
        self.changes_state_p2pfaas = Depends(self.authorize_p2pfaas_change)
        self._servers: list = []

    async def start(self) -> "Bridge":
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

    def shutdown(self) -> None:
        for server in self._servers:
            server.should_exit = True

    # -- shared by the routers --------------------------------------------------------------
    async def authorize_p2pfaas_change(self, request: Request) -> None:
        """Changes on P2PFaaS's own ports: open if ``p2pfaas_open``, else the operator's."""
        if not self.p2pfaas_open:
            await self.require_operator(request)

    def new_call_id(self) -> str:
        """Random, not counted: ``GET /result/{id}`` answers whoever names an id."""
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

    def count(self, route: str, status: int, seconds: float) -> None:
        """One request in the bridge's metrics (children looked up once per route and status)."""
        children = self._metric_children.get((route, status))
        if children is None:
            children = self._metric_children[(route, status)] = (
                self.http_requests.labels(route=route, status=str(status)), self.http_latency.labels(route=route))
        children[0].inc()
        children[1].observe(seconds)


def _bearer_matches(authorization: str | None, token: str) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
