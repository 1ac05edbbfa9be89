"""Gymnasium environment for farm autoscaling, over a simulator or live-pool backend; observation,
actions and reward come from controller/features.py, as in the evaluation and the live controller."""

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
    check_observation_size,
)
from controller.panic import PanicRule
from controller.scenario import Scenario, load_scenario
from controller.simulator import EpisodeTotals, FarmSimulator
from controller.workloads import FAMILIES, TRAINING_MIXES, is_mix, training_scenario

__all__ = [
    "ACTION_DELTAS", "OBSERVATION_FIELDS", "TRAINING_SEED_FLOOR", "FarmBackend", "FarmScalingEnv", "RewardConfig",
    "SimulatedFarm",
]

# Episode seeds the env draws itself are >= 2**32; evaluation uses seeds below, so they never meet.
TRAINING_SEED_FLOOR = 2**32


class FarmBackend(Protocol):
    """Where the env's actions go: the simulator, or a live pool over NATS (controller/live_env.py)."""

    def reset(self, seed: int) -> PoolTelemetry:
        """Start with the initial workers; the warm-up period's telemetry."""
        ...

    def apply(self, target_workers: int) -> None:
        ...

    def advance(self, step_seconds: float) -> PoolTelemetry:
        ...

    def totals(self) -> EpisodeTotals:
        ...


class SimulatedFarm:
    """``FarmBackend`` over the simulator (``instant``: the oracle's farm, no delays)."""

    def __init__(self, scenario: Scenario, instant: bool = False, panic: PanicRule | None = None) -> None:
        self.scenario = scenario
        self.simulator = FarmSimulator(scenario, seed=0, instant=instant)
        self.panic = panic

    @property
    def target(self) -> int:
        """The last target applied, or what the panic rule raised it to since."""
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
    """A task farm (FIFO queue, one task per worker, cold starts) under a time-varying Poisson load;
    every ``step_seconds`` the agent sets the number of workers (docs/autoscaling.md has the details).

    * Actions: ``unit`` Discrete(3) -1/keep/+1; ``wide`` Discrete(9) ``a - 4``; ``target`` Discrete(7):
      keep, or ``ceil(need + beta sqrt(need))`` (``TARGET_ACTIONS``). Targets clamped to ``workers.min/max``.
    * Observation: Box(16,) float32, ``OBSERVATION_FIELDS`` (worker counts / 32); ``observation_size=14``
      the first 14, as models made before the long-memory fields take.
    * Reward: ``-(billed + miss_cost x missed x S / T) / 32 - change_penalty x [target changed]``
      (``RewardConfig``: worker-seconds, a miss priced at ``miss_cost`` = 60 times its work).
    * Never terminates; truncated after ``scenario.max_steps`` decisions, the last ``info["totals"]``
      the ``EpisodeTotals``. One warm-up period runs before the first observation.
    * Each episode's workload seed is drawn >= 2**32 from ``np_random``; ``scenario`` "generated",
      "mixed", "mixed-paper" or a mix (``paper:40,bursty:20,mixed:40``) draws the scenario from it too
      (controller/workloads.py).
    * ``panic``: the controller's reaction between periods (controller/panic.py) runs here as live.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        scenario: str | Scenario = "bursty",
        action_mode: ActionMode = "unit",
        reward: RewardConfig | None = None,
        backend: FarmBackend | None = None,
        panic: bool = True,
        observation_size: int = len(OBSERVATION_FIELDS),
    ) -> None:
        self.actions = ScalingActions(action_mode)
        self.observation_size = check_observation_size(observation_size)
        self.panic = panic
        self.family = scenario if isinstance(scenario, str) and (scenario in FAMILIES or scenario in TRAINING_MIXES
                                                                 or is_mix(scenario)) else None
        if self.family and backend is not None:
            raise ValueError("generated workloads run on the simulator: do not pass a backend")
        self._use(training_scenario(self.family, TRAINING_SEED_FLOOR) if self.family else load_scenario(scenario),
                  backend)
        self.reward_config = reward or RewardConfig()
        self.action_space = spaces.Discrete(self.actions.n)
        n = self.observation_size
        self.observation_space = spaces.Box(OBSERVATION_LOW[:n], OBSERVATION_HIGH[:n], dtype=np.float32)
        self._steps = 0

    def _use(self, scenario: Scenario, backend: FarmBackend | None = None) -> None:
        self.scenario = scenario
        self.backend: FarmBackend = (backend if backend is not None else
                                     SimulatedFarm(scenario, panic=PanicRule(scenario) if self.panic else None))
        self.observe = ObservationBuilder(scenario, self.observation_size)
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
        target = bounds.clamp(wanted)
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
