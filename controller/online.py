"""Online learning with a safety net: ``ModelGuard`` chooses which weights decide for a live RL
policy, the known-good ones or the learner's newest (docs/autoscaling.md, "Online learning")."""

from __future__ import annotations

import base64
import dataclasses
import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from broker.messages import LearnerWeights, PoolTelemetry
from broker.subjects import scaling_model
from controller.baselines import RLPolicy
from controller.features import RewardConfig

log = logging.getLogger(__name__)

SHIPPED = "shipped"


Z_99 = 2.326                  # one-sided 99 % quantile of the normal distribution: a rollback
Z_95 = 1.645                  # ... 95 %: a promotion (a false one is rolled back like any weights)
RISING, SURGING = 1.25, 2.0   # arrival rate over the lowest of the previous STRATUM_LOOKBACK periods
STRATUM_LOOKBACK = 3          # a step in load and the periods that drain its backlog
STRATA = 3
MIN_STRATUM_PERIODS = 3       # shipped periods of a stratum before its periods are judged
BATCH = 8                     # periods per batch mean of the paired worker difference: neighbouring
                              # periods share a state, so single ones are not independent draws


def load_stratum(rate: float, previous: deque[float]) -> int:
    """0 steady or falling, 1 rising, 2 surging (vs the lowest previous rate): what QoS depends on
    most whoever decides."""
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


class Reference:
    """The anchor's deadlines met per load stratum; the newest ``window_periods`` give the spread."""

    def __init__(self, window_periods: int) -> None:
        self.strata = [QoSTally() for _ in range(STRATA)]
        self.periods: list[deque[tuple[int, int]]] = [deque(maxlen=window_periods) for _ in range(STRATA)]

    def add(self, stratum: int, met: int, completed: int) -> None:
        tally = self.strata[stratum]
        tally.met, tally.completed, tally.periods = tally.met + met, tally.completed + completed, tally.periods + 1
        if completed:
            self.periods[stratum].append((met, completed))

    @property
    def total_periods(self) -> int:
        return sum(t.periods for t in self.strata)

    def judged(self, stratum: int) -> bool:
        return len(self.periods[stratum]) >= MIN_STRATUM_PERIODS

    def qos_variance(self, stratum: int) -> float:
        """Task-weighted, of one period's QoS around the stratum's."""
        periods, mean = self.periods[stratum], self.strata[stratum].qos
        return sum(c * (m / c - mean) ** 2 for m, c in periods) / sum(c for _, c in periods)


@dataclass(frozen=True)
class CostVerdict:
    """The online weights' cost against the anchor's over the same periods, in workers per period:
    the workers they asked for above what the anchor asked for in the same states (paired, so the
    hour's load cancels out) plus the work they missed beyond the anchor's expected QoS, priced as
    the env prices it."""

    extra_workers: float
    missed_workers: float
    sigma: float
    tolerance: float             # workers per period too few to act on, however sure

    @property
    def difference(self) -> float:
        return self.extra_workers + self.missed_workers

    @property
    def dearer(self) -> bool:
        return self.difference - max(self.tolerance, Z_99 * self.sigma) > 0

    @property
    def cheaper(self) -> bool:
        return self.difference + max(self.tolerance, Z_95 * self.sigma) < 0


@dataclass(frozen=True)
class Verdict:
    """The online weights' newest judged periods against the anchor in the same strata."""

    tally: QoSTally
    expected_qos: float
    margin: float                # one-sided 99 %
    promotion_margin: float      # one-sided 95 %
    sigma: float                 # of the QoS, by chance alone

    @property
    def worse(self) -> bool:
        return self.tally.qos < self.expected_qos - self.margin

    @property
    def better(self) -> bool:
        return self.tally.qos > self.expected_qos + self.promotion_margin


class ModelGuard:
    """Swaps ``policy.agent`` between the anchor (known-good weights: the shipped ones at first)
    and the learner's online copy.

    * A version newer than ``floor_version`` decides once the anchor has decided
      ``reference_periods`` periods; newer versions then replace it at once (same lineage).
    * After ``trial_periods`` (32: with 8, chance and the load's phase rolled back good weights
      every few episodes), every period compares the online weights' recent QoS with what the
      anchor met in periods of the same load stratum (a surge misses deadlines whoever decides).
      Below it by more than ``tolerance`` and chance (the anchor's own spread, one-sided 99 %),
      ``observe`` returns True: the caller re-seeds the learner with ``anchor`` and calls
      ``reseeded``; only versions trained from the anchor again are taken after that.
    * Above it by more than chance (one-sided 95 %) over ``promote_periods``, the online weights
      become the anchor: online learning drifts as well as it improves.
    * With ``judge_cost`` (off by default: it sees the workers a decision costs now, not the
      deadlines they meet in a later surge; docs/autoscaling.md), cost over ``promote_periods``
      (``CostVerdict``, with ``shadow`` called after each decision):
      cheaper than the anchor by more than chance (95 %) and ``cost_tolerance`` of the anchor's
      workers, the online weights become the anchor; dearer by as much (chance at 99 %), they are
      rolled back.
    """

    def __init__(self, policy: RLPolicy, reference_periods: int = 8, trial_periods: int = 32,
                 min_tasks: int = 50, tolerance: float = 0.005, window_periods: int = 200,
                 promote_periods: int = 96, miss_cost: float = RewardConfig().miss_cost,
                 judge_cost: bool = False, cost_tolerance: float = 0.02) -> None:
        self.policy = policy
        self.anchor, self.anchor_version = policy.agent, None   # None: the shipped weights
        self.reference_periods, self.trial_periods = reference_periods, trial_periods
        self.min_tasks, self.tolerance = min_tasks, tolerance
        self.window_periods, self.promote_periods = window_periods, promote_periods
        self.reference = Reference(window_periods)   # periods the anchor decided, by stratum
        self.trial = QoSTally()          # periods online weights decided since they took over
        # the same periods (met, completed, stratum), newest last: only recent ones are judged, so a
        # version turning bad after days of good ones is not diluted in them
        self.recent: deque[tuple[int, int, int]] = deque(maxlen=max(trial_periods, window_periods, promote_periods))
        if judge_cost and promote_periods < 2 * BATCH:
            raise ValueError(f"judge_cost needs promote_periods >= {2 * BATCH} (two batches for a spread), "
                             f"got {promote_periods}")
        self.miss_cost, self.judge_cost, self.cost_tolerance = miss_cost, judge_cost, cost_tolerance
        # per decision of online weights: the workers they asked for minus the anchor's in that state,
        # and the anchor's
        self.extra: deque[tuple[int, int]] = deque(maxlen=promote_periods)
        self._rates: deque[float] = deque(maxlen=STRATUM_LOOKBACK)
        self.online_version: int | None = None
        self.candidate: tuple[Any, int] | None = None
        self.floor_version = 0
        self.rollbacks = 0
        self.promotions = 0
        self.awaiting_reseed = False     # rolled back, the learner not yet reset to the anchor's weights
        policy.version = SHIPPED

    @property
    def version(self) -> str:
        if self.online_version is not None:
            return f"online-{self.online_version}"
        return SHIPPED if self.anchor_version is None else f"online-{self.anchor_version}"

    def offer(self, agent: Any, version: int) -> None:
        """New weights from the learner (``agent`` acts with them)."""
        if self.awaiting_reseed or version <= self.floor_version:
            return
        self.candidate = (agent, version)
        if self.online_version is None and self.reference.total_periods >= self.reference_periods:
            self._new_trial()
            self._decide_with(agent, version)
        elif self.online_version is not None:
            self._decide_with(agent, version)

    def observe(self, t: PoolTelemetry) -> bool:
        """Account the period to the weights that decided it; True when they were rolled back."""
        stratum = load_stratum(t.arrival_rate, self._rates)
        self._rates.append(t.arrival_rate)
        if self.online_version is None:
            self.reference.add(stratum, t.met_deadline, t.completed)
            if self.candidate is not None and self.reference.total_periods >= self.reference_periods:
                self._decide_with(*self.candidate)
                self._new_trial()
            return False
        self.trial.add(t)
        self.recent.append((t.met_deadline, t.completed, stratum))
        # the newest trial_periods catch a bad version fast, the newest promote_periods a small lasting drop
        short, long = self.verdict(self.trial_periods), self.verdict(self.promote_periods)
        worse = next((v for v in (short, long) if v is not None and v.worse), None)
        if worse is not None:
            log.warning("controller: online weights %s met %.2f %% of deadlines over their last %d periods, the %s "
                        "%.2f %% in periods of the same load (margin %.2f points): rolling back to the %s",
                        self.version, 100 * worse.tally.qos, worse.tally.periods, self._anchor_name,
                        100 * worse.expected_qos, 100 * worse.margin, self._anchor_name)
            self.rollback()
            return True
        if long is None or self.trial.periods < self.promote_periods:
            return False
        cost = self.cost_verdict(long, t) if self.judge_cost else None
        if long.better or (cost is not None and cost.cheaper):
            self._promote(long, cost)
        elif cost is not None and cost.dearer:
            log.warning("controller: online weights %s cost %.2f workers per period more than the %s in the same "
                        "states (%.2f asked for, %.2f in missed work; chance %.2f): rolling back to the %s",
                        self.version, cost.difference, self._anchor_name, cost.extra_workers, cost.missed_workers,
                        Z_99 * cost.sigma, self._anchor_name)
            self.rollback()
            return True
        return False

    def shadow(self, current_target: int, chosen: int) -> None:
        """After online weights decided ``chosen``: what the anchor asks for in the same state."""
        policy = self.policy
        if not self.judge_cost or self.online_version is None or policy.last_observation is None:
            return
        bounds = policy.scenario.workers
        anchor_action = int(self.anchor.act(policy.last_observation, explore=False))
        anchor = bounds.clamp(policy.actions.target(anchor_action, current_target, policy.observe))
        self.extra.append((bounds.clamp(chosen) - anchor, anchor))

    def cost_verdict(self, qos: Verdict, t: PoolTelemetry) -> CostVerdict | None:
        """Over the newest ``promote_periods`` decisions; the spread of the asked-for difference from
        batch means of ``BATCH`` periods, the missed work's from the QoS verdict's chance."""
        if len(self.extra) < self.promote_periods:
            return None
        extra = [difference for difference, _ in self.extra]
        batches = [sum(extra[i:i + BATCH]) / BATCH for i in range(0, len(extra) - BATCH + 1, BATCH)]
        mean = sum(batches) / len(batches)
        variance = sum((b - mean) ** 2 for b in batches) / (len(batches) - 1) / len(batches)
        # a missed task is its work S over the period T, at miss_cost (controller/features.py RewardConfig)
        scenario = self.policy.scenario
        per_period = qos.tally.completed / qos.tally.periods * scenario.mean_service_s / max(t.period_s, 1e-9)
        missed = self.miss_cost * per_period * (qos.expected_qos - qos.tally.qos)
        sigma = math.sqrt(variance + (self.miss_cost * per_period * qos.sigma) ** 2)
        anchor_workers = sum(anchor for _, anchor in self.extra) / len(self.extra)
        return CostVerdict(mean, missed, sigma, self.cost_tolerance * anchor_workers)

    @property
    def _anchor_name(self) -> str:
        return "shipped model" if self.anchor_version is None else f"promoted weights online-{self.anchor_version}"

    def spread(self, stratum: int) -> float | None:
        """The anchor's per-period QoS variance in ``stratum``; None until ``MIN_STRATUM_PERIODS``."""
        return self.reference.qos_variance(stratum) if self.reference.judged(stratum) else None

    def expected_qos(self, stratum: int) -> float:
        return self.reference.strata[stratum].qos

    def verdict(self, periods: int) -> Verdict | None:
        """The online weights' newest ``periods`` judged periods (and ``min_tasks`` tasks) against
        the anchor's QoS in the same strata, with chance's margin; None: not yet. Periods of a
        stratum the anchor has too few of are not judged."""
        tally, expected_met, variance = QoSTally(), 0.0, 0.0
        for met, completed, stratum in reversed(self.recent):
            spread = self.spread(stratum)
            if spread is None or not completed:
                continue
            tally.met, tally.completed, tally.periods = tally.met + met, tally.completed + completed, tally.periods + 1
            expected_met += completed * self.expected_qos(stratum)
            variance += completed**2 * spread
            if tally.periods >= periods and tally.completed >= self.min_tasks:
                sigma = math.sqrt(variance) / tally.completed
                return Verdict(tally, expected_met / tally.completed, max(self.tolerance, Z_99 * sigma),
                               max(self.tolerance, Z_95 * sigma), sigma)
        return None

    def _new_trial(self) -> None:
        self.trial = QoSTally()
        self.recent.clear()
        self.extra.clear()

    def _promote(self, verdict: Verdict, cost: CostVerdict | None = None) -> None:
        log.info("controller: online weights %s promoted: %.2f %% of deadlines met over %d periods, the %s %.2f %% "
                 "in periods of the same load (margin %.2f points), %s; a rollback comes back to them", self.version,
                 100 * verdict.tally.qos, verdict.tally.periods, self._anchor_name, 100 * verdict.expected_qos,
                 100 * verdict.margin, "cost not judged" if cost is None else
                 f"{cost.difference:+.2f} workers per period of cost (chance {Z_95 * cost.sigma:.2f})")
        self.anchor, self.anchor_version = self.policy.agent, self.online_version
        if verdict.better:
            self.reference = Reference(self.window_periods)
        # promoted on cost, their QoS is the old reference's: their newest periods join it, rather
        # than standing alone for the load of one hour
        for met, completed, stratum in self.recent:
            self.reference.add(stratum, met, completed)
        self.promotions += 1
        self._new_trial()

    def rollback(self) -> None:
        self.floor_version = max(self.floor_version, self.online_version or 0,
                                 self.candidate[1] if self.candidate else 0)
        self.online_version, self.candidate = None, None
        self.policy.agent = self.anchor
        self.policy.version = self.version
        self._new_trial()
        self.rollbacks += 1
        self.awaiting_reseed = True

    def reseeded(self, version: int) -> None:
        """The learner restarted from the anchor's weights at ``version``: newer ones may decide again."""
        self.floor_version = max(self.floor_version, version)
        self.awaiting_reseed = False

    def _decide_with(self, agent: Any, version: int) -> None:
        if self.online_version is None:
            log.info("controller: online weights version %d decide from now on", version)
        self.policy.agent, self.online_version = agent, version
        self.policy.version = self.version


# Online training of a seeded model: no exploration (the controller acts greedily), small steps
# from the first few dozen live experiences.
ONLINE_OVERRIDES: dict[str, dict[str, Any]] = {
    "dqn": {"learning_starts": 32, "batch_size": 32, "learning_rate": 1e-4, "start_e": 0.0, "end_e": 0.0,
            "exploration_steps": 1, "target_network_frequency": 100, "buffer_size": 10_000},
    "pg": {"num_steps": 32, "num_minibatches": 2, "learning_rate": 1e-4},
    "sarsa": {"alpha": 0.05, "start_e": 0.0, "end_e": 0.0, "exploration_steps": 1},
}


def online_weights(node: str, pool: str, agent: Any) -> LearnerWeights:
    """``agent``'s weights with the online-training hyper-parameters, for the learner's ``weights.set``."""
    config = {**dataclasses.asdict(agent.config), **ONLINE_OVERRIDES.get(agent.algorithm, {})}
    return LearnerWeights(node=node, model=scaling_model(pool), algorithm=agent.algorithm, obs_dim=agent.obs_dim,
                          n_actions=agent.n_actions, config=config,
                          version=0, weights_b64=base64.b64encode(agent.get_weights()).decode())
