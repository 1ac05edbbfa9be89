"""A tiny seeded queue environment and evaluation helpers for the RL algorithm tests."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces


class TinyQueueEnv(gym.Env):
    """
    ## Description
    A queue holds 0..5 tasks. Serving is right when the queue is long (>= 3), waiting
    is right when it is short: the best action depends on the state.

    ## Action Space
    Discrete(2): 0 wait (the queue grows by one), 1 serve (it shrinks by two).

    ## Observation Space
    Box(0, 1, (1,), float32): queue length / 5.

    ## Rewards
    +1 for the right action, 0 otherwise.

    ## Starting State
    A uniform queue length in 0..5.

    ## Episode End
    Truncated after 20 steps; never terminated. After each step one task arrives with
    probability 0.3 (from the env's seeded RNG), so episodes visit every length.

    ## Arguments
    `max_steps`: episode length (20).
    """

    def __init__(self, max_steps: int = 20):
        self.max_steps = max_steps
        self.observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.queue = 0
        self.steps = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.queue / 5.0], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.queue = int(self.np_random.integers(0, 6))
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        right = 1 if self.queue >= 3 else 0
        reward = 1.0 if int(action) == right else 0.0
        self.queue = max(self.queue - 2, 0) if action == 1 else min(self.queue + 1, 5)
        self.queue = min(self.queue + int(self.np_random.random() < 0.3), 5)
        self.steps += 1
        return self._obs(), reward, False, self.steps >= self.max_steps, {}


def episode_returns(policy: Callable[[np.ndarray], int], seeds) -> np.ndarray:
    """Undiscounted return of `policy` on one TinyQueueEnv episode per seed."""
    env = TinyQueueEnv()
    returns = []
    for seed in seeds:
        obs, _ = env.reset(seed=int(seed))
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            total += reward
            done = terminated or truncated
        returns.append(total)
    return np.asarray(returns)


def beats_random(agent, episodes: int = 30) -> tuple[bool, str]:
    """Welch-style check that the agent's greedy policy beats a uniform random policy on
    the same evaluation seeds (unseen in training): mean gap > 3 standard errors and > 3."""
    seeds = range(10_000, 10_000 + episodes)
    rng = np.random.default_rng(123)
    trained = episode_returns(lambda obs: agent.act(obs, explore=False), seeds)
    random = episode_returns(lambda obs: int(rng.integers(2)), seeds)
    gap = trained.mean() - random.mean()
    se = np.sqrt(trained.var(ddof=1) / episodes + random.var(ddof=1) / episodes)
    verdict = f"trained {trained.mean():.2f} vs random {random.mean():.2f} (gap {gap:.2f}, se {se:.2f})"
    return bool(gap > max(3.0, 3.0 * se)), verdict


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # the tests share two cores with everything else
    yield
    torch.set_num_threads(previous)


class DelayedRewardEnv(gym.Env):
    """
    ## Description
    Two steps at most: from state A, `take` (0) ends the episode with 0.5 at once, `wait`
    (1) moves to state B, whose every action ends the episode with 1.0. With gamma 0.9,
    waiting is worth 0.9 > 0.5: only an agent that bootstraps correctly prefers it.

    ## Action Space
    Discrete(2).

    ## Observation Space
    Box(0, 1, (1,), float32): 0.0 in A, 1.0 in B.

    ## Rewards
    0.5 for take in A, 0 for wait in A, 1.0 for anything in B.

    ## Starting State
    A.

    ## Episode End
    Terminated after take in A or any action in B.

    ## Arguments
    None.
    """

    def __init__(self):
        self.observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.in_b = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.in_b = False
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        if self.in_b:
            return np.ones(1, dtype=np.float32), 1.0, True, False, {}
        if int(action) == 0:
            return np.zeros(1, dtype=np.float32), 0.5, True, False, {}
        self.in_b = True
        return np.ones(1, dtype=np.float32), 0.0, False, False, {}


@pytest.fixture(scope="session")
def queue_env() -> Callable[[], TinyQueueEnv]:
    return TinyQueueEnv


@pytest.fixture(scope="session")
def delayed_env() -> Callable[[], DelayedRewardEnv]:
    return DelayedRewardEnv


@pytest.fixture(name="beats_random", scope="session")
def beats_random_fixture():
    return beats_random


@pytest.fixture(name="episode_returns", scope="session")
def episode_returns_fixture():
    return episode_returns
