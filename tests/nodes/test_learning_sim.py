"""The simulated heterogeneous cluster that trains the shipped scheduling table: seeded, and the
learned tables beat running everything where it arrives."""

from __future__ import annotations

from nodes.scheduler.learning import LOCAL
from p2pfaas.experiments.learning import LearningExperiment
from p2pfaas.experiments.learning_sim import measure_greedy, simulate, train_scheduling_tables


class Always:
    def __init__(self, action: int) -> None:
        self.action = action

    def act(self, state, explore: bool = False) -> int:
        return self.action


def test_training_is_seeded_and_beats_running_everything_here():
    exp = LearningExperiment(duration_s=30.0)
    first = train_scheduling_tables(exp, 120.0, seed=3)
    again = train_scheduling_tables(exp, 120.0, seed=3)
    assert all(first[n].q.keys() == again[n].q.keys() for n in first)
    assert all((first[n].q[k] == again[n].q[k]).all() for n in first for k in first[n].q)
    learned = measure_greedy(exp, first, seed=4)
    local = simulate(exp, exp.duration_s, 4, {n.node_id: Always(LOCAL) for n in exp.nodes}, explore=False, train=False)
    assert learned.requests == local.requests > 500
    assert learned.met_rate > local.met_rate + 0.15 and learned.rejected < local.rejected / 5
    assert all(len(state) == 4 for state in first["n1"].q)   # [type, free here, free at each of 2 peers]
