"""Serving the HTTP bridge: uvicorn (httptools) inside our own event loop, behind the edge that no one
client can exhaust (broker/http/edge.py). Several bridge processes may share a port (``SO_REUSEPORT``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING

import uvicorn

from broker.http.edge import HTTP_IMPLEMENTATION, KEEP_ALIVE_S, Edge, edge_websocket

if TYPE_CHECKING:
    from broker.http.bridge import Bridge


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


async def serve_in_loop(bridge: "Bridge", apps: list[tuple[object, str, int, bool]],
                        started: asyncio.Event | None = None, *, reuse_port: bool = False,
                        tls: tuple[str, str] | None = None) -> None:
    """Serve each ``(app, host, port, lifespan)`` until ``bridge.shutdown()`` (the lifespan app starts and
    stops the bridge's NATS client); ``tls``: HTTPS only. One edge: a client's slots count on every port."""
    edge = bridge.http_edge = Edge(bridge.limits, refused=bridge.http_refused)
    if isinstance(HTTP_IMPLEMENTATION, str):   # no httptools: h11 and uvicorn's own limits
        http, ws, limit = HTTP_IMPLEMENTATION, "auto", edge.limit
    else:   # the edge counts connections; uvicorn's own limit (503 once the headers are in) stays off
        http, ws, limit = type("EdgeHttpToolsProtocol", (HTTP_IMPLEMENTATION,), {"edge": edge}), edge_websocket(edge), None
    servers, socks = [], []
    for app, host, port, lifespan in apps:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on" if lifespan else "off",
                                access_log=False, http=http, ws=ws, timeout_graceful_shutdown=5,
                                proxy_headers=False,   # nobody's X-Forwarded-For is believed (and a middleware less per call)
                                limit_concurrency=limit, timeout_keep_alive=KEEP_ALIVE_S,
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
