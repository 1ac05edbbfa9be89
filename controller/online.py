"""Online learning with a safety net: which weights decide for a live RL policy.

The controller starts with the model it shipped with (known good); the learner keeps training
a copy on the live experiences and publishes new versions. ``ModelGuard`` lets the newest
version decide once the shipped model's live QoS is known, keeps measuring, and rolls back to
the shipped weights when the online ones do worse than the shipped model did (docs/autoscaling.md).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from broker.messages import PoolTelemetry
from controller.baselines import RLPolicy

log = logging.getLogger(__name__)

SHIPPED = "shipped"


@dataclass
class QoSTally:
    """Deadlines met out of tasks completed, over the periods a set of weights decided."""

    met: int = 0
    completed: int = 0
    periods: int = 0

    def add(self, t: PoolTelemetry) -> None:
        self.met += t.met_deadline
        self.completed += t.completed
        self.periods += 1

    @property
    def qos(self) -> float:
        return self.met / self.completed if self.completed else 1.0


class ModelGuard:
    """Swaps ``policy.agent`` between the shipped agent and the learner's online copy.

    * a learner version newer than ``floor_version`` is a candidate; it decides once the
      shipped model has decided ``reference_periods`` periods (its live QoS is then known);
    * while online weights decide, newer versions replace them at once (same lineage);
    * once they have decided ``trial_periods`` periods with at least ``min_tasks`` tasks, every
      period judges their *recent* QoS (the newest periods that hold both, at most
      ``window_periods``): below the shipped model's by more than ``tolerance``, the shipped weights
      decide again
      (``observe`` returns True: the caller resets the learner to the shipped weights and reports
      the version it restarts at with ``reseeded``); until then no new version is taken, and
      afterwards only versions trained from the shipped weights again.
    """

    def __init__(self, policy: RLPolicy, reference_periods: int = 8, trial_periods: int = 8,
                 min_tasks: int = 50, tolerance: float = 0.005, window_periods: int = 200) -> None:
        self.policy, self.shipped = policy, policy.agent
        self.reference_periods, self.trial_periods = reference_periods, trial_periods
        self.min_tasks, self.tolerance = min_tasks, tolerance
        self.reference = QoSTally()      # periods the shipped weights decided
        self.trial = QoSTally()          # periods online weights decided since they took over
        # the same periods one by one, newest last: judged over the recent ones only (judged over
        # the online weights' whole life, a version turning bad after days of good ones was
        # rolled back hours late, its bad periods diluted in the good ones)
        self.recent: deque[tuple[int, int]] = deque(maxlen=max(trial_periods, window_periods))
        self.online_version: int | None = None
        self.candidate: tuple[Any, int] | None = None
        self.floor_version = 0
        self.rollbacks = 0
        self.awaiting_reseed = False     # rolled back, the learner not yet reset to the shipped weights
        policy.version = SHIPPED

    @property
    def version(self) -> str:
        return SHIPPED if self.online_version is None else f"online-{self.online_version}"

    def offer(self, agent: Any, version: int) -> None:
        """New weights from the learner (``agent`` acts with them)."""
        if self.awaiting_reseed or version <= self.floor_version:
            return
        self.candidate = (agent, version)
        if self.online_version is None and self.reference.periods >= self.reference_periods:
            self._new_trial()
            self._decide_with(agent, version)
        elif self.online_version is not None:
            self._decide_with(agent, version)

    def observe(self, t: PoolTelemetry) -> bool:
        """Account the period to the weights that decided it; True when they were rolled back."""
        if self.online_version is None:
            self.reference.add(t)
            if self.candidate is not None and self.reference.periods >= self.reference_periods:
                self._decide_with(*self.candidate)
                self._new_trial()
            return False
        self.trial.add(t)
        self.recent.append((t.met_deadline, t.completed))
        judged = self._recent_tally()
        if judged is not None and judged.qos < self.reference.qos - self.tolerance:
            log.warning("controller: online weights %s met %.2f %% of deadlines over their last %d periods, the "
                        "shipped model %.2f %%: rolling back to the shipped model", self.version, 100 * judged.qos,
                        judged.periods, 100 * self.reference.qos)
            self.rollback()
            return True
        return False

    def _recent_tally(self) -> QoSTally | None:
        """The newest periods holding ``trial_periods`` periods and ``min_tasks`` tasks (None: not yet)."""
        tally = QoSTally()
        for met, completed in reversed(self.recent):
            tally.met, tally.completed, tally.periods = tally.met + met, tally.completed + completed, tally.periods + 1
            if tally.periods >= self.trial_periods and tally.completed >= self.min_tasks:
                return tally
        return None

    def _new_trial(self) -> None:
        self.trial = QoSTally()
        self.recent.clear()

    def rollback(self) -> None:
        self.floor_version = max(self.floor_version, self.online_version or 0,
                                 self.candidate[1] if self.candidate else 0)
        self.online_version, self.candidate = None, None
        self.policy.agent, self.policy.version = self.shipped, SHIPPED
        self._new_trial()
        self.rollbacks += 1
        self.awaiting_reseed = True

    def reseeded(self, version: int) -> None:
        """The learner restarted from the shipped weights at ``version``: newer ones may decide again."""
        self.floor_version = max(self.floor_version, version)
        self.awaiting_reseed = False

    def _decide_with(self, agent: Any, version: int) -> None:
        if self.online_version is None:
            log.info("controller: online weights version %d decide from now on", version)
        self.policy.agent, self.online_version = agent, version
        self.policy.version = self.version
