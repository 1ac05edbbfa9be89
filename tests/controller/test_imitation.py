"""The warm start (controller/imitation.py): its labels are each episode's best constant target
action, and imitating them makes the actor choose them."""

import numpy as np
import pytest
import torch

from controller.env import FarmScalingEnv
from controller.imitation import Demonstrations, _rollout, best_constant_demonstrations, imitate
from controller.training import rl_agents, train_agent


def test_each_episode_is_labelled_with_the_constant_action_of_the_highest_return():
    env = FarmScalingEnv("generated", action_mode="target")
    demos = best_constant_demonstrations(env, 3, gamma=0.9, seed=5)
    assert sum(demos.counts.values()) == 3 and "keep" not in demos.counts
    assert len(demos.observations) == len(demos.actions) == len(demos.returns) > 0
    # replay the same episode seeds: the label's return is the best of every constant action
    rng = np.random.default_rng(5)
    start = 0
    for _ in range(3):
        episode_seed = int(rng.integers(2**40, 2**62))
        totals = {a: sum(_rollout(env, episode_seed, a)[1]) for a in range(1, env.action_space.n)}
        steps = len(_rollout(env, episode_seed, 1)[0])
        labels = set(demos.actions[start:start + steps].tolist())
        assert labels == {max(totals, key=totals.get)}
        start += steps
    assert start == len(demos.actions)


def test_imitation_makes_the_actor_choose_the_labels():
    # two workloads that look different, labelled with different actions
    parts = [(_rollout(FarmScalingEnv(name, action_mode="target"), 7, 4)[0], label)
             for name, label in (("spike", 2), ("steady", 6))]
    observations = np.array([o for seen, _ in parts for o in seen], dtype=np.float32)
    actions = np.array([label for seen, label in parts for _ in seen])
    demos = Demonstrations(observations, actions, np.full(len(actions), -1.0, dtype=np.float32), {})
    agent = rl_agents()["pg"](observations.shape[1], FarmScalingEnv("spike", action_mode="target").action_space.n, seed=0)
    with torch.no_grad():
        before = float((agent.network.actor(torch.from_numpy(observations)).argmax(1).numpy() == actions).mean())
    assert before < 0.9 and imitate(agent, demos, epochs=80) > 0.95


def test_a_warm_start_needs_pg_in_the_target_mode(tmp_path):
    with pytest.raises(ValueError, match="target"):
        best_constant_demonstrations(FarmScalingEnv("spike", action_mode="unit"), 1, 0.9, 0)
    with pytest.raises(ValueError, match="pg"):
        train_agent("dqn", "spike", 10, warm_start=2, out=tmp_path / "dqn.npz")
