"""What a scaling agent sees, what its actions mean and what it is paid, shared by the env, the
evaluation and the live controller. Worker counts are in units of ``N_REF`` (not of a scenario's
maximum), so one model serves farms of any size."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from broker.messages import PoolTelemetry
from controller.distributions import UniformDist
from controller.scenario import Scenario

N_REF = 32.0          # worker counts are divided by this
HISTORY = 6           # periods of arrival history the trend features look back on
NEED_WINDOW = 2       # target actions size the pool for the highest need of this many periods
LONG_HISTORY = 16     # periods the long-memory features look back on
DEAD_BAND = 0.15      # target actions leave the pool alone when it would shrink by less than this share

OBSERVATION_FIELDS = (
    "load",             # arrival rate x mean service: workers the arrivals keep busy
    "load_trend",       # load minus the previous period's load (the arrival-rate slope, per period)
    "load_peak",        # highest load of the last HISTORY periods
    "load_spread",      # highest minus lowest load of the last HISTORY periods (how bursty)
    "backlog",          # queue x mean service / step: workers needed to drain the queue in one period
    "backlog_growth",   # backlog minus the previous period's backlog (queue growth)
    "ready",            # workers serving
    "starting",         # workers requested, still in their cold start
    "headroom",         # (ready + starting - load - backlog) / sqrt(max(1, load + backlog)), sqrt-staffing units
    "qos",              # fraction of the period's completed tasks that met their deadline (0 if stalled)
    "latency_p95",      # the period's p95 latency / mean deadline
    "cold_start",       # mean cold start / step
    "capacity",         # workers.max
    "deadline_slack",   # (mean deadline - mean service) / mean service
    "load_peak_long",   # highest load of the last LONG_HISTORY periods
    "since_peak_long",  # periods since that highest load / LONG_HISTORY
)
# the first eight fields and "capacity" are worker counts / N_REF
OBSERVATION_LOW = np.array([0, -4, 0, 0, 0, -4, 0, 0, -8, 0, 0, 0, 0, 0, 0, 0], dtype=np.float32)
OBSERVATION_HIGH = np.array([8, 4, 8, 8, 8, 4, 8, 8, 12, 1, 8, 4, 8, 10, 8, 1], dtype=np.float32)
# A model sees the first n fields: models made before the long-memory fields take 14, newer ones all
OBSERVATION_SIZES = (14, len(OBSERVATION_FIELDS))


def observation_size(agent) -> int:
    """How many fields ``agent`` (anything with ``obs_dim``) takes; all of them when it does not say."""
    return int(getattr(agent, "obs_dim", 0) or len(OBSERVATION_FIELDS))


def check_observation_size(size: int) -> int:
    if size not in OBSERVATION_SIZES:
        raise ValueError(f"a scaling model takes {' or '.join(map(str, OBSERVATION_SIZES))} observation fields, "
                         f"not {size}")
    return size


def mean_delay_s(delay) -> float:
    if isinstance(delay, (int, float)):
        return float(delay)
    if isinstance(delay, UniformDist):
        return (delay.low + delay.high) / 2
    return float(delay.value)


def need_of(t: PoolTelemetry, scenario: Scenario) -> float:
    """Workers the period asks for: its arrivals' load plus draining its queue within one step."""
    service = scenario.mean_service_s
    return t.arrival_rate * service + t.queue_length * service / scenario.step_seconds


class ObservationBuilder:
    """Each period's telemetry as the observation; stateful (the last ``LONG_HISTORY`` periods):
    ``reset()`` when an episode or live session starts, then call it once per period, in order.
    ``size``: the first that many ``OBSERVATION_FIELDS`` (a model's own ``obs_dim``)."""

    def __init__(self, scenario: Scenario, size: int = len(OBSERVATION_FIELDS)) -> None:
        self.size = check_observation_size(size)
        self.low, self.high = OBSERVATION_LOW[:size], OBSERVATION_HIGH[:size]
        self.scenario = scenario
        service, deadline = scenario.mean_service_s, scenario.mean_deadline_s
        self._constants = (
            mean_delay_s(scenario.cold_start_seconds) / scenario.step_seconds,
            scenario.workers.max / N_REF,
            max(0.0, deadline - service) / service,
        )
        self.reset()

    def reset(self) -> None:
        self._loads: deque[float] = deque(maxlen=HISTORY)
        self._long: deque[float] = deque(maxlen=LONG_HISTORY)
        self._needs: deque[float] = deque(maxlen=NEED_WINDOW)
        self._backlog: float | None = None

    @property
    def need(self) -> float:
        """The highest load + backlog of the last ``NEED_WINDOW`` periods (one noisy one does not shrink)."""
        return max(self._needs) if self._needs else 0.0

    @property
    def peak(self) -> float:
        """The highest load of the last ``HISTORY`` periods plus the backlog (holds an oscillating load)."""
        return (max(self._loads) if self._loads else 0.0) + (self._backlog or 0.0)

    def __call__(self, t: PoolTelemetry) -> np.ndarray:
        sc = self.scenario
        service = sc.mean_service_s
        load = t.arrival_rate * service
        backlog = t.queue_length * service / sc.step_seconds
        previous_load = self._loads[-1] if self._loads else load
        previous_backlog = self._backlog if self._backlog is not None else backlog
        self._loads.append(load)
        self._long.append(load)
        long_peak = max(self._long)   # a surge's aftermath: calm now, a high load not long ago
        since_peak = len(self._long) - 1 - max(i for i, x in enumerate(self._long) if x == long_peak)
        self._backlog = backlog
        need = load + backlog
        self._needs.append(need)
        provisioned = t.workers_ready + t.workers_starting
        stalled = t.completed == 0 and t.queue_length > 0
        raw = np.array(
            [
                load / N_REF,
                (load - previous_load) / N_REF,
                max(self._loads) / N_REF,
                (max(self._loads) - min(self._loads)) / N_REF,
                backlog / N_REF,
                (backlog - previous_backlog) / N_REF,
                t.workers_ready / N_REF,
                t.workers_starting / N_REF,
                (provisioned - need) / math.sqrt(max(1.0, need)),
                0.0 if stalled else t.qos,
                t.latency_p95_s / sc.mean_deadline_s,
                *self._constants,
                long_peak / N_REF,
                since_peak / LONG_HISTORY,
            ],
            dtype=np.float32,
        )
        return np.clip(raw[:self.size], self.low, self.high)


# --------------------------------------------------------------------------- actions
ActionMode = Literal["unit", "wide", "target"]
ACTION_DELTAS: dict[str, tuple[int, ...]] = {"unit": (-1, 0, 1), "wide": tuple(range(-4, 5))}
# "target": action 0 keeps the target; the others size it by square-root staffing, with a beta, of
# the recent need (the last NEED_WINDOW periods) or of the peak load of the last HISTORY periods.
TARGET_ACTIONS: tuple[tuple[str, float], ...] = (
    ("need", 1.0), ("need", 2.0), ("need", 3.0), ("need", 4.0), ("peak", 1.0), ("peak", 2.0))
ACTION_MODES: tuple[str, ...] = ("unit", "wide", "target")


def staffing(need: float, beta: float) -> int:
    """Square-root staffing: ``ceil(need + beta * sqrt(need))`` workers (Halfin-Whitt)."""
    return math.ceil(need + beta * math.sqrt(max(need, 0.0)) - 1e-9)


@dataclass(frozen=True)
class ScalingActions:
    """A discrete action: a target change (``unit``, ``wide``) or size (``target``: ``TARGET_ACTIONS``)."""

    mode: str = "unit"

    def __post_init__(self) -> None:
        if self.mode not in ACTION_MODES:
            raise ValueError(f"action_mode must be one of {', '.join(ACTION_MODES)}, got {self.mode!r}")

    @property
    def n(self) -> int:
        return len(TARGET_ACTIONS) + 1 if self.mode == "target" else len(ACTION_DELTAS[self.mode])

    @property
    def keep(self) -> int:
        """The action that leaves the target as it is (the safe answer for a state never seen)."""
        return 0 if self.mode == "target" else ACTION_DELTAS[self.mode].index(0)

    def target(self, action: int, current: int, observed: "ObservationBuilder") -> int:
        """The target ``action`` asks for (the caller clamps it to the bounds)."""
        if self.mode != "target":
            return current + ACTION_DELTAS[self.mode][action]
        if action == 0:
            return current
        basis, beta = TARGET_ACTIONS[action - 1]
        wanted = staffing(observed.need if basis == "need" else observed.peak, beta)
        if current - max(1.0, DEAD_BAND * current) < wanted < current:
            return current   # a small shrink is not worth a change (hysteresis, as the HPA's tolerance)
        return wanted

    def nearest(self, current: int, wanted: int, observed: "ObservationBuilder") -> int:
        """The action closest to a change another policy made (for its experiences)."""
        if wanted == current:
            return self.keep
        candidates = [abs(self.target(a, current, observed) - wanted) for a in range(self.n)]
        return int(np.argmin(candidates))


def action_names(mode: str) -> Sequence[str]:
    actions = ScalingActions(mode)
    if mode == "target":
        return ["keep", *(f"{basis}+{beta:g}sqrt" for basis, beta in TARGET_ACTIONS)]
    return [f"{d:+d}" for d in ACTION_DELTAS[actions.mode]]


# --------------------------------------------------------------------------- reward
@dataclass(frozen=True, slots=True)
class RewardConfig:
    """``r = -(billed + miss_cost x missed x S / T) / N_REF - change_penalty x [target changed]``: both
    costs in worker-seconds (billed = ready + starting + stopping over the period ``T``; a miss
    priced at ``miss_cost`` times its work ``S``, the mean service time), divided by ``T``."""

    miss_cost: float = 60.0
    """A missed deadline costs this many times a task's mean service time in worker-seconds."""
    change_penalty: float = 0.05
    """Per decision that changes the target (0.05 = 1.6 workers for one period)."""

    def missed(self, t: PoolTelemetry) -> float:
        """The period's missed deadlines; a stalled farm (a queue, nothing completed) counts its queue."""
        if t.completed == 0 and t.queue_length > 0:
            return float(t.queue_length)
        return float(t.completed - t.met_deadline)

    def reward(self, t: PoolTelemetry, scenario: Scenario, changed: bool) -> float:
        billed = t.workers_ready + t.workers_starting + t.workers_stopping
        period = t.period_s if t.period_s > 0 else scenario.step_seconds
        missed_workers = self.missed(t) * scenario.mean_service_s / period
        return -(billed + self.miss_cost * missed_workers) / N_REF - self.change_penalty * float(changed)
