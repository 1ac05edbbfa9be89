"""The node's durable intake: its async calls, pulled in batches from the shared async stream.

Each message is held (unacknowledged, kept alive with ``in_progress``) until its answer is
stored, so a node that dies mid-call loses nothing: JetStream delivers the message again.
The consumer is durable (``node-<id>``, filter ``<prefix>.async.<id>.>``) with explicit acks
and ``max_deliver``; the last delivery of a call is dead-lettered by the service, not run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import BadRequestError

from broker.streams import async_stream
from broker.subjects import Subjects

log = logging.getLogger(__name__)

BATCH = 256             # messages per pull
HOLD_LIMIT = 10_000     # messages held at once (running, queued in memory, being answered)


def consumer_name(node: str) -> str:
    return f"node-{node}"


class AsyncIntake:
    def __init__(self, node: str, nc: Client, subjects: Subjects, *, ack_wait_s: float, max_deliver: int,
                 take: Callable[[Msg], Awaitable[None]]) -> None:
        self.node, self.nc, self.js, self.subjects = node, nc, nc.jetstream(), subjects
        self.ack_wait_s, self.max_deliver, self._take = ack_wait_s, max_deliver, take
        self.held: dict[str, Msg] = {}          # by delivery (its ack subject)
        self.healthy = False
        self._room = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._sub = None

    async def start(self) -> "AsyncIntake":
        stream = async_stream(self.subjects)
        config = ConsumerConfig(durable_name=consumer_name(self.node), ack_policy=AckPolicy.EXPLICIT,
                                ack_wait=self.ack_wait_s, max_deliver=self.max_deliver, max_ack_pending=HOLD_LIMIT,
                                filter_subject=self.subjects.async_of(self.node))
        try:
            await self.js.add_consumer(stream, config)
        except BadRequestError as exc:  # exists with other settings: the stream keeps the messages
            if exc.err_code != 10148:
                raise
            await self.js.delete_consumer(stream, config.durable_name)
            await self.js.add_consumer(stream, config)
        self._sub = await self.js.pull_subscribe_bind(durable=config.durable_name, stream=stream)
        self.healthy = True
        self._tasks = [asyncio.create_task(self._pull(), name=f"{self.node}-intake"),
                       asyncio.create_task(self._keep_alive(), name=f"{self.node}-intake-keepalive")]
        return self

    async def stop(self) -> None:
        """Stop pulling; what is still held is handed back at once (a restarted node takes it)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception as exc:  # the connection may already be gone
                log.debug("intake unsubscribe: %s", exc)
        self.healthy = False

    def hold(self, msg: Msg) -> None:
        self.held[msg.reply] = msg

    def release(self, msg: Msg) -> None:
        self.held.pop(msg.reply, None)
        self._room.set()

    async def _pull(self) -> None:
        while True:
            room = HOLD_LIMIT - len(self.held)
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            try:
                msgs = await self._sub.fetch(min(BATCH, room), timeout=1.0)
            except (NatsTimeout, asyncio.TimeoutError):
                self.healthy = True
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # broker blip (JetStream down, reconnecting): retry, say so
                if self.healthy:
                    log.warning("%s: async intake cannot pull (%s); retrying", self.node, exc)
                self.healthy = False
                await asyncio.sleep(0.5)
                continue
            self.healthy = True
            for msg in msgs:
                try:
                    await self._take(msg)
                except Exception:  # never let one message stop the intake
                    log.exception("%s: async call on %s failed to start", self.node, msg.subject)
                    self.release(msg)

    async def _keep_alive(self) -> None:
        """Held messages are not delivered again while their call is queued or running."""
        while True:
            await asyncio.sleep(self.ack_wait_s / 3)
            for msg in list(self.held.values()):
                try:
                    await msg.in_progress()
                except Exception as exc:  # connection blip: the next round tries again
                    log.debug("in_progress: %s", exc)
                    break
