"""What the algorithms decide on (:class:`~nodes.scheduler.base.SchedulingView`): this node's
load, its peers and their loads, and the node's learning context."""

from __future__ import annotations

import logging
from typing import Sequence

from nodes.config_store import ConfigStore
from nodes.dispatch import Dispatcher
from nodes.metrics import NodeMetrics
from nodes.peer_source import PeerSource
from nodes.scheduler.base import LocalLoad
from nodes.scheduler.learning import LearningContext

log = logging.getLogger(__name__)


class NodeView:
    def __init__(self, node_id: str, store: ConfigStore, main: Dispatcher, metrics: NodeMetrics,
                 peers: PeerSource | None = None, learning: LearningContext | None = None) -> None:
        self.node_id = node_id
        self.store, self.main, self.metrics = store, main, metrics
        self._peers = peers
        self.learning = learning   # view.learning: the LearningScheduler's learner and rewards

    def local_load(self) -> LocalLoad:
        c = self.store.node
        return LocalLoad(self.main.n_running, self.main.n_queued, c.parallel_running_functions_max,
                         c.queue_length_max, c.queue_enabled)

    def peers(self) -> Sequence[str]:
        return self._peers.peers() if self._peers else ()

    def resolve(self, name: str) -> str:
        """A node named by its IP address (P2PFaaS's master), as discovery knows it."""
        return self._peers.resolve(name) if self._peers else name

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
