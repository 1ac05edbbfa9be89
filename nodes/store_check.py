"""Whether JetStream can still store what the node accepts: a tiny write every few seconds (one
message per node, kept once) and the async intake's room. A full disk or a full intake shows in
the node's info and so in ``/healthz`` (503) before a caller's async call is refused for it."""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client

from broker.lifecycle import cancel_and_wait, still_wanted
from broker.streams import async_stream, store_check_stream
from broker.subjects import Subjects

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 2.0
FULL_SHARE = 0.99   # the intake holding this share of its byte or message limit refuses new work soon


class StoreCheck:
    def __init__(self, node: str, nc: Client, subjects: Subjects, every_s: float) -> None:
        self.node, self.js, self.subjects, self.every_s = node, nc.jetstream(), subjects, every_s
        self.problem: str | None = None   # None: the last check stored and the intake has room
        self._task: asyncio.Task | None = None

    def start(self) -> "StoreCheck":
        self._task = asyncio.create_task(self._run(), name=f"{self.node}-store-check")
        return self

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            still_wanted()
            problem = await self.check()
            if problem != self.problem:
                (log.warning if problem else log.info)("%s: JetStream store %s", self.node, problem or "ok again")
            self.problem = problem
            await asyncio.sleep(self.every_s)

    async def check(self) -> str | None:
        try:
            await self.js.publish(self.subjects.store_check(self.node), b"", stream=store_check_stream(self.subjects),
                                  timeout=CHECK_TIMEOUT_S)
            info = await self.js.stream_info(async_stream(self.subjects))
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # a full disk, JetStream away, a stream gone (the intake makes it again)
            return f"cannot store: {type(exc).__name__}: {exc}"
        config, state = info.config, info.state
        if config.max_bytes and config.max_bytes > 0 and state.bytes >= FULL_SHARE * config.max_bytes:
            return f"async intake full: {state.bytes} of {config.max_bytes} bytes"
        if config.max_msgs and config.max_msgs > 0 and state.messages >= FULL_SHARE * config.max_msgs:
            return f"async intake full: {state.messages} of {config.max_msgs} calls"
        return None
