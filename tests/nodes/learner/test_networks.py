"""The torch agents' internals: Double DQN's target network and PPO's advantages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.learner.algorithms import PPO, DoubleDQN, DQNConfig, PPOConfig, QNetwork, greedy_action


def test_target_network_follows_the_online_network_on_schedule():
    config = DQNConfig(learning_starts=4, batch_size=4, target_network_frequency=10, train_frequency=1)
    agent = DoubleDQN(2, 3, config, seed=0)
    initial = [p.clone() for p in agent.target_network.parameters()]
    rng = np.random.default_rng(0)
    for step in range(1, 11):
        obs, next_obs = rng.random(2, dtype=np.float32), rng.random(2, dtype=np.float32)
        metrics = agent.update(obs, step % 3, 1.0, next_obs, False)
        if step < 10:
            assert all(torch.equal(a, b) for a, b in zip(initial, agent.target_network.parameters()))
    assert "losses/td_loss" in metrics  # trained from step 5 on, so the online network moved
    for target, online in zip(agent.target_network.parameters(), agent.q_network.parameters()):
        assert torch.equal(target, online)
    assert not all(torch.equal(a, b) for a, b in zip(initial, agent.target_network.parameters()))


def test_greedy_action_is_the_argmax_of_the_q_network():
    network = QNetwork(1, 3, hidden_sizes=())
    with torch.no_grad():
        network.network[0].weight.copy_(torch.tensor([[0.0], [1.0], [-1.0]]))
        network.network[0].bias.zero_()
    assert greedy_action(network, np.array([2.0])) == 1
    assert greedy_action(network, np.array([-2.0])) == 2


def test_advantages_bootstrap_per_transition_and_break_chains():
    agent = PPO(1, 2, PPOConfig(gamma=0.5, gae_lambda=1.0), seed=0)
    last = agent.network.critic[-1]
    with torch.no_grad():  # a critic that says 1.0 everywhere
        last.weight.zero_()
        last.bias.fill_(1.0)
    obs = torch.tensor([[0.0], [1.0], [5.0]])
    next_obs = torch.tensor([[1.0], [2.0], [6.0]])  # 1 continues from 0; 2 starts elsewhere
    rewards = torch.tensor([1.0, 2.0, 4.0])
    terminated = torch.tensor([0.0, 0.0, 1.0])
    advantages, values = agent._advantages(obs, rewards, next_obs, terminated, (False, False, True))
    # deltas: 1 + 0.5*1 - 1 = 0.5; 2 + 0.5*1 - 1 = 1.5; terminated: 4 - 1 = 3
    # chain: t1 ends its run (t2 does not start at 2.0), t0 continues into t1: 0.5 + 0.5*1.5
    assert advantages.tolist() == pytest.approx([1.25, 1.5, 3.0])
    assert values.tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_ppo_trains_once_per_complete_rollout():
    agent = PPO(1, 2, PPOConfig(num_steps=8, num_minibatches=2, update_epochs=1), seed=0)
    before = [p.clone() for p in agent.network.parameters()]
    results = [agent.update([i / 8], i % 2, float(i % 2), [(i + 1) / 8], False) for i in range(8)]
    assert all(r == {} for r in results[:-1])
    assert {"losses/policy_loss", "losses/value_loss", "losses/approx_kl"} <= set(results[-1])
    assert agent.rollout == []
    assert not all(torch.equal(a, b) for a, b in zip(before, agent.network.parameters()))
