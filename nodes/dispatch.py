"""One pool's slots: which worker runs which call, and the calls waiting for a worker.

The node dispatches every call itself (core NATS request to the worker's own subject) and
sees every answer, so running and queued counts are exact — P2PFaaS's own semantics. The
main pool has K slots (``slots``); a dedicated (autoscaled) pool has one slot per worker.
A CPU-bound call takes a whole idle worker; a concurrent one (I/O-bound, async, inline)
shares a worker with others of its kind, up to the function's concurrency.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker import headers as H
from broker.codec import frame, unframe
from broker.errors import ContractError
from broker.messages import WorkerCall, WorkerOutcome
from broker.subjects import Subjects
from functions.registry import FunctionRegistry
from nodes.calls import Call
from nodes.inbox import Inbox

log = logging.getLogger(__name__)

OVERRUN_GRACE_S = 2.0   # past its timeout plus this, a silent worker is taken for stuck

Done = Callable[[Call, WorkerOutcome, bytes], Awaitable[None]]
Lost = Callable[[Call, str], Awaitable[None]]


@dataclass(eq=False, slots=True)
class WorkerSlot:
    name: str
    subject: str
    running: int = 0
    limit: int = 1            # calls it may run at once, given the ones it runs (1: exclusive)
    stopping: bool = False


class Dispatcher:
    def __init__(self, pool: str, nc: Client, subjects: Subjects, node: str, registry: FunctionRegistry,
                 inbox: Inbox, done: Done, lost: Lost, *, slots: int | None = None,
                 kill_worker: Callable[[str], None] = lambda name: None) -> None:
        self.pool, self.nc, self.subjects, self.node = pool, nc, subjects, node
        self.registry, self.inbox = registry, inbox
        self._done, self._lost, self._kill_worker = done, lost, kill_worker
        self.slots = slots                      # None: one per worker (dedicated pool)
        self.workers: dict[str, WorkerSlot] = {}
        self.queue: deque[Call] = deque()
        self.running: dict[int, Call] = {}
        self._tokens: dict[int, str] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    # -- counts -----------------------------------------------------------------------
    @property
    def n_running(self) -> int:
        return len(self.running)

    @property
    def n_queued(self) -> int:
        return len(self.queue)

    @property
    def capacity(self) -> int:
        if self.slots is not None:
            return self.slots
        return sum(1 for w in self.workers.values() if not w.stopping)

    def keys(self) -> tuple[set[str], set[str]]:
        """(running, running or queued) call keys (the LearningScheduler's per-type counts)."""
        running = {c.key for c in self.running.values()}
        return running, running | {c.key for c in self.queue}

    # -- workers ----------------------------------------------------------------------
    async def add_worker(self, name: str) -> None:
        """A worker is ready for calls."""
        self.workers[name] = WorkerSlot(name, self.subjects.worker(self.node, name))
        await self._pump()

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
            await self._lost(call, reason)
        await self._pump()

    async def set_slots(self, slots: int | None) -> None:
        self.slots = slots
        await self._pump()

    # -- calls ------------------------------------------------------------------------
    async def submit(self, call: Call) -> None:
        call.pool = self.pool
        self.queue.append(call)
        await self._pump()

    async def _pump(self) -> None:
        """Dispatch queued calls, first come first served, while slots and workers allow."""
        while self.queue and len(self.running) < self.capacity:
            concurrency = self._concurrency(self.queue[0].fn)
            slot = self._pick(concurrency)
            if slot is None:
                return
            await self._dispatch(self.queue.popleft(), slot, concurrency)

    def _concurrency(self, fn: str) -> int:
        """Calls of ``fn`` one worker may run at once (always 1 in a dedicated pool: a worker is a slot)."""
        spec = self.registry.get(fn)
        return spec.concurrency if spec is not None and self.slots is not None else 1

    def _pick(self, concurrency: int) -> WorkerSlot | None:
        """An idle worker for a CPU-bound call; for a concurrent one, the least busy worker that
        runs only concurrent calls and has room."""
        best: WorkerSlot | None = None
        for slot in self.workers.values():
            if slot.stopping:
                continue
            if slot.running == 0:
                return slot
            if concurrency > 1 and slot.running < slot.limit and (best is None or slot.running < best.running):
                best = slot
        return best

    async def _dispatch(self, call: Call, slot: WorkerSlot, concurrency: int) -> None:
        slot.limit = concurrency if slot.running == 0 else min(slot.limit, concurrency)
        slot.running += 1
        call.worker, call.dispatched_at = slot.name, time.time()
        self.running[call.id] = call
        timeout_s = call.timeout_s

        async def on_reply(msg: Msg) -> None:
            await self._on_outcome(call, msg)

        token, reply = self.inbox.expect(on_reply)
        self._tokens[call.id] = token
        self._timers[call.id] = asyncio.get_running_loop().call_later(
            timeout_s + OVERRUN_GRACE_S, self._overrun, call)
        try:
            await self.nc.publish(slot.subject, frame(WorkerCall(fn=call.fn, timeout_s=timeout_s), call.payload),
                                  reply=reply)
        except Exception as exc:  # the connection is gone: the call cannot reach its worker
            self._end(call)
            await self._lost(call, f"could not reach worker {slot.name}: {exc}")

    async def _on_outcome(self, call: Call, msg: Msg) -> None:
        if self.running.get(call.id) is not call:
            return
        self._end(call)
        if not msg.data and (msg.headers or {}).get(H.NATS_STATUS) == "503":
            # nobody listens on that worker's subject (it is exiting): the call never ran there
            self.retire_worker(call.worker)
            self.queue.appendleft(call)
            return await self._pump()
        try:
            outcome, output = unframe(WorkerOutcome, msg.data)
        except ContractError as exc:
            outcome, output = WorkerOutcome(status=500, error=f"unreadable worker answer: {exc}"), b""
        if outcome.retiring:
            self.retire_worker(call.worker)
        await self._pump()
        await self._done(call, outcome, output)

    def _overrun(self, call: Call) -> None:
        """No answer past the timeout and its grace: the worker is stuck (or its answer lost);
        it is killed (the pool replaces it) and the call answered 504."""
        if self.running.get(call.id) is not call:
            return
        log.warning("%s: worker %s did not answer %s within its timeout; killing it", self.pool, call.worker, call.key)
        self._end(call)
        self._kill_worker(call.worker)
        outcome = WorkerOutcome(status=504, error=f"{call.fn} exceeded its timeout of {call.timeout_s:g} s "
                                                  f"(worker {call.worker} did not answer)")
        task = asyncio.get_running_loop().create_task(self._done(call, outcome, b""))
        task.add_done_callback(lambda t: t.exception() and log.error("answering %s: %r", call.key, t.exception()))

    def _end(self, call: Call) -> None:
        self.running.pop(call.id, None)
        token = self._tokens.pop(call.id, None)
        if token is not None:
            self.inbox.forget(token)
        timer = self._timers.pop(call.id, None)
        if timer is not None:
            timer.cancel()
        slot = self.workers.get(call.worker)
        if slot is not None:
            slot.running = max(0, slot.running - 1)
            if slot.running == 0:
                slot.limit = 1

    def drain(self) -> list[Call]:
        """Every call still queued or running (the node is stopping)."""
        calls = [*self.queue, *self.running.values()]
        self.queue.clear()
        for call in list(self.running.values()):
            self._end(call)
        return calls
