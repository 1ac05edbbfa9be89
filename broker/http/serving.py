"""Serving the HTTP bridge: uvicorn inside our own event loop, with its fastest parser.

Measured in bench/invoke_path.py: uvicorn with httptools on uvloop, the app's direct-call
fast path in front of FastAPI. A bridge may run as several processes on one port
(``SO_REUSEPORT``: the kernel spreads connections over them); each process has its own
NATS connection. ``p2pfaas bridge http --processes N`` and ``p2pfaas up`` use this.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from broker.http_bridge import HttpBridge

CONNECTION_LIMIT = 4096       # concurrent connections per bridge process; beyond: 503
KEEP_ALIVE_S = 30.0           # an idle keep-alive connection is closed after this
HEADER_TIMEOUT_S = 10.0       # a request's headers must arrive within this (slowloris)
BODY_TIMEOUT_S = 60.0         # and its body within this, once the headers are in


def _guarded_protocol():
    """uvicorn's httptools protocol with what it lacks: a deadline for a request's headers (from
    the first byte or from the connection) and for its body; a client that dawdles is cut off."""
    if importlib.util.find_spec("httptools") is None:
        return "h11"
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(HEADER_TIMEOUT_S)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm(HEADER_TIMEOUT_S)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm(BODY_TIMEOUT_S)
            if self.cycle is not None and not isinstance(self.cycle.transport, _OneWrite):
                self.cycle.transport = _OneWrite(self.transport, self.loop)

        def on_message_complete(self) -> None:
            self._disarm()   # the app runs as long as it needs; keep-alive has its own timeout
            super().on_message_complete()

    return GuardedHttpToolsProtocol


class _OneWrite:
    """A response's transport that writes its status line and headers together with the body that
    follows them: uvicorn writes the two in two system calls, and the client wakes up for each (a
    direct call's latency, bench/invoke_path.py row 2). The first write is held; the next one
    leaves with it at once, or, when no body follows in this turn of the loop, it leaves alone at
    the end of the turn. Everything but ``write`` is the connection's own; what is held is written
    before the connection closes."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport, loop) -> None:
        self._transport, self._loop, self._held = transport, loop, None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self._flush)
            return
        self._held = None
        if not self._transport.is_closing():
            self._transport.write(held + data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


HTTP_IMPLEMENTATION = _guarded_protocol()


class EmbeddedServer(uvicorn.Server):
    """uvicorn inside our loop: the process's launcher owns SIGINT/SIGTERM, not uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def listening_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A TCP socket bound to ``host:port``; with ``reuse_port`` several processes share the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


async def serve_in_loop(bridge: "HttpBridge", apps: list[tuple[object, str, int, bool]],
                        started: asyncio.Event | None = None, *, reuse_port: bool = False,
                        tls: tuple[str, str] | None = None) -> None:
    """Serve each ``(app, host, port, lifespan)`` until ``bridge.shutdown()``; the app with the
    lifespan (the scheduler API) starts and stops the bridge's NATS client. ``tls``: (certificate,
    key) files: HTTPS only."""
    servers, socks = [], []
    for app, host, port, lifespan in apps:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on" if lifespan else "off",
                                access_log=False, http=HTTP_IMPLEMENTATION, timeout_graceful_shutdown=5,
                                proxy_headers=False,   # nobody's X-Forwarded-For is believed (and a middleware less per call)
                                limit_concurrency=CONNECTION_LIMIT, timeout_keep_alive=KEEP_ALIVE_S,
                                ssl_certfile=tls[0] if tls else None, ssl_keyfile=tls[1] if tls else None)
        servers.append(EmbeddedServer(config))
        socks.append(listening_socket(host, port, reuse_port))
    bridge._servers = servers
    tasks = [asyncio.create_task(server.serve(sockets=[sock])) for server, sock in zip(servers, socks)]
    try:
        while not all(server.started for server in servers) and not any(task.done() for task in tasks):
            await asyncio.sleep(0.01)
        if started is not None:
            started.set()
        for task in asyncio.as_completed(tasks):
            await task
            bridge.shutdown()   # one server ended (or failed): end the others too
    finally:
        for sock in socks:
            sock.close()
