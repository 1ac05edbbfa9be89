"""One pool's slots: which worker runs which call, and the calls waiting for a worker. The node
dispatches every call itself and sees every answer, so running and queued counts are exact. Calls
dispatched to a worker in one loop turn leave as one ``WorkerCalls`` message; the worker answers a
turn's outcomes as one ``WorkerOutcomes``."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from nats.aio.client import Client

from broker import headers as H
from broker.answers import HEADER_ROOM
from broker.codec import frame, split_by_size, unframe
from broker.errors import ContractError
from broker.lifecycle import OnItsLoop, Tasks
from broker.messages import WorkerOutcome, WorkerOutcomes
from broker.subjects import Subjects
from functions.registry import FunctionRegistry
from nodes.calls import Call, calls_document
from nodes.forwarding import due_notices, send_notices
from nodes.inbox import Inbox, Reply
from nodes.settings import Timings
from nodes.waiting import RecentTimes, WaitingLines
from nodes.worker_checks import STATUS_TRIES, WorkerChecks, by_worker

log = logging.getLogger(__name__)

OVERRUN_GRACE_S = 2.0   # past its timeout plus this, a silent worker is taken for stuck
OVERRUN_SWEEP_S = 0.5   # how often running calls are checked for that (one timer per pool, not per call)

class Answers(Protocol):
    """Where calls go once they leave the dispatcher (nodes/answering.py's Answerer)."""

    def ended(self, call: Call, outcome: WorkerOutcome, output: bytes) -> None: ...

    async def lost(self, call: Call, reason: str) -> None: ...

    async def unrun(self, calls: list[Call], expected_s: dict[str, float]) -> None: ...

    def direct_context(self, call: Call) -> dict | None: ...


@dataclass(eq=False, slots=True)
class WorkerSlot:
    name: str
    subject: str
    running: int = 0
    limit: int = 1            # calls it may run at once, given the ones it runs (1: exclusive)
    stopping: bool = False
    outbox: list[Call] = field(default_factory=list)   # dispatched this turn, sent at its end


class Dispatcher(OnItsLoop):
    def __init__(self, pool: str, nc: Client, subjects: Subjects, node: str, registry: FunctionRegistry,
                 inbox: Inbox, answers: Answers, *, slots: int | None = None,
                 kill_worker: Callable[[str], None] = lambda name: None,
                 unreachable: Callable[[str], None] | None = None, wake: Callable[[], None] | None = None,
                 timings: Timings = Timings()) -> None:
        """``answers`` takes every call that leaves. ``unreachable(worker)``: nobody listened on its
        subject (default: it gets no more calls); ``wake()``: a call came to a pool scaled to zero."""
        self.pool, self.nc, self.subjects, self.node = pool, nc, subjects, node
        self.registry, self.inbox, self.answers = registry, inbox, answers
        self._kill_worker = kill_worker
        self._unreachable = unreachable or self.retire_worker
        self._wake = wake
        self.ready_at = 0.0                       # unix time a worker last came to a pool that had none
        self.idle_since = time.monotonic()        # nothing has run or waited since
        self.slots = slots                      # None: one per worker (dedicated pool)
        self.workers: dict[str, WorkerSlot] = {}
        self.waiting = WaitingLines(async_lane=slots is not None)
        self.times = RecentTimes()
        self.checks = WorkerChecks(pool, node, subjects, inbox, timings.worker_check_after_s)
        self.notice_every_s = timings.forward_notice_every_s
        self.running: dict[int, Call] = {}
        self._tokens: dict[int, str] = {}                   # call id -> its batch's reply token
        self._batches: dict[str, dict[int, Call]] = {}      # reply token -> its calls still running
        self._sweep: asyncio.TimerHandle | None = None     # armed while calls run or wait
        self._sending = Tasks(pool, log)

    # -- counts -----------------------------------------------------------------------
    @property
    def n_running(self) -> int:
        return len(self.running)

    @property
    def n_queued(self) -> int:
        """Calls in the queue that admission bounds (queue_length_max)."""
        return len(self.waiting.queue)

    @property
    def n_waiting(self) -> int:
        """Every call waiting for a slot: the queue and the async lane."""
        return len(self.waiting)

    @property
    def queued_bytes(self) -> int:
        return self.waiting.queued_bytes

    @property
    def capacity(self) -> int:
        if self.slots is not None:
            return self.slots
        return sum(1 for w in self.workers.values() if not w.stopping)

    def keys(self) -> tuple[set[str], set[str]]:
        """(running, running or queued) call keys (the LearningScheduler's per-type counts)."""
        running = {c.key for c in self.running.values()}
        return running, running | self.waiting.keys()

    # -- workers ----------------------------------------------------------------------
    async def add_worker(self, name: str) -> None:
        if not self.capacity:
            self.ready_at = time.time()
        self.workers[name] = WorkerSlot(name, self.subjects.worker(self.node, name))
        self._pump()

    def idle_for(self) -> float:
        """Seconds since a call last ran or waited here (0 while one does)."""
        if self.running or self.waiting:
            return 0.0
        return time.monotonic() - self.idle_since

    def retire_worker(self, name: str) -> None:
        """A worker is stopping: it finishes its calls and gets no new ones."""
        slot = self.workers.get(name)
        if slot is not None:
            slot.stopping = True

    async def lose_worker(self, name: str, reason: str) -> None:
        """A worker ended: the calls it still ran get no answer from it."""
        slot = self.workers.pop(name, None)
        if slot is None:
            return
        for call in [c for c in self.running.values() if c.worker == name]:
            self._end(call)
            await self.answers.lost(call, reason)
        self._pump()

    async def set_slots(self, slots: int | None) -> None:
        self.slots = slots
        self._pump()

    # -- calls ------------------------------------------------------------------------
    def submit(self, call: Call) -> None:
        call.pool = self.pool
        call.queued = bool(self.waiting) or len(self.running) >= self.capacity
        if self._wake is not None and not self.capacity:   # it waits for a cold start
            call.cold_from = time.time()
            self._wake()
        self.waiting.enter(call)
        self._pump()

    def _pump(self) -> None:
        """Dispatch waiting calls FIFO while slots and workers allow, skipping those too late to run."""
        now, gone, waiting = 0.0, [], self.waiting
        while len(self.running) < self.capacity and (line := waiting.next_line()) is not None:
            head = line[0]
            if head.wanted_until and self.times.too_late(head, now := now or time.time()):
                gone.append(waiting.take(line))
                continue
            concurrency = self._concurrency(head.fn)
            slot = self._pick(concurrency)
            if slot is None:
                break
            self._dispatch(waiting.take(line), slot, concurrency)
        if gone:
            self._spawn(self._answer_abandoned(gone))
        if waiting.queue and self._sweep is None:   # calls wait: the peers that forwarded them hear from us
            self._sweep = self.loop.call_later(OVERRUN_SWEEP_S, self._sweep_overruns)

    def _concurrency(self, fn: str) -> int:
        """Calls of ``fn`` one worker may run at once (always 1 in a dedicated pool: a worker is a slot)."""
        spec = self.registry.get(fn)
        return spec.concurrency if spec is not None and self.slots is not None else 1

    def _pick(self, concurrency: int) -> WorkerSlot | None:
        """An idle worker for a CPU-bound call; a concurrent call goes to the busiest worker with room,
        to an idle one only when none has, so the most workers stay idle for CPU-bound calls."""
        idle: WorkerSlot | None = None
        best: WorkerSlot | None = None
        for slot in self.workers.values():
            if slot.stopping:
                continue
            if slot.running == 0:
                if concurrency == 1:
                    return slot
                idle = idle or slot
            elif concurrency > 1 and slot.running < slot.limit and (best is None or slot.running > best.running):
                best = slot
        return best or idle

    def _dispatch(self, call: Call, slot: WorkerSlot, concurrency: int) -> None:
        slot.limit = concurrency if slot.running == 0 else min(slot.limit, concurrency)
        slot.running += 1
        call.worker, call.dispatched_at = slot.name, time.time()
        if call.cold_from:
            call.cold_start_s = max(0.0, self.ready_at - call.cold_from)
        self.running[call.id] = call
        loop = self.loop
        if self._sweep is None:
            self._sweep = loop.call_later(OVERRUN_SWEEP_S, self._sweep_overruns)
        if not slot.outbox:
            loop.call_soon(self._send_batch, slot)
        slot.outbox.append(call)

    def _send_batch(self, slot: WorkerSlot) -> None:
        """End of the turn: the calls dispatched to ``slot`` leave in as few messages as their inputs fit."""
        calls = [c for c in slot.outbox if self.running.get(c.id) is c]   # not ended meanwhile
        slot.outbox = []
        if not calls:
            return
        batch = {c.id: c for c in calls}

        def on_reply(msg: Reply) -> None:
            self._on_outcomes(token, batch, msg)

        token, reply = self.inbox.expect(on_reply, standing=True)
        self._batches[token] = batch
        for c in calls:
            self._tokens[c.id] = token
        # as many messages as the payloads need (large inputs dispatched together), one reply subject
        for run in split_by_size(calls, [len(c.payload) for c in calls], self.nc.max_payload - HEADER_ROOM):
            data = frame(calls_document(run, self.answers.direct_context), b"".join(c.payload for c in run))
            try:
                self.nc.send(slot.subject, data, reply=reply)
            except Exception as exc:  # the connection is gone (or the message too large): they cannot reach it
                self._spawn(self._unsent(slot, run, exc))
        notices = due_notices(calls, time.time(), self.notice_every_s)
        if notices:
            self._spawn(send_notices(self.nc, notices))

    async def _unsent(self, slot: WorkerSlot, calls: list[Call], exc: Exception) -> None:
        for call in calls:
            if self.running.get(call.id) is call:
                self._end(call)
                await self.answers.lost(call, f"could not reach worker {slot.name}: {exc}")

    def _on_outcomes(self, token: str, batch: dict[int, Call], msg: Reply) -> None:
        if not msg.data and (msg.headers or {}).get(H.NATS_STATUS) == "503":
            # nobody listens on that worker's subject: the calls never ran there and go to another
            waiting = [c for c in batch.values() if self.running.get(c.id) is c]
            for call in waiting:
                self._end(call)
            for worker in {c.worker for c in waiting}:
                self._unreachable(worker)
            for call in reversed(waiting):   # back at the head of their lines, in their order
                self.waiting.put(call, first=True)
            return self._pump()
        try:
            answer, outputs = unframe(WorkerOutcomes, msg.data)
        except ContractError as exc:
            answer, outputs = WorkerOutcomes(error=f"unreadable worker answer: {exc}"), b""
        ended: list[tuple[Call, WorkerOutcome, bytes]] = []
        if answer.error is not None:   # the whole batch failed
            ended = [(c, WorkerOutcome(id=c.id, status=500, error=answer.error), b"")
                     for c in batch.values() if self.running.get(c.id) is c]
        offset = 0
        for outcome in answer.outcomes:
            output, offset = outputs[offset:offset + outcome.size], offset + outcome.size
            call = batch.get(outcome.id)
            if call is not None and self.running.get(call.id) is call:
                ended.append((call, outcome, output))
        for call, outcome, _ in ended:
            self._end(call)
            if outcome.retiring:
                self.retire_worker(call.worker)
            if outcome.status == 200:
                self.times.executed(call.fn, outcome.execution_s)
        self._pump()
        for call, outcome, output in ended:
            self.answers.ended(call, outcome, output)

    # -- after a broker outage ----------------------------------------------------------
    async def reconcile(self, before: float) -> None:
        """After a broker outage: each worker is asked which calls dispatched before ``before`` it still
        runs (it resends outcomes first); those it neither runs nor finished are lost, not left to time out."""
        calls = by_worker(c for c in self.running.values() if c.dispatched_at <= before)
        await asyncio.gather(*(self._reconcile_worker(worker, calls) for worker, calls in calls.items()))

    def _check_long_calls(self, now: float) -> None:
        """Check calls running long with their workers; a silent one is left alone (a function may hold its loop)."""
        for worker, calls in self.checks.long_calls(self.running.values(), now).items():
            self._spawn(self.checks.while_checking(worker, self._reconcile_worker(worker, calls, replace_silent=False)))

    async def _reconcile_worker(self, worker: str, calls: list[Call], *, replace_silent: bool = True) -> None:
        status = await self.checks.status(worker, [c.id for c in calls], STATUS_TRIES if replace_silent else 1,
                                          alive=lambda: worker in self.workers)
        if status is None:
            if replace_silent and worker in self.workers:
                log.warning("%s: worker %s does not answer after the broker outage; replacing it", self.pool, worker)
                self._kill_worker(worker)   # the pool replaces it; lose_worker answers its calls
            return
        still = set(status.running)
        lost = [c for c in calls if self.running.get(c.id) is c and c.id not in still]
        if not lost:
            return
        log.warning("%s: %d call(s) of worker %s were lost with the broker connection", self.pool, len(lost), worker)
        for call in lost:
            self._end(call)
            await self.answers.lost(call, "the call or its outcome was lost with the broker connection")
        self._pump()

    def _sweep_overruns(self) -> None:
        """Every OVERRUN_SWEEP_S while calls run or wait: overruns, long calls, abandoned queued calls, notices."""
        self._sweep = None
        now = time.time()
        for call in [c for c in self.running.values() if now > c.dispatched_at + c.timeout_s + OVERRUN_GRACE_S]:
            self._overrun(call)
        self._check_long_calls(now)
        def abandoned(call: Call) -> bool:
            return call.wanted_until > 0 and self.times.too_late(call, now)
        queue = self.waiting.queue
        if any(map(abandoned, queue)):   # they hold queue places live callers need
            self._spawn(self._answer_abandoned(self.drop_queued(abandoned)))
        notices = due_notices([*queue, *self.running.values()], now, self.notice_every_s)
        if notices:
            self._spawn(send_notices(self.nc, notices))
        if self.running or queue:
            self._sweep = self.loop.call_later(OVERRUN_SWEEP_S, self._sweep_overruns)

    def _overrun(self, call: Call) -> None:
        """No answer past the timeout and grace: kill the worker (the pool replaces it), answer 504."""
        if self.running.get(call.id) is not call:
            return
        log.warning("%s: worker %s did not answer %s within its timeout; killing it", self.pool, call.worker, call.key)
        self._end(call)
        self._kill_worker(call.worker)
        outcome = WorkerOutcome(status=504, error=f"{call.fn} exceeded its timeout of {call.timeout_s:g} s "
                                                  f"(worker {call.worker} did not answer)")
        self.answers.ended(call, outcome, b"")

    def _end(self, call: Call) -> None:
        self.running.pop(call.id, None)
        token = self._tokens.pop(call.id, None)
        batch = self._batches.get(token) if token is not None else None
        if batch is not None:
            batch.pop(call.id, None)
            if not batch:   # the batch's last call: its reply subject is done
                del self._batches[token]
                self.inbox.forget(token)
        slot = self.workers.get(call.worker)
        if slot is not None:
            slot.running = max(0, slot.running - 1)
            if slot.running == 0:
                slot.limit = 1
        if not self.running and not self.waiting:
            self.idle_since = time.monotonic()

    async def _answer_abandoned(self, calls: list[Call]) -> None:
        """Queued direct calls taken out unrun: run, they would hold slots live callers need (under
        overload a FIFO queue settles where every call ends just after its caller gives up)."""
        try:
            await self.answers.unrun(calls, self.times.expected_s)
        except Exception as exc:  # never in the way of the calls that just ended (their answers come next)
            log.error("%s: answering %d call(s) not run: %r", self.pool, len(calls), exc)

    def _spawn(self, coro) -> None:
        self._sending.spawn(coro)

    def drop_queued(self, unwanted: Callable[[Call], bool]) -> list[Call]:
        return self.waiting.drop_queued(unwanted)

    def drain(self) -> list[Call]:
        """Every call still waiting or running (the node is stopping)."""
        calls = [*self.waiting.drain(), *self.running.values()]
        for call in list(self.running.values()):
            self._end(call)
        return calls
