"""Closed-loop rewards of the LearningScheduler: when a decided request's answer appears, the node
publishes reward 1 if it was served within its deadline, else 0, on ``faas.<node>.reward``
(docs/learning.md)."""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from nats.aio.client import Client

from broker import headers as H
from broker.codec import encode
from broker.messages import LearningDecision, SchedulingExperience
from broker.subjects import Subjects
from broker.lifecycle import still_wanted

__all__ = ["PendingDecision", "RewardStats", "RewardTracker", "reward_of"]

log = logging.getLogger(__name__)

PUBLISH_BATCH = 64


def reward_of(status: int, total_s: float, deadline_s: float) -> float:
    """1 for an answer with status 200 whose total time (arrival to answer) met the deadline, else 0."""
    return 1.0 if status == 200 and total_s <= deadline_s else 0.0


@dataclass(slots=True)
class PendingDecision:
    decision: LearningDecision
    deadline_s: float
    expires_at: float   # tracker clock: past this, the answer cannot meet the deadline any more


@dataclass(slots=True)
class RewardStats:
    tracked: int = 0
    published: int = 0
    met: int = 0            # rewards of 1
    timed_out: int = 0      # no answer within deadline + grace: reward 0
    evicted: int = 0        # pushed out by max_pending: reward 0
    failed: int = 0         # could not be stored on the reward stream (logged)


class RewardTracker:
    """Decisions waiting for their answer, keyed by ``<client>.<req>``.

    * the node offers every answer it gives or relays (:meth:`observe`);
    * no answer within ``deadline + grace_s``: reward 0, a later answer is ignored;
    * at most ``max_pending`` decisions wait; beyond that the oldest gets reward 0;
    * rewards are published **in EID order**, in the background: the learner pairs EID n with n + 1,
      and a late reward arriving after its successor was trained would be lost (a bias to slow actions).
    """

    def __init__(self, nc: Client, node: str, *, prefix: str = "faas", grace_s: float = 1.0,
                 max_pending: int = 10_000, sweep_period_s: float = 0.25,
                 clock: Callable[[], float] = time.monotonic, publish: bool = True) -> None:
        """``publish`` False: decisions are tracked but the clients post the rewards (``node_rewards``)."""
        self.nc, self.node, self.publishing = nc, node, publish
        self.subjects = Subjects(prefix)
        self.reward_subject = self.subjects.reward(node)
        self.grace_s, self.max_pending, self.sweep_period_s, self.clock = grace_s, max_pending, sweep_period_s, clock
        self.pending: OrderedDict[str, PendingDecision] = OrderedDict()
        self.stats = RewardStats()
        self._ready: list[tuple[int, SchedulingExperience]] = []   # heap by EID: decided, not yet released
        self._queue: asyncio.Queue[SchedulingExperience] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._started = False
        self._lock = asyncio.Lock()

    # -- lifecycle ----------------------------------------------------------------
    async def start(self) -> "RewardTracker":
        """Start sweeping and publishing (idempotent)."""
        if self._started:
            return self
        async with self._lock:
            if self._started:
                return self
            self._tasks = [asyncio.create_task(self._sweep(), name=f"{self.node}-rewards-sweep"),
                           asyncio.create_task(self._publish(), name=f"{self.node}-rewards-publish")]
            self._started = True
        return self

    async def stop(self) -> None:
        """Publish what is decided; decisions still waiting are dropped (logged)."""
        if self.pending:
            log.info("rewards of %s: %d decisions still waiting for their answer at stop (dropped)",
                     self.node, len(self.pending))
            self.pending.clear()
        self._release()  # what was decided goes out (its predecessors' answers will not come now)
        if self._tasks:
            self._tasks[0].cancel()
            try:
                async with asyncio.timeout(5.0):
                    await self._queue.join()
            except asyncio.TimeoutError:
                log.warning("rewards of %s: %d rewards not published at stop", self.node, self._queue.qsize())
            self._tasks[1].cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks.clear()
        self._started = False

    # -- decisions ----------------------------------------------------------------
    def track(self, key: str, decision: LearningDecision, deadline_s: float) -> None:
        """Remember a decision until the answer of request ``key`` comes (call ``start`` before)."""
        self.pending.pop(key, None)  # decided again (a redelivery): the new decision counts
        self.pending[key] = PendingDecision(decision, deadline_s, self.clock() + deadline_s + self.grace_s)
        self.stats.tracked += 1
        while len(self.pending) > self.max_pending:
            _, oldest = self.pending.popitem(last=False)
            self.stats.evicted += 1
            self._reward(oldest, 0.0)

    def decision_of(self, key: str) -> LearningDecision | None:
        entry = self.pending.get(key)
        return entry.decision if entry else None

    def _reward(self, entry: PendingDecision, reward: float) -> None:
        """Called once the entry left ``pending``."""
        if not self.publishing:
            return
        d = entry.decision
        self.stats.met += reward > 0
        heapq.heappush(self._ready, (d.eid, SchedulingExperience(eid=d.eid, state=d.state, action=d.action,
                                                                reward=reward, node=self.node)))
        self._release()

    def _release(self) -> None:
        """Queue the decided rewards that no earlier decision is still waiting in front of."""
        floor = next(iter(self.pending.values())).decision.eid if self.pending else None
        while self._ready and (floor is None or self._ready[0][0] < floor):
            self._queue.put_nowait(heapq.heappop(self._ready)[1])

    def observe(self, key: str, status: int, total_s: float) -> None:
        """The answer of request ``key`` (any request: those without a decision are ignored)."""
        if not self.pending:
            return
        entry = self.pending.pop(key, None)
        if entry is not None:
            self._reward(entry, reward_of(status, total_s, entry.deadline_s))

    async def _sweep(self) -> None:
        while True:
            still_wanted()
            await asyncio.sleep(self.sweep_period_s)
            now = self.clock()
            expired = [key for key, entry in self.pending.items() if entry.expires_at <= now]
            for key in expired:
                self.stats.timed_out += 1
                self._reward(self.pending.pop(key), 0.0)

    async def _publish(self) -> None:
        js = self.nc.jetstream()
        while True:
            still_wanted()
            batch = [await self._queue.get()]
            while len(batch) < PUBLISH_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            results = await asyncio.gather(*(js.publish(self.reward_subject, encode(e), timeout=5.0,
                                                        headers={H.MSG_ID: e.msg_id}) for e in batch),
                                           return_exceptions=True)
            for experience, outcome in zip(batch, results):
                if isinstance(outcome, BaseException):
                    self.stats.failed += 1
                    log.warning("rewards of %s: EID %d not stored: %r", self.node, experience.eid, outcome)
                else:
                    self.stats.published += 1
                self._queue.task_done()
