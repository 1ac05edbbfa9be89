"""What every RL agent shares: the `Agent` protocol others code against, the one codec for
weights and checkpoints (torch.save, always loaded weights_only), and learn()'s env loop."""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import gymnasium as gym
import numpy as np
import torch

FORMAT_VERSION = 1
Progress = Callable[[int, int], None]
ConfigT = TypeVar("ConfigT")


@runtime_checkable
class Agent(Protocol):
    """The interface of every class in `AGENTS` (see docs/agents.md)."""

    obs_dim: int
    n_actions: int

    def act(self, obs: np.ndarray, explore: bool = False) -> int: ...

    def learn(self, env: gym.Env, total_steps: int, seed: int, progress: Progress | None = None) -> dict: ...

    def update(self, obs, action, reward, next_obs, done, truncated: bool = False) -> dict: ...

    def save(self, path: str | Path) -> None: ...

    def get_weights(self) -> bytes: ...

    def set_weights(self, b: bytes) -> None: ...


class IncompatibleWeights(ValueError):
    """Weights or a checkpoint made by another algorithm or for other dimensions."""


MAX_PARAMETER = 1e15   # no hyper-parameter is larger; a larger one would not fit a checkpoint's manifest


def to_bytes(payload: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> dict[str, Any]:
    """Decode a payload made by to_bytes. weights_only: loading can never execute code."""
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for garbage input
        raise IncompatibleWeights(f"not an agent weights payload: {exc}") from exc
    if not isinstance(payload, dict):
        raise IncompatibleWeights(f"not an agent weights payload: a {type(payload).__name__}")
    return payload


def _envelope(agent: Any, state: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Who made the state, for which dimensions."""
    return {"algorithm": agent.algorithm, "format": FORMAT_VERSION, "obs_dim": agent.obs_dim,
            "n_actions": agent.n_actions, "state": state, **extra}


def _open(payload: dict[str, Any], algorithm: str, **expected: int | None) -> dict[str, Any]:
    """Check the envelope (and the expected dimensions); raise IncompatibleWeights why not."""
    made_by = (payload.get("algorithm"), payload.get("format"))
    if made_by != (algorithm, FORMAT_VERSION):
        raise IncompatibleWeights(
            f"expected {algorithm!r} format {FORMAT_VERSION}, got {made_by[0]!r} format {made_by[1]!r}"
        )
    for name, want in expected.items():
        if want is not None and payload[name] != want:
            raise IncompatibleWeights(f"{algorithm}: {name} is {want}, the weights were made for {payload[name]}")
    return payload


def weights_to_bytes(agent: Any, state: dict[str, Any]) -> bytes:
    """get_weights(): what acting needs, in an envelope that set_weights() checks."""
    return to_bytes(_envelope(agent, state))


def weights_from_bytes(agent: Any, data: bytes, check_obs_dim: bool = True) -> dict[str, Any]:
    obs_dim = agent.obs_dim if check_obs_dim else None
    return _open(from_bytes(data), agent.algorithm, obs_dim=obs_dim, n_actions=agent.n_actions)["state"]


class WeightsCodec:
    """An agent's get_weights()/set_weights() over its weights_state()/load_weights_state()."""

    check_obs_dim = True

    def get_weights(self) -> bytes:
        return weights_to_bytes(self, self.weights_state())

    def set_weights(self, b: bytes) -> None:
        self.load_weights_state(weights_from_bytes(self, b, self.check_obs_dim))


def save_checkpoint(path: str | Path, agent: Any, state: dict[str, Any]) -> None:
    """Write state + dimensions + config + seed, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(to_bytes(_envelope(agent, state, config=dataclasses.asdict(agent.config), seed=agent.seed)))
    tmp.replace(path)


def load_checkpoint(path: str | Path, cls: type) -> tuple[Any, dict[str, Any]]:
    """A new `cls` agent made from the checkpoint, and the saved state for it to restore."""
    payload = _open(from_bytes(Path(path).read_bytes()), cls.algorithm)
    config = config_from_dict(cls.config_class, payload["config"])
    return cls(payload["obs_dim"], payload["n_actions"], config, payload["seed"]), payload["state"]


def config_from_dict(cls: type[ConfigT], values: dict[str, Any]) -> ConfigT:
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown hyper-parameters {sorted(unknown)}")
    return cls(**values)


def table_to_state(q: dict[tuple, np.ndarray], n_actions: int) -> dict[str, Any]:
    """A tabular Q as weights_only-safe values: state keys (tuples) and one float64 tensor."""
    keys = list(q)
    values = np.stack([q[k] for k in keys]) if keys else np.zeros((0, n_actions))
    return {"keys": keys, "values": torch.from_numpy(values)}


def table_from_state(state: dict[str, Any], n_actions: int) -> dict[tuple, np.ndarray]:
    values = state["values"].numpy()
    if values.shape[1:] != (n_actions,):
        raise IncompatibleWeights(f"the table has {values.shape[1]} actions, this agent {n_actions}")
    return {tuple(key): values[i].copy() for i, key in enumerate(state["keys"])}


def check_action(agent: Any, action: Any) -> int:
    """An action from outside as an int in range, or ValueError (a bad experience is refused on arrival)."""
    index = int(action)
    if index != action or not 0 <= index < agent.n_actions:
        raise ValueError(f"{agent.algorithm}: action {action!r} is not in 0..{agent.n_actions - 1}")
    return index


def greedy_or_default(row: np.ndarray, default: int) -> int:
    """The greedy action of a Q-row; the default wins ties, so an unseen state gets the safe answer."""
    default = min(max(int(default), 0), len(row) - 1)
    return default if row[default] >= row.max() else int(row.argmax())


def linear_schedule(start: float, end: float, duration: int, step: int) -> float:
    """Linear interpolation from start to end over `duration` steps, then flat at end."""
    if duration <= 0:
        return end
    return start + (end - start) * min(step / duration, 1.0)


def report_every(total_steps: int) -> int:
    """How often learn() calls progress: about a hundred times per run."""
    return max(1, total_steps // 100)


def interact(agent: Agent, env: gym.Env, total_steps: int, seed: int, progress: Progress | None) -> dict[str, Any]:
    """The environment loop every learn() shares. Returns namespaced metrics: full lists for
    episodes, the mean of the last 100 values for everything update() reports."""
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    returns: list[float] = []
    lengths: list[int] = []
    recent: dict[str, list[float]] = {}
    episode_return, episode_length = 0.0, 0
    every = report_every(total_steps)
    started = time.perf_counter()
    for step in range(1, total_steps + 1):
        action = agent.act(obs, explore=True)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in agent.update(obs, action, float(reward), next_obs, terminated, truncated=truncated).items():
            values = recent.setdefault(key, [])
            values.append(float(value))
            del values[:-100]
        episode_return += float(reward)
        episode_length += 1
        if terminated or truncated:
            returns.append(episode_return)
            lengths.append(episode_length)
            episode_return, episode_length = 0.0, 0
            obs, _ = env.reset()
        else:
            obs = next_obs
        if progress is not None and (step % every == 0 or step == total_steps):
            progress(step, total_steps)
    metrics: dict[str, Any] = {key: float(np.mean(values)) for key, values in recent.items()}
    metrics["charts/episodic_return"] = returns
    metrics["charts/episodic_length"] = lengths
    metrics["charts/SPS"] = total_steps / max(time.perf_counter() - started, 1e-9)
    return metrics
