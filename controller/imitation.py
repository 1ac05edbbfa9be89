"""Warm start for PPO: the actor imitates, on each training episode, the target action that did best
held constant over it (hindsight on training seeds only, so the model stays causal), and the critic
learns its discounted returns; PPO trains on from there (docs/autoscaling.md, "Warm start")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from controller.env import FarmScalingEnv


@dataclass(frozen=True)
class Demonstrations:
    observations: np.ndarray      # (n, obs_dim) float32
    actions: np.ndarray           # (n,) the episode's best constant action at every observation
    returns: np.ndarray           # (n,) discounted returns from each observation under that action
    counts: dict[str, int]        # episodes per best action


def _rollout(env: FarmScalingEnv, episode_seed: int, action: int) -> tuple[list[np.ndarray], list[float]]:
    obs, _ = env.reset(seed=episode_seed)
    seen, rewards = [obs], []
    while True:
        obs, reward, terminated, truncated, _ = env.step(action)
        rewards.append(float(reward))
        if terminated or truncated:
            return seen, rewards
        seen.append(obs)


def best_constant_demonstrations(env: FarmScalingEnv, episodes: int, gamma: float, seed: int,
                                 progress: Callable[[int, int], None] | None = None) -> Demonstrations:
    """Each target action but keep held over each episode; the best return labels its observations."""
    from controller.features import action_names

    if env.actions.mode != "target":
        raise ValueError("a warm start needs the 'target' action mode: its actions are staffing levels")
    rng = np.random.default_rng(seed)
    observations: list[np.ndarray] = []
    actions: list[int] = []
    returns: list[float] = []
    counts = np.zeros(env.action_space.n, dtype=int)
    for done in range(episodes):
        episode_seed = int(rng.integers(2**40, 2**62))    # the env draws workload and scenario from it
        best: tuple[float, int, list[np.ndarray], list[float]] | None = None
        for action in range(1, env.action_space.n):
            seen, rewards = _rollout(env, episode_seed, action)
            if best is None or sum(rewards) > best[0]:
                best = (sum(rewards), action, seen, rewards)
        assert best is not None
        _, action, seen, rewards = best
        counts[action] += 1
        discounted, g = [], 0.0
        for reward in reversed(rewards):
            g = reward + gamma * g
            discounted.append(g)
        observations += seen
        actions += [action] * len(seen)
        returns += discounted[::-1]
        if progress is not None:
            progress(done + 1, episodes)
    names = action_names("target")
    return Demonstrations(np.asarray(observations, dtype=np.float32), np.asarray(actions, dtype=np.int64),
                          np.asarray(returns, dtype=np.float32),
                          {names[a]: int(n) for a, n in enumerate(counts) if n})


def imitate(agent, demos: Demonstrations, epochs: int = 30, smoothing: float = 0.05) -> float:
    """Fit a PPO agent's actor (label-smoothed cross-entropy) and critic to the demonstrations; the
    share of greedy actions matching the label. Minibatches from torch's generator (the agent's seed)."""
    import torch

    network = getattr(agent, "network", None)
    if network is None or not hasattr(network, "actor") or not hasattr(network, "value"):
        raise ValueError(f"a warm start needs an actor-critic agent (pg), not {agent.algorithm!r}")
    x, a, g = (torch.from_numpy(demos.observations), torch.from_numpy(demos.actions),
               torch.from_numpy(demos.returns))
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for start in range(0, len(x), 256):
            batch = order[start:start + 256]
            loss = (torch.nn.functional.cross_entropy(network.actor(x[batch]), a[batch], label_smoothing=smoothing)
                    + 0.5 * ((network.value(x[batch]) - g[batch]) ** 2).mean())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        return float((network.actor(x).argmax(1) == a).float().mean())
