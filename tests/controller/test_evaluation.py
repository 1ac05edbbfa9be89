import json

import numpy as np
import pytest

from controller.baselines import FixedSize, make_baseline
from controller.evaluation import (
    EvalReport,
    evaluate,
    load_rl_policy,
    report_table,
    rl_agents,
    train_agent,
    write_json,
    write_plots,
)
from controller.scenario import load_scenario


@pytest.fixture(scope="module")
def report() -> EvalReport:
    sc = load_scenario("bursty")
    return evaluate(sc, [make_baseline(n, sc) for n in ("fixed", "keda", "kpa", "reactive-max")], episodes=3, seed=100)


def test_every_policy_gets_the_same_episodes(report):
    assert report.episode_seeds == [100, 101, 102]
    per_policy = [[(e.seed, e.workload, e.totals.tasks) for e in p.episodes] for p in report.policies]
    assert all(episodes == per_policy[0] for episodes in per_policy)
    assert len({workload for _, workload, _ in per_policy[0]}) == 3  # episodes differ from each other
    # ...while the policies really behaved differently on them
    assert len({p.metrics["worker_seconds"].mean for p in report.policies}) == len(report.policies)


def test_metrics_are_mean_and_sample_std_over_episodes(report):
    kpa = next(p for p in report.policies if p.name == "kpa")
    qos = [100 * e.totals.qos for e in kpa.episodes]
    assert kpa.metrics["qos_pct"].mean == pytest.approx(np.mean(qos))
    assert kpa.metrics["qos_pct"].std == pytest.approx(np.std(qos, ddof=1))
    assert kpa.metrics["episode_return"].mean == pytest.approx(np.mean([e.episode_return for e in kpa.episodes]))
    fixed = report.policies[0]
    assert fixed.metrics["mean_workers"].mean == 12 and fixed.metrics["scaling_actions"].mean == 0
    assert len(fixed.episodes[0].steps) == 31  # warm-up + 30 decisions
    assert fixed.episodes[0].totals.worker_seconds == 12 * 248


def test_seeds_and_names_are_checked():
    sc = load_scenario("steady")
    with pytest.raises(ValueError, match="2\\*\\*32"):
        evaluate(sc, [FixedSize(sc)], episodes=2, seed=2**32 - 1)
    with pytest.raises(ValueError, match="unique"):
        evaluate(sc, [FixedSize(sc), FixedSize(sc)], episodes=1)


def test_outputs(report, tmp_path):
    path = write_json(report, tmp_path / "out" / "report.json")
    assert EvalReport.model_validate_json(path.read_text()) == report
    assert json.loads(path.read_text())["policies"][1]["name"] == "keda"
    (png,) = write_plots(report, tmp_path / "plots")
    assert png.name == "scaling-bursty.png" and png.read_bytes()[:4] == b"\x89PNG"
    table = report_table(report)
    assert table.row_count == 4 and "QoS %" in [c.header for c in table.columns]


RL = sorted(rl_agents())


def test_every_rl_kind_is_available():
    assert RL == ["dqn", "pg", "sarsa"]


@pytest.mark.parametrize("kind", RL)
def test_train_save_load_evaluate(kind, tmp_path):
    sc = load_scenario("steady")
    calls = []
    trained = train_agent(kind, sc, 300, seed=0, out=tmp_path / f"{kind}.pt", progress=lambda d, t: calls.append((d, t)))
    assert trained.path.is_file() and calls[-1] == (300, 300)
    assert len(trained.metrics["charts/episodic_return"]) == 300 // sc.steps
    policy = load_rl_policy(kind, trained.path, sc)
    result = evaluate(sc, [policy], episodes=1, seed=0)
    assert result.policies[0].name == kind and len(result.policies[0].episodes[0].steps) == sc.steps + 1


def test_short_training_beats_a_pool_that_never_scales(tmp_path):
    sc = load_scenario("bursty")
    trained = train_agent("sarsa", sc, 3000, seed=0, out=tmp_path / "sarsa.pt")
    rep = evaluate(sc, [load_rl_policy("sarsa", trained.path, sc), FixedSize(sc)], episodes=5, seed=0)
    agent, fixed = (p.metrics for p in rep.policies)
    assert agent["episode_return"].mean > fixed["episode_return"].mean + 10
    assert agent["qos_pct"].mean > fixed["qos_pct"].mean + 50


def test_unknown_agent_is_refused():
    with pytest.raises(ValueError, match="unknown RL agent 'alphago'"):
        train_agent("alphago", "steady", 10)
