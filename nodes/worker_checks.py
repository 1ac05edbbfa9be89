"""Asking a pool's workers which of their calls they still run: a call (or its outcome) can be lost in
transit (a worker's NATS server died with it buffered, or the node's connection dropped). Asked after a
broker outage (``Dispatcher.reconcile``) and for calls running past ``Timings.worker_check_after_s``."""

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
        """Calls running past ``after_s``, by worker: at most every ``after_s``, one check per worker at once."""
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
        """The worker's answer through the node's inbox, after the outcomes it sends again (same
        subscription); None if it never answers, or answers what cannot be read."""
        reply = await self.inbox.ask(self.subjects.worker_status(self.node, worker), encode(WorkerStatusRequest(ids=ids)),
                                     timeout_s=STATUS_TIMEOUT_S, tries=tries, wanted=alive)
        if reply is None:
            return None
        try:
            return decode(WorkerStatus, reply.data)
        except ContractError as exc:
            log.warning("%s: unreadable status of worker %s: %s", self.pool, worker, exc)
            return None
