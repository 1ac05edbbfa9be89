"""Differential SARSA: P2PFaaS's learner semantics, with its two defects fixed."""

from __future__ import annotations

import numpy as np
import pytest

from broker.messages import SchedulingExperience
from nodes.learner.algorithms import DifferentialSarsa, DifferentialSarsaConfig


def sample(eid: int, state, action: int, reward: float) -> dict:
    return {"eid": eid, "state": list(state), "action": action, "reward": reward}


def test_defaults_are_p2pfaas():
    agent = DifferentialSarsa()
    assert agent.parameters() == {
        "actions_n": 2, "alpha": 0.01, "beta": 0.01, "epsilon_start": 0.9, "epsilon_min": 0.1,
        "epsilon_decay": 0.99, "epsilon_decay_enabled": True, "window_size": 5, "default_action": 1,
    }
    assert agent.epsilon == 0.9


@pytest.mark.parametrize("explore", [False, True])
def test_an_unseen_or_untrained_state_gets_the_safe_default_never_action_0(explore):
    agent = DifferentialSarsa(n_actions=5, config=DifferentialSarsaConfig(epsilon_start=0.0, epsilon_min=0.0))
    assert [agent.act([float(i), 0.0], explore=explore) for i in range(20)] == [1] * 20   # never seen: run here
    agent.train_window([sample(1, (0, 1), 2, 1.0), sample(2, (7, 7), 3, 1.0)])  # (7, 7) only as a successor
    assert (7.0, 7.0) in agent.q and agent.act([7, 7], explore=explore) == 1    # an all-zero row: still 1
    assert agent.act([0, 1], explore=explore) == 2                               # a learned preference wins
    agent.set_parameters({"default_action": 4})
    assert agent.act([9, 9], explore=explore) == 4
    with pytest.raises(ValueError):
        agent.set_parameters({"default_action": -1})


def test_average_reward_is_incremented_not_assigned():
    agent = DifferentialSarsa(config=DifferentialSarsaConfig(alpha=0.5, beta=0.1))
    result = agent.train_window([sample(1, (0,), 0, 1.0), sample(2, (1,), 1, 0.0), sample(3, (0,), 0, 2.0)])
    # Pair 1 -> 2: delta = 1 - 0 + Q((1,),1)=0 - Q((0,),0)=0 = 1.0
    #   avg_r = 0 + 0.1 * 1.0 = 0.1;  Q((0,),0) = 0 + 0.5 * 1.0 = 0.5
    # Pair 2 -> 3: delta = 0 - 0.1 + Q((0,),0)=0.5 - Q((1,),1)=0 = 0.4
    #   avg_r = 0.1 + 0.1 * 0.4 = 0.14 (the original assigned: 0.0 + 0.1 * 0.4 = 0.04);  Q((1,),1) = 0.2
    assert result["trained"] == 2
    assert agent.average_reward == pytest.approx(0.14)
    assert agent.q[(0.0,)][0] == pytest.approx(0.5)
    assert agent.q[(1.0,)][1] == pytest.approx(0.2)
    assert agent.q[(1.0,)][0] == 0.0
    assert agent.stats()["eid_last_trained"] == 3


def test_states_that_concatenate_alike_never_collide():
    agent = DifferentialSarsa(config=DifferentialSarsaConfig(alpha=1.0, beta=0.0))
    agent.train_window([sample(1, (1, 23), 1, 1.0), sample(2, (12, 3), 0, 0.0)])
    assert agent.q[(1.0, 23.0)][1] == 1.0
    assert agent.q[(12.0, 3.0)][1] == 0.0  # the original keyed both as "123"
    agent.train_window([sample(1, (1, 2), 0, 5.0), sample(2, (1, 2, 0), 0, 0.0)])
    assert agent.q[(1.0, 2.0)][0] == 5.0 and agent.q[(1.0, 2.0, 0.0)][0] == 0.0
    assert agent.stats()["states"] == 4
    assert agent.act([1, 23]) == 1 and agent.q[(12.0, 3.0)].max() == 0.0


def test_train_window_sorts_skips_gaps_and_duplicates():
    agent = DifferentialSarsa(config=DifferentialSarsaConfig(alpha=0.5, beta=0.0))
    shuffled = [sample(5, (2,), 0, 0.0), sample(2, (1,), 0, 0.0), sample(1, (0,), 1, 1.0),
                sample(1, (9,), 0, 99.0), sample(4, (3,), 1, 7.0)]
    result = agent.train_window(shuffled)
    # runs 1-2 and 4-5: two pairs; the duplicate eid 1 is ignored; 2 -> 4 is a gap.
    assert (result["trained"], result["runs"]) == (2, 2)
    assert agent.q[(0.0,)][1] == pytest.approx(0.5)
    assert agent.q[(3.0,)][1] == pytest.approx(3.5)
    assert (1.0,) not in agent.q or agent.q[(1.0,)][0] == 0.0
    assert (9.0,) not in agent.q


def test_train_window_accepts_broker_experiences():
    agent = DifferentialSarsa(config=DifferentialSarsaConfig(alpha=0.5, beta=0.0))
    experiences = [SchedulingExperience(eid=i, state=[float(i % 2), 1.0], action=i % 2, reward=1.0) for i in range(5)]
    assert agent.train_window(experiences)["trained"] == 4
    assert agent.stats()["trained_items"] == 4 and agent.stats()["windows"] == 1


def test_online_update_matches_train_window():
    window = [sample(1, (0,), 0, 1.0), sample(2, (1,), 1, 0.0), sample(3, (0,), 1, 0.5), sample(4, (1,), 0, 0.0)]
    by_window = DifferentialSarsa(config=DifferentialSarsaConfig(alpha=0.3, beta=0.2))
    by_window.train_window(window)
    online = DifferentialSarsa(config=DifferentialSarsaConfig(alpha=0.3, beta=0.2))
    for now, nxt in zip(window, window[1:]):
        online.update(now["state"], now["action"], now["reward"], nxt["state"], False)
    online.update(window[-1]["state"], window[-1]["action"], 0.0, [0.0], False)  # completes the third pair
    assert online.average_reward == pytest.approx(by_window.average_reward)
    for state, row in by_window.q.items():
        np.testing.assert_allclose(online.q[state], row)


def test_epsilon_decays_per_exploring_act_down_to_the_minimum():
    agent = DifferentialSarsa(seed=1)
    agent.act([0.0])  # greedy: no decay, not counted
    assert agent.epsilon == 0.9 and agent.stats()["inferences"] == 0
    for _ in range(10):
        agent.act([0.0], explore=True)
    assert agent.epsilon == pytest.approx(0.9 * 0.99**10)
    for _ in range(500):
        agent.act([0.0], explore=True)
    assert agent.epsilon == pytest.approx(0.1)
    assert agent.stats()["inferences"] == 510


def test_parameters_change_at_run_time():
    agent = DifferentialSarsa()
    agent.train_window([sample(1, (0,), 1, 1.0), sample(2, (0,), 1, 1.0)])
    new = agent.set_parameters({"alpha": "0.5", "epsilon_decay_enabled": "false", "window_size": "8", "actions_n": 4})
    assert new["alpha"] == 0.5 and new["epsilon_decay_enabled"] is False and new["window_size"] == 8
    assert agent.q[(0.0,)].shape == (4,) and agent.q[(0.0,)][1] > 0
    agent.act([0.0], explore=True)
    assert agent.epsilon == 0.9
    before = agent.parameters()
    bad_values = ({"gamma": 0.9}, {"alpha": "fast"}, {"window_size": 1}, {"epsilon_decay_enabled": "maybe"}, {"alpha": 0})
    for bad in bad_values:
        with pytest.raises(ValueError):
            agent.set_parameters(bad)
    assert agent.parameters() == before


def test_reset_forgets_everything():
    agent = DifferentialSarsa()
    agent.train_window([sample(1, (0,), 1, 1.0), sample(2, (0,), 1, 1.0)])
    agent.act([0.0], explore=True)
    agent.reset()
    assert agent.q == {} and agent.average_reward == 0.0 and agent.epsilon == 0.9
    assert agent.stats() | {"epsilon": 0} == {"inferences": 0, "trained_items": 0, "windows": 0, "epsilon": 0,
                                              "average_reward": 0.0, "states": 0, "eid_last_trained": None}


def test_non_finite_states_are_refused():
    with pytest.raises(ValueError):
        DifferentialSarsa().act([float("nan"), 1.0])


def test_a_window_with_a_bad_sample_is_refused_untrained():
    agent = DifferentialSarsa()
    for bad in (sample(2, (1,), 3, 0.0), sample(2, (1,), -1, 0.0), sample(2, (float("inf"),), 0, 0.0)):
        with pytest.raises(ValueError):
            agent.train_window([sample(1, (0,), 1, 1.0), bad])
    assert agent.q == {} and agent.stats()["trained_items"] == 0
