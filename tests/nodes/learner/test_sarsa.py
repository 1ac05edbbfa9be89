"""SARSA(lambda): the discretisation and the eligibility traces, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from nodes.learner.algorithms import Discretiser, SarsaConfig, SarsaLambda


def test_discretiser_bins_clips_and_never_collides():
    cells = Discretiser(2, bins=(30, 30), low=0.0, high=30.0)
    assert cells([1.5, 23.5]) == (1, 23)
    assert cells([12.5, 3.5]) == (12, 3)  # different tuples, where "123" would collide
    assert cells([-5.0, 99.0]) == (0, 29)  # clipped into the edge bins
    assert cells(np.array([30.0, 0.0], dtype=np.float32)) == (29, 0)
    per_dimension = Discretiser(2, bins=(2, 4), low=(-1.0, 0.0), high=(1.0, 2.0))
    assert per_dimension([0.1, 1.9]) == (1, 3)
    with pytest.raises(ValueError):
        cells([float("nan"), 0.0])
    with pytest.raises(ValueError):
        Discretiser(1, bins=0, low=0.0, high=1.0)
    with pytest.raises(ValueError):
        Discretiser(1, bins=4, low=1.0, high=1.0)


def chain(lam: float) -> SarsaLambda:
    """s0 -> s1 -> s2 -> end with reward 1 at the end; alpha 0.5, gamma 1."""
    agent = SarsaLambda(1, 2, SarsaConfig(alpha=0.5, gamma=1.0, lam=lam, bins=4))
    observations = [np.array([x]) for x in (0.1, 0.4, 0.6, 0.9)]
    agent.update(observations[0], 0, 0.0, observations[1], False)
    agent.update(observations[1], 0, 0.0, observations[2], False)
    agent.update(observations[2], 0, 1.0, observations[3], True)
    return agent


def test_traces_carry_a_reward_back_along_the_chain():
    with_traces = chain(lam=1.0)
    # Both earlier deltas were 0; the final delta of 1 reaches every traced pair with weight 1.
    assert [with_traces.q[(i,)][0] for i in range(3)] == [0.5, 0.5, 0.5]
    one_step = chain(lam=0.0)
    assert [one_step.q[(i,)][0] for i in range(3)] == [0.0, 0.0, 0.5]
    assert with_traces.traces == {} and with_traces.pending is None


def test_a_broken_stream_bootstraps_the_pending_transition_and_cuts_traces():
    agent = SarsaLambda(1, 2, SarsaConfig(alpha=0.5, gamma=0.5, lam=1.0, bins=4, start_e=0.0, end_e=0.0))
    agent.q[(3,)] = np.array([0.0, 4.0])
    agent.update([0.1], 0, 1.0, [0.9], False)  # pending: its next action is not known yet
    assert agent.q.get((0,)) is None or agent.q[(0,)][0] == 0.0
    agent.update([0.4], 1, 0.0, [0.6], False)  # does not start at 0.9: a new stream
    # Bootstrap with the greedy value of (3,) (epsilon 0): 1 + 0.5 * 4 - 0 = 3, times alpha.
    assert agent.q[(0,)][0] == pytest.approx(1.5)
    assert set(agent.traces) == set()  # cut; the new transition waits in pending
    assert agent.pending is not None and agent.pending[0] == (1,)


def test_epsilon_follows_the_linear_schedule():
    agent = SarsaLambda(1, 2, SarsaConfig(start_e=1.0, end_e=0.1, exploration_steps=10))
    for _ in range(5):
        agent.update([0.1], 0, 0.0, [0.1], False)
    assert agent.epsilon == pytest.approx(0.55)
    for _ in range(10):
        agent.update([0.1], 0, 0.0, [0.1], False)
    assert agent.epsilon == pytest.approx(0.1)


@pytest.mark.parametrize("explore", [False, True])
def test_an_unseen_or_untrained_state_keeps_the_pool_never_removes_a_worker(explore):
    agent = SarsaLambda(1, 3, SarsaConfig(bins=10, start_e=0.0, end_e=0.0))   # -1 / 0 / +1 worker
    assert {agent.act([x / 10], explore=explore) for x in range(10)} == {1}   # the middle action: keep
    agent.q[(5,)] = np.zeros(3)                                                # a row never updated
    assert agent.act([0.55], explore=explore) == 1
    agent.q[(5,)][2] = 0.3
    assert agent.act([0.55], explore=explore) == 2
    target_mode = SarsaLambda(1, 7, SarsaConfig(bins=10, default_action=0))   # "target" actions: 0 keeps
    assert target_mode.act([0.5]) == 0 and target_mode.default_action == 0
