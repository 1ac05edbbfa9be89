"""P2PFaaS's learner model: tabular SARSA with differential (average-reward) updates (Sutton &
Barto, sec. 10.3), epsilon-greedy, trained on windows of contiguous EIDs. Unlike P2PFaaS, avg_r is
incremented (not assigned) and states are tuples of floats (not concatenated strings)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from .agent import (
    MAX_PARAMETER,
    Progress,
    WeightsCodec,
    check_action,
    greedy_or_default,
    interact,
    load_checkpoint,
    save_checkpoint,
    table_from_state,
    table_to_state,
)

State = tuple[float, ...]


@dataclass
class DifferentialSarsaConfig:
    alpha: float = 0.01
    """Step size of the Q-table updates."""
    beta: float = 0.01
    """Step size of the average-reward estimate."""
    epsilon_start: float = 0.9
    """Exploration epsilon after construction or reset()."""
    epsilon_min: float = 0.1
    """Epsilon stops decaying here."""
    epsilon_decay: float = 0.99
    """Epsilon is multiplied by this after every exploring act()."""
    epsilon_decay_enabled: bool = True
    """Whether epsilon decays at all."""
    window_size: int = 5
    """Contiguous EIDs the learner service collects before calling train_window()."""
    default_action: int = 1
    """The answer for a state never trained (and the winner of ties): 1, run here."""


def state_key(obs: Any) -> State:
    """A state's table key: the tuple of its values (any length), rounded to float32 so that
    0.8 from JSON and np.float32(0.8) from an env are one state. Integers stay exact up to 2**24."""
    values = np.asarray(obs, dtype=np.float32).ravel()
    if not np.isfinite(values).all():
        raise ValueError(f"state has non-finite values: {values}")
    return tuple(values.tolist())


def _field(sample: Any, name: str) -> Any:
    return sample[name] if isinstance(sample, Mapping) else getattr(sample, name)


def _coerce(kind: type, value: Any) -> Any:
    """Parameters may arrive as strings (P2PFaaS sends them so)."""
    if kind is bool and isinstance(value, str):
        if value.strip().lower() not in {"true", "false", "1", "0"}:
            raise ValueError(f"not a boolean: {value!r}")
        return value.strip().lower() in {"true", "1"}
    out = kind(value)
    if kind in (int, float) and (not math.isfinite(out) or abs(out) > MAX_PARAMETER):   # the checkpoint must hold it
        raise ValueError(f"not a finite number of at most {MAX_PARAMETER:.0e} in size: {value!r}")
    return out


class DifferentialSarsa(WeightsCodec):
    """Differential SARSA. `act(explore=True)` is P2PFaaS's /act, `train_window()` its
    /train_batch, `parameters()`/`set_parameters()`/`stats()`/`reset()` its /learner routes."""

    algorithm = "dsarsa"
    config_class = DifferentialSarsaConfig
    check_obs_dim = False   # states may have any length

    def __init__(
        self, obs_dim: int = 0, n_actions: int = 2, config: DifferentialSarsaConfig | None = None, seed: int = 0
    ):
        # obs_dim is informative only: a state is a tuple of any length
        self.obs_dim, self.n_actions, self.seed = int(obs_dim), int(n_actions), seed
        self.config = config or DifferentialSarsaConfig()
        self.rng = np.random.default_rng(seed)
        self.pending: tuple[State, int, float, State] | None = None  # see SarsaLambda.update
        self.reset()

    def reset(self) -> None:
        """Forget everything learned: Q-table, average reward, epsilon and counters."""
        self.q: dict[State, np.ndarray] = {}
        self.average_reward = 0.0
        self.epsilon = self.config.epsilon_start
        self.pending = None
        self.inferences = self.trained_items = self.windows = 0
        self.eid_last_trained: int | None = None

    def _row(self, state: State) -> np.ndarray:
        row = self.q.get(state)
        if row is None:
            row = self.q[state] = np.zeros(self.n_actions)
        return row

    def act(self, obs: Any, explore: bool = False) -> int:
        """Greedy action; with explore, epsilon-greedy and epsilon decays (read `epsilon` before the call)."""
        row = self.q.get(state_key(obs))
        default = min(self.config.default_action, self.n_actions - 1)
        if explore:
            self.inferences += 1
            c = self.config
            explored = self.rng.random() < self.epsilon
            if c.epsilon_decay_enabled and self.epsilon > c.epsilon_min:
                self.epsilon = max(c.epsilon_min, self.epsilon * c.epsilon_decay)
            if explored:
                return int(self.rng.integers(self.n_actions))
        return default if row is None else greedy_or_default(row, default)

    def differential_update(self, state: State, action: int, reward: float, next_value: float) -> float:
        """delta = r - avg_r + Q(s',a') - Q(s,a); avg_r += beta*delta; Q(s,a) += alpha*delta."""
        row = self._row(state)
        delta = float(reward - self.average_reward + next_value - row[action])
        self.average_reward += self.config.beta * delta
        row[action] += self.config.alpha * delta
        self.trained_items += 1
        return delta

    def train_window(self, samples: Iterable[Any]) -> dict:
        """Train on samples with `eid`, `state`, `action`, `reward` (mappings or objects), sorted
        by EID; a gap splits the window into runs, a repeated EID is ignored. A run's last sample
        has no successor and is not trained: pass it again at the head of the next window."""
        by_eid: dict[int, tuple[State, int, float]] = {}
        for sample in samples:  # parse all first: a bad sample refuses the window, untrained
            eid = int(_field(sample, "eid"))
            parsed = (state_key(_field(sample, "state")), check_action(self, _field(sample, "action")),
                      float(_field(sample, "reward")))
            by_eid.setdefault(eid, parsed)
        eids = sorted(by_eid)
        runs = sum(1 for i, eid in enumerate(eids) if i == 0 or eids[i - 1] != eid - 1)
        deltas = []
        for eid in eids:
            if eid + 1 not in by_eid:
                continue
            (state, action, reward), (next_state, next_action, _) = by_eid[eid], by_eid[eid + 1]
            deltas.append(self.differential_update(state, action, reward, self._row(next_state)[next_action]))
            self.eid_last_trained = eid + 1
        self.windows += 1
        return {
            "trained": len(deltas),
            "runs": runs,
            "losses/td_error": float(np.mean(np.abs(deltas))) if deltas else 0.0,
            "charts/average_reward": self.average_reward,
        }

    def update(self, obs, action, reward, next_obs, done, truncated: bool = False) -> dict:
        """One transition; its update waits for the next action (next transition). Terminated:
        Q(s',.) = 0; truncated or not continued: bootstrap with the epsilon-greedy expectation."""
        state, next_state, action = state_key(obs), state_key(next_obs), check_action(self, action)
        deltas = []
        if self.pending is not None:
            p_state, p_action, p_reward, p_next = self.pending
            self.pending = None
            next_value = self._row(state)[action] if p_next == state else self._expected_value(p_next)
            deltas.append(self.differential_update(p_state, p_action, p_reward, next_value))
        if done:
            deltas.append(self.differential_update(state, action, float(reward), 0.0))
        elif truncated:
            deltas.append(self.differential_update(state, action, float(reward), self._expected_value(next_state)))
        else:
            self.pending = (state, action, float(reward), next_state)
        metrics = {"charts/epsilon": self.epsilon, "charts/average_reward": self.average_reward}
        if deltas:
            metrics["losses/td_error"] = float(np.mean(np.abs(deltas)))
        return metrics

    def _expected_value(self, state: State) -> float:
        row = self._row(state)
        return float((1 - self.epsilon) * row.max() + self.epsilon * row.mean())

    def learn(self, env: gym.Env, total_steps: int, seed: int, progress: Progress | None = None) -> dict:
        self.rng = np.random.default_rng(seed)
        self.pending = None
        return interact(self, env, total_steps, seed, progress)

    # -- run-time parameters and stats (P2PFaaS /learner/parameters, /learner/stats) ----

    def parameters(self) -> dict[str, Any]:
        return {"actions_n": self.n_actions, **dataclasses.asdict(self.config)}

    def set_parameters(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Change hyper-parameters (strings allowed); ValueError changes nothing. Returns the new parameters."""
        kinds = {f.name: type(f.default) for f in dataclasses.fields(DifferentialSarsaConfig)}
        unknown = set(values) - set(kinds) - {"actions_n"}
        if unknown:
            raise ValueError(f"unknown parameters {sorted(unknown)}; known: {sorted(kinds) + ['actions_n']}")
        changes = {name: _coerce(kinds[name], value) for name, value in values.items() if name != "actions_n"}
        config = dataclasses.replace(self.config, **changes)
        actions_n = int(values.get("actions_n", self.n_actions))
        if actions_n < 1 or config.window_size < 2 or not (0 <= config.epsilon_min <= config.epsilon_start <= 1):
            raise ValueError("need actions_n >= 1, window_size >= 2 and 0 <= epsilon_min <= epsilon_start <= 1")
        if min(config.alpha, config.beta, config.epsilon_decay) <= 0:
            raise ValueError("alpha, beta and epsilon_decay must be > 0")
        if config.default_action < 0:
            raise ValueError("default_action must be >= 0")
        if actions_n != self.n_actions:  # new actions start at 0, removed ones are dropped
            self.q = {s: np.pad(row, (0, max(0, actions_n - len(row))))[:actions_n] for s, row in self.q.items()}
            self.n_actions = actions_n
        self.config = config
        return self.parameters()

    def stats(self) -> dict[str, Any]:
        return {
            "inferences": self.inferences,
            "trained_items": self.trained_items,
            "windows": self.windows,
            "epsilon": self.epsilon,
            "average_reward": self.average_reward,
            "states": len(self.q),
            "eid_last_trained": self.eid_last_trained,
        }

    # -- weights and checkpoints ------------------------------------------------------

    def weights_state(self) -> dict:
        return {**table_to_state(self.q, self.n_actions), "average_reward": float(self.average_reward),
                "epsilon": float(self.epsilon)}

    def load_weights_state(self, state: dict) -> None:
        self.q = table_from_state(state, self.n_actions)
        self.average_reward = float(state["average_reward"])
        self.epsilon = float(state["epsilon"])
        self.pending = None

    def save(self, path: str | Path) -> None:
        """Q-table, average reward, epsilon and counters; a pending transition is not saved."""
        counters = {"inferences": self.inferences, "trained_items": self.trained_items, "windows": self.windows,
                    "eid_last_trained": self.eid_last_trained}
        save_checkpoint(path, self, {**self.weights_state(), **counters})

    @classmethod
    def load(cls, path: str | Path) -> DifferentialSarsa:
        agent, state = load_checkpoint(path, cls)
        agent.load_weights_state(state)
        agent.inferences, agent.trained_items = state["inferences"], state["trained_items"]
        agent.windows, agent.eid_last_trained = state["windows"], state["eid_last_trained"]
        return agent
