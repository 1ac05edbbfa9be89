"""A scaling policy by name for the live controller: a baseline, a shipped or trained model, or a file."""

from __future__ import annotations

from pathlib import Path

import orjson

from controller import panic
from controller.baselines import ScalingPolicy, make_baseline
from controller.names import AUTO, MODEL_SUFFIX, SB3_SUFFIX, canonical
from controller.scenario import Scenario
from controller.training import (
    DEFAULT_ACTION_MODE,
    DEFAULT_WORKLOADS,
    RL_KINDS,
    default_model_path,
    load_rl_policy,
    shipped_model,
    sidecar_of,
)

AUTO_KIND = "pg"                         # what "auto" runs: the shipped PPO (the best shipped model, docs/autoscaling.md)


def _reaction(settings: dict) -> str:
    def value(key: str) -> str:
        v = settings.get(key)
        return f"{v:g}" if isinstance(v, (int, float)) else "?"
    return f"{value('threshold')}x the pool, raising to need + {value('headroom')} sqrt(need)"


def reaction_note(meta: dict) -> str | None:
    """What to know when a model trained under another reaction between periods than the controller's:
    it was trained for one, so it may hold too few or too many workers under another."""
    current = panic.default_settings()
    trained = meta.get("panic")
    if isinstance(trained, dict) and {k: trained.get(k) for k in current} == current:
        return None
    if "panic" not in meta:
        why = "it does not record the reaction between periods it trained with (older models)"
    elif trained is None:
        why = "it trained without the reaction between periods"
    elif isinstance(trained, dict):
        why = f"it trained with the reaction between periods at {_reaction(trained)}"
    else:
        why = f"its sidecar's reaction between periods ({trained!r}) is unreadable"
    return f"{why}; the controller's is at {_reaction(current)} (docs/autoscaling.md: fine-tune it under this one)"


def describe_model(path: Path) -> str:
    """One line on where a model comes from (its sidecar's training command and seed), and whether it
    trained under the controller's reaction between periods."""
    try:
        meta = orjson.loads(sidecar_of(path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        meta = None
    if not isinstance(meta, dict):
        return str(path)
    note = reaction_note(meta)
    return (f"{path} (trained with `{meta.get('command', '?')}`, seed {meta.get('seed', '?')})"
            + (f"; {note}" if note else ""))


def model_for(kind: str, models_dir: Path) -> tuple[Path, bool]:
    """(model file of ``kind``, shipped?): your own trained one in ``models_dir`` wins."""
    own = default_model_path(models_dir, kind, DEFAULT_WORKLOADS, DEFAULT_ACTION_MODE)
    return (own, False) if own.is_file() else (shipped_model(kind), True)


def resolve_policy(name: str, scenario: Scenario, models_dir: Path) -> tuple[ScalingPolicy, str, str | None]:
    """(policy, name, note for the user) for a name of controller/names.py; ``auto`` and the RL kinds
    run the model trained in ``models_dir`` if there is one, else the shipped one."""
    name = canonical(name)   # PolicyNameError (a ValueError) for a name no command knows
    if name == AUTO or name in RL_KINDS:
        kind = AUTO_KIND if name == AUTO else name
        path, shipped = model_for(kind, models_dir)
        if not path.is_file():
            raise ValueError(f"no {kind} model: neither {path} nor a shipped one; "
                             f"train it: p2pfaas train scaling {kind}")
        origin = "shipped in the package" if shipped else "trained here"
        return load_rl_policy(path, scenario, name=kind), kind, f"RL policy {kind}, {origin}: {describe_model(path)}"
    if name.endswith(SB3_SUFFIX):
        from controller.sb3 import load_sb3_policy

        policy = load_sb3_policy(Path(name), scenario)
        return policy, policy.name, (f"Stable-Baselines3 {policy.agent.algorithm} from {name} "
                                     f"({policy.actions.mode} actions; it decides, it does not learn online)")
    if name.endswith(MODEL_SUFFIX):
        path = Path(name)
        policy = load_rl_policy(path, scenario)
        return policy, policy.name, f"RL policy from {describe_model(path)}"
    return make_baseline(name, scenario), name, None
