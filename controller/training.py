"""RL scaling agents: hyper-parameters for the farm env, training, portable model files with a JSON
sidecar, and the shipped models. The algorithms live in nodes/learner/algorithms."""

from __future__ import annotations

import contextlib
import dataclasses
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from controller import panic
from controller.baselines import RLPolicy
from controller.env import OBSERVATION_FIELDS, FarmScalingEnv, RewardConfig
from controller.scenario import Scenario

RL_KINDS = ("dqn", "pg", "sarsa")
SHIPPED_DIR = Path(__file__).with_name("models")
DEFAULT_WORKLOADS = "mixed"
DEFAULT_ACTION_MODE = "target"
DEFAULT_STEPS = {"dqn": 200_000, "pg": 300_000, "sarsa": 200_000}
SIDECAR_SUFFIX = ".json"


def rl_agents() -> dict[str, type]:
    """The RL agent classes by kind; empty when the learner's algorithms are not installed."""
    try:
        from nodes.learner.algorithms import AGENTS
    except ImportError:
        return {}
    return {kind: AGENTS[kind] for kind in RL_KINDS if kind in AGENTS}


def agent_config(kind: str, agent_class: type, steps: int, action_mode: str) -> Any:
    """Hyper-parameters for the scaling env (docs/autoscaling.md says why): small steps, as a surge's
    misses dwarf a period's workers; for tabular SARSA a grid on the fields that drive the decision."""
    from controller.features import ScalingActions

    config_class = getattr(agent_class, "config_class", None)
    if config_class is None:
        return None
    fields = {f.name for f in dataclasses.fields(config_class)}
    values: dict[str, Any] = {"gamma": 0.9} if "gamma" in fields else {}
    if "exploration_steps" in fields:
        values["exploration_steps"] = max(1, steps // 3)
    if kind == "dqn":
        values.update(learning_starts=min(2_000, max(1, steps // 10)), buffer_size=100_000, learning_rate=1e-4,
                      batch_size=128, train_frequency=4, target_network_frequency=2_000)
    if kind == "pg":
        values.update(num_steps=2048, learning_rate=1e-4, update_epochs=8)
    if kind == "sarsa" and {"bins", "low", "high"} <= fields:
        # Fields (controller/features.py): load, trend, peak, spread, backlog, growth, ready,
        # starting, headroom, qos, p95, cold start, capacity, slack, long peak, since it. One bin
        # ignores a field: the table is the size it was before the long-memory fields.
        values["bins"] = (1, 3, 1, 3, 2, 1, 1, 2, 8, 2, 1, 1, 1, 1, 1, 1)
        values["low"] = (0, -0.03, 0, 0, 0, -1, 0, 0, -2, 0.95, 0, 0, 0, 0, 0, 0)
        values["high"] = (1, 0.03, 1, 0.25, 0.05, 1, 1, 0.03, 6, 1, 1, 1, 1, 1, 1, 1)
        values["default_action"] = ScalingActions(action_mode).keep
    return config_class(**values)


@contextlib.contextmanager
def torch_threads(n: int):
    """Small networks train several times faster on one thread, most of all on a busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def sidecar_of(path: Path) -> Path:
    return Path(path).with_suffix(SIDECAR_SUFFIX)


def shipped_model(kind: str) -> Path:
    return SHIPPED_DIR / f"scaling-{kind}.npz"


def default_model_path(models_dir: Path, kind: str, workloads: str, action_mode: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", workloads).strip("-")   # a mix: paper:40,mixed:60
    return Path(models_dir) / f"scaling-{kind}-{slug}-{action_mode}.npz"


class NotContinuable(ValueError):
    """A ``--from-model`` that cannot be trained on here (unreadable, another agent or action space)."""


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    kind: str
    path: Path
    metrics: dict
    metadata: dict


def train_agent(
    kind: str,
    workloads: str | Scenario = DEFAULT_WORKLOADS,
    steps: int | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    out: Path | None = None,
    models_dir: Path = Path("data/models"),
    action_mode: str = DEFAULT_ACTION_MODE,
    command: str = "",
    reward: RewardConfig | None = None,
    warm_start: int = 0,
    warm_start_progress: Callable[[int, int], None] | None = None,
    learning_rate: float | None = None,
    from_model: Path | None = None,
    widen: bool = False,
) -> TrainedModel:
    """Train a ``kind`` agent on the simulator (training seeds) and save it as a portable ``.npz`` with
    a JSON sidecar saying how; ``warm_start`` episodes of imitation first (controller/imitation.py);
    ``from_model``: go on training that saved model instead of a new one (fine-tuning); ``widen``: a
    model of fewer observation fields (an older release's 14) goes on with all of them."""
    agents = rl_agents()
    if kind not in agents:
        raise ValueError(f"unknown RL agent {kind!r}; available: {', '.join(agents) or 'none (nodes.learner.algorithms missing)'}")
    from nodes.learner.algorithms.portable import save_portable

    steps = steps or DEFAULT_STEPS[kind]
    if widen and from_model is None:
        raise NotContinuable("--widen widens a saved model's input: it needs --from-model")
    size = len(OBSERVATION_FIELDS) if from_model is None or widen else saved_observation_size(Path(from_model))
    env = FarmScalingEnv(workloads, action_mode=action_mode, reward=reward, observation_size=size)
    name = workloads if isinstance(workloads, str) else workloads.name
    agent_class = agents[kind]
    config = agent_config(kind, agent_class, steps, action_mode)
    if learning_rate is not None:
        config = dataclasses.replace(config, learning_rate=learning_rate)
    if warm_start and kind != "pg":
        raise ValueError(f"a warm start trains an actor-critic agent (pg), not {kind!r}")
    if from_model is not None:
        if warm_start:
            raise NotContinuable("a warm start makes a new model; --from-model goes on training a trained one: not both")
        agent, base = continued_agent(Path(from_model), kind, action_mode, env, learning_rate, widen)
    else:
        agent, base = agent_class(env.observation_space.shape[0], int(env.action_space.n), config=config, seed=seed), None
    started = time.perf_counter()
    imitated: dict[str, Any] = {}
    with torch_threads(1):
        if warm_start:
            from controller.imitation import best_constant_demonstrations, imitate

            demos = best_constant_demonstrations(env, warm_start, config.gamma, seed, progress=warm_start_progress)
            imitated = {"episodes": warm_start, "best_actions": demos.counts,
                        "labels_matched": round(imitate(agent, demos), 4)}
        metrics = agent.learn(env, total_steps=steps, seed=seed, progress=progress)
    returns = metrics.get("charts/episodic_return", [])
    metadata = {
        "kind": kind, "algorithm": agent.algorithm, "purpose": "scaling", "action_mode": action_mode,
        "workloads": name, "steps": steps, "seed": seed, "reward": dataclasses.asdict(env.reward_config),
        # the reaction between periods it trained with: the live controller runs today's (controller/panic.py)
        "panic": panic.default_settings() if env.panic else None,
        **({"warm_start": imitated} if imitated else {}),
        **({"learning_rate": learning_rate} if learning_rate is not None else {}),
        **({"from_model": base} if base else {}),
        "command": command or f"p2pfaas train scaling {kind} --workloads {name} --steps {steps} --seed {seed} "
                              f"--action-mode {action_mode}"
                              + (f" --warm-start {warm_start}" if warm_start else "")
                              + (f" --learning-rate {learning_rate:g}" if learning_rate is not None else "")
                              + (f" --from-model {from_model}" if from_model is not None else "")
                              + (" --widen" if widen else "")
                              + (f" --miss-cost {env.reward_config.miss_cost:g}" if reward is not None else ""),
        "train_seconds": round(time.perf_counter() - started, 1),
        "episodes": len(returns),
        "last_returns_mean": round(sum(returns[-50:]) / max(1, len(returns[-50:])), 4),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"), "python": platform.python_version(),
    }
    path = Path(out) if out is not None else default_model_path(models_dir, kind, name, action_mode)
    save_portable(path, agent, metadata)
    sidecar_of(path).write_bytes(orjson.dumps(metadata, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return TrainedModel(kind=kind, path=path, metrics=metrics, metadata=metadata)


def saved_observation_size(path: Path) -> int:
    from nodes.learner.algorithms.agent import IncompatibleWeights
    from nodes.learner.algorithms.portable import read_header

    try:
        return int(read_header(path.read_bytes())[0]["obs_dim"])
    except (OSError, IncompatibleWeights, KeyError, ValueError) as exc:
        raise NotContinuable(f"{path}: {exc}") from None


def widen_inputs(header: dict[str, Any], arrays: dict[str, Any], size: int) -> None:
    """A saved network of fewer inputs (``read_header``'s parts, changed in place) taking ``size``: zero
    weights for the new ones (every first layer's), so it decides exactly as before until trained."""
    import numpy as np

    old = int(header["obs_dim"])
    firsts = [name for name, a in arrays.items() if name.endswith(".0.weight") and a.ndim == 2 and a.shape[1] == old]
    if not firsts:
        raise NotContinuable(f"a {header['algorithm']} model has no input layer to widen (a table: train a new one)")
    for name in firsts:
        a = arrays[name]
        arrays[name] = np.concatenate([a, np.zeros((a.shape[0], size - old), a.dtype)], axis=1)
    header["obs_dim"] = size


def continued_agent(path: Path, kind: str, action_mode: str, env: FarmScalingEnv,
                    learning_rate: float | None, widen: bool = False) -> tuple[Any, dict[str, Any]]:
    """A saved model ready to train on (its own hyper-parameters, ``learning_rate`` if given) and what
    the new sidecar keeps of it: its digest and its own sidecar, since ``--ship`` may overwrite the file;
    ``widen``: its input widened to the env's observation first."""
    import hashlib

    from nodes.learner.algorithms.agent import IncompatibleWeights
    from nodes.learner.algorithms.portable import agent_from, read_header

    try:
        data = path.read_bytes()
        header, arrays = read_header(data)
        metadata = header["metadata"]
        if widen and header["obs_dim"] < env.observation_space.shape[0]:
            widen_inputs(header, arrays, env.observation_space.shape[0])
        agent = agent_from(header, arrays, {"learning_rate": learning_rate} if learning_rate is not None else None)
    except (OSError, IncompatibleWeights, NotContinuable) as exc:
        raise NotContinuable(f"{path}: {exc}") from None
    problems = [f"{what} is {have!r}, not {want!r}" for what, have, want in (
        ("its agent", metadata.get("kind", agent.algorithm), kind),
        ("its action mode", metadata.get("action_mode"), action_mode),
        ("its observation size", agent.obs_dim, env.observation_space.shape[0]),
        ("its number of actions", agent.n_actions, int(env.action_space.n))) if have != want]
    if problems:
        raise NotContinuable(f"{path}: cannot go on training it here: {'; '.join(problems)}")
    return agent, {"path": str(path), "sha256": hashlib.sha256(data).hexdigest(), "metadata": metadata}


def load_model(path: Path, config_overrides: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    from nodes.learner.algorithms.portable import load_portable

    return load_portable(path, config_overrides)


def load_rl_policy(path: Path, scenario: Scenario, name: str | None = None, version: str = "") -> RLPolicy:
    """A saved model as a ``ScalingPolicy`` (its action mode from the file)."""
    agent, metadata = load_model(path)
    kind = metadata.get("kind", agent.algorithm)
    return RLPolicy(name or kind, agent, scenario, metadata.get("action_mode", "unit"), version=version)
