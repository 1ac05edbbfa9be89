"""The node's durable intake: its async calls, pulled from the shared async stream by its durable
consumer (``node-<id>``, explicit acks). Each message is held, kept alive with ``in_progress``, until its
answer is stored, so a node that dies mid-call loses nothing. One pull request at a time asks only for
what the node can take: a backlog waits in the stream, durable and free. A consumer or stream deleted
under the node is made again (the service's duplicate guard drops calls delivered again already answered)."""

from __future__ import annotations

import asyncio
import logging

import orjson
from typing import Callable, Mapping

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import BadRequestError, NotFoundError

from broker import headers as H
from broker.connection import listen, on_event
from broker.fastpath import delivery, pull_subject
from broker.streams import async_stream, ensure_shared_streams
from broker.subjects import Subjects
from broker.lifecycle import still_wanted
from nodes.settings import memory_share

log = logging.getLogger(__name__)

BATCH = 256             # messages per pull request
HOLD_LIMIT = 10_000     # messages held at once (running, queued in memory, being answered)
PULL_EXPIRES_S = 1.0    # an open pull request ends after this (nats-server answers 408)
PULL_GRACE_S = 2.0      # no word on a pull request by its expiry plus this: JetStream is away
CONSUMER_DELETED = "409 Consumer Deleted"   # nats-server's word to an open pull request
BATCH_COMPLETED = "Batch Completed"         # ... and its word when a pull's max_bytes is reached
NO_RESPONDERS = "503"   # nobody serves the pull subject: the consumer is gone, or JetStream is
LOOKUP_TIMEOUT_S = 1.0  # asking JetStream whether the consumer still exists
STREAM_NOT_FOUND = 10059  # JetStream's error code: the stream does not exist


def consumer_name(node: str) -> str:
    return f"node-{node}"


def consumer_config(node: str, subjects: Subjects, ack_wait_s: float) -> ConsumerConfig:
    """max_deliver unlimited: the service counts ``num_delivered`` and dead-letters the one numbered
    ``max_deliver``; nats-server's limit also counted deliveries lost while the node reconnected, and
    such a call stayed in the stream for ever, unrun and unanswered."""
    return ConsumerConfig(durable_name=consumer_name(node), ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait_s,
                          max_deliver=-1, max_ack_pending=HOLD_LIMIT, filter_subject=subjects.async_of(node))


class AsyncIntake:
    def __init__(self, node: str, nc: Client, subjects: Subjects, *, ack_wait_s: float,
                 take: Callable[[Msg], None], budget: Callable[[], int] = lambda: HOLD_LIMIT,
                 hold_bytes: int | None = None) -> None:
        """``take(msg)``: a plain call for each delivery, from the connection's read loop (it
        spawns what has to wait). ``budget()``: how many messages the node may hold at once now;
        ``hold_bytes``: how many bytes of inputs (None: a share of the machine's memory)."""
        self.node, self.nc, self.js, self.subjects = node, nc, nc.jetstream(), subjects
        self.ack_wait_s, self._take, self._budget = ack_wait_s, take, budget
        self.held: dict[str, Msg] = {}          # by delivery (its ack subject)
        self.held_bytes = 0                     # their inputs
        self.bytes_limit = hold_bytes or memory_share()
        self.healthy = False
        self._room = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._sub = None
        self._next_subject = ""                 # the consumer's pull API subject
        self._inbox = ""                        # pulls reply on <inbox>.<n>
        self._pulls = 0
        self._reply = ""                        # the open pull request's reply subject
        self._asked = 0                         # messages the open pull request may still bring
        self._ended = asyncio.Event()           # the open pull request is done (full, expired, refused)
        self._refusal = ""                      # why nats-server ended it, when not full or expired
        self._unlisten: Callable[[], None] = lambda: None
        self.pulls_after_reconnect = 0          # pull requests made at once after a reconnect

    async def start(self) -> "AsyncIntake":
        """Starts in the background: direct calls need no JetStream, so a node whose JetStream is
        slow or down still serves them (``healthy`` says when async calls are being taken)."""
        self._tasks = [asyncio.create_task(self._pull(), name=f"{self.node}-intake"),
                       asyncio.create_task(self._keep_alive(), name=f"{self.node}-intake-keepalive")]
        self._unlisten = on_event(self.nc, "reconnected", self._on_reconnected)
        return self

    def _on_reconnected(self) -> None:
        """Back on the broker: the open pull request may have gone with a restarted nats-server
        (no word comes for it then); pull again now rather than at its expiry plus grace."""
        self.pulls_after_reconnect += 1
        self._ended.set()

    async def _bound(self) -> None:
        """Bind, retrying until JetStream takes it (a loaded machine, a leader election, a sweeper...)."""
        delay = 0.2
        while self._sub is None:
            still_wanted()
            try:
                await self._bind()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("%s: async intake not ready (%s); retrying in %g s", self.node, exc, delay)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
        self.healthy = True

    async def _bind(self) -> None:
        stream = async_stream(self.subjects)
        config = consumer_config(self.node, self.subjects, self.ack_wait_s)
        try:
            await self.js.add_consumer(stream, config)
        except NotFoundError as exc:
            if exc.err_code != STREAM_NOT_FOUND:
                raise
            # the stream is gone (`nats stream rm`, a store lost): no async call could be stored: make it
            log.warning("%s: async stream %s is gone (with the calls stored in it); making it again",
                        self.node, stream)
            await ensure_shared_streams(self.js, self.subjects)
            await self.js.add_consumer(stream, config)
        except BadRequestError as exc:  # exists with other settings: the stream keeps the messages
            if exc.err_code != 10148:
                raise
            await self.js.delete_consumer(stream, config.durable_name)
            await self.js.add_consumer(stream, config)
        self._next_subject = pull_subject(self.js, stream, config.durable_name)
        self._inbox = self.nc.new_inbox()
        self._sub = await listen(self.nc, f"{self._inbox}.*", self._on_message)

    async def stop(self) -> None:
        """Stop pulling; what is still held is handed back at once (a restarted node takes it)."""
        self._unlisten()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._forget()
        self.healthy = False

    def hold(self, msg: Msg) -> None:
        if msg.reply not in self.held:
            self.held_bytes += len(msg.data)
        self.held[msg.reply] = msg

    def release(self, msg: Msg) -> None:
        if self.held.pop(msg.reply, None) is not None:
            self.held_bytes -= len(msg.data)
        self._room.set()

    def wake(self) -> None:
        """The budget may have grown (K raised): pull for it now."""
        self._room.set()

    async def _pull(self) -> None:
        await self._bound()
        while True:
            still_wanted()
            room = min(HOLD_LIMIT, self._budget()) - len(self.held)
            room_bytes = self.bytes_limit - self.held_bytes
            if room <= 0 or room_bytes < self.nc.max_payload:   # a pull's next message may be that large
                self._room.clear()
                await self._room.wait()
                continue
            self._asked, self._refusal = min(BATCH, room), ""
            self._ended.clear()
            request = orjson.dumps({"batch": self._asked, "max_bytes": room_bytes, "expires": int(PULL_EXPIRES_S * 1e9)})
            try:
                self._pulls += 1   # each pull its own reply subject: a word about an earlier one is not about it
                self._reply = f"{self._inbox}.{self._pulls}"
                await self.nc.publish(self._next_subject, request, reply=self._reply)
                async with asyncio.timeout(PULL_EXPIRES_S + PULL_GRACE_S):
                    await self._ended.wait()
                if not self._refusal:
                    self.healthy = True
                    continue
                problem = self._refusal
            except asyncio.TimeoutError:
                problem = "no answer to a pull request"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # not connected (reconnecting)
                problem = str(exc)
            if await self._consumer_gone(problem):
                # pulling again would be refused for ever (and sweepers take us for an unknown node)
                log.warning("%s: async intake consumer %s is gone (%s); making it again",
                            self.node, consumer_name(self.node), problem)
                self.healthy = False
                await self._forget()
                await self._bound()
                continue
            # a broker blip (JetStream down, reconnecting, a leader election): retry, say so
            if self.healthy:
                log.warning("%s: async intake cannot pull (%s); retrying", self.node, problem)
            self.healthy = False
            await asyncio.sleep(0.5)

    async def _consumer_gone(self, problem: str) -> bool:
        """Whether a refused pull means our consumer no longer exists: nats-server says so to an open
        pull; no responders is ambiguous (JetStream away too), so JetStream is asked; silence is a blip."""
        if problem.startswith(CONSUMER_DELETED):
            return True
        if not problem.startswith(NO_RESPONDERS):
            return False
        try:
            await self.js.consumer_info(async_stream(self.subjects), consumer_name(self.node),
                                        timeout=LOOKUP_TIMEOUT_S)
        except NotFoundError:   # consumer (or stream) not found: JetStream answered, it is gone
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # JetStream away or busy: the usual retry
            log.debug("%s: intake consumer lookup: %s", self.node, exc)
        return False

    async def _forget(self) -> None:
        """Drop the subscription; what is held stays held (a consumer made again delivers it again and
        the service swaps the delivery it acknowledges)."""
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # the connection may be gone too
                log.debug("intake unsubscribe: %s", exc)

    def _on_message(self, subject: str, reply: str, data: bytes, headers: Mapping[str, str]) -> None:
        """A message of the open pull request, or nats-server's word that it ended."""
        if not data and headers and H.NATS_STATUS in headers:
            if subject != self._reply:   # about an earlier pull (it ended already)
                return
            status = headers[H.NATS_STATUS]
            if status == "100":       # idle heartbeat (not asked for)
                return
            text = next((v for k, v in headers.items() if k == H.NATS_DESCRIPTION), "")
            # the normal ends: 404 no messages, 408 expired, 409 "Batch Completed" (its max_bytes reached)
            if status not in ("404", "408") and not (status == "409" and text.startswith(BATCH_COMPLETED)):
                self._refusal = f"{status} {text}".strip()
            self._ended.set()
            return
        self._asked -= 1
        if self._asked <= 0:
            self._ended.set()
        msg = delivery(self.nc, subject, reply, data, headers)
        try:
            self._take(msg)
        except Exception:  # never let one message stop the intake
            log.exception("%s: async call on %s failed to start", self.node, subject)
            self.release(msg)

    async def _keep_alive(self) -> None:
        """Held messages are not delivered again while their call is queued or running."""
        while True:
            still_wanted()
            await asyncio.sleep(self.ack_wait_s / 3)
            for msg in list(self.held.values()):
                try:
                    await msg.in_progress()
                except Exception as exc:  # connection blip: the next round tries again
                    log.debug("in_progress: %s", exc)
                    break
