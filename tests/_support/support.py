"""Test helpers shared by the test modules (importable as ``support``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Callable

import httpx

from broker.embedded import free_port


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.02) -> None:
    """Poll ``predicate`` until true; AssertionError after ``timeout_s`` (never a bare sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)


async def eventually(fetch, predicate, timeout_s: float = 10.0, interval_s: float = 0.05):
    """Call ``await fetch()`` until ``predicate(value)``; the value, or AssertionError after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = await fetch()
        if predicate(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s (last value {value!r})")
        await asyncio.sleep(interval_s)


class Collector:
    """Subscribe to ``subject`` and keep every message (``async with Collector(nc, s) as c``)."""

    def __init__(self, nc, subject: str) -> None:
        self.nc, self.subject = nc, subject
        self.messages: list = []
        self.event = asyncio.Event()
        self._sub = None

    async def _on(self, msg) -> None:
        self.messages.append(msg)
        self.event.set()

    async def __aenter__(self) -> "Collector":
        self._sub = await self.nc.subscribe(self.subject, cb=self._on)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._sub.unsubscribe()


@contextlib.asynccontextmanager
async def serving(bridge, timeout_s: float = 30.0):
    """Serve an ``HttpBridge`` on a free port; yields an httpx client bound to it."""
    port = free_port()
    await bridge.start()
    started = asyncio.Event()
    task = asyncio.create_task(bridge.serve("127.0.0.1", port, started))
    await asyncio.wait_for(started.wait(), 10)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s) as http:
            yield http
    finally:
        bridge.shutdown()
        await task
        await bridge.stop()


# discovery fast enough for tests, and nobody is suspected in the middle of one
FAST = dict(heartbeat_period_s=0.1, suspect_after=50, remove_after=100, runtime="inprocess")


@contextlib.asynccontextmanager
async def cluster(node_factory, *specs, **common):
    """Nodes ``(id, scheduler)`` or ``(id, scheduler, overrides)``, once every node sees all the others."""
    async with contextlib.AsyncExitStack() as stack:
        nodes = []
        for nid, sched, *rest in specs:
            overrides = {**FAST, **common, **(rest[0] if rest else {})}
            nodes.append(await stack.enter_async_context(node_factory(node_id=nid, scheduler=sched, **overrides)))
        ids = {n.settings.node_id for n in nodes}
        await wait_until(lambda: all(set(n.discovery.peers()) == ids - {n.settings.node_id} for n in nodes), 10)
        yield nodes


@contextlib.asynccontextmanager
async def http_for(nc, node: str, prefix: str):
    """An httpx client on a node's HTTP bridge app, in process (no port)."""
    from broker.http_bridge import HttpBridge

    bridge = await HttpBridge(nc, node, prefix=prefix, invoke_timeout_s=20).start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=bridge.app), base_url="http://bridge",
                                     timeout=30) as client:
            yield client
    finally:
        await bridge.stop()
