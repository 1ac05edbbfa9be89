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

HTTP_IMPLEMENTATION = "httptools" if importlib.util.find_spec("httptools") else "h11"
CONNECTION_LIMIT = 4096       # concurrent connections per bridge process; beyond: 503
KEEP_ALIVE_S = 30.0           # an idle keep-alive connection is closed after this


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


async def serve_in_loop(bridge: "HttpBridge", host: str, port: int, started: asyncio.Event | None = None, *,
                        reuse_port: bool = False) -> None:
    """Serve until ``bridge.shutdown()``; the lifespan starts and stops the bridge's NATS client."""
    config = uvicorn.Config(bridge.app, host=host, port=port, log_level="warning", lifespan="on",
                            access_log=False, http=HTTP_IMPLEMENTATION, timeout_graceful_shutdown=5,
                            limit_concurrency=CONNECTION_LIMIT, timeout_keep_alive=KEEP_ALIVE_S)
    server = EmbeddedServer(config)
    bridge._server = server
    sock = listening_socket(host, port, reuse_port)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if started is not None:
            started.set()
        await task
    finally:
        sock.close()
