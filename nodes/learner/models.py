"""The learner's models and their persistence, without any broker: one `ModelSlot` per
purpose, run-time hyper-parameters, and the atomic checkpoint of a node's models together with
its experience-stream position (the window of EIDs it holds: nodes/learner/eid_window.py)."""

from __future__ import annotations

import base64
import dataclasses
import logging
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from broker.messages import LearnerTrainSample, LearnerWeights
from nodes.learner.algorithms import AGENTS
from nodes.learner.algorithms.agent import MAX_PARAMETER, config_from_dict

log = logging.getLogger(__name__)

# Config fields that size a model: on a live model they change only with "reset": true, which rebuilds it.
STRUCTURAL = frozenset({"actions_n", "hidden_sizes", "buffer_size", "bins", "low", "high", "num_steps"})
MANIFEST = "learner.json"
FORMAT_VERSION = 1


def _parse_text(name: str, text: str) -> Any:
    """P2PFaaS sends parameters as strings: "0.5", "true", "[64, 64]"."""
    try:
        return orjson.loads(text.strip())
    except orjson.JSONDecodeError:
        if text.strip().lower() in ("true", "false"):
            return text.strip().lower() == "true"
        raise ValueError(f"{name}: {text!r} is not a number, boolean or list") from None


def _coerce(name: str, default: Any, value: Any) -> Any:
    """A parameter value as the type of the config field's default, or ValueError."""
    if isinstance(value, str):
        value = _parse_text(name, value)
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                and abs(v) <= MAX_PARAMETER for v in value):
            raise ValueError(f"{name}: {value!r} is not a list of finite numbers")
        return tuple(value)
    if isinstance(default, bool) or isinstance(value, bool):
        if not (isinstance(default, bool) and isinstance(value, bool)):
            raise ValueError(f"{name}: {value!r} is not a {type(default).__name__}")
        return value
    if value is None:
        if default is not None:
            raise ValueError(f"{name}: may not be null")
        return None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or abs(value) > MAX_PARAMETER:
        raise ValueError(f"{name}: {value!r} is not a finite number of at most {MAX_PARAMETER:.0e} in size")
    if isinstance(default, int):
        if value != int(value):
            raise ValueError(f"{name}: {value!r} is not an integer")
        return int(value)
    return float(value)


def is_true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1"))


class ModelSlot:
    """One model of a node; its agent is created when the state size is known (a ``dsarsa`` at once)."""

    def __init__(self, name: str, algorithm: str, n_actions: int, obs_dim: int | None = None,
                 parameters: Mapping[str, Any] | None = None, seed: int = 0) -> None:
        if algorithm not in AGENTS:
            raise ValueError(f"unknown agent {algorithm!r}; known: {sorted(AGENTS)}")
        self.name, self.algorithm, self.cls, self.seed_value = name, algorithm, AGENTS[algorithm], seed
        self.n_actions, self.obs_dim = int(n_actions), obs_dim
        self.config = self.cls.config_class()
        self.agent: Any = None
        self.experiences = 0
        self.weights_published = 0
        self.dirty = False          # changed since the last checkpoint
        self.fresh = False          # changed since the last weights publication
        if algorithm == "dsarsa":
            self.ensure(0)
        if parameters:
            self.set_parameters(parameters)

    @property
    def exists(self) -> bool:
        return self.agent is not None

    def ensure(self, obs_dim: int) -> Any:
        if self.agent is None:
            self.obs_dim = self.obs_dim or obs_dim
            self.agent = self.cls(self.obs_dim, self.n_actions, self.config, self.seed_value)
            self.dirty = self.fresh = True
        return self.agent

    def check_state(self, state: list[float]) -> None:
        """A state this model can take; a DQN/PPO/SARSA(λ) state has exactly obs_dim values."""
        if self.algorithm != "dsarsa" and self.obs_dim and len(state) != self.obs_dim:
            raise ValueError(f"model {self.name}: state has {len(state)} values, the model takes {self.obs_dim}")

    def check_action(self, action: int) -> None:
        if not 0 <= action < self.n_actions:
            raise ValueError(f"model {self.name}: action {action} is not in 0..{self.n_actions - 1}")

    # -- acting and training ----------------------------------------------------------
    def act(self, state: list[float], explore: bool) -> tuple[int, float]:
        """(action, epsilon the decision used: 0 when greedy)."""
        self.check_state(state)
        agent = self.ensure(len(state))
        eps = float(getattr(agent, "epsilon", 0.0)) if explore else 0.0
        return int(agent.act(state, explore=explore)), eps

    def update(self, obs: list[float], action: int, reward: float, next_obs: list[float], done: bool) -> dict:
        if len(obs) != len(next_obs):
            raise ValueError(f"model {self.name}: observation has {len(obs)} values, next_observation {len(next_obs)}")
        self.check_state(obs)
        self.check_action(action)
        metrics = self.ensure(len(obs)).update(obs, action, reward, next_obs, done)
        # a DQN filling its replay memory, or PPO filling a rollout, has the same weights as before
        self._trained(1, changed=any(key.startswith("losses/") for key in metrics))
        return metrics

    def train_window(self, samples: list[LearnerTrainSample]) -> int:
        """A P2PFaaS window (sorted by EID), trained as P2PFaaS does for ``dsarsa``; returns samples trained."""
        agent = self.ensure(len(samples[0].state))
        if self.algorithm == "dsarsa":
            trained = int(agent.train_window(samples)["trained"])
        else:
            by_eid = {s.eid: s for s in samples}
            trained = 0
            for s in samples:
                nxt = by_eid.get(s.eid + 1)
                if nxt is not None:
                    agent.update(s.state, s.action, s.reward, nxt.state, False)
                    trained += 1
        self._trained(trained)
        return trained

    def _trained(self, n: int, changed: bool = True) -> None:
        if n:
            self.experiences += n
            self.dirty = True
            self.fresh = self.fresh or changed

    def seed(self, weights: LearnerWeights) -> None:
        """Continue from published weights, acting exactly as they do; ``experiences`` keeps
        counting, so versions only grow."""
        cls = AGENTS.get(weights.algorithm)
        if cls is None:
            raise ValueError(f"unknown agent {weights.algorithm!r}; known: {sorted(AGENTS)}")
        if self.algorithm == "dsarsa" or weights.algorithm == "dsarsa":
            raise ValueError("weights.set seeds DQN, PPO and SARSA(lambda) models, not a differential SARSA table")
        try:
            agent = cls(weights.obs_dim, weights.n_actions, config_from_json(cls, weights.config), self.seed_value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model {self.name}: unusable config: {exc}") from exc
        agent.set_weights(base64.b64decode(weights.weights_b64))
        self.algorithm, self.cls, self.agent, self.config = weights.algorithm, cls, agent, agent.config
        self.n_actions, self.obs_dim = agent.n_actions, agent.obs_dim
        self.dirty = self.fresh = True

    # -- run-time parameters ----------------------------------------------------------
    def parameters(self) -> dict[str, Any]:
        if self.algorithm == "dsarsa":
            return self.agent.parameters()
        return {"actions_n": self.n_actions, **dataclasses.asdict(self.config)}

    def set_parameters(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Change hyper-parameters; ValueError (nothing changed), also for a structural change without reset."""
        values = dict(values)
        reset = is_true(values.pop("reset", False))
        if self.algorithm == "dsarsa" and self.agent is not None:
            self.agent.set_parameters(values)
            self.n_actions, self.config = self.agent.n_actions, self.agent.config
        else:
            defaults = {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)}
            unknown = set(values) - set(defaults) - {"actions_n"}
            if unknown:
                raise ValueError(f"unknown parameters {sorted(unknown)}; known: {sorted(defaults) + ['actions_n']}")
            changes = {k: _coerce(k, defaults[k], v) for k, v in values.items() if k != "actions_n"}
            n_actions = _coerce("actions_n", 0, values.get("actions_n", self.n_actions))
            if n_actions < 1:
                raise ValueError("actions_n must be >= 1")
            config = dataclasses.replace(self.config, **changes)
            if self.agent is not None and not reset:
                fixed = sorted(k for k, v in changes.items() if k in STRUCTURAL and v != defaults[k])
                fixed += ["actions_n"] if n_actions != self.n_actions else []
                if fixed:
                    raise ValueError(f"{', '.join(fixed)} shape the {self.algorithm} model and cannot change on a "
                                     'live model; send them with "reset": true to rebuild it (its training is lost)')
            self.config, self.n_actions = config, n_actions
            if self.agent is not None and not reset:
                self.agent.config = config
                optimizer = getattr(self.agent, "optimizer", None)
                if "learning_rate" in changes and optimizer is not None:
                    for group in optimizer.param_groups:
                        group["lr"] = config.learning_rate
        self.dirty = self.fresh = True
        if reset:
            self.reset()
        return self.parameters()

    def reset(self) -> None:
        """Forget what was learned; hyper-parameters stay."""
        if self.algorithm == "dsarsa":
            self.agent.reset()
        elif self.agent is not None:
            self.agent = self.cls(self.obs_dim, self.n_actions, self.config, self.seed_value)
        self.experiences = 0
        self.dirty = self.fresh = True

    def stats(self) -> dict[str, Any]:
        agent = self.agent
        if agent is None:
            return {}
        if hasattr(agent, "stats"):
            return agent.stats()
        out: dict[str, Any] = {"epsilon": float(getattr(agent, "epsilon", 0.0))}
        if hasattr(agent, "global_step"):
            out["global_step"] = int(agent.global_step)
        return out

    def weights(self, node: str) -> LearnerWeights:
        assert self.agent is not None
        return LearnerWeights(node=node, model=self.name, algorithm=self.algorithm, obs_dim=self.agent.obs_dim,
                              n_actions=self.agent.n_actions, config=dataclasses.asdict(self.agent.config),
                              version=self.experiences,
                              weights_b64=base64.b64encode(self.agent.get_weights()).decode())


def config_from_json(cls: type, values: Mapping[str, Any]) -> Any:
    """An agent config from JSON, where tuples (hidden sizes, bins) came back as lists."""
    return config_from_dict(cls.config_class, {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def agent_from_weights(weights: LearnerWeights) -> Any:
    """A new agent acting exactly like the published one (used by `LocalPolicy`)."""
    cls = AGENTS[weights.algorithm]
    config = dict(weights.config)
    if "buffer_size" in config:
        config["buffer_size"] = 1  # an acting copy never trains: no replay memory
    agent = cls(weights.obs_dim, weights.n_actions, config_from_json(cls, config))
    agent.set_weights(base64.b64decode(weights.weights_b64))
    return agent


@dataclasses.dataclass
class Restored:
    slots: dict[str, ModelSlot]
    window: list[LearnerTrainSample]
    stream_seq: int
    malformed: int
    window_trained: list[int] = dataclasses.field(default_factory=list)
    window_fed: list[int] = dataclasses.field(default_factory=list)


class CheckpointStore:
    """``<dir>/learner.json`` names one file per model and the stream sequence they include;
    replacing it atomically commits the checkpoint (a kill leaves the old or the new, never a mix)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.generation = 0
        self.files: dict[str, str] = {}

    def load(self, seed: int) -> Restored | None:
        path = self.directory / MANIFEST
        if not path.exists():
            return None
        try:
            manifest = orjson.loads(path.read_bytes())
            self.generation = int(manifest["generation"])
            slots: dict[str, ModelSlot] = {}
            for name, entry in manifest["models"].items():
                slot = ModelSlot(name, entry["algorithm"], entry["n_actions"], entry["obs_dim"], seed=seed)
                slot.config = config_from_json(slot.cls, entry["config"])
                if entry["file"]:
                    slot.agent = slot.cls.load(self.directory / entry["file"])
                    slot.n_actions, slot.obs_dim = slot.agent.n_actions, slot.agent.obs_dim
                    slot.config = slot.agent.config
                    self.files[name] = entry["file"]
                slot.experiences = int(entry["experiences"])
                slot.dirty, slot.fresh = False, True
                slots[name] = slot
            window = [LearnerTrainSample.model_validate(s) for s in manifest["window"]]
            return Restored(slots, window, int(manifest["stream_seq"]), int(manifest["malformed"]),
                            [int(e) for e in manifest.get("window_trained", [])],
                            [int(e) for e in manifest.get("window_fed", [])])
        except Exception as exc:   # unreadable, corrupt, of another shape (RuntimeError, AttributeError ...)
            # a checkpoint we cannot read is not a reason to stay down: the stream replays
            log.error("learner checkpoint %s unreadable (%s): starting from an empty model", path, exc)
            self.files = {}
            return None

    def commit(self, slots: Mapping[str, ModelSlot], window: Iterable[LearnerTrainSample], stream_seq: int,
               malformed: int, window_trained: Iterable[int] = (), window_fed: Iterable[int] = ()) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.generation += 1
        self.files = {name: file for name, file in self.files.items() if name in slots}   # dropped models' files go
        models = {}
        for name, slot in slots.items():
            if slot.agent is not None and (slot.dirty or name not in self.files):
                self.files[name] = f"{name}.{self.generation}.pt"
                slot.agent.save(self.directory / self.files[name])
            elif slot.agent is None:
                self.files.pop(name, None)
            models[name] = {"algorithm": slot.algorithm, "n_actions": slot.n_actions, "obs_dim": slot.obs_dim,
                            "config": dataclasses.asdict(slot.config), "experiences": slot.experiences,
                            "file": self.files.get(name)}
        manifest = {"format": FORMAT_VERSION, "generation": self.generation, "stream_seq": stream_seq,
                    "malformed": malformed, "models": models, "window": [s.model_dump() for s in window],
                    "window_trained": sorted(window_trained), "window_fed": sorted(window_fed)}
        tmp = self.directory / (MANIFEST + ".tmp")
        with open(tmp, "wb") as f:
            f.write(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / MANIFEST)
        for slot in slots.values():
            slot.dirty = False
        keep = set(self.files.values())
        for path in self.directory.glob("*.pt"):
            if path.name not in keep:
                path.unlink(missing_ok=True)
