"""Behaviour every agent in AGENTS shares: it learns (offline through learn(), online
through update()), deterministically, and its model survives save/load and get/set_weights."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from nodes.learner.algorithms import (
    AGENTS,
    DifferentialSarsaConfig,
    DQNConfig,
    IncompatibleWeights,
    PPOConfig,
    SarsaConfig,
)
from nodes.learner.algorithms.agent import Agent, from_bytes

# Small, fast hyper-parameters for one-dimensional toy environments.
FAST = {
    "dqn": DQNConfig(learning_rate=1e-3, buffer_size=5_000, learning_starts=200, exploration_steps=1_000,
                     target_network_frequency=100, batch_size=32, train_frequency=2, gamma=0.9, hidden_sizes=(32, 32)),
    "pg": PPOConfig(learning_rate=3e-3, num_steps=128, gamma=0.9, hidden_sizes=(32, 32)),
    "sarsa": SarsaConfig(alpha=0.2, gamma=0.9, lam=0.8, bins=6, exploration_steps=1_000),
    "dsarsa": DifferentialSarsaConfig(alpha=0.1),
}
STEPS = {"dqn": 2_000, "pg": 3_000, "sarsa": 1_500, "dsarsa": 1_500}
GRID = [np.array([q / 5.0], dtype=np.float32) for q in range(6)]
NAMES = sorted(AGENTS)


def make(name: str, seed: int = 0, n_actions: int = 2, **overrides):
    return AGENTS[name](1, n_actions, dataclasses.replace(FAST[name], **overrides), seed=seed)


def same_state(a, b) -> bool:
    """Deep equality of decoded weights: tensors exactly, everything else with ==."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b


def weights_of(agent) -> dict:
    return from_bytes(agent.get_weights())["state"]


@pytest.fixture(scope="module")
def trained(queue_env):
    """One agent per algorithm trained with learn() on TinyQueueEnv, with its metrics."""
    results = {}
    for name in NAMES:
        agent = make(name)
        calls: list[tuple[int, int]] = []
        metrics = agent.learn(queue_env(), STEPS[name], seed=0, progress=lambda *call: calls.append(call))
        results[name] = (agent, metrics, calls)
    return results


def test_toy_environments_follow_gymnasium(queue_env, delayed_env):
    check_env(queue_env(), skip_render_check=True)
    check_env(delayed_env(), skip_render_check=True)


@pytest.mark.parametrize("name", NAMES)
def test_every_agent_follows_the_protocol(name):
    """Not only the names (a runtime-checkable Protocol checks no more): every method takes the
    Protocol's parameters, in its order, with its defaults, and the dimensions are the ones asked."""
    agent = make(name)
    assert isinstance(agent, Agent)
    for method in ("act", "learn", "update", "save", "get_weights", "set_weights"):
        want = inspect.signature(getattr(Agent, method)).parameters
        got = inspect.signature(getattr(type(agent), method)).parameters
        assert [(p.name, p.default) for p in list(got.values())[:len(want)]] == \
               [(p.name, p.default) for p in want.values()], (name, method, list(got))
        assert all(p.default is not inspect.Parameter.empty or p.kind is p.VAR_KEYWORD
                   for p in list(got.values())[len(want):]), (name, method, "extra parameters need defaults")
    assert (agent.obs_dim, agent.n_actions) == (1, 2)


def test_the_registry_holds_every_algorithm():
    assert set(AGENTS) == {"dqn", "pg", "sarsa", "dsarsa"}


@pytest.mark.parametrize("name", NAMES)
def test_trained_greedy_policy_beats_random(name, trained, beats_random):
    ok, verdict = beats_random(trained[name][0])
    assert ok, f"{name}: {verdict}"


@pytest.mark.parametrize("name", NAMES)
def test_untrained_agent_does_not_beat_random(name, beats_random):
    # Control for the check above: it must be able to fail.
    ok, verdict = beats_random(make(name))
    assert not ok, f"{name}: {verdict}"


@pytest.mark.parametrize("name", NAMES)
def test_learn_reports_namespaced_metrics_and_progress(name, trained):
    _, metrics, calls = trained[name]
    assert all("/" in key for key in metrics)
    assert len(metrics["charts/episodic_return"]) == STEPS[name] // 20
    assert metrics["charts/episodic_length"][0] == 20
    assert any(key.startswith("losses/") for key in metrics)
    assert calls[-1] == (STEPS[name], STEPS[name]) and len(calls) <= 101


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_result(name, queue_env):
    runs = []
    for seed in (3, 3, 4):
        agent = make(name, seed=seed)
        metrics = agent.learn(queue_env(), 600, seed=seed)
        runs.append((metrics["charts/episodic_return"], weights_of(agent), [agent.act(o) for o in GRID]))
    assert runs[0][0] == runs[1][0]
    assert same_state(runs[0][1], runs[1][1])
    assert runs[0][2] == runs[1][2]
    assert not same_state(runs[0][1], runs[2][1]), "the seed must matter"


@pytest.mark.parametrize("name", NAMES)
def test_save_load_round_trip(name, trained, tmp_path):
    agent = trained[name][0]
    path = tmp_path / "models" / f"{name}.pt"
    agent.save(path)
    loaded = AGENTS[name].load(path)
    assert type(loaded) is type(agent)
    assert loaded.config == agent.config
    assert (loaded.obs_dim, loaded.n_actions) == (agent.obs_dim, agent.n_actions)
    assert same_state(weights_of(loaded), weights_of(agent))
    assert [loaded.act(o) for o in GRID] == [agent.act(o) for o in GRID]


@pytest.mark.parametrize("name", NAMES)
def test_load_refuses_a_checkpoint_of_another_algorithm(name, trained, tmp_path):
    other = next(n for n in NAMES if n != name)
    trained[other][0].save(tmp_path / "other.pt")
    with pytest.raises(IncompatibleWeights):
        AGENTS[name].load(tmp_path / "other.pt")


@pytest.mark.parametrize("name", NAMES)
def test_weights_round_trip_lets_another_agent_act_alike(name, trained, beats_random):
    agent = trained[name][0]
    actor = make(name, seed=7)
    assert [actor.act(o) for o in GRID] != [agent.act(o) for o in GRID]
    actor.set_weights(agent.get_weights())
    assert same_state(weights_of(actor), weights_of(agent))
    assert [actor.act(o) for o in GRID] == [agent.act(o) for o in GRID]
    assert beats_random(actor)[0]


@pytest.mark.parametrize("name", NAMES)
def test_set_weights_refuses_foreign_weights(name, trained):
    agent = make(name)
    other = next(n for n in NAMES if n != name)
    with pytest.raises(IncompatibleWeights):
        agent.set_weights(trained[other][0].get_weights())
    with pytest.raises(IncompatibleWeights):
        make(name, n_actions=3).set_weights(trained[name][0].get_weights())


@pytest.mark.parametrize("name", NAMES)
def test_online_update_path_learns(name, queue_env, beats_random):
    """Transitions arrive one by one as from a broker: plain lists, the five-argument
    update() (no truncated flag), and the agent must notice episode boundaries itself."""
    agent, env = make(name, seed=1), queue_env()
    obs, _ = env.reset(seed=1)
    for _ in range(STEPS[name]):
        action = agent.act(obs, explore=True)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        agent.update(obs.tolist(), action, reward, next_obs.tolist(), terminated)
        obs = env.reset()[0] if terminated or truncated else next_obs
    ok, verdict = beats_random(agent)
    assert ok, f"{name}: {verdict}"


DELAYED = {
    "dqn": ({"learning_starts": 100, "exploration_steps": 800, "target_network_frequency": 50}, 1_500),
    "pg": ({"num_steps": 64}, 1_500),
    "sarsa": ({"bins": 2, "exploration_steps": 500}, 1_000),
}


@pytest.mark.parametrize("name", sorted(DELAYED))
@pytest.mark.parametrize("gamma, best", [(0.9, 1), (0.3, 0)])
def test_discounted_agents_bootstrap_a_delayed_reward(name, gamma, best, delayed_env):
    # Waiting earns 1.0 one step later: worth 0.9 with gamma 0.9 (beats 0.5 now), 0.3 with 0.3.
    overrides, steps = DELAYED[name]
    agent = make(name, gamma=gamma, **overrides)
    agent.learn(delayed_env(), steps, seed=0)
    assert agent.act(np.zeros(1, dtype=np.float32)) == best


@pytest.mark.parametrize("name", NAMES)
def test_act_accepts_lists_and_read_only_arrays(name, trained):
    # Observations decoded from a broker payload are lists or read-only np.frombuffer views.
    agent = trained[name][0]
    read_only = np.frombuffer(np.array([0.8], dtype=np.float32).tobytes(), dtype=np.float32)
    assert agent.act(read_only) == agent.act([0.8]) == agent.act(GRID[4])
    assert agent.act(read_only, explore=True) in (0, 1)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("action", [2, -1, 0.5])
def test_update_refuses_an_action_out_of_range(name, action):
    # A poison experience is refused on arrival, not when a later training step samples it.
    with pytest.raises(ValueError):
        make(name).update([0.2], action, 1.0, [0.4], False)
