"""P2PFaaS's windows of contiguous EIDs: the learner trains on links between consecutive
experiences, which come back in any order."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from broker.messages import LearnerTrainSample

log = logging.getLogger(__name__)


class EidWindow:
    """A window is ready when ``size - 1`` untrained links (EID n and n + 1 both here) wait. A sample
    stays while its successor or predecessor has not come, so a late one still links (once)."""

    def __init__(self, size: int, max_pending: int) -> None:
        self.size, self.max_pending = size, max_pending
        self.samples: dict[int, LearnerTrainSample] = {}
        self.trained: set[int] = set()   # EIDs whose link to EID + 1 was trained
        self.fed: set[int] = set()       # EIDs whose link from EID - 1 was trained
        self.linked = 0                  # untrained links

    def __len__(self) -> int:
        return len(self.samples)

    def _untrained_link(self, eid: int) -> bool:
        return eid in self.samples and eid + 1 in self.samples and eid not in self.trained

    def add(self, sample: LearnerTrainSample) -> bool:
        """Keep the sample (a repeated EID is ignored); True when a window is ready."""
        eid = sample.eid
        if eid not in self.samples:
            self.samples[eid] = sample
            self.linked += self._untrained_link(eid) + self._untrained_link(eid - 1)
            while len(self.samples) > self.max_pending:
                self._evict(min(self.samples))
        return self.linked >= self.size - 1

    def _evict(self, eid: int) -> None:
        self.linked -= self._untrained_link(eid)
        lost = eid not in self.trained and eid + 1 not in self.samples
        del self.samples[eid]
        self.trained.discard(eid)
        self.fed.discard(eid)
        if lost:
            log.warning("EID %d dropped: its successor did not arrive among %d samples", eid, self.max_pending)

    def take(self) -> list[list[LearnerTrainSample]]:
        """The untrained links as sorted runs of consecutive EIDs; keeps the samples still waiting."""
        runs: list[list[LearnerTrainSample]] = []
        for eid in sorted(self.samples):
            if not self._untrained_link(eid):
                continue
            if runs and runs[-1][-1].eid == eid:
                runs[-1].append(self.samples[eid + 1])
            else:
                runs.append([self.samples[eid], self.samples[eid + 1]])
            self.trained.add(eid)
            self.fed.add(eid + 1)
        present = set(self.samples)
        self.samples = {e: s for e, s in self.samples.items()
                        if (e not in self.trained and e + 1 not in present)      # waits for its successor
                        or (e not in self.fed and e - 1 not in present)}        # ... or a late predecessor
        self.trained &= set(self.samples)
        self.fed &= set(self.samples)
        self.linked = 0
        return runs

    def clear(self) -> None:
        self.samples, self.trained, self.fed, self.linked = {}, set(), set(), 0

    def restore(self, samples: Iterable[LearnerTrainSample], trained: Iterable[int] = (), fed: Iterable[int] = ()) -> None:
        self.clear()
        self.trained, self.fed = set(trained), set(fed)
        for sample in samples:
            self.add(sample)
        self.trained &= set(self.samples)
        self.fed &= set(self.samples)
