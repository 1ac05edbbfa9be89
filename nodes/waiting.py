"""The calls a pool holds until a slot frees, and how long its functions take. Direct calls wait
in the queue that admission bounds; in the main pool, async calls wait in a lane of their own. A
free slot goes to whichever head came first."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Callable

from nodes.calls import Call

EXECUTIONS_KEPT = 7     # a function's recent execution time is the median of its last this many runs

_entries = itertools.count(1)   # the order calls entered their pool's lines in (first come first served)


class WaitingLines:
    def __init__(self, async_lane: bool) -> None:
        self.async_lane = async_lane
        self.queue: deque[Call] = deque()       # direct calls (and every call of a dedicated pool)
        self.lane: deque[Call] = deque()        # main pool: async calls waiting for a slot
        self.queued_bytes = 0                   # inputs held in ``queue``

    def __len__(self) -> int:
        return len(self.queue) + len(self.lane)

    def __bool__(self) -> bool:
        return bool(self.queue or self.lane)

    def keys(self) -> set[str]:
        return {c.key for c in self.queue} | {c.key for c in self.lane}

    def enter(self, call: Call) -> None:
        call.entered = next(_entries)
        self.put(call)

    def put(self, call: Call, *, first: bool = False) -> None:
        line = self.lane if call.is_async and self.async_lane else self.queue
        if line is self.queue:
            self.queued_bytes += len(call.payload)
        (line.appendleft if first else line.append)(call)

    def next_line(self) -> deque[Call] | None:
        """The line whose head came first (None: nothing waits)."""
        queue, lane = self.queue, self.lane
        if not lane:
            return queue or None
        if not queue:
            return lane
        return queue if queue[0].entered < lane[0].entered else lane

    def take(self, line: deque[Call]) -> Call:
        call = line.popleft()
        if line is self.queue:
            self.queued_bytes -= len(call.payload)
        return call

    def drop_queued(self, unwanted: Callable[[Call], bool]) -> list[Call]:
        """Take the queued calls ``unwanted`` picks out of the queue (nobody waits for them any more)."""
        dropped: list[Call] = []
        kept: list[Call] = []
        for call in self.queue:   # one pass: the queue may hold 100,000 calls (not one scan per call dropped)
            (dropped if unwanted(call) else kept).append(call)
        if dropped:
            self.queue.clear()
            self.queue.extend(kept)
            self.queued_bytes = sum(len(c.payload) for c in kept)
        return dropped

    def drain(self) -> list[Call]:
        calls = [*self.queue, *self.lane]
        self.queue.clear()
        self.lane.clear()
        self.queued_bytes = 0
        return calls


class RecentTimes:
    """Each function's recent execution time, and the calls it makes too late to run."""

    def __init__(self) -> None:
        self.expected_s: dict[str, float] = {}   # fn -> the median of its last EXECUTIONS_KEPT runs
        self._recent_s: dict[str, deque[float]] = {}

    def executed(self, fn: str, seconds: float) -> None:
        """A median, not a mean: one long run (a large input) does not make every short call look too late."""
        recent = self._recent_s.get(fn)
        if recent is None:
            recent = self._recent_s[fn] = deque(maxlen=EXECUTIONS_KEPT)
        recent.append(seconds)
        self.expected_s[fn] = sorted(recent)[len(recent) // 2]

    def too_late(self, call: Call, now: float) -> bool:
        """Its caller has stopped waiting, or it waited and its caller will stop before the function's
        recent execution time is over (a call that finds a free slot always runs)."""
        return call.wanted_until < now or (call.queued and call.wanted_until < now + self.expected_s.get(call.fn, 0.0))
