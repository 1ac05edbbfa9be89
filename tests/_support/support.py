"""Test helpers shared by the test modules (importable as ``support``)."""

from __future__ import annotations

import asyncio
from typing import Callable


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.02) -> None:
    """Poll ``predicate`` until true; AssertionError after ``timeout_s`` (never a bare sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
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
