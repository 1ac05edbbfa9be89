"""Stable-Baselines3 models (a ``.zip`` trained on ``p2pfaas/FarmScaling-v0``: DQN, PPO or A2C) as
scaling policies wherever a model file is taken. They decide only: their weights are not the node
learner's kind, so they do not learn online."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from controller.baselines import RLPolicy
from controller.features import ACTION_MODES, OBSERVATION_SIZES, ScalingActions
from controller.scenario import Scenario

EXTRA = "pip install 'p2pfaas[sb3]'"


class SB3Agent:
    """``act(obs, explore) -> action``: deterministic unless exploring."""

    online = False   # RLPolicy.learns_online

    def __init__(self, model, algorithm: str) -> None:
        self.model, self.algorithm = model, algorithm
        self.n_actions = int(model.action_space.n)
        self.obs_dim = int(model.observation_space.shape[0])

    def act(self, obs: np.ndarray, explore: bool = False) -> int:
        action, _ = self.model.predict(obs, deterministic=not explore)
        return int(action)


def load_sb3_policy(path: Path, scenario: Scenario, name: str | None = None) -> RLPolicy:
    """ValueError saying why a file cannot decide here (not an SB3 model, another env's spaces)."""
    try:
        import stable_baselines3 as sb3
        from stable_baselines3.common.save_util import load_from_zip_file
    except ImportError:
        raise ValueError(f"{path} is a Stable-Baselines3 model: that needs the sb3 extra ({EXTRA})") from None
    from gymnasium import spaces

    try:
        data, _, _ = load_from_zip_file(path, device="cpu", print_system_info=False)
    except Exception as exc:   # not a zip, or not one of SB3's
        raise ValueError(f"{path} is not a Stable-Baselines3 model ({type(exc).__name__}: {exc})") from None
    algorithm = _algorithm(data or {})
    if algorithm is None:
        raise ValueError(f"{path}: a Stable-Baselines3 model of an algorithm with discrete actions is needed "
                         "(DQN, PPO or A2C)")
    obs_space, act_space = data.get("observation_space"), data.get("action_space")
    if not isinstance(act_space, spaces.Discrete) or not isinstance(obs_space, spaces.Box) \
            or len(obs_space.shape) != 1 or obs_space.shape[0] not in OBSERVATION_SIZES:
        raise ValueError(f"{path}: trained on another env (observation {getattr(obs_space, 'shape', '?')}, "
                         f"actions {act_space}); train it on p2pfaas/FarmScaling-v0")
    modes = [m for m in ACTION_MODES if ScalingActions(m).n == act_space.n]
    if len(modes) != 1:
        raise ValueError(f"{path}: {act_space.n} actions match no action mode of the env "
                         f"({', '.join(f'{m}: {ScalingActions(m).n}' for m in ACTION_MODES)})")
    model = getattr(sb3, algorithm).load(path, device="cpu")
    return RLPolicy(name or path.name, SB3Agent(model, algorithm), scenario, modes[0])


def _algorithm(data: dict) -> str | None:
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.dqn.policies import DQNPolicy

    policy = data.get("policy_class")
    if isinstance(policy, type) and issubclass(policy, DQNPolicy):
        return "DQN"
    if isinstance(policy, type) and issubclass(policy, ActorCriticPolicy):
        return "PPO" if "clip_range" in data else "A2C"
    return None
