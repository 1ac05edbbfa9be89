"""Tabular SARSA(lambda) with eligibility traces (Sutton & Barto, ch. 12) over a
discretised observation, epsilon-greedy with a linear schedule."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

from .agent import (
    IncompatibleWeights,
    Progress,
    WeightsCodec,
    check_action,
    greedy_or_default,
    interact,
    linear_schedule,
    load_checkpoint,
    save_checkpoint,
    table_from_state,
    table_to_state,
)

State = tuple[int, ...]


@dataclass
class SarsaConfig:
    alpha: float = 0.1
    """Step size of the Q-table updates."""
    gamma: float = 0.99
    """Discount factor."""
    lam: float = 0.9
    """Trace decay lambda: 0 is one-step SARSA, 1 approaches Monte Carlo."""
    replacing_traces: bool = True
    """Reset a visited pair's trace to 1 (replacing) instead of adding 1 (accumulating)."""
    trace_cutoff: float = 1e-3
    """Traces that decayed below this are dropped, which bounds the work per update."""
    start_e: float = 1.0
    """Exploration epsilon at the first transition."""
    end_e: float = 0.05
    """Exploration epsilon once the schedule has run out."""
    exploration_steps: int = 10_000
    """Transitions over which epsilon falls linearly from start_e to end_e."""
    bins: int | tuple[int, ...] = 10
    """Bins per observation dimension (one int for all, or one per dimension)."""
    low: float | tuple[float, ...] = 0.0
    """Lower clip bound per dimension; values below fall in the first bin."""
    high: float | tuple[float, ...] = 1.0
    """Upper clip bound per dimension; values above fall in the last bin."""
    initial_q: float = 0.0
    """Value of a state-action pair never updated (> 0 is optimistic exploration)."""
    default_action: int | None = None
    """The answer for an untrained state (and ties): None = the middle action, "keep" for scaling."""


class Discretiser:
    """Maps an observation to a tuple of bin indices, so two different cells never share a key."""

    def __init__(self, obs_dim: int, bins, low, high):
        self.obs_dim = obs_dim
        self.bins = np.broadcast_to(np.asarray(bins, dtype=np.int64), (obs_dim,)).copy()
        self.low = np.broadcast_to(np.asarray(low, dtype=np.float64), (obs_dim,)).copy()
        self.high = np.broadcast_to(np.asarray(high, dtype=np.float64), (obs_dim,)).copy()
        if (self.bins < 1).any() or not (self.high > self.low).all():
            raise ValueError("Discretiser: every dimension needs bins >= 1 and high > low")
        self.width = (self.high - self.low) / self.bins

    def __call__(self, obs) -> State:
        # via float32, so 0.8 from JSON and np.float32(0.8) from an env land in one cell
        x = np.asarray(obs, dtype=np.float32).astype(np.float64).reshape(self.obs_dim)
        if not np.isfinite(x).all():
            raise ValueError(f"Discretiser: observation has non-finite values: {x}")
        cells = np.floor((np.clip(x, self.low, self.high) - self.low) / self.width).astype(np.int64)
        return tuple(np.minimum(cells, self.bins - 1).tolist())

    def fingerprint(self) -> tuple:
        return tuple(self.bins.tolist()), tuple(self.low.tolist()), tuple(self.high.tolist())


class SarsaLambda(WeightsCodec):
    """SARSA(lambda); `update()` takes transitions one by one, in stream order."""

    algorithm = "sarsa"
    config_class = SarsaConfig

    def __init__(self, obs_dim: int, n_actions: int, config: SarsaConfig | None = None, seed: int = 0):
        self.obs_dim, self.n_actions, self.seed = int(obs_dim), int(n_actions), seed
        self.config = config or SarsaConfig()
        self.discretise = Discretiser(self.obs_dim, self.config.bins, self.config.low, self.config.high)
        self.rng = np.random.default_rng(seed)
        self.q: dict[State, np.ndarray] = {}
        self.traces: dict[State, np.ndarray] = {}
        # the last transition waits here until the next one brings the action SARSA needs
        self.pending: tuple[State, int, float, np.ndarray] | None = None
        self.global_step = 0

    @property
    def epsilon(self) -> float:
        c = self.config
        return linear_schedule(c.start_e, c.end_e, c.exploration_steps, self.global_step)

    def _row(self, state: State) -> np.ndarray:
        row = self.q.get(state)
        if row is None:
            row = self.q[state] = np.full(self.n_actions, self.config.initial_q)
        return row

    @property
    def default_action(self) -> int:
        chosen = self.config.default_action
        return self.n_actions // 2 if chosen is None else min(int(chosen), self.n_actions - 1)

    def act(self, obs: np.ndarray, explore: bool = False) -> int:
        if explore and self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.n_actions))
        row = self.q.get(self.discretise(obs))
        if row is None:  # never seen: the safe action, not whatever index 0 means
            return self.default_action
        return greedy_or_default(row, self.default_action)

    def _expected_value(self, state: State) -> float:
        """Value of `state` under the epsilon-greedy policy: the bootstrap when the next action is unknown."""
        row, e = self._row(state), self.epsilon
        return float((1 - e) * row.max() + e * row.mean())

    def _learn(self, state: State, action: int, reward: float, next_value: float) -> float:
        c = self.config
        delta = reward + c.gamma * next_value - self._row(state)[action]
        trace = self.traces.setdefault(state, np.zeros(self.n_actions))
        trace[action] = 1.0 if c.replacing_traces else trace[action] + 1.0
        decay = c.gamma * c.lam
        for key in list(self.traces):
            self.q[key] += c.alpha * delta * self.traces[key]
            self.traces[key] *= decay
            if self.traces[key].max() < c.trace_cutoff:
                del self.traces[key]
        return float(delta)

    def _close_pending(self) -> float | None:
        if self.pending is None:
            return None
        state, action, reward, next_obs = self.pending
        self.pending = None
        delta = self._learn(state, action, reward, self._expected_value(self.discretise(next_obs)))
        self.traces.clear()
        return delta

    def update(self, obs, action, reward, next_obs, done, truncated: bool = False) -> dict:
        """One transition (`done`: terminated). If it does not start where the pending one ended,
        that one is closed with an expected bootstrap and traces are cut."""
        action, reward = check_action(self, action), float(reward)
        state, next_obs = self.discretise(obs), np.array(next_obs, dtype=np.float32)
        deltas = []
        if self.pending is not None and np.array_equal(self.pending[3], np.asarray(obs, dtype=np.float32)):
            p_state, p_action, p_reward, _ = self.pending
            self.pending = None
            deltas.append(self._learn(p_state, p_action, p_reward, self._row(state)[action]))
        elif self.pending is not None:
            deltas.append(self._close_pending())
        self.global_step += 1
        if done:
            deltas.append(self._learn(state, action, reward, 0.0))
            self.traces.clear()
        else:
            self.pending = (state, action, reward, next_obs)
            if truncated:
                deltas.append(self._close_pending())
        metrics = {"charts/epsilon": self.epsilon, "charts/states": float(len(self.q))}
        if deltas:
            metrics["losses/td_error"] = float(np.mean(np.abs(deltas)))
        return metrics

    def learn(self, env: gym.Env, total_steps: int, seed: int, progress: Progress | None = None) -> dict:
        self._close_pending()
        self.rng = np.random.default_rng(seed)
        return interact(self, env, total_steps, seed, progress)

    # -- weights and checkpoints ------------------------------------------------------

    def weights_state(self) -> dict:
        cells = self.discretise.fingerprint()
        return {**table_to_state(self.q, self.n_actions), "global_step": self.global_step, "discretisation": cells}

    def load_weights_state(self, state: dict) -> None:
        ours = self.discretise.fingerprint()
        if tuple(state["discretisation"]) != ours:
            raise IncompatibleWeights(f"sarsa: weights use discretisation {state['discretisation']}, this agent {ours}")
        self.q = table_from_state(state, self.n_actions)
        self.traces.clear()
        self.pending = None
        self.global_step = int(state["global_step"])

    def save(self, path: str | Path) -> None:
        """Q-table and step counter; traces and a pending transition are not saved."""
        save_checkpoint(path, self, self.weights_state())

    @classmethod
    def load(cls, path: str | Path) -> SarsaLambda:
        agent, state = load_checkpoint(path, cls)
        agent.load_weights_state(state)
        return agent
