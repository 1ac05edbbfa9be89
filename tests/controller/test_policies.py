"""Choosing the live policy by name: RL out of the box (the shipped model), baselines, model files."""

from __future__ import annotations

import json

import pytest

from controller.baselines import Reactive, RLPolicy
from controller.policies import AUTO_KIND, resolve_policy
from controller.scenario import load_scenario
from controller.training import RL_KINDS, shipped_model, sidecar_of, train_agent

SC = load_scenario("bursty")


@pytest.mark.parametrize("kind", RL_KINDS)
def test_every_rl_kind_ships_a_small_model_with_its_training_command_and_seed(kind):
    path = shipped_model(kind)
    assert path.is_file() and path.stat().st_size < 200_000 and not path.name.endswith((".pt", ".pth", ".ckpt"))
    meta = json.loads(sidecar_of(path).read_text())
    assert meta["kind"] == kind and meta["command"].startswith(f"p2pfaas train scaling {kind}")
    assert isinstance(meta["seed"], int) and meta["steps"] > 0 and meta["action_mode"] == "target"


def test_auto_runs_the_shipped_model_and_says_so(tmp_path):
    policy, name, note = resolve_policy("auto", SC, tmp_path)
    assert isinstance(policy, RLPolicy) and name == AUTO_KIND and policy.actions.mode == "target"
    assert "shipped in the package" in note and "train scaling" in note and "seed" in note


def test_your_own_model_wins_and_files_and_baselines_resolve(tmp_path):
    own = train_agent("sarsa", "generated", 100, seed=1, out=tmp_path / "scaling-sarsa-mixed-target.npz")
    policy, name, note = resolve_policy("sarsa", SC, tmp_path)
    assert name == "sarsa" and "trained here" in note and str(own.path) in note
    policy, name, _ = resolve_policy(str(own.path), SC, tmp_path / "none")
    assert isinstance(policy, RLPolicy) and name == "sarsa"
    policy, name, note = resolve_policy("reactive", SC, tmp_path)
    assert isinstance(policy, Reactive) and name == "reactive-avg" and note is None
    with pytest.raises(ValueError, match="unknown policy"):
        resolve_policy("alphago", SC, tmp_path)
    with pytest.raises(ValueError, match="no model file"):
        resolve_policy(str(tmp_path / "missing.npz"), SC, tmp_path)


def test_a_model_trained_under_another_reaction_between_periods_says_so(tmp_path):
    from controller import panic
    from controller.policies import describe_model

    own = train_agent("sarsa", "generated", 100, seed=1, out=tmp_path / "scaling-sarsa-mixed-target.npz")
    assert "reaction between periods" not in describe_model(own.path)   # trained under today's rule
    sidecar = sidecar_of(own.path)
    meta = json.loads(sidecar.read_text())
    assert meta["panic"] == panic.default_settings()
    for trained, says in (({**meta["panic"], "threshold": 2.0, "headroom": 1.0},
                           "trained with the reaction between periods at 2x the pool, raising to need + 1 sqrt"),
                          (None, "trained without the reaction between periods"),
                          ({"threshold": 2.0}, "at 2x the pool, raising to need + ? sqrt"),
                          (1.4, "reaction between periods (1.4) is unreadable")):
        sidecar.write_text(json.dumps({**meta, "panic": trained}))
        note = describe_model(own.path)
        assert says in note and f"the controller's is at {panic.THRESHOLD:g}x the pool" in note
    sidecar.write_text(json.dumps({k: v for k, v in meta.items() if k != "panic"}))
    assert "does not record the reaction between periods" in describe_model(own.path)
    _, _, note = resolve_policy(str(own.path), SC, tmp_path / "none")   # what up and controller print
    assert "does not record the reaction between periods" in note
    sidecar.write_text("[]")   # not a sidecar at all: the path alone, no crash
    assert describe_model(own.path) == str(own.path)
