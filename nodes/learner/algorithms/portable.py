"""Trained models as portable files, as they ship and as ``train`` writes them: a numpy ``.npz`` of
the weights plus a JSON header; loading never unpickles. The learner's own checkpoints are torch's."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch

from .agent import IncompatibleWeights

FORMAT = "p2pfaas-agent"
FORMAT_VERSION = 1
HEADER = "__header__"
SEPARATOR = "/"


def _flatten(state: dict[str, Any], prefix: str, arrays: dict[str, np.ndarray], values: dict[str, Any]) -> None:
    for key, value in state.items():
        if SEPARATOR in key:
            raise ValueError(f"state key {key!r} contains {SEPARATOR!r}")
        name = f"{prefix}{key}"
        if isinstance(value, torch.Tensor):
            arrays[name] = value.detach().cpu().numpy()
        elif isinstance(value, dict):
            _flatten(value, name + SEPARATOR, arrays, values)
        else:
            values[name] = value


def _tuples(value: Any) -> Any:
    """JSON gave lists back; the agents' states hold tuples (table keys, discretisation)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _unflatten(arrays: dict[str, np.ndarray], values: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    leaves = [(k, torch.from_numpy(np.array(v))) for k, v in arrays.items()] + [(k, _tuples(v)) for k, v in values.items()]
    for name, value in leaves:
        *path, leaf = name.split(SEPARATOR)
        node = state
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return state


def to_portable(agent: Any, metadata: dict[str, Any] | None = None) -> bytes:
    """The agent's acting state, sizes, config and seed as ``.npz`` bytes."""
    arrays: dict[str, np.ndarray] = {}
    values: dict[str, Any] = {}
    _flatten(agent.weights_state(), "", arrays, values)
    header = {"format": FORMAT, "version": FORMAT_VERSION, "algorithm": agent.algorithm, "obs_dim": agent.obs_dim,
              "n_actions": agent.n_actions, "config": dataclasses.asdict(agent.config), "seed": agent.seed,
              "values": values, "metadata": metadata or {}}
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{HEADER: np.frombuffer(orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY),
                                                          dtype=np.uint8)}, **arrays)
    return buffer.getvalue()


def read_header(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        header = orjson.loads(arrays.pop(HEADER).tobytes())
    except Exception as exc:  # zip, numpy and JSON errors alike: not one of our files
        raise IncompatibleWeights(f"not a portable agent file: {exc}") from exc
    if (header.get("format"), header.get("version")) != (FORMAT, FORMAT_VERSION):
        raise IncompatibleWeights(f"expected {FORMAT} version {FORMAT_VERSION}, got "
                                  f"{header.get('format')!r} version {header.get('version')!r}")
    return header, arrays


def from_portable(data: bytes, config_overrides: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """(a new agent acting as the saved one, the file's metadata); ``config_overrides`` replace
    hyper-parameters that do not shape the model (e.g. a learning rate for online training)."""
    header, arrays = read_header(data)
    return agent_from(header, arrays, config_overrides), header["metadata"]


def agent_from(header: dict[str, Any], arrays: dict[str, np.ndarray],
               config_overrides: dict[str, Any] | None = None) -> Any:
    """The agent a file's ``read_header`` describes."""
    from . import AGENTS
    from .agent import config_from_dict

    cls = AGENTS.get(header["algorithm"])
    if cls is None:
        raise IncompatibleWeights(f"unknown algorithm {header['algorithm']!r}")
    config = {k: _tuples(v) for k, v in {**header["config"], **(config_overrides or {})}.items()}
    agent = cls(header["obs_dim"], header["n_actions"], config_from_dict(cls.config_class, config), header["seed"])
    agent.load_weights_state(_unflatten(arrays, header["values"]))
    return agent


def save_portable(path: str | Path, agent: Any, metadata: dict[str, Any] | None = None) -> Path:
    """Write atomically (a crash never leaves half a model)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(to_portable(agent, metadata))
    tmp.replace(path)
    return path


def load_portable(path: str | Path, config_overrides: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    return from_portable(Path(path).read_bytes(), config_overrides)
