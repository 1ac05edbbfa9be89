"""Gymnasium environment for farm autoscaling, over a pluggable backend (simulator or live pool).

Observation, actions and reward come from controller/features.py, which the evaluation
and the live controller use too: agents act live on exactly what they were trained on.
"""

from __future__ import annotations

from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from broker.messages import PoolTelemetry
from controller.features import (
    ACTION_DELTAS,
    OBSERVATION_FIELDS,
    OBSERVATION_HIGH,
    OBSERVATION_LOW,
    ActionMode,
    ObservationBuilder,
    RewardConfig,
    ScalingActions,
)
from controller.panic import PanicRule
from controller.scenario import Scenario, load_scenario
from controller.simulator import EpisodeTotals, FarmSimulator
from controller.workloads import FAMILIES, TRAINING_MIXES, training_scenario

__all__ = [
    "ACTION_DELTAS", "OBSERVATION_FIELDS", "TRAINING_SEED_FLOOR", "FarmBackend", "FarmScalingEnv", "RewardConfig",
    "SimulatedFarm",
]

# Episode seeds the env draws itself are >= 2**32; evaluation uses seeds below, so they never meet.
TRAINING_SEED_FLOOR = 2**32


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
    """``FarmBackend`` over :class:`FarmSimulator` (``instant``: the oracle's farm, no delays;
    ``panic``: the controller's reaction between periods, controller/panic.py)."""

    def __init__(self, scenario: Scenario, instant: bool = False, panic: PanicRule | None = None) -> None:
        self.scenario = scenario
        self.simulator = FarmSimulator(scenario, seed=0, instant=instant)
        self.panic = panic

    @property
    def target(self) -> int:
        """The target now: the last one applied, or what the panic rule raised it to since."""
        return self.simulator.target

    def reset(self, seed: int) -> PoolTelemetry:
        self.simulator.reset(seed)
        return self.simulator.advance(self.scenario.step_seconds)

    def apply(self, target_workers: int) -> None:
        self.simulator.set_target(target_workers)

    def advance(self, step_seconds: float) -> PoolTelemetry:
        if self.panic is None:
            return self.simulator.advance(step_seconds)
        return self.simulator.advance(step_seconds, react=self.panic.react, tick_s=self.panic.tick_s)

    def totals(self) -> EpisodeTotals:
        return self.simulator.totals()


class FarmScalingEnv(gym.Env[np.ndarray, np.integer]):
    """
    ## Description

    A task farm (an emitter feeding a FIFO queue, served by a pool of stateless
    workers, one task each) under a time-varying Poisson load. Every
    ``step_seconds`` the agent sets the number of workers. Added workers need a cold
    start before they serve; removed workers finish their task first. Each task
    has a deadline (a multiple of its own service time); the goal is to meet as many
    deadlines as the price of a miss is worth, with as few worker-seconds and as few
    scaling changes as possible. After Li, Coppola et al., "RL-managed farm
    skeletons on serverless" (arXiv 2602.06555).

    ## Action Space

    ``action_mode="unit"``: ``Discrete(3)``, 0 remove one worker, 1 keep, 2 add one.
    ``"wide"``: ``Discrete(9)``, action ``a`` changes the target by ``a - 4``.
    ``"target"``: ``Discrete(7)``, 0 keeps the target, ``k`` sets it to
    ``ceil(need + beta_k sqrt(need))`` with ``beta`` in ``TARGET_BETAS`` (0.5 .. 4) and
    need = load + backlog in workers: any size in one decision. Targets are clamped to
    ``workers.min/max``.

    ## Observation Space

    ``Box(14,)`` float32 from :class:`ObservationBuilder` (``OBSERVATION_FIELDS``): the
    load, its trend, peak and spread over the last 6 periods, the backlog and its growth,
    workers ready and still starting (worker counts / 32), the headroom in square-root
    staffing units, the period's QoS and p95 latency / mean deadline, and the farm's
    constants: mean cold start / step, ``workers.max`` / 32, deadline slack.

    ## Rewards

    ``r = -(billed + miss_cost x missed x S / T) / 32 - change_penalty x [target changed]``
    (:class:`RewardConfig`): the period's worker-seconds and its missed deadlines, each
    priced in worker-seconds (a miss costs ``miss_cost`` = 60 times a task's work).

    ## Starting State

    ``workers.initial`` warm workers and an empty queue; one warm-up period runs
    without a decision, and its telemetry is the first observation. The episode's
    workload is drawn from an integer seed >= 2**32 taken from ``self.np_random``; with
    ``scenario="generated"`` that seed also draws the scenario itself
    (controller/workloads.py), so every episode is a new workload.

    ## Episode End

    Never terminates (the farm is a continuing system); truncated after
    ``scenario.max_steps`` decisions. On the last step ``info["totals"]`` holds
    the :class:`EpisodeTotals` (QoS over every task, worker-seconds, ...).

    ## Arguments

    * ``scenario``: shipped name (``"bursty"``), path to a scenario file, a ``Scenario``,
      ``"generated"`` (a new generated workload every episode), ``"mixed"`` (half generated,
      half the shipped scenarios, on training seeds) or ``"mixed-paper"`` (the paper's setting
      for a quarter of the episodes, ``mixed`` for the rest).
    * ``action_mode``: ``"unit"`` (default), ``"wide"`` or ``"target"``.
    * ``reward``: a :class:`RewardConfig`.
    * ``backend``: a :class:`FarmBackend`; default :class:`SimulatedFarm`.
    * ``panic``: the controller's reaction between periods (controller/panic.py) runs in the
      simulated farm, as it does live (default True).

    ``gymnasium.make("p2pfaas/FarmScaling-v0", scenario="bursty")`` after ``import controller``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        scenario: str | Scenario = "bursty",
        action_mode: ActionMode = "unit",
        reward: RewardConfig | None = None,
        backend: FarmBackend | None = None,
        panic: bool = True,
    ) -> None:
        self.actions = ScalingActions(action_mode)
        self.panic = panic
        self.family = scenario if isinstance(scenario, str) and (scenario in FAMILIES or scenario in TRAINING_MIXES) else None
        if self.family and backend is not None:
            raise ValueError("generated workloads run on the simulator: do not pass a backend")
        self._use(training_scenario(self.family, TRAINING_SEED_FLOOR) if self.family else load_scenario(scenario),
                  backend)
        self.reward_config = reward or RewardConfig()
        self.action_space = spaces.Discrete(self.actions.n)
        self.observation_space = spaces.Box(OBSERVATION_LOW, OBSERVATION_HIGH, dtype=np.float32)
        self._steps = 0

    def _use(self, scenario: Scenario, backend: FarmBackend | None = None) -> None:
        self.scenario = scenario
        self.backend: FarmBackend = (backend if backend is not None else
                                     SimulatedFarm(scenario, panic=PanicRule(scenario) if self.panic else None))
        self.observe = ObservationBuilder(scenario)
        self._target = scenario.workers.initial

    @property
    def deltas(self) -> tuple[int, ...]:
        """The target changes of the ``unit``/``wide`` actions."""
        return ACTION_DELTAS[self.actions.mode]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        episode_seed = int(self.np_random.integers(TRAINING_SEED_FLOOR, 2**63))
        if self.family:
            self._use(training_scenario(self.family, episode_seed))
        telemetry = self.backend.reset(episode_seed)
        self.observe.reset()
        self._target = self.scenario.workers.initial
        self._steps = 0
        info = {"telemetry": telemetry, "target": self._target, "episode_seed": episode_seed,
                "scenario": self.scenario.name}
        return self.observe(telemetry), info

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r} for {self.action_space}")
        bounds = self.scenario.workers
        wanted = self.actions.target(int(action), self._target, self.observe)
        target = min(bounds.max, max(bounds.min, wanted))
        changed = target != self._target
        self._target = target
        self.backend.apply(target)
        telemetry = self.backend.advance(self.scenario.step_seconds)
        self._target = getattr(self.backend, "target", self._target)   # raised between periods by the panic rule
        self._steps += 1
        reward = self.reward_config.reward(telemetry, self.scenario, changed)
        truncated = self._steps >= self.scenario.steps
        info: dict[str, Any] = {"telemetry": telemetry, "target": target, "changed": changed}
        if truncated:
            info["totals"] = self.backend.totals()
        return self.observe(telemetry), float(reward), False, truncated, info
