"""The causal rules as peers of eval scaling, and the paper's setting as a workload family."""

import numpy as np
import pytest

from controller.baselines import make_baseline
from controller.evaluation import PolicySpec, evaluate, notable_rules, run_policy
from controller.frontier import rules
from controller.report import target_checks
from controller.workloads import paper_scenario


def test_paper_family_has_the_papers_shape():
    for seed in range(20):
        sc = paper_scenario(seed)
        assert sc.name == f"paper-{seed}" and sc == paper_scenario(seed)
        assert (sc.step_seconds, sc.steps, sc.workers.min, sc.workers.max, sc.workers.initial) == (8, 30, 1, 32, 12)
        assert (sc.cold_start_seconds.low, sc.cold_start_seconds.high) == (5.2, 9.0)
        assert 1.3 <= sc.mean_service_s <= 1.7 and sc.deadline.factor == 2
        quiet, surge, plateau = (p.rate_per_s for p in sc.phases)
        assert 4.5 <= surge / quiet <= 5.5 and 0.55 <= plateau / surge <= 0.8
        # the phases cover the warm-up period and every decision
        assert sum(p.duration_s for p in sc.phases) == 31 * 8
    assert len({paper_scenario(s).phases[0].duration_s for s in range(20)}) > 1   # details differ by seed


def test_notable_rules_are_the_best_by_return_and_the_cheapest_at_99():
    reports = [run_policy(spec, [(paper_scenario(s), s) for s in range(3)]) for spec in rules()]
    best, *cheapest = notable_rules(reports)
    returns = [r.metrics["episode_return"].mean for r in reports]
    assert best.metrics["episode_return"].mean == max(returns) and best.name.startswith("rule ")
    passing = [r for r in reports if r.metrics["qos_pct"].mean >= 99]
    if passing and min(passing, key=lambda r: r.metrics["mean_workers"].mean) is not reports[returns.index(max(returns))]:
        assert cheapest and cheapest[0].metrics["qos_pct"].mean >= 99
        assert cheapest[0].metrics["mean_workers"].mean == min(p.metrics["mean_workers"].mean for p in passing)
    assert notable_rules([]) == []


def test_rules_are_peers_in_the_target_checks():
    """A rule with a better return than every baseline is the best peer an RL policy must beat."""
    # a 'policy' standing in for RL: the baseline with the lowest return here, so rules beat it
    specs = [PolicySpec("keda as rl", lambda sc: make_baseline("keda", sc), "rl"),
             PolicySpec("keda", lambda sc: make_baseline("keda", sc), "baseline")]
    report = evaluate("bursty", specs, episodes=2, seed=3, references=True, rules=rules())
    roles = [p.role for p in report.policies]
    assert roles[:2] == ["rl", "baseline"] and "rule" in roles
    (check,) = target_checks([report])
    best = max((p for p in report.policies if p.role in ("baseline", "rule")),
               key=lambda p: p.metrics["episode_return"].mean)
    assert best.role == "rule" and check.best_peer == best.name
    assert check.best_peer_return == pytest.approx(best.metrics["episode_return"].mean)
    assert not check.beats_peers
    assert check.peer_reaches_99 == any(p.metrics["qos_pct"].mean >= 99 for p in report.policies
                                        if p.role in ("baseline", "rule"))


def test_paper_family_evaluates_by_name():
    report = evaluate("paper", [PolicySpec("kpa", lambda sc: make_baseline("kpa", sc), "baseline")], episodes=2, seed=7)
    assert report.scenario == "paper" and [e.scenario for e in report.policies[0].episodes] == ["paper-7", "paper-8"]
    assert np.isfinite(report.policies[0].metrics["episode_return"].mean)
