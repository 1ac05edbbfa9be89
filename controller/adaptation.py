"""Online adaptation in the simulator: the live controller's learning path (guard, learner model,
versions; controller/live.py) period by period over consecutive episodes, next to the shipped model
frozen on the same episodes. Unlike live, no broker in between and no experience spans two episodes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.messages import PoolTelemetry
from broker.subjects import scaling_model
from controller.baselines import RLPolicy
from controller.evaluation import episode_workloads, run_episode
from controller.features import RewardConfig
from controller.online import ModelGuard, online_weights
from controller.scenario import Scenario
from controller.training import load_model
from nodes.learner.models import ModelSlot, agent_from_weights

NODE, POOL = "sim", "farm"


class OnlineLearning:
    """A ``ScalingPolicy`` that is the live controller's RL half: guard, learner model, versions."""

    def __init__(self, agent: Any, action_mode: str, scenario: Scenario, name: str = "online",
                 reward: RewardConfig | None = None, guard_options: dict[str, Any] | None = None,
                 seed: int = 0) -> None:
        self.name = name
        self.policy = RLPolicy(name, agent, scenario, action_mode)
        self.reward = reward or RewardConfig()
        self.guard = ModelGuard(self.policy, **{"miss_cost": self.reward.miss_cost, **(guard_options or {})})
        self.slot = ModelSlot(scaling_model(POOL), agent.algorithm, agent.n_actions, agent.obs_dim, seed=seed)
        self.slot.seed(online_weights(NODE, POOL, agent))
        self.guard.floor_version = self.slot.experiences
        self._previous: tuple[Any, int, bool] | None = None
        self.periods = 0            # periods decided, over the whole run
        self.online_periods = 0     # ... by online weights

    def rebind(self, scenario: Scenario) -> None:
        self.policy.rebind(scenario)

    def reset(self) -> None:
        self.policy.reset()
        self._previous = None

    def decide(self, t: PoolTelemetry, current_target: int) -> int:
        if self.guard.observe(t) or self.guard.awaiting_reseed:
            self.slot.seed(online_weights(NODE, POOL, self.guard.anchor))
            self.guard.reseeded(self.slot.experiences)
        self.periods += 1
        self.online_periods += self.guard.online_version is not None
        wanted = self.policy.decide(t, current_target)
        self.guard.shadow(current_target, wanted)
        obs, action = self.policy.last_observation, self.policy.last_action
        bounds = self.policy.scenario.workers
        changed = bounds.clamp(wanted) != current_target
        if self._previous is not None:   # the previous decision's outcome is this period
            prev_obs, prev_action, prev_changed = self._previous
            reward = self.reward.reward(t, self.policy.scenario, prev_changed)
            self.slot.update(prev_obs.tolist(), prev_action, reward, obs.tolist(), False)
            if self.slot.fresh:   # trained: the learner publishes a version, the controller's copy takes it
                self.slot.fresh = False
                weights = self.slot.weights(NODE)
                self.guard.offer(agent_from_weights(weights), weights.version)
        self._previous = (obs, action, changed)
        return wanted


@dataclass(frozen=True)
class OnlineEpisode:
    index: int
    seed: int
    scenario: str
    online_cost: float         # -(the env's return) with online learning
    shipped_cost: float        # the shipped model, frozen, on the same episode
    online_qos: float
    shipped_qos: float
    online_workers: float
    shipped_workers: float
    model_version: str         # deciding at the episode's end
    periods: int               # periods decided so far
    online_periods: int        # ... by online weights
    rollbacks: int             # so far
    promotions: int            # so far


def run_online(model: Path, workloads: str, episodes: int, seed: int = 0, reward: RewardConfig | None = None,
               guard_options: dict[str, Any] | None = None, panic: bool = True,
               progress: Callable[[OnlineEpisode], None] | None = None) -> Iterator[OnlineEpisode]:
    """Episodes ``seed ..`` of ``workloads`` in turn with one online learner, each also run frozen."""
    reward = reward or RewardConfig()
    agent, metadata = load_model(model)
    frozen_agent, _ = load_model(model)
    mode = metadata.get("action_mode", "unit")
    plan = episode_workloads(workloads, episodes, seed)
    learner = OnlineLearning(agent, mode, plan[0][0], reward=reward, guard_options=guard_options, seed=seed)
    frozen = RLPolicy("shipped", frozen_agent, plan[0][0], mode)
    for index, (scenario, episode_seed) in enumerate(plan):
        learner.rebind(scenario)
        frozen.rebind(scenario)
        online = run_episode(scenario, learner, episode_seed, reward, panic=panic)
        shipped = run_episode(scenario, frozen, episode_seed, reward, panic=panic)
        episode = OnlineEpisode(
            index=index, seed=episode_seed, scenario=scenario.name,
            online_cost=-online.episode_return, shipped_cost=-shipped.episode_return,
            online_qos=online.totals.qos, shipped_qos=shipped.totals.qos,
            online_workers=online.totals.mean_workers, shipped_workers=shipped.totals.mean_workers,
            model_version=learner.guard.version, periods=learner.periods, online_periods=learner.online_periods,
            rollbacks=learner.guard.rollbacks, promotions=learner.guard.promotions)
        if progress is not None:
            progress(episode)
        yield episode
