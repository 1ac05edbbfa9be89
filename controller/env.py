"""Gymnasium environment for farm autoscaling, over a pluggable backend (simulator or live pool).

The observation and the reward are public functions of ``PoolTelemetry`` so the
live controller computes exactly what the agents were trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from broker.messages import PoolTelemetry
from controller.scenario import Scenario, load_scenario
from controller.simulator import EpisodeTotals, FarmSimulator

ActionMode = Literal["unit", "wide"]
ACTION_DELTAS: dict[str, tuple[int, ...]] = {"unit": (-1, 0, 1), "wide": tuple(range(-4, 5))}
OBSERVATION_FIELDS = (
    "backlog",        # queue x mean service / step, in workers, / max workers
    "ready",          # workers ready / max workers
    "starting",       # workers starting (cold) / max workers
    "load",           # arrival rate x mean service (busy workers needed) / max workers
    "throughput",     # throughput x mean service / max workers
    "latency_mean",   # mean latency / mean deadline
    "latency_max",    # max latency / mean deadline
    "qos",            # fraction of the period's completed tasks that met their deadline
    "gap",            # (load + backlog - ready - starting) / max workers: workers missing
)
OBSERVATION_LOW = np.array([0, 0, 0, 0, 0, 0, 0, 0, -1], dtype=np.float32)
OBSERVATION_HIGH = np.array([4, 1, 1, 4, 4, 4, 4, 1, 4], dtype=np.float32)
# Episode seeds the env draws itself are >= 2**32; evaluation uses seeds below, so they never meet.
TRAINING_SEED_FLOOR = 2**32


def observation_from_telemetry(t: PoolTelemetry, scenario: Scenario) -> np.ndarray:
    """The normalised float32 observation (fields in ``OBSERVATION_FIELDS``) of one period."""
    service, deadline = scenario.mean_service_s, scenario.mean_deadline_s
    cap = scenario.workers.max
    backlog = t.queue_length * service / scenario.step_seconds
    load = t.arrival_rate * service
    gap = load + backlog - t.workers_ready - t.workers_starting
    raw = np.array(
        [
            backlog / cap,
            t.workers_ready / cap,
            t.workers_starting / cap,
            load / cap,
            t.throughput * service / cap,
            t.latency_mean_s / deadline,
            t.latency_max_s / deadline,
            t.qos,
            gap / cap,
        ],
        dtype=np.float32,
    )
    return np.clip(raw, OBSERVATION_LOW, OBSERVATION_HIGH)


@dataclass(frozen=True, slots=True)
class RewardConfig:
    """Weights of ``r = -qos_weight * shortfall - cost_weight * billed/max - scaling_penalty * changed``."""

    qos_target: float = 0.99
    """QoS (fraction of a period's tasks meeting their deadline) below which the agent is penalised."""
    qos_weight: float = 1.0
    """Penalty when the period's QoS is ``shortfall_cap`` target-gaps or more below the target."""
    shortfall_cap: float = 10.0
    """Shortfall is measured in units of ``1 - qos_target`` and saturates here (0.89 for a 0.99 target)."""
    cost_weight: float = 0.2
    """Penalty for billing all ``workers.max`` workers for one period (linear in the count)."""
    scaling_penalty: float = 0.02
    """Penalty per decision that changes the target (discourages thrashing)."""

    def qos_shortfall(self, t: PoolTelemetry) -> float:
        """How far the period's QoS fell short of the target, in [0, 1] (1 = at or past the cap)."""
        qos = t.qos
        if t.completed == 0 and t.queue_length > 0:
            qos = 0.0  # a stalled farm must not look perfect
        gaps = max(0.0, self.qos_target - qos) / (1.0 - self.qos_target)
        return min(gaps, self.shortfall_cap) / self.shortfall_cap

    def reward(self, t: PoolTelemetry, max_workers: int, changed: bool) -> float:
        billed = t.workers_ready + t.workers_starting + t.workers_stopping
        return (
            -self.qos_weight * self.qos_shortfall(t)
            - self.cost_weight * billed / max_workers
            - self.scaling_penalty * float(changed)
        )


class FarmBackend(Protocol):
    """Where the env's actions go: the simulator, or (later) a live pool over NATS."""

    def reset(self, seed: int) -> PoolTelemetry:
        """Start an episode with the scenario's initial workers; telemetry of its first (warm-up) period."""
        ...

    def apply(self, target_workers: int) -> None:
        """Ask for ``target_workers`` workers (clamped to the scenario bounds)."""
        ...

    def advance(self, step_seconds: float) -> PoolTelemetry:
        """Let one control period pass and return its telemetry."""
        ...

    def totals(self) -> EpisodeTotals:
        """Figures of the episode so far."""
        ...


class SimulatedFarm:
    """``FarmBackend`` over :class:`FarmSimulator`."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.simulator = FarmSimulator(scenario, seed=0)

    def reset(self, seed: int) -> PoolTelemetry:
        self.simulator.reset(seed)
        return self.simulator.advance(self.scenario.step_seconds)

    def apply(self, target_workers: int) -> None:
        self.simulator.set_target(target_workers)

    def advance(self, step_seconds: float) -> PoolTelemetry:
        return self.simulator.advance(step_seconds)

    def totals(self) -> EpisodeTotals:
        return self.simulator.totals()


class FarmScalingEnv(gym.Env[np.ndarray, np.integer]):
    """
    ## Description

    A task farm (an emitter feeding a FIFO queue, served by a pool of stateless
    workers, one task each) under a time-varying Poisson load. Every
    ``step_seconds`` the agent adds or removes workers. Added workers need a cold
    start before they serve; removed workers finish their task first. Each task
    has a deadline (a multiple of its own service time); the goal is to keep the
    fraction of tasks meeting it at the target with as few workers and as few
    scaling changes as possible. After Li, Coppola et al., "RL-managed farm
    skeletons on serverless" (arXiv 2602.06555).

    ## Action Space

    ``Discrete(3)`` for ``action_mode="unit"``: 0 remove one worker, 1 keep, 2 add
    one. ``action_mode="wide"`` gives ``Discrete(9)``: action ``a`` changes the
    target by ``a - 4`` (-4 .. +4). Targets are clamped to ``workers.min/max``.

    ## Observation Space

    ``Box(9,)`` float32, from :func:`observation_from_telemetry` (see
    ``OBSERVATION_FIELDS``): backlog, ready, starting, offered load, throughput
    (all in workers / ``workers.max``; backlog = queue x mean service / step),
    mean and max latency / mean deadline, the period's QoS, and the gap
    (load + backlog - ready - starting) / ``workers.max``. Bounds: low
    ``OBSERVATION_LOW``, high ``OBSERVATION_HIGH``; values are clipped.

    ## Rewards

    ``r = -qos_weight * shortfall - cost_weight * billed / workers.max -
    scaling_penalty * [target changed]`` with ``shortfall = min(max(0, target -
    qos) / (1 - target), cap) / cap`` (see :class:`RewardConfig`). Missing the
    QoS target by one target-gap (0.98 for 0.99) costs as much as 16 of 32
    workers for a period, so meeting the target dominates, then cost, then
    stability. A period with no completion but a queue counts as QoS 0.

    ## Starting State

    ``workers.initial`` warm workers and an empty queue; one warm-up period runs
    without a decision, and its telemetry is the first observation. The episode's
    workload is drawn from an integer seed >= 2**32 taken from ``self.np_random``.

    ## Episode End

    Never terminates (the farm is a continuing system); truncated after
    ``scenario.max_steps`` decisions. On the last step ``info["totals"]`` holds
    the :class:`EpisodeTotals` (QoS over every task, worker-seconds, ...).

    ## Arguments

    * ``scenario``: shipped name (``"bursty"``), path to a scenario file, or a ``Scenario``.
    * ``action_mode``: ``"unit"`` (default) or ``"wide"``.
    * ``reward``: a :class:`RewardConfig` (default weights above).
    * ``backend``: a :class:`FarmBackend`; default :class:`SimulatedFarm`.

    ``gymnasium.make("p2pfaas/FarmScaling-v0", scenario="bursty")`` after ``import controller``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        scenario: str | Scenario = "bursty",
        action_mode: ActionMode = "unit",
        reward: RewardConfig | None = None,
        backend: FarmBackend | None = None,
    ) -> None:
        if action_mode not in ACTION_DELTAS:
            raise ValueError(f"action_mode must be one of {sorted(ACTION_DELTAS)}, got {action_mode!r}")
        self.scenario = load_scenario(scenario)
        self.deltas = ACTION_DELTAS[action_mode]
        self.reward_config = reward or RewardConfig()
        self.backend: FarmBackend = backend if backend is not None else SimulatedFarm(self.scenario)
        self.action_space = spaces.Discrete(len(self.deltas))
        self.observation_space = spaces.Box(OBSERVATION_LOW, OBSERVATION_HIGH, dtype=np.float32)
        self._target = self.scenario.workers.initial
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        episode_seed = int(self.np_random.integers(TRAINING_SEED_FLOOR, 2**63))
        telemetry = self.backend.reset(episode_seed)
        self._target = self.scenario.workers.initial
        self._steps = 0
        info = {"telemetry": telemetry, "target": self._target, "episode_seed": episode_seed}
        return observation_from_telemetry(telemetry, self.scenario), info

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r} for {self.action_space}")
        bounds = self.scenario.workers
        target = min(bounds.max, max(bounds.min, self._target + self.deltas[int(action)]))
        changed = target != self._target
        self._target = target
        self.backend.apply(target)
        telemetry = self.backend.advance(self.scenario.step_seconds)
        self._steps += 1
        reward = self.reward_config.reward(telemetry, bounds.max, changed)
        truncated = self._steps >= self.scenario.steps
        info: dict[str, Any] = {"telemetry": telemetry, "target": target, "changed": changed}
        if truncated:
            info["totals"] = self.backend.totals()
        return observation_from_telemetry(telemetry, self.scenario), float(reward), False, truncated, info
