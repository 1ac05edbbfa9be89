"""Choosing a scaling policy by name for the live controller: a baseline, or a trained RL model."""

from __future__ import annotations

from pathlib import Path

from controller.baselines import ScalingPolicy, is_baseline, make_baseline
from controller.evaluation import RL_KINDS, load_rl_policy, model_path
from controller.scenario import Scenario

ALIASES = {"reactive": "reactive-avg"}   # the paper's reactive controller (on average latency)
FALLBACK = "reactive-max"                # what "auto" uses when no RL model has been trained


def resolve_policy(name: str, scenario: Scenario, models_dir: Path) -> tuple[ScalingPolicy, str, str | None]:
    """(policy, its name, a note for the user) for ``dqn|pg|sarsa|<baseline>|auto``.

    RL policies load ``models_dir/scaling-<kind>-<scenario>-unit.pt`` (``p2pfaas train scaling``
    writes it); ``auto`` is the DQN model when it exists, else ``reactive-max``.
    """
    name = ALIASES.get(name, name)
    if name == "auto":
        path = model_path(models_dir, "dqn", scenario)
        if path.is_file():
            return load_rl_policy("dqn", path, scenario), "dqn", f"RL policy from {path}"
        note = (f"no trained model at {path}: using {FALLBACK} "
                f"(train one: p2pfaas train scaling --agent dqn --scenario {scenario.name})")
        return make_baseline(FALLBACK, scenario), FALLBACK, note
    if name in RL_KINDS:
        path = model_path(models_dir, name, scenario)
        if not path.is_file():
            raise ValueError(f"no trained {name} model at {path}; "
                             f"train it first: p2pfaas train scaling --agent {name} --scenario {scenario.name}")
        return load_rl_policy(name, path, scenario), name, f"RL policy from {path}"
    if is_baseline(name):
        return make_baseline(name, scenario), name, None
    raise ValueError(f"unknown policy {name!r}: use auto, {', '.join(RL_KINDS)}, reactive, reactive-avg, "
                     "reactive-max, keda, kpa, hpa or fixed-<n>")
