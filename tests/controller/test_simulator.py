import math

import numpy as np
import pytest

from controller.simulator import FarmSimulator, p95

from .conftest import make_scenario


def run(sim: FarmSimulator, seconds: float, step: float):
    return [sim.advance(step) for _ in range(round(seconds / step))]


def erlang_c_wait(rate: float, mean_service: float, servers: int) -> float:
    """Mean queueing delay of M/M/c."""
    a = rate * mean_service
    top = a**servers / math.factorial(servers) * servers / (servers - a)
    p_wait = top / (sum(a**k / math.factorial(k) for k in range(servers)) + top)
    return p_wait / (servers / mean_service - rate)


def test_mmc_waiting_time_and_littles_law():
    sc = make_scenario(
        workers={"min": 6, "max": 6, "initial": 6},
        service_time={"dist": "exponential", "mean": 1.0},
        phases=[{"duration_s": 3000, "rate_per_s": 4.0}],
    )
    latencies, samples, completed = [], [], 0
    for seed in range(2):
        sim = FarmSimulator(sc, seed)
        for t in run(sim, 2990, 0.5):
            samples.append(t.queue_length + t.in_service)
            completed += t.completed
        latencies.append(sim.totals().latency_mean_s)
    want = 1.0 + erlang_c_wait(4.0, 1.0, 6)  # 1.2526 s
    assert np.mean(latencies) == pytest.approx(want, rel=0.06)
    throughput = completed / (2 * 2990)
    assert throughput == pytest.approx(4.0, rel=0.03)
    assert np.mean(samples) == pytest.approx(throughput * np.mean(latencies), rel=0.06)  # L = lambda W


def test_constant_service_without_contention_is_exact():
    sc = make_scenario(workers={"min": 1, "max": 64, "initial": 64}, deadline={"factor": 1.0})
    sim = FarmSimulator(sc, 3)
    windows = run(sim, 95, 5)
    totals = sim.totals()
    assert totals.tasks > 50
    assert totals.latency_mean_s == pytest.approx(2.0) and totals.latency_p95_s == pytest.approx(2.0)
    assert totals.qos == 1.0  # latency == deadline counts as met
    assert all(w.latency_max_s in (0.0, pytest.approx(2.0)) for w in windows)


def test_nothing_is_lost_while_scaling_at_random():
    sc = make_scenario(
        workers={"min": 0, "max": 12, "initial": 3},
        cold_start_seconds={"dist": "uniform", "low": 1, "high": 6},
        scale_down_seconds={"dist": "uniform", "low": 0, "high": 3},
        service_time={"dist": "gamma", "shape": 2, "scale": 1.0},
        phases=[{"duration_s": 400, "rate_per_s": 3.0}],
    )
    sim = FarmSimulator(sc, 11)
    rng = np.random.default_rng(0)
    arrived = completed = 0
    for _ in range(150):
        sim.set_target(int(rng.integers(0, 13)))
        t = sim.advance(float(rng.uniform(0.1, 5)))
        arrived += t.arrivals
        completed += t.completed
        assert arrived == completed + t.queue_length + t.in_service
        assert t.in_service <= t.workers_ready + t.workers_stopping
        assert t.workers_ready + t.workers_starting == sim.target
    totals = sim.totals()
    assert totals.tasks == arrived and totals.unfinished == t.queue_length + t.in_service
    assert totals.workers_added - totals.workers_removed == sim.target - 3


def test_cold_start_is_respected():
    sc = make_scenario(workers={"min": 1, "max": 8, "initial": 1}, cold_start_seconds=5.0, phases=[{"duration_s": 100, "rate_per_s": 20}])
    sim = FarmSimulator(sc, 0)
    sim.advance(1.0)
    sim.set_target(4)
    t = sim.advance(4.9)
    assert (t.workers_ready, t.workers_starting, t.in_service) == (1, 3, 1)
    t = sim.advance(0.2)
    assert (t.workers_ready, t.workers_starting, t.in_service) == (4, 0, 4)
    # a starting worker is billed: 1 worker for 1 s, then 4 workers for 5.1 s
    assert sim.worker_seconds == pytest.approx(1.0 + 4 * 5.1)


def test_scale_down_is_graceful_and_cancels_starting_workers_first():
    sc = make_scenario(
        workers={"min": 1, "max": 8, "initial": 4},
        cold_start_seconds=5.0,
        scale_down_seconds=1.0,
        service_time={"dist": "constant", "value": 10.0},
        phases=[{"duration_s": 100, "rate_per_s": 50}],
    )
    sim = FarmSimulator(sc, 0)
    sim.advance(0.5)  # 4 busy, a queue behind them
    sim.set_target(6)
    sim.set_target(5)  # cancels one of the two starting workers, not a busy one
    t = sim.advance(0.1)
    assert (t.workers_ready, t.workers_starting, t.workers_stopping, t.in_service) == (4, 1, 1, 4)
    sim.set_target(1)  # the other starting one goes, then three busy ones drain
    t = sim.advance(0.1)
    assert (t.workers_ready, t.workers_starting, t.in_service, t.workers_stopping) == (1, 0, 4, 2 + 3)
    t = sim.advance(1.0)  # the two cancelled workers needed their 1 s scale-down
    assert (t.workers_stopping, t.in_service) == (3, 4)
    t = sim.advance(8.85)  # t = 10.55: the first four tasks (arrived before 0.5 s) are done
    assert sim.tasks_completed() == 4 and t.in_service == 1  # only the kept worker took a new task
    assert t.workers_stopping == 3  # drained workers leave 1 s after their task
    t = sim.advance(1.45)
    assert (t.workers_ready, t.workers_stopping, t.in_service) == (1, 0, 1)


def test_same_seed_same_run_and_workload_independent_of_decisions():
    sc = make_scenario(cold_start_seconds={"dist": "uniform", "low": 1, "high": 4}, service_time={"dist": "exponential", "mean": 2.0})

    def trace(seed: int, targets: list[int]):
        sim = FarmSimulator(sc, seed)
        out = []
        for n in targets:
            sim.set_target(n)
            out.append(sim.advance(5.0))
        return sim, out

    a, ta = trace(7, [2, 6, 3, 9])
    b, tb = trace(7, [2, 6, 3, 9])
    assert ta == tb and a.totals() == b.totals()
    c, _ = trace(7, [16, 16, 1, 1])
    assert c.workload_fingerprint() == a.workload_fingerprint()
    d, _ = trace(8, [2, 6, 3, 9])
    assert d.workload_fingerprint() != a.workload_fingerprint()
    a.reset(7)  # reset restarts from the very same state
    a.set_target(2)
    assert a.advance(5.0) == ta[0]


def test_targets_are_clamped_and_only_changes_count():
    sim = FarmSimulator(make_scenario(workers={"min": 2, "max": 5, "initial": 3}), 0)
    assert sim.set_target(99) == 5 and sim.set_target(7) == 5 and sim.set_target(0) == 2
    assert sim.scaling_actions == 2


def test_totals_project_pending_tasks_and_bill_the_pool():
    sc = make_scenario(workers={"min": 1, "max": 4, "initial": 2}, phases=[{"duration_s": 100, "rate_per_s": 3}])
    sim = FarmSimulator(sc, 5)
    run(sim, 60, 5)
    totals = sim.totals()
    assert totals.unfinished > 50  # 2 workers serve 1 task/s, 3 arrive
    assert totals.tasks == sim.tasks_arrived() == sim.tasks_completed() + totals.unfinished
    assert totals.qos < 0.5 and totals.met_deadline <= totals.tasks
    assert totals.worker_seconds == pytest.approx(2 * 60) and totals.mean_workers == pytest.approx(2)
    assert sim.totals() == totals  # projecting does not touch the state


def test_p95_nearest_rank():
    assert p95([]) == 0.0
    assert p95(list(range(1, 101))) == 95
    assert p95([1.0, float("inf")]) == float("inf")
