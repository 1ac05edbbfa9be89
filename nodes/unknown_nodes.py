"""Async calls stored for a node that does not exist: refused on their client's reject subject
after a while, never kept forever in silence (the intake, nodes/intake.py, takes a node's own)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from typing import Awaitable, Callable, Iterable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import BadRequestError, NotFoundError

from broker.streams import async_stream
from broker.errors import InvalidToken
from broker.subjects import TOKEN_RE, Subjects, check_node
from broker.lifecycle import cancel_and_wait, still_wanted
from nodes.intake import BATCH

log = logging.getLogger(__name__)

UNKNOWN_AFTER_S = 60.0   # an async call to a node that never existed waits this long, then is refused
SWEEP_PERIOD_S = 15.0
SCAN = 256               # stored calls looked at per sweep (the oldest first)


class UnknownNodeSweeper:
    """Now and then, refuses and removes the oldest stored async calls addressed to a node that
    never had a durable consumer, once older than ``unknown_after_s``. This node and the peers
    ``alive`` names exist, whatever happened to their consumer."""

    def __init__(self, node: str, nc: Client, subjects: Subjects, refuse: Callable[[Msg | object, str], Awaitable[None]],
                 *, alive: Callable[[], Iterable[str]] = lambda: (), unknown_after_s: float = UNKNOWN_AFTER_S,
                 period_s: float = SWEEP_PERIOD_S, here_only: bool = False) -> None:
        """``here_only``: a device's streams are its node's alone, so every other node is refused here."""
        self.node, self.js, self.subjects = node, nc.jetstream(), subjects
        self._refuse, self._alive, self.here_only = refuse, alive, here_only
        self.unknown_after_s, self.period_s = unknown_after_s, period_s
        self._task: asyncio.Task | None = None

    def start(self) -> "UnknownNodeSweeper":
        self._task = asyncio.create_task(self._run(), name=f"{self.node}-sweeper")
        return self

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        await asyncio.sleep(self.period_s * (0.5 + random.random()))   # nodes do not all sweep at once
        while True:
            still_wanted()
            try:
                unknown = await self.unknown_nodes()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # JetStream busy or down: the next sweep tries again
                log.debug("%s: sweep skipped: %s", self.node, exc)
                unknown = set()
            for node in sorted(unknown):   # one node's trouble never keeps the others' calls waiting
                try:
                    await self.drain(node)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("%s: the stored calls to unknown node %r were not refused this sweep: %r",
                                self.node, node, exc)
            await asyncio.sleep(self.period_s)

    async def unknown_nodes(self) -> set[str]:
        stream = async_stream(self.subjects)
        info = await self.js.stream_info(stream)
        if not info.state.messages:
            return set()
        known = {c.name[len("node-"):] for c in await self.js.consumers_info(stream) if c.name.startswith("node-")}
        known |= {self.node, *self._alive()}
        unknown: set[str] = set()
        seq, now = info.state.first_seq, time.time()
        for _ in range(SCAN):
            try:
                msg = await self.js.get_msg(stream, seq=seq, subject=self.subjects.all_async(), next=True)
            except NotFoundError:
                break
            if msg.time is not None and now - msg.time.timestamp() < self.unknown_after_s:
                break   # the rest are younger
            node = msg.subject.split(".")[2] if msg.subject else ""
            if node and node not in known:
                unknown.add(node)
            seq = (msg.seq or seq) + 1
        return unknown

    async def drain(self, node: str) -> None:
        """Refuse every stored call of ``node`` through our own consumer (a work queue: nobody else takes them)."""
        stream = async_stream(self.subjects)
        name = f"sweep-{node}"[:64]
        try:
            check_node(node)
            why = (f"no node {node!r} on this machine: a device takes calls for its own node ({self.node}) only; "
                   f"address it, and its scheduler forwards" if self.here_only else
                   f"no node {node!r}: it has never been started (calls to it are refused after {self.unknown_after_s:g} s)")
        except InvalidToken as exc:   # a name no node can have (reserved, too long): never served
            why = f"no node {node!r} can exist: {exc}"
            if not TOKEN_RE.match(node):   # a consumer's name takes no such token (a '/', say)
                name = f"sweep-x{hashlib.sha256(node.encode()).hexdigest()[:24]}"
        try:
            await self.js.add_consumer(stream, ConsumerConfig(
                durable_name=name, ack_policy=AckPolicy.EXPLICIT, filter_subject=self.subjects.stored_async_of(node),
                inactive_threshold=60.0))
        except BadRequestError as exc:   # the node appeared meanwhile, or another node sweeps it
            log.debug("%s: not sweeping %s: %s", self.node, node, exc)
            return
        try:
            sub = await self.js.pull_subscribe_bind(durable=name, stream=stream)
            while True:
                try:
                    msgs = await sub.fetch(BATCH, timeout=1.0)
                except (NatsTimeout, asyncio.TimeoutError):
                    break
                for msg in msgs:
                    await self._refuse(msg, why)
                    await msg.ack()
            await sub.unsubscribe()
        finally:
            try:
                await self.js.delete_consumer(stream, name)
            except Exception as exc:
                log.debug("%s: sweep consumer of %s not deleted: %s", self.node, node, exc)
