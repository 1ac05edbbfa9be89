"""Calls a node did not run because their callers stopped waiting, said as one log line per window."""

from __future__ import annotations

import asyncio
import logging
import time

from nodes.calls import Call

log = logging.getLogger(__name__)


def unrun_reason(call: Call, now: float, takes_s: float) -> tuple[str, str]:
    """(reason, kind) of a queued call taken out unrun: its caller stopped waiting, or would
    before it ended (``takes_s``: the function's recent execution time)."""
    waited = now - call.arrival
    if call.wanted_until <= now:
        return f"not run: its caller stopped waiting for the answer after {waited:.3g} s in the queue", "caller_gone"
    return (f"not run: after {waited:.3g} s in the queue it would end after its caller stops waiting "
            f"({call.wanted_until - now:.3g} s left, {call.fn} takes about {takes_s:.3g} s); "
            "the node is overloaded, try again later"), "too_late"


class DropSummary:
    """One log line every ``every_s`` at most (under overload there are many a second); what comes
    inside a window is said when it ends. The metrics count every call."""

    def __init__(self, node: str, every_s: float) -> None:
        self.node, self.every_s = node, every_s
        self.kinds: dict[str, int] = {}
        self.since = self.logged = 0.0
        self.reason = ""                                   # the last one's
        self.timer: asyncio.TimerHandle | None = None      # the line of a window still open

    def add(self, kind: str, reason: str) -> None:
        now = time.time()
        if not self.kinds:
            self.since = now
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        self.reason = reason
        due_in = self.logged + self.every_s - now
        if due_in <= 0:
            self.flush()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(due_in, self.flush)

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.kinds:
            return
        now = time.time()
        self.logged = now
        log.warning("%s: %s queued call(s) not run in the last %.0f s: %s (the last: %s)", self.node,
                    sum(self.kinds.values()), now - self.since,
                    ", ".join(f"{n} {k}" for k, n in sorted(self.kinds.items())), self.reason)
        self.kinds.clear()
