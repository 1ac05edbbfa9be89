"""The node's ingress: direct calls and peers' forwards over core NATS, async calls from the durable
intake. Each call is validated once (an async one checked against the calls already taken or
answered: a redelivery is the same call) and handed to ``schedule(call)``; what cannot be a call is
refused here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Callable, Mapping, Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from broker import codes
from broker import headers as H
from broker.answers import error_body, input_limit
from broker.codec import encode
from broker.connection import listen
from broker.fastpath import ack_now, delivery_info
from broker.header_blocks import HeaderBlock
from broker.lifecycle import Tasks
from broker.messages import Rejection
from broker.streams import results_stream
from broker.subjects import Invocation, Subjects
from functions.registry import FunctionRegistry
from nodes.answering import Answerer
from nodes.calls import Call
from nodes.dispatch import Dispatcher
from nodes.intake import HOLD_LIMIT, AsyncIntake
from nodes.metrics import NodeMetrics
from nodes.scheduler.base import SchedulingRequest
from nodes.scheduler.inbound import Inbound, Refusal
from nodes.settings import NodeSettings
from nodes.unknown_nodes import UnknownNodeSweeper
from nodes.worker import DEFAULT_POOL

log = logging.getLogger(__name__)

RECENT = 65_536     # answered async calls remembered, to drop duplicates without a message id
ASYNC_AHEAD = 4     # async calls held per slot of the main pool (async_budget)


class Ingress:
    def __init__(self, settings: NodeSettings, nc: Client, registry: FunctionRegistry, metrics: NodeMetrics,
                 answerer: Answerer, pools: Mapping[str, Dispatcher], schedule: Callable[[Call], None],
                 alive: Callable[[], Sequence[str]] = lambda: ()) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.nc = nc
        self.subjects = Subjects(settings.prefix)
        self.metrics, self.answerer, self.pools = metrics, answerer, pools
        self.schedule = schedule
        self.inbound = Inbound(self.subjects, self.node_id, registry, input_limit(nc.max_payload, settings.max_payload_bytes))
        self.intake = AsyncIntake(self.node_id, nc, self.subjects, ack_wait_s=settings.ack_wait_s,
                                  take=self.take_async, budget=self.async_budget,
                                  hold_bytes=settings.intake_hold_bytes)
        self.sweeper = UnknownNodeSweeper(self.node_id, nc, self.subjects, self._refuse_unknown_node,
                                          alive=(lambda: ()) if settings.edge else alive,
                                          unknown_after_s=settings.unknown_node_after_s,
                                          period_s=min(15.0, settings.unknown_node_after_s / 2), here_only=settings.edge)
        self._subs: list = []
        self._door_open = False
        # refusals and stored-answer lookups: the stop waits for them, never cancels (a caller would go unanswered)
        self._refusing = Tasks(f"{self.node_id}: a call failed while being taken in", log)
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._holding: dict[str, Call] = {}    # async calls taken and not yet released, by key
        self._checking: dict[str, Msg] = {}    # async calls whose stored answer is being looked up, by key
        self._started_at = time.time()
        self._last_seq = 0        # highest intake stream sequence taken
        self._doubtful_seq = 0    # intake messages up to this one may have run before an outage

    def async_budget(self) -> int:
        """Async calls the node holds at once: the main pool's slots twice over (the rest waits in the
        stream); with a dedicated pool, whose queue its controller scales on, the intake's whole hold."""
        if len(self.pools) > 1:
            return HOLD_LIMIT
        return ASYNC_AHEAD * max(1, self.pools[DEFAULT_POOL].capacity)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._subs.append(await listen(self.nc, self.subjects.requests_of(self.node_id), self._on_request))
        self._subs.append(await listen(self.nc, self.subjects.forwards_of(self.node_id), self._on_forward))
        self._door_open = True
        await self.intake.start()
        self.sweeper.start()

    async def stop(self) -> None:
        """No new calls: unsubscribe and stop pulling (calls already taken still run)."""
        self._door_open = False   # before the subscriptions go: a call in between goes over NATS
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # the connection may already be gone at shutdown
                log.debug("unsubscribe: %s", exc)
        self._subs.clear()
        try:   # the broker has the unsubscriptions: a caller from now on hears "no responders" at once
            async with asyncio.timeout(1.0):
                await self.nc.flush()
        except Exception as exc:  # the connection is going: nothing reaches us anyway
            log.debug("flush after unsubscribing: %r", exc)
        await self.sweeper.stop()
        await self.intake.stop()
        if self._refusing:
            await asyncio.wait(list(self._refusing), timeout=5.0)

    def reconnected(self) -> None:
        """Back on the broker after an outage: intake messages taken so far may come again."""
        self._doubtful_seq = self._last_seq

    def released(self, call: Call, answered: bool) -> None:
        """An async call's message was acknowledged (``answered``) or handed back to be delivered again."""
        assert call.held is not None
        self.intake.release(call.held)
        if self._holding.get(call.key) is call:
            del self._holding[call.key]
        if answered:
            self._recent[call.key] = None
            if len(self._recent) > RECENT:
                self._recent.popitem(last=False)

    # -- the three doors ----------------------------------------------------------------
    # Direct calls and forwards are taken in the connection's read loop; whatever has to wait is a task.
    def _on_request(self, subject: str, reply: str, data: bytes, headers: Mapping[str, str]) -> None:
        if not reply:  # published without a reply (MQTT through a foreign nats-server): make it async
            return self._later(self._to_async(subject, data, headers))
        self._take_direct(subject, reply, data, headers)

    def door(self, subject: str, reply: str, data: bytes, block: bytes) -> bool:
        """The request door for a caller in this process (:meth:`broker.client.FaasClient.open_door`),
        one hop fewer. False once the node stops taking calls; a call it fails on is answered 500."""
        if not self._door_open:
            return False
        try:
            self._on_request(subject, reply, data, HeaderBlock(block) if block else {})
        except Exception:
            log.exception("%s: a direct call failed at the in-process door", self.node_id)
            self._later(self._refuse_raw(reply, Refusal(codes.GENERIC, 500, "the node failed on this call "
                                                        "(its log says why)", "internal"), subject=subject))
        return True

    def _on_forward(self, subject: str, reply: str, data: bytes, headers: Mapping[str, str]) -> None:
        if not reply:
            self.metrics.error("malformed_subject")
            log.warning("%s: forward on %s without a reply subject ignored", self.node_id, subject)
            return
        self._take_direct(subject, reply, data, headers)

    def _take_direct(self, subject: str, reply: str, data: bytes, headers: Mapping[str, str]) -> None:
        now = time.time()
        inv = self.inbound.invocation(subject)
        if isinstance(inv, Refusal):
            return self._later(self._refuse_raw(reply, inv))
        call = self.inbound.call(inv, data, headers, arrival=now, reply=reply)
        if isinstance(call, Refusal):
            return self._later(self.answerer.refused(self._bare(inv, now, reply=reply), call.code,
                                                     call.http_status, call.reason, call.kind))
        self.schedule(call)

    def take_async(self, msg: Msg) -> None:
        """One message of the durable intake, taken in the read loop; what has to wait is a task."""
        now = time.time()
        info = delivery_info(msg.reply)
        inv = self.inbound.invocation(msg.subject)
        if isinstance(inv, Refusal):
            return self._later(self._refuse_and_ack(msg, inv))
        key = inv.call_key
        self._last_seq = max(self._last_seq, info.stream_seq)
        holding = self._holding.get(key)
        if holding is not None:
            # delivered again while we still run it (keep-alive lost in an outage): acknowledge the new one
            if holding.held is not None and holding.held.reply != msg.reply:
                self.intake.release(holding.held)
                self.intake.hold(msg)
                holding.held = msg
            return
        if key in self._checking:   # its answer is being looked up: the later delivery is the one kept
            self._checking[key] = msg
            return
        if key in self._recent:
            return self._drop_duplicate(msg, key)
        # a redelivery says so (num_delivered), except after nats-server lost its consumer state
        # in a crash: then anything stored before our start or taken before the outage may have run
        if info.num_delivered > 1 or info.timestamp < self._started_at or info.stream_seq <= self._doubtful_seq:
            self._checking[key] = msg
            return self._later(self._take_unless_answered(inv, now))
        self._admit(msg, inv, now)

    async def _take_unless_answered(self, inv: Invocation, now: float) -> None:
        try:
            answered = await self._answered(inv)
        finally:
            msg = self._checking.pop(inv.call_key)
        if answered:
            return self._drop_duplicate(msg, inv.call_key)
        self._admit(msg, inv, now)

    def _admit(self, msg: Msg, inv: Invocation, now: float) -> None:
        info = delivery_info(msg.reply)
        self.intake.hold(msg)
        call = self.inbound.call(inv, msg.data, msg.headers, arrival=info.timestamp)
        if isinstance(call, Refusal):
            return self._later(self.answerer.refused(self._bare(inv, info.timestamp, held=msg), call.code,
                                                     call.http_status, call.reason, call.kind))
        call.held, call.waited_s, call.deliveries = msg, max(0.0, now - info.timestamp), info.num_delivered
        call.released = self.released
        self._holding[inv.call_key] = call
        if info.num_delivered >= self.settings.max_deliver:
            return self._later(self.answerer.dead_letter(
                call, f"delivered {info.num_delivered} times without an answer: its worker or node failed while "
                      "running it, or the deliveries were lost (a broker outage)"))
        self.schedule(call)

    def _drop_duplicate(self, msg: Msg, key: str) -> None:
        log.info("%s: %s already answered; dropping the duplicate", self.node_id, key)
        try:
            ack_now(msg)
        except Exception as exc:  # the connection is away: it comes again and is dropped again
            log.debug("%s: ack of the duplicate %s: %s", self.node_id, key, exc)

    async def _answered(self, inv: Invocation) -> bool:
        js = self.nc.jetstream()
        for subject in (self.subjects.result(inv.client, inv.request_id), self.subjects.reject(inv.client, inv.request_id)):
            try:
                await js.get_last_msg(results_stream(self.subjects), subject)
                return True
            except NotFoundError:
                continue
        return False

    # -- refusals -----------------------------------------------------------------------
    def _later(self, coro) -> None:
        self._refusing.spawn(coro)

    def _bare(self, inv: Invocation, arrival: float, *, reply: str = "", held: Msg | None = None) -> Call:
        """A call that will not run: just enough to answer it."""
        request = SchedulingRequest(fn=inv.fn, client=inv.client, request_id=inv.request_id)
        return Call(inv=inv, payload=b"", request=request, arrival=arrival, timeout_s=0.0, reply=reply, held=held,
                    released=self.released if held is not None else None)

    async def _refuse_and_ack(self, msg: Msg, refusal: Refusal) -> None:
        await self._refuse_raw("", refusal, subject=msg.subject)
        await msg.ack()

    async def _refuse_raw(self, reply: str, refusal: Refusal, *, subject: str = "") -> None:
        """A message whose subject is not a call of ours: refused on its reply or its client's reject subject."""
        self.metrics.error(refusal.kind)
        log.warning("%s: refused %s: %s", self.node_id, subject or "a request", refusal.reason)
        if reply:
            await self.nc.publish(reply, error_body(refusal.code, refusal.reason), headers={H.STATUS: str(refusal.http_status)})
            return
        ids = self.subjects.salvage_reply_to(subject)
        client, req = ids if ids else ("invalid", "invalid")
        rejection = Rejection(request_id=req, client=client, fn="?", code=refusal.code, http_status=refusal.http_status,
                              reason=refusal.reason, node=self.node_id)
        target = self.subjects.reject(client, req) if ids else self.subjects.invalid()
        try:
            await self.nc.jetstream().publish(target, encode(rejection), stream=results_stream(self.subjects), timeout=5.0)
        except Exception as exc:
            log.warning("%s: rejection of %s not stored: %s", self.node_id, subject, exc)

    async def _refuse_unknown_node(self, msg: Msg, reason: str) -> None:
        await self._refuse_raw("", Refusal(codes.NOT_FOUND, 404, reason, "unknown_node"), subject=msg.subject)

    async def _to_async(self, subject: str, data: bytes, headers: Mapping[str, str]) -> None:
        """A call published without a reply subject (e.g. MQTT through a foreign nats-server): stored in
        the async intake, then answered on the client's result subject."""
        inv = self.inbound.invocation(subject)
        if isinstance(inv, Refusal):
            return await self._refuse_raw("", inv, subject=subject)
        headers = dict(headers)
        headers.setdefault(H.MSG_ID, inv.call_key)
        try:
            await self.nc.jetstream().publish(self.subjects.async_request(inv.node, inv.fn, inv.client, inv.request_id),
                                              data, headers=headers, timeout=5.0)
        except Exception as exc:   # the intake is full or away: the client is told (its reject subject)
            await self._refuse_raw("", Refusal(codes.GENERIC, 503, f"{inv.fn}: not stored, try again later "
                                                                  f"({type(exc).__name__}: {exc})", "not_stored"),
                                   subject=subject)
