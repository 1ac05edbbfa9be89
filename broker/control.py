"""Control-plane request/reply: nodes serve it as a NATS service's endpoints, bridges and tools ask. Replies
carry ``X-P2pfaas-Status``; a handler raises :class:`ControlError` (or ``ContractError``: 400) to refuse."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable

import orjson

from nats import micro
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from broker import codes
from broker import headers as H
from broker.answers import VERSION, error_body, status_of
from broker.connection import request
from broker.errors import ContractError, NodeUnavailable

log = logging.getLogger(__name__)

Handler = Callable[[bytes], Awaitable[bytes]]


class ControlError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class ControlServer:
    """Serves control subjects as the endpoints of one NATS service; ``refused`` hears every refusal."""

    def __init__(self, nc: Client, refused: Callable[[str, str], None] = lambda subject, message: None, *,
                 name: str = "p2pfaas-control", description: str = "", metadata: dict[str, str] | None = None) -> None:
        self.nc, self._refused = nc, refused
        self.config = micro.ServiceConfig(name=name, version=VERSION, description=description or None,
                                          metadata=metadata or {})
        self.service: micro.Service | None = None

    async def serve(self, subject: str, handler: Handler) -> None:
        async def on_request(request: micro.Request) -> None:
            subject = request.subject
            try:
                body, status, headers = await handler(request.data), 200, {H.STATUS: "200"}
            except (ControlError, ContractError) as exc:
                status = exc.status if isinstance(exc, ControlError) else 400
                message = exc.message if isinstance(exc, ControlError) else str(exc)
                self._refused(subject, message)
                body = error_body(codes.for_status(status), message)
                headers = {H.STATUS: str(status), H.SERVICE_ERROR: message[:200].replace("\n", " "),
                           H.SERVICE_ERROR_CODE: str(status)}
            except OSError as exc:   # a full disk, a read-only data dir: the asker hears which, not "internal error"
                message = f"the node could not write its state: {exc.strerror or exc}" + (
                    f" ({exc.filename})" if exc.filename else "")
                log.error("control request on %s failed: %s", subject, message)
                status, body = 500, error_body(codes.GENERIC, message)
                headers = {H.STATUS: "500", H.SERVICE_ERROR: message[:200], H.SERVICE_ERROR_CODE: "500"}
            except Exception as exc:  # a bug must answer too, never leave the caller waiting
                log.exception("control request on %s failed", subject)
                status, body = 500, error_body(codes.GENERIC, f"internal error: {type(exc).__name__}")
                headers = {H.STATUS: "500", H.SERVICE_ERROR: "internal error", H.SERVICE_ERROR_CODE: "500"}
            with contextlib.suppress(ValueError):   # a publish without a reply subject: served, not answered
                await request.respond(body, headers=headers)

        if self.service is None:
            self.service = await micro.add_service(self.nc, self.config)
        # an endpoint's name is its subject, dots as dashes (names take no dots)
        await self.service.add_endpoint(name=subject.replace(".", "-"), subject=subject, handler=on_request)

    async def stop(self) -> None:
        if self.service is not None:
            try:
                await self.service.stop()
            except Exception as exc:  # the connection may already be gone
                log.debug("control service stop: %s", exc)
            self.service = None


async def control_request(nc: Client, subject: str, body: bytes = b"", timeout_s: float = 3.0) -> tuple[int, bytes]:
    """(status, body) of a control request; NodeUnavailable when nobody answers in time."""
    try:
        msg = await request(nc, subject, body, timeout_s=timeout_s)   # NotPermitted: at once
    except (NatsTimeout, NoRespondersError, asyncio.TimeoutError) as exc:
        raise NodeUnavailable(f"nobody answered on {subject} ({type(exc).__name__})") from None
    return status_of((msg.headers or {}).get(H.STATUS)), msg.data


def node_health(node: str, status: int, body: bytes) -> tuple[dict, str | None]:
    """A node's info answer judged: (info, None) when healthy, else (info, why not)."""
    try:
        info = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        info = {}
    if not isinstance(info, dict):
        info = {}
    if status != 200:
        return info, f"node {node}: its info request failed ({status}: {info.get('message', 'no message')})"
    if info.get("node") != node:
        return info, f"node {node}: its info does not name it ({info.get('node')!r})"
    if info.get("intake", "ok") != "ok":
        return info, f"node {node}: its async intake cannot pull from JetStream"
    if info.get("store", "ok") != "ok":
        return info, f"node {node}: JetStream {info['store']}"
    if info.get("answers_unstored", 0):
        return info, f"node {node}: {info['answers_unstored']} answer(s) waiting for JetStream to store them"
    return info, None
