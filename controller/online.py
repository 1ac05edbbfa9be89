"""Online learning with a safety net: which weights decide for a live RL policy.

The controller starts with the model it shipped with (known good); the learner keeps training
a copy on the live experiences and publishes new versions. ``ModelGuard`` lets the newest
version decide once the shipped model's live QoS is known, keeps measuring, and rolls back to
the shipped weights when the online ones do worse than the shipped model did (docs/autoscaling.md).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from broker.messages import PoolTelemetry
from controller.baselines import RLPolicy

log = logging.getLogger(__name__)

SHIPPED = "shipped"


Z_99 = 2.326                  # one-sided 99 % quantile of the normal distribution
RISING, SURGING = 1.25, 2.0   # arrival rate over the lowest of the previous STRATUM_LOOKBACK periods
STRATUM_LOOKBACK = 3          # a step in load and the periods that drain its backlog
STRATA = 3
MIN_STRATUM_PERIODS = 3       # shipped periods of a stratum before its periods are judged


def load_stratum(rate: float, previous: deque[float]) -> int:
    """0 steady or falling, 1 rising (over 1.25x), 2 surging (over 2x the lowest rate of the
    previous periods): what any policy's QoS depends on most, and no policy changes."""
    if not previous:
        return 0
    ratio = rate / max(min(previous), 1e-3)
    return 2 if ratio > SURGING else 1 if ratio > RISING else 0


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
    * once they have decided ``trial_periods`` periods (32: 4 min at 8 s, about one cycle of a
      bursty load; over 8, chance and the phase of the load rolled back weights that decided as
      the shipped ones did every few episodes, and online learning never got anywhere) with at
      least ``min_tasks`` tasks, every
      period judges their *recent* QoS (the newest periods that hold both, at most
      ``window_periods``) against what the shipped model met *in the same kind of periods*:
      every period has a load stratum (:func:`load_stratum`: steady, rising, surging, from the
      arrival rates alone, so it does not depend on who decides), the shipped model's QoS is kept
      per stratum, and the online weights are expected to meet, on each of their periods, what
      the shipped weights met in that stratum (a surge misses deadlines whoever decides: judged
      against one QoS of other periods, every surge rolled the online weights back). Below that
      by more than ``tolerance`` and more than chance explains (the spread of the shipped
      weights' own period QoS in those strata, over the periods judged), the shipped weights
      decide again
      (``observe`` returns True: the caller resets the learner to the shipped weights and reports
      the version it restarts at with ``reseeded``); until then no new version is taken, and
      afterwards only versions trained from the shipped weights again.
    """

    def __init__(self, policy: RLPolicy, reference_periods: int = 8, trial_periods: int = 32,
                 min_tasks: int = 50, tolerance: float = 0.005, window_periods: int = 200) -> None:
        self.policy, self.shipped = policy, policy.agent
        self.reference_periods, self.trial_periods = reference_periods, trial_periods
        self.min_tasks, self.tolerance = min_tasks, tolerance
        self.reference = QoSTally()      # periods the shipped weights decided
        self.strata = [QoSTally() for _ in range(STRATA)]   # ... by load stratum
        self.trial = QoSTally()          # periods online weights decided since they took over
        # the same periods one by one (met, completed, stratum), newest last: judged over the
        # recent ones only (judged over the online weights' whole life, a version turning bad after
        # days of good ones was rolled back hours late, its bad periods diluted in the good ones)
        self.recent: deque[tuple[int, int, int]] = deque(maxlen=max(trial_periods, window_periods))
        self._rates: deque[float] = deque(maxlen=STRATUM_LOOKBACK)
        # (met, completed) of the periods the shipped weights decided, per stratum: their spread is
        # what chance does to one period's QoS (tasks of one period miss together, so the unit is the period)
        self.shipped_periods: list[deque[tuple[int, int]]] = [deque(maxlen=window_periods) for _ in range(STRATA)]
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
        stratum = load_stratum(t.arrival_rate, self._rates)
        self._rates.append(t.arrival_rate)
        if self.online_version is None:
            self.reference.add(t)
            self.strata[stratum].add(t)
            if t.completed:
                self.shipped_periods[stratum].append((t.met_deadline, t.completed))
            if self.candidate is not None and self.reference.periods >= self.reference_periods:
                self._decide_with(*self.candidate)
                self._new_trial()
            return False
        self.trial.add(t)
        self.recent.append((t.met_deadline, t.completed, stratum))
        judged = self._recent_tally()
        if judged is None:
            return False
        tally, expected, margin = judged
        if tally.qos < expected - margin:
            log.warning("controller: online weights %s met %.2f %% of deadlines over their last %d periods, the "
                        "shipped model %.2f %% in periods of the same load (margin %.2f points): rolling back to the "
                        "shipped model", self.version, 100 * tally.qos, tally.periods, 100 * expected, 100 * margin)
            self.rollback()
            return True
        return False

    def spread(self, stratum: int) -> float | None:
        """The variance of one shipped period's QoS around the stratum's (task-weighted; None while
        the shipped model has decided fewer than ``MIN_STRATUM_PERIODS`` such periods)."""
        periods = self.shipped_periods[stratum]
        if len(periods) < MIN_STRATUM_PERIODS:
            return None
        mean = self.strata[stratum].qos
        tasks = sum(c for _, c in periods)
        return sum(c * (m / c - mean) ** 2 for m, c in periods) / tasks

    def expected_qos(self, stratum: int) -> float:
        """What the shipped model met in periods of ``stratum``."""
        return self.strata[stratum].qos

    def _recent_tally(self) -> tuple[QoSTally, float, float] | None:
        """The online weights' newest periods holding ``trial_periods`` judged periods and
        ``min_tasks`` tasks, the QoS the shipped model met in periods of the same strata (task for
        task) and the margin chance allows there (None: not yet). A period of a stratum the shipped
        model has not decided often enough is not judged: there is nothing to compare it with."""
        tally, expected_met, variance = QoSTally(), 0.0, 0.0
        for met, completed, stratum in reversed(self.recent):
            spread = self.spread(stratum)
            if spread is None or not completed:
                continue
            tally.met, tally.completed, tally.periods = tally.met + met, tally.completed + completed, tally.periods + 1
            expected_met += completed * self.expected_qos(stratum)
            variance += completed**2 * spread
            if tally.periods >= self.trial_periods and tally.completed >= self.min_tasks:
                # one-sided 99 %: the period-to-period spread of the shipped model's own QoS, over these periods
                margin = max(self.tolerance, Z_99 * math.sqrt(variance) / tally.completed)
                return tally, expected_met / tally.completed, margin
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
