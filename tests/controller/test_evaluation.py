import json

import numpy as np
import pytest

from controller.baselines import FixedSize, make_baseline
from controller.evaluation import (
    EvalReport,
    PolicySpec,
    best_fixed_pool,
    episode_workloads,
    evaluate,
    run_episode,
    tune_oracle,
    write_json,
    write_plots,
)
from controller.oracle import ORACLE_BETAS, InstantResizeOracle, LookaheadOracle
from controller.panic import HEADROOM, THRESHOLD
from controller.report import TargetCheck, markdown_report, paired_se, report_table, target_checks, targets_tables
from controller.scenario import load_scenario
from controller.training import load_model, load_rl_policy, rl_agents, sidecar_of, train_agent

from .conftest import make_scenario


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
    table, legend = report_table(report).renderables
    assert table.row_count == 4 and "QoS %" in [c.header for c in table.columns] and "over the episodes" in str(legend)


def test_a_long_peer_name_wraps_between_words_and_no_header_or_number_is_cut_at_80_columns():
    """A rule's full name as the best peer (generated workloads, 1,000 episodes) once squeezed the
    number columns until their headers read "retur / n" and "peer' / s"."""
    from rich.console import Console

    peer = "rule hysteresis beta 4 band [1.5, 6]"
    check = TargetCheck("generated", "pg", 98.06, 99.05, False, 0.94, -27.2, f"{peer} (best of 12 rules)", -26.66,
                        0.40, 9.9, 34.9)
    console = Console(width=80, record=True, color_system=None)
    for table in targets_tables([check]):
        console.print(table)
    lines = console.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    header = next(line for line in lines if line.startswith("scenario") and "best peer" in line)
    assert header.split() == ["scenario", "RL", "return", ">", "peers", "best", "peer", "peer's", "gap", "±", "se"]
    row = lines[lines.index(header) + 2]
    assert row.split()[:4] == ["generated", "pg", "-27.2", "no"] and "-26.7" in row and "-0.5 ± 0.4" in row
    start, end = header.index("best peer"), header.index("peer's")
    at = lines.index(header) + 2
    cell = [lines[at][start:end].strip()]
    while not lines[at + len(cell)][:start].strip():   # the row's continuation lines
        cell.append(lines[at + len(cell)][start:end].strip())
    assert " ".join(cell) == peer, lines   # whole, wrapped between its words


RL = sorted(rl_agents())


def test_every_rl_kind_is_available():
    assert RL == ["dqn", "pg", "sarsa"]


@pytest.mark.parametrize("kind", RL)
def test_train_save_load_evaluate(kind, tmp_path):
    sc = load_scenario("steady")
    calls = []
    trained = train_agent(kind, sc, 300, seed=0, out=tmp_path / f"{kind}.npz", progress=lambda d, t: calls.append((d, t)))
    assert trained.path.is_file() and calls[-1] == (300, 300) and trained.path.stat().st_size < 200_000
    assert len(trained.metrics["charts/episodic_return"]) == 300 // sc.steps
    meta = json.loads(sidecar_of(trained.path).read_text())
    assert meta["seed"] == 0 and meta["steps"] == 300 and meta["kind"] == kind and "train scaling" in meta["command"]
    assert meta["panic"] == {"threshold": THRESHOLD, "headroom": HEADROOM, "tick_s": 2.0}   # the rule it trained under
    assert load_model(trained.path)[1] == meta
    policy = load_rl_policy(trained.path, sc)
    result = evaluate(sc, [policy], episodes=1, seed=0)
    assert result.policies[0].name == kind and len(result.policies[0].episodes[0].steps) == sc.steps + 1


def test_short_training_on_generated_workloads_beats_a_pool_that_never_scales(tmp_path):
    """The statistical check: PPO trained for 4096 steps (seconds) against the trivial policy (the
    initial pool, never scaling) on 16 workloads it never saw, by a one-sided sign test on the
    paired episode returns: at least 12 wins of 16 has p < 0.04 under "no better" (measured: 15)."""
    trained = train_agent("pg", "generated", 4096, seed=0, out=tmp_path / "pg.npz")
    specs = [PolicySpec("pg", lambda sc: load_rl_policy(trained.path, sc), "rl"),
             PolicySpec("fixed", lambda sc: FixedSize(sc), "baseline")]
    rep = evaluate("generated", specs, episodes=16, seed=0)
    agent, fixed = ([e.episode_return for e in p.episodes] for p in rep.policies)
    wins = sum(a > f for a, f in zip(agent, fixed))
    assert wins >= 12, wins
    assert rep.policies[0].metrics["qos_pct"].mean > rep.policies[1].metrics["qos_pct"].mean + 20


def test_unknown_agent_is_refused():
    with pytest.raises(ValueError, match="unknown RL agent 'alphago'"):
        train_agent("alphago", "steady", 10)


# --------------------------------------------------------------------------- references
TWO_PHASES = make_scenario(
    step_seconds=5.0, workers={"min": 1, "max": 40, "initial": 2}, cold_start_seconds=20.0, scale_down_seconds=5.0,
    service_time={"dist": "constant", "value": 1.0}, deadline={"factor": 3.0},
    phases=[{"duration_s": 30.0, "rate_per_s": 2.0}, {"duration_s": 30.0, "rate_per_s": 12.0}])


def test_oracle_anticipates_each_steps_rate_and_resizes_instantly():
    oracle = InstantResizeOracle(TWO_PHASES, beta=0.0)
    result = run_episode(TWO_PHASES, oracle, seed=3)
    # decisions at t = 5, 10, ..: the one at 25 s sizes [25, 30) (rate 2), the one at 30 s [30, 35) (rate 12)
    targets = {round(s.time): s.target for s in result.steps}
    assert targets[30] <= 4 and targets[35] >= 12
    assert all(s.starting == 0 for s in result.steps)              # no cold start, despite 20 s in the scenario
    slow = run_episode(TWO_PHASES, make_baseline("fixed-12", TWO_PHASES), seed=3)
    assert any(s.starting > 0 for s in slow.steps)                  # the others wait for their workers


def test_lookahead_oracle_asks_for_workers_a_cold_start_ahead_and_waits_for_them():
    oracle = LookaheadOracle(TWO_PHASES, beta=0.0)
    assert oracle.horizon_steps == 5                                # the next step + 20 s of cold start
    result = run_episode(TWO_PHASES, oracle, seed=3)
    targets = {round(s.time): s.target for s in result.steps}
    # the decision at 5 s sees [5, 30) (rate 2); the one at 10 s sees [10, 35): the jump to 12/s at 30 s
    assert targets[10] <= 4 and targets[15] >= 12
    assert any(s.starting > 0 for s in result.steps)               # it pays the cold start, as a policy does
    late = run_episode(TWO_PHASES, InstantResizeOracle(TWO_PHASES, beta=0.0), seed=3)
    assert {round(s.time): s.target for s in late.steps}[15] <= 4  # the instant oracle needs no head start


def test_references_are_the_smallest_that_reach_the_target():
    workloads = episode_workloads("bursty", 3, 0)
    fixed = best_fixed_pool(workloads)
    size = int(fixed.name.split()[0].removeprefix("fixed-"))
    assert fixed.metrics["qos_pct"].mean >= 99 and fixed.role == "reference"
    smaller = evaluate("bursty", [FixedSize(load_scenario("bursty"), size - 1)], episodes=3, seed=0)
    assert smaller.policies[0].metrics["qos_pct"].mean < 99
    oracle = tune_oracle(workloads)
    beta = float(oracle.name.split()[2].rstrip(","))
    assert oracle.metrics["qos_pct"].mean >= 99
    lower = ORACLE_BETAS[ORACLE_BETAS.index(beta) - 1]
    below = evaluate("bursty", [PolicySpec("o", lambda sc: InstantResizeOracle(sc, lower))], episodes=3, seed=0)
    assert below.policies[0].metrics["qos_pct"].mean < 99
    assert oracle.metrics["mean_workers"].mean < fixed.metrics["mean_workers"].mean


def test_generated_evaluation_with_references_and_target_checks(tmp_path):
    trained = train_agent("sarsa", "generated", 300, seed=0, out=tmp_path / "sarsa.npz")
    specs = [PolicySpec("sarsa", lambda sc: load_rl_policy(trained.path, sc), "rl"),
             PolicySpec("reactive-avg", lambda sc: make_baseline("reactive-avg", sc), "baseline")]
    rep = evaluate("generated", specs, episodes=3, seed=5, references=True)
    assert rep.scenario == "generated" and rep.episode_seeds == [5, 6, 7]
    assert [e.scenario for e in rep.policies[0].episodes] == ["generated-5", "generated-6", "generated-7"]
    assert [p.role for p in rep.policies] == ["rl", "baseline", "reference", "reference", "reference", "reference"]
    assert rep.policies[-1].name.startswith("lookahead oracle")
    (check,) = target_checks([rep])
    sarsa, peer, lookahead = rep.policies[0], rep.policies[1], rep.policies[-1]
    mean = lambda p, key: p.metrics[key].mean   # noqa: E731
    assert check.policy == "sarsa" and check.best_peer == "reactive-avg"
    assert check.workers_vs_lookahead == pytest.approx(mean(sarsa, "mean_workers") / mean(lookahead, "mean_workers"))
    assert check.beats_peers == (mean(sarsa, "episode_return") > mean(peer, "episode_return"))
    gaps = [a.episode_return - b.episode_return for a, b in zip(sarsa.episodes, peer.episodes)]
    assert check.gap == pytest.approx(np.mean(gaps))
    assert check.gap_se == pytest.approx(np.std(gaps, ddof=1) / np.sqrt(3)) and check.gap_se > 0
    assert check.qos_ok == (None if mean(peer, "qos_pct") < 99 else mean(sarsa, "qos_pct") >= 99)
    assert check.workers_ok == (mean(sarsa, "qos_pct") >= 99 and check.workers_vs_lookahead <= 1.15)
    assert "| **sarsa** |" in markdown_report([rep], 3, 5)
    with pytest.raises(ValueError, match="PolicySpec"):
        evaluate("generated", [FixedSize(load_scenario("steady"))], episodes=2)


def test_the_gap_to_a_peer_is_paired_per_episode():
    """Two policies on the same seeds: the gap's standard error is that of the per-episode differences,
    NaN for a single episode, and a report of other seeds is refused, not paired."""
    specs = [PolicySpec("fixed-9", lambda sc: make_baseline("fixed-9", sc)),
             PolicySpec("reactive-max", lambda sc: make_baseline("reactive-max", sc))]
    three = evaluate("steady", specs, episodes=3, seed=4)
    a, b = three.policies
    gaps = [x.episode_return - y.episode_return for x, y in zip(a.episodes, b.episodes)]
    assert paired_se(a, b) == pytest.approx(np.std(gaps, ddof=1) / np.sqrt(3))
    one = evaluate("steady", specs, episodes=1, seed=4)
    assert np.isnan(paired_se(*one.policies))
    later = evaluate("steady", specs, episodes=3, seed=5)
    for other in (one, later):
        with pytest.raises(ValueError, match="not run the same episodes"):
            paired_se(a, other.policies[1])
