"""Load accounting per worker pool: what is queued and running, and each pool's telemetry window.

The scheduler records enqueues; the workers' started/done events (which name
their pool) move tasks along. Keyed by request, so a redelivery does not double count.
"""

from __future__ import annotations

from nodes.telemetry import PoolStats
from nodes.worker import DEFAULT_POOL


class LoadTracker:
    """Running and queued tasks of this node, from the scheduler's own bookkeeping
    and the workers' started/done events (keyed by request, so redeliveries do not double count)."""

    RECENT = 65536  # finished requests remembered for duplicate detection

    def __init__(self, unknown_outstanding: int = 0) -> None:
        self.outstanding: set[str] = set()
        self.running: set[str] = set()
        self.unknown = unknown_outstanding  # tasks left in the stream by a previous run
        self.recent: dict[str, None] = {}   # insertion-ordered, bounded

    def seen(self, key: str) -> bool:
        return key in self.outstanding or key in self.recent

    def enqueued(self, key: str) -> None:
        self.outstanding.add(key)

    def cancel(self, key: str) -> None:
        """Forget an enqueue that did not happen (the task could not be stored)."""
        self.outstanding.discard(key)

    def started(self, key: str) -> None:
        if key in self.outstanding or self.unknown:
            self.running.add(key)

    def done(self, key: str) -> None:
        self.running.discard(key)
        self.recent[key] = None
        if len(self.recent) > self.RECENT:
            del self.recent[next(iter(self.recent))]
        if key in self.outstanding:
            self.outstanding.discard(key)
        elif self.unknown:
            self.unknown -= 1

    @property
    def n_running(self) -> int:
        return len(self.running)

    @property
    def n_queued(self) -> int:
        return max(0, len(self.outstanding) + self.unknown - len(self.running))


class PoolAccount:
    def __init__(self, node: str, name: str, unknown_outstanding: int = 0) -> None:
        self.name = name
        self.load = LoadTracker(unknown_outstanding)
        self.stats = PoolStats(node, name)


class Accounts:
    """The node's pools by name, and which pool serves which function."""

    def __init__(self, node: str, dedicated: dict[str, list[str]] | None = None) -> None:
        self.node = node
        self.pools: dict[str, PoolAccount] = {DEFAULT_POOL: PoolAccount(node, DEFAULT_POOL)}
        self._pool_of: dict[str, str] = {}
        for pool, functions in (dedicated or {}).items():
            self.pools[pool] = PoolAccount(node, pool)
            self._pool_of.update({fn: pool for fn in functions})

    @property
    def default(self) -> PoolAccount:
        return self.pools[DEFAULT_POOL]

    def for_fn(self, fn: str) -> PoolAccount:
        return self.pools[self._pool_of.get(fn, DEFAULT_POOL)]

    def get(self, pool: str | None) -> PoolAccount:
        return self.pools.get(pool or DEFAULT_POOL, self.default)

    def seen(self, key: str) -> bool:
        return any(acc.load.seen(key) for acc in self.pools.values())
