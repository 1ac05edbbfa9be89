"""The scheduler service: every call that reaches the node, decided by its algorithm and carried out.

Three doors, one path. Direct calls (``<prefix>.<node>.request...`` with a reply subject)
and peers' forwards (``<prefix>.<node>.forward...``) arrive over core NATS; async calls come
from the durable intake (:mod:`nodes.intake`). Each is validated (:mod:`nodes.scheduler.inbound`),
decided (``decide(algorithm, request, view) -> Decision``: Execute, Forward or Reject) and
carried out: Execute queues it on a pool's :class:`~nodes.dispatch.Dispatcher` (K slots and a
bounded queue, counted exactly), Forward hands it to the :class:`~nodes.forwarding.Forwarder`,
Reject answers at once. Answers go out through :class:`~nodes.answering.Answerer`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from typing import Mapping, Sequence

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
from nodes.config_store import ConfigStore
from nodes.dispatch import Dispatcher
from nodes.forwarding import Forwarder
from nodes.inbox import Inbox
from nodes.intake import HOLD_LIMIT, AsyncIntake
from nodes.unknown_nodes import UnknownNodeSweeper
from nodes.metrics import NodeMetrics
from nodes.peer_source import PeerSource
from nodes.scheduler.algorithms import build_algorithm, decide, forced_algorithm
from nodes.scheduler.base import (
    Decision,
    Execute,
    Forward,
    LocalLoad,
    Reject,
    SchedulingAlgorithm,
    SchedulingRequest,
    complete_now,
)
from nodes.scheduler.forward import run_locally
from nodes.scheduler.inbound import Inbound, Refusal
from nodes.settings import NodeSettings, machine_memory
from nodes.worker import DEFAULT_POOL, STOP_GRACE_S

log = logging.getLogger(__name__)

RECENT = 65_536          # answered async calls remembered, to drop duplicates without a message id
MAX_WAITING = 100_000    # calls a pool keeps in memory whatever the algorithm says (NoScheduler without loss)
ASYNC_AHEAD = 4          # async calls held per slot of the main pool (async_budget)
QUEUE_MEMORY_SHARE = 16  # direct calls waiting in memory hold at most 1/16 of the machine's memory in inputs


class SchedulerService:
    def __init__(self, settings: NodeSettings, nc: Client, registry: FunctionRegistry, store: ConfigStore,
                 metrics: NodeMetrics, answerer: Answerer, inbox: Inbox, pools: dict[str, Dispatcher],
                 peers: PeerSource | None = None) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.nc = nc
        self.subjects = Subjects(settings.prefix)
        self.registry, self.store, self.metrics, self.answerer = registry, store, metrics, answerer
        self.pools = pools
        self.main = pools[DEFAULT_POOL]
        self.pool_of = {fn: name for name, spec in settings.pools.items() for fn in spec.functions}
        self.algorithm: SchedulingAlgorithm = build_algorithm(store.scheduler.name, store.scheduler.parameters)
        self._described: tuple[SchedulingAlgorithm | None, str] = (None, "")
        self.inbound = Inbound(self.subjects, self.node_id, registry, input_limit(nc.max_payload, settings.max_payload_bytes))
        self.forwarder = Forwarder(self.node_id, nc, self.subjects, inbox, answerer, self.run_here, self._count_forward,
                                   peers)
        self.forwarder.on_gone.append(self._sender_gone)
        self.intake = AsyncIntake(self.node_id, nc, self.subjects, ack_wait_s=settings.ack_wait_s,
                                  take=self.take_async, budget=self.async_budget)
        self.sweeper = UnknownNodeSweeper(self.node_id, nc, self.subjects, self._refuse_unknown_node,
                                          alive=(lambda: ()) if settings.edge else self.peers,
                                          unknown_after_s=settings.unknown_node_after_s,
                                          period_s=min(15.0, settings.unknown_node_after_s / 2), here_only=settings.edge)
        self.forwards: dict[str, int] = {}   # forwards per peer since the last heartbeat
        self.learning = None  # the node's LearningContext (nodes/scheduler/learning.py): view.learning
        self.rng = random.Random()
        self._peers = peers
        self._subs: list = []
        self._door_open = False
        self._deciding = Tasks(f"{self.node_id}: a call failed while being decided", log)
        self._carrying = Tasks(f"{self.node_id}: a call failed while being carried out", log)
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._holding: dict[str, Call] = {}    # async calls taken and not yet released, by key
        self._checking: dict[str, Msg] = {}    # async calls whose stored answer is being looked up, by key
        self._started_at = time.time()
        self._stopping_at: float | None = None   # loop time the node began to stop
        self.queue_bytes_max = queue_memory_limit()
        self._last_seq = 0        # highest intake stream sequence taken
        self._doubtful_seq = 0    # intake messages up to this one may have run before an outage

    # -- SchedulingView -----------------------------------------------------------------
    def local_load(self) -> LocalLoad:
        c = self.store.node
        return LocalLoad(self.main.n_running, self.main.n_queued, c.parallel_running_functions_max,
                         c.queue_length_max, c.queue_enabled)

    def peers(self) -> Sequence[str]:
        return self._peers.peers() if self._peers else ()

    def async_budget(self) -> int:
        """How many async calls the node holds at once: enough to fill the main pool's slots and as
        many again waiting for them (what frees a slot finds the next one here, not a pull away).
        The rest of a backlog waits in the stream. A dedicated pool queues its whole backlog (its
        queue is what its controller scales on): the intake cannot tell its calls from the others'
        before pulling them, so on such a node the budget is the intake's whole hold."""
        if len(self.pools) > 1:
            return HOLD_LIMIT
        return ASYNC_AHEAD * max(1, self.main.capacity)

    async def probe(self, peer: str) -> int | None:
        """A peer's load for the algorithm; a probe that fails (None, or an error) is counted
        (``probe_failed``): a peer believed alive that cannot answer shows in the metrics."""
        if not self._peers:
            return None
        try:
            load = await self._peers.probe(peer)
        except Exception as exc:
            log.debug("%s: probe of %s: %r", self.node_id, peer, exc)
            load = None
        if load is None:
            self.metrics.error("probe_failed")
        return load

    def resolve(self, name: str) -> str:
        return self._peers.resolve(name) if self._peers else name

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        await self.forwarder.start()
        self._subs.append(await listen(self.nc, self.subjects.requests_of(self.node_id), self._on_request))
        self._subs.append(await listen(self.nc, self.subjects.forwards_of(self.node_id), self._on_forward))
        self._door_open = True
        await self.intake.start()
        self.sweeper.start()

    async def stop_intake(self) -> None:
        """No new calls: unsubscribe and stop pulling (running calls still finish)."""
        self._stopping_at = asyncio.get_running_loop().time()
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
        self._deciding.cancel()
        await asyncio.gather(*self._deciding, return_exceptions=True)
        if self._carrying:   # forwards being sent, answers being published: brief
            await asyncio.wait(list(self._carrying), timeout=5.0)

    async def stop(self) -> None:
        """After the pools stopped: forwarded calls get what is left of the workers' grace to come
        back; calls still waiting are answered (direct) or handed back (async)."""
        since = asyncio.get_running_loop().time() - (self._stopping_at or asyncio.get_running_loop().time())
        await self.forwarder.stop(grace_s=max(0.0, STOP_GRACE_S - since))
        for pool in self.pools.values():
            for call in pool.drain():
                if call.is_async:
                    await self.answerer.lost(call, f"node {self.node_id} stopped before running it", "node_stopping")
                else:
                    await self.answerer.refused(call, codes.GENERIC, 503, f"node {self.node_id} is stopping", "node_stopping",
                                                retry_after_s=1.0)
        await self.answerer.settle()

    def set_algorithm(self, name: str, parameters: list[str]) -> SchedulingAlgorithm:
        self.algorithm = build_algorithm(name, parameters)  # ValueError leaves the old one in place
        return self.algorithm

    # -- the three doors ----------------------------------------------------------------
    # Direct calls and forwards are taken in the connection's read loop (broker.connection.listen):
    # validated, decided and dispatched without a coroutine when the algorithm decides at once;
    # whatever has to wait (a probe, a forward, an answer to publish) is spawned.
    def _on_request(self, subject: str, reply: str, data: bytes, headers: Mapping[str, str]) -> None:
        if not reply:  # published without a reply (MQTT through a foreign nats-server): make it async
            return self._answer_later(self._to_async(subject, data, headers))
        self._take_direct(subject, reply, data, headers)

    def door(self, subject: str, reply: str, data: bytes, block: bytes) -> bool:
        """The request door for a caller in this very process (the HTTP bridge that ``p2pfaas node
        --http-port`` serves; :meth:`broker.client.FaasClient.open_door`): the message the caller
        would have sent, taken as the subscription takes it, one hop through nats-server fewer.
        False once the node stops taking calls (the caller then goes over NATS: nobody answers,
        503). A call the door fails on is answered 500, never left to its caller's timeout."""
        if not self._door_open:
            return False
        try:
            self._on_request(subject, reply, data, HeaderBlock(block) if block else {})
        except Exception:
            log.exception("%s: a direct call failed at the in-process door", self.node_id)
            self._answer_later(self._refuse_raw(reply, Refusal(codes.GENERIC, 500, "the node failed on this call "
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
            return self._answer_later(self._refuse_raw(reply, inv))
        call = self.inbound.call(inv, data, headers, arrival=now, reply=reply)
        if isinstance(call, Refusal):
            return self._answer_later(self.answerer.refused(self._bare(inv, now, reply=reply), call.code,
                                                            call.http_status, call.reason, call.kind))
        self.schedule(call)

    def take_async(self, msg: Msg) -> None:
        """One message of the durable intake (see :class:`~nodes.intake.AsyncIntake`), taken in
        the read loop; what has to wait (a stored answer looked up, a refusal) is a task."""
        now = time.time()
        info = delivery_info(msg.reply)
        inv = self.inbound.invocation(msg.subject)
        if isinstance(inv, Refusal):
            return self._answer_later(self._refuse_and_ack(msg, inv))
        key = inv.call_key
        self._last_seq = max(self._last_seq, info.stream_seq)
        holding = self._holding.get(key)
        if holding is not None:
            # delivered again while this node still runs it (its keep-alive was lost in a broker
            # outage): the same task, not a second one -- the new delivery is the one to acknowledge
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
            return self._answer_later(self._take_unless_answered(inv, now))
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
            return self._answer_later(self.answerer.refused(self._bare(inv, info.timestamp, held=msg), call.code,
                                                            call.http_status, call.reason, call.kind))
        call.held, call.waited_s, call.deliveries = msg, max(0.0, now - info.timestamp), info.num_delivered
        self._holding[inv.call_key] = call
        if info.num_delivered >= self.settings.max_deliver:
            return self._answer_later(self.answerer.dead_letter(
                call, f"delivered {info.num_delivered} times without an answer: its worker or node failed while "
                      "running it, or the deliveries were lost (a broker outage)"))
        self.schedule(call)

    def _drop_duplicate(self, msg: Msg, key: str) -> None:
        log.info("%s: %s already answered; dropping the duplicate", self.node_id, key)
        try:
            ack_now(msg)
        except Exception as exc:  # the connection is away: it comes again and is dropped again
            log.debug("%s: ack of the duplicate %s: %s", self.node_id, key, exc)

    async def _refuse_and_ack(self, msg: Msg, refusal: Refusal) -> None:
        await self._refuse_raw("", refusal, subject=msg.subject)
        await msg.ack()

    def reconnected(self) -> None:
        """Back on the broker after an outage: intake messages taken so far may come again."""
        self._doubtful_seq = self._last_seq

    def released(self, call: Call, answered: bool) -> None:
        """An async call's message was acknowledged after its answer was stored (``answered``),
        or handed back to be delivered again."""
        assert call.held is not None
        self.intake.release(call.held)
        if self._holding.get(call.key) is call:
            del self._holding[call.key]
        if answered:
            self._recent[call.key] = None
            if len(self._recent) > RECENT:
                self._recent.popitem(last=False)

    # -- deciding -----------------------------------------------------------------------
    def schedule(self, call: Call) -> None:
        """Decide and carry the decision out; an algorithm that has to wait (it probes, or asks the
        learner) decides in a task of its own."""
        request = call.request
        dedicated = self.pool_of.get(call.fn)
        if dedicated is not None and not request.force_reject:
            # a dedicated (autoscaled) pool queues every task: scaling, not admission, keeps its QoS
            call.scheduler = call.scheduler or f"pool {dedicated}"
            return self._execute(call, Execute(), self.pools[dedicated])
        algorithm = self.algorithm
        forced = forced_algorithm(request)
        # X-P2pfaas-Scheduler names the algorithm that decided: the forced one, as P2PFaaS does
        call.scheduler = call.scheduler or (forced.describe() if forced is not None else self._describe(algorithm))
        if algorithm.instant or forced is not None:
            try:
                decision = complete_now(decide(algorithm, request, self))
            except Exception as exc:
                return self._answer_later(self._undecided(call, exc))
            return self.carry_out(call, decision)
        self._spawn(self._decide_and_carry_out(call, algorithm))   # it probes or asks the learner

    def _describe(self, algorithm: SchedulingAlgorithm) -> str:
        """``algorithm.describe()``, computed once per algorithm installed (it is on every call's path)."""
        if self._described[0] is not algorithm:
            self._described = (algorithm, algorithm.describe())
        return self._described[1]

    async def _decide_and_carry_out(self, call: Call, algorithm: SchedulingAlgorithm) -> None:
        try:
            decision = await decide(algorithm, call.request, self)
        except Exception as exc:
            return await self._undecided(call, exc)
        self.carry_out(call, decision)

    async def _undecided(self, call: Call, exc: Exception) -> None:
        """The algorithm raised instead of deciding (a bug in it, a learner's answer it could not
        read): the call is refused now, "cannot schedule" (400, HTTP 500). Left undecided, a direct
        caller waited for its own timeout and an async call was held, kept alive, for ever."""
        log.debug("%s: %s raised deciding %s", self.node_id, call.scheduler, call.key, exc_info=exc)
        call.scheduled_at = time.time()
        await self.answerer.refused(call, codes.CANNOT_SCHEDULE, codes.STATUS[codes.CANNOT_SCHEDULE],
                                    f"scheduler {call.scheduler} failed to decide: {type(exc).__name__}: {exc}",
                                    "scheduler_failed", retry_after_s=1.0)

    def carry_out(self, call: Call, decision: Decision) -> None:
        call.scheduled_at = time.time()
        call.probing_s = decision.probing_s
        if self.learning is not None:  # X-P2pfaas-Scheduler-Learning-* go back with the answer
            call.learning = self.learning.decision_for(call.key, call.request, decision)
        if isinstance(decision, Execute):
            return self._execute(call, decision, self.main)
        if isinstance(decision, Forward):
            self.metrics.request(call.fn, "forwarded")
            return self._answer_later(self.forwarder.forward(call, decision.peer))
        assert isinstance(decision, Reject)
        if call.is_async and decision.code == codes.CANNOT_SCHEDULE:
            # accepted async work is never refused because others came first: it waits for a slot
            # in the pool's async lane (the intake pulled it because there was room for it)
            return self._execute(call, Execute(probing_s=decision.probing_s), self.main)
        # P2PFaaS: 401 deliberately rejected -> HTTP 503; 400 cannot schedule (overload) -> HTTP 500
        self._answer_later(self.answerer.refused(call, decision.code, codes.STATUS.get(decision.code, 500),
                                                 decision.reason, "rejected", retry_after_s=1.0))

    async def run_here(self, call: Call) -> None:
        """A forward found nobody at the peer: run here after all (with loss)."""
        self.carry_out(call, run_locally(self, loss=True, probing_s=call.probing_s))

    async def _sender_gone(self, node: str) -> None:
        """``node`` went away (it died, or stopped after answering its callers itself): the calls it
        forwarded here that still wait in a queue are dropped, not run. Their answers had nowhere to
        go, they held queue places (calls of live callers were refused meanwhile), and an async one,
        delivered again at its origin, ran twice."""
        def from_it(call: Call) -> bool:
            return call.request.external and call.request.peers[-1:] == (node,)

        for pool in self.pools.values():
            for call in pool.drop_queued(from_it):
                self.answerer.count_unrun(call)
                await self.answerer.refused(call, codes.GENERIC, 503, f"not run: node {node}, which forwarded it, "
                                                                      "went away", "sender_gone")

    def _execute(self, call: Call, decision: Execute, pool: Dispatcher) -> None:
        if not call.is_async and (pool.n_queued >= MAX_WAITING
                                  or pool.queued_bytes + len(call.payload) > self.queue_bytes_max):
            # whatever the algorithm and queue_length_max say, what waits in memory is bounded
            return self._answer_later(self.answerer.refused(
                call, codes.CANNOT_SCHEDULE, 500, f"{pool.n_queued} calls ({pool.queued_bytes} bytes of input) "
                                                  f"already wait on pool {pool.pool}", "rejected", retry_after_s=1.0))
        call.scheduled_at = call.scheduled_at or time.time()
        self.metrics.request(call.fn, "scheduled")
        stats = self.answerer.stats_of(pool.pool)
        if stats is not None:
            stats.arrived()
        pool.submit(call)

    # -- helpers ------------------------------------------------------------------------
    def _spawn(self, coro) -> None:
        """A decision that has to wait (it probes, or asks the learner): cancelled at the stop."""
        self._deciding.spawn(coro)

    def _answer_later(self, coro) -> None:
        """What a decision leaves to do that has to wait (a forward, an answer to publish): a task
        that the node's stop waits for, never cancels (it would leave its call unanswered)."""
        self._carrying.spawn(coro)

    def _count_forward(self, peer: str) -> None:
        self.forwards[peer] = self.forwards.get(peer, 0) + 1

    def _bare(self, inv: Invocation, arrival: float, *, reply: str = "", held: Msg | None = None) -> Call:
        """A call that will not run: just enough to answer it."""
        request = SchedulingRequest(fn=inv.fn, client=inv.client, request_id=inv.request_id)
        return Call(inv=inv, payload=b"", request=request, arrival=arrival, timeout_s=0.0, reply=reply, held=held)

    async def _refuse_raw(self, reply: str, refusal: Refusal, *, subject: str = "") -> None:
        """A message whose subject is not a call of ours: answered on its reply subject, or on the
        reject subject of its client when the subject still names one."""
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

    async def _answered(self, inv: Invocation) -> bool:
        js = self.nc.jetstream()
        for subject in (self.subjects.result(inv.client, inv.request_id), self.subjects.reject(inv.client, inv.request_id)):
            try:
                await js.get_last_msg(results_stream(self.subjects), subject)
                return True
            except NotFoundError:
                continue
        return False

    async def _to_async(self, subject: str, data: bytes, headers: Mapping[str, str]) -> None:
        """A call published without a reply subject: stored in the async intake, then answered on
        the client's result subject. (Without our nats-server configuration, MQTT through its own
        listener arrives this way: such a call is as durable as this node is up; docs/architecture.md.)"""
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


def queue_memory_limit() -> int:
    return max(64 * 1024 * 1024, machine_memory() // QUEUE_MEMORY_SHARE)
