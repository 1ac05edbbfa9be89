"""Asking a pool's workers which of their calls they still run.

A call (or its outcome) can be lost in transit while the node stays connected: its worker's
NATS server died with the message in its buffers and the worker reconnected elsewhere; or the
node's own connection dropped. The dispatcher asks the workers after a broker outage
(:meth:`~nodes.dispatch.Dispatcher.reconcile`) and, for calls running long, every
``Timings.worker_check_after_s``: a lost call is found then, not at the function's timeout (an hour for ``sleep``).
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable, Iterable

from broker.codec import decode, encode
from broker.errors import ContractError
from broker.messages import WorkerStatus, WorkerStatusRequest
from broker.subjects import Subjects
from nodes.calls import Call
from nodes.inbox import Inbox

log = logging.getLogger(__name__)

STATUS_TRIES = 8        # after a broker outage, a worker is asked this many times (it may reconnect later)
STATUS_TIMEOUT_S = 2.0


def by_worker(calls: Iterable[Call]) -> dict[str, list[Call]]:
    grouped: dict[str, list[Call]] = {}
    for call in calls:
        grouped.setdefault(call.worker, []).append(call)
    return grouped


class WorkerChecks:
    def __init__(self, pool: str, node: str, subjects: Subjects, inbox: Inbox, after_s: float) -> None:
        """``after_s``: a call running this long is checked with its worker (then every as long again)."""
        self.pool, self.node, self.subjects, self.inbox, self.after_s = pool, node, subjects, inbox, after_s
        self.checking: set[str] = set()          # workers asked about their long calls right now
        self._checked_at = 0.0

    def long_calls(self, running: Iterable[Call], now: float) -> dict[str, list[Call]]:
        """Calls running longer than ``after_s``, by worker, at most every ``after_s`` and
        never twice at once for one worker (:meth:`while_checking`)."""
        if now - self._checked_at < self.after_s:
            return {}
        self._checked_at = now
        due = by_worker(c for c in running if now - c.dispatched_at >= self.after_s and c.worker not in self.checking)
        self.checking.update(due)
        return due

    async def while_checking(self, worker: str, check: Awaitable[None]) -> None:
        try:
            await check
        finally:
            self.checking.discard(worker)

    async def status(self, worker: str, ids: list[int], tries: int, alive: Callable[[], bool]) -> WorkerStatus | None:
        """The worker's answer through the node's inbox (the outcomes it sends again come on the
        same subscription first, so they are counted before its answer is read); None if it never
        answers, or answers what cannot be read."""
        reply = await self.inbox.ask(self.subjects.worker_status(self.node, worker), encode(WorkerStatusRequest(ids=ids)),
                                     timeout_s=STATUS_TIMEOUT_S, tries=tries, wanted=alive)
        if reply is None:
            return None
        try:
            return decode(WorkerStatus, reply.data)
        except ContractError as exc:
            log.warning("%s: unreadable status of worker %s: %s", self.pool, worker, exc)
            return None
