"""Online adaptation in the simulator: the live learning path over consecutive episodes."""

import logging

import pytest

from controller.adaptation import OnlineLearning, run_online
from controller.baselines import RLPolicy
from controller.evaluation import run_episode
from controller.training import load_model, shipped_model
from controller.workloads import paper_scenario


def test_the_shipped_weights_decide_until_the_learner_publishes_and_the_guard_lets_them():
    agent, metadata = load_model(shipped_model("pg"))
    sc = paper_scenario(3)
    learner = OnlineLearning(agent, metadata["action_mode"], sc, guard_options={"reference_periods": 8})
    learner.rebind(sc)
    online = run_episode(sc, learner, 3, panic=True)
    frozen_agent, _ = load_model(shipped_model("pg"))
    shipped = run_episode(sc, RLPolicy("shipped", frozen_agent, sc, metadata["action_mode"]), 3, panic=True)
    # PPO trains on rollouts of 32 experiences: until the first version, the same decisions as the shipped model
    first = [s.target for s in online.steps[:32]]
    assert first == [s.target for s in shipped.steps[:32]]
    assert learner.slot.experiences == 29   # 30 decisions: each but the last has its outcome in the episode
    assert learner.periods == 30


def test_online_run_trains_publishes_versions_and_accounts_every_episode(caplog):
    caplog.set_level(logging.WARNING, logger="controller.online")
    episodes = list(run_online(shipped_model("pg"), "paper", 4, seed=50))
    assert [e.scenario for e in episodes] == [f"paper-{s}" for s in range(50, 54)]
    last = episodes[-1]
    assert last.periods == 4 * 30 and 0 < last.online_periods < last.periods
    assert last.model_version.startswith("online-") or last.rollbacks > 0
    # a rollback is said, and counted
    assert last.rollbacks == sum("rolling back" in r.getMessage() for r in caplog.records)
    for e in episodes:
        assert e.online_cost > 0 and e.shipped_cost > 0 and 0 < e.online_qos <= 1
    # the shipped model frozen: the same cost for the same episode, whatever ran before it
    again = list(run_online(shipped_model("pg"), "paper", 1, seed=53))
    assert again[0].shipped_cost == pytest.approx(episodes[-1].shipped_cost)
