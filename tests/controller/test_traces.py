"""Recorded workloads (controller/traces.py): the Azure Functions 2019 format and a plain CSV, as
scenario files every command reads; a generated sample in the Azure format, nothing downloaded."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from controller.scenario import ScenarioError, load_scenario, shipped_scenarios
from controller.simulator import FarmSimulator
from controller.traces import write_azure_sample


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> tuple[Path, Path]:
    return write_azure_sample(tmp_path_factory.mktemp("azure"), seed=3, functions=4)


def day_counts(invocations: Path) -> dict[str, np.ndarray]:
    with invocations.open() as f:
        rows = list(csv.reader(f))[1:]
    return {row[2]: np.array(row[4:], dtype=int) for row in rows}


def scenario_file(directory: Path, trace: dict, **fields) -> Path:
    data = {"name": "trace", "step_seconds": 5.0, "workers": {"min": 1, "max": 32, "initial": 2},
            "deadline": {"factor": 3.0}, "trace": trace, **fields}
    path = directory / "trace.json"
    path.write_text(json.dumps(data))
    return path


def test_an_azure_window_is_replayed_as_its_exact_counts_per_minute(sample):
    invocations, durations = sample
    counts = day_counts(invocations)
    fn = max(counts, key=lambda k: counts[k][100:160].sum())
    sc = load_scenario(scenario_file(invocations.parent, {
        "format": "azure", "invocations": invocations.name, "durations": durations.name,
        "functions": [fn[:10]], "start_minute": 100, "minutes": 60, "seconds_per_minute": 5.0}))
    window = counts[fn][100:160]
    assert sc.phases[0].counts == window.tolist()
    assert sc.steps == 59 and fn[:8] in sc.description
    for seed in (0, 1):
        arrivals, _ = sc.sample_tasks(np.random.default_rng(seed), sc.duration_s)
        per_minute = np.bincount((arrivals // 5.0).astype(int), minlength=60)
        assert per_minute.tolist() == window.tolist()   # exact counts, times drawn within each minute
    assert sc.rate_at(np.array([2.5, 7.5])).tolist() == pytest.approx((window[:2] / 5.0).tolist())


def test_azure_durations_become_the_functions_percentile_curves(sample):
    invocations, durations = sample
    with durations.open() as f:
        rows = {row["HashFunction"]: row for row in csv.DictReader(f)}
    sc = load_scenario(scenario_file(invocations.parent, {
        "format": "azure", "invocations": invocations.name, "durations": durations.name, "top": 1,
        "minutes": 120, "seconds_per_minute": 2.0, "duration_scale": 0.5}))
    busiest = max(day_counts(invocations).items(), key=lambda kv: kv[1][:120].sum())[0]
    row = rows[busiest]
    [curve] = sc.service_time.curves
    assert [q for q, _ in curve.points] == [0, 1, 25, 50, 75, 99, 100]
    assert curve.points[3][1] == pytest.approx(float(row["percentile_Average_50"]) / 1000 * 0.5)
    draws = sc.service_time.sample(np.random.default_rng(0), 40_000)
    assert np.median(draws) == pytest.approx(curve.points[3][1], rel=0.03)
    assert np.percentile(draws, 99) <= curve.points[5][1] * 1.01
    assert sc.mean_service_s == pytest.approx(draws.mean(), rel=0.03)


def test_several_functions_are_summed_and_mixed_by_their_share_of_calls(sample):
    invocations, durations = sample
    counts = day_counts(invocations)
    two = sorted(counts, key=lambda k: -counts[k][:60].sum())[:2]
    sc = load_scenario(scenario_file(invocations.parent, {
        "format": "azure", "invocations": invocations.name, "durations": durations.name,
        "functions": two, "minutes": 60, "seconds_per_minute": 3.0}))
    assert sc.phases[0].counts == (counts[two[0]][:60] + counts[two[1]][:60]).tolist()
    assert [c.weight for c in sc.service_time.curves] == [counts[k][:60].sum() for k in two]


def test_peak_rate_scales_the_counts_and_a_service_time_stands_in_for_missing_durations(sample):
    invocations, _ = sample
    sc = load_scenario(scenario_file(invocations.parent, {
        "format": "azure", "invocations": str(invocations), "top": 1, "minutes": 30,
        "seconds_per_minute": 4.0, "peak_rate_per_s": 5.0}, service_time={"dist": "constant", "value": 0.5}))
    assert max(sc.phases[0].counts) == 20 and sc.phases[0].peak_rate == 5.0
    assert sc.mean_service_s == 0.5


@pytest.mark.parametrize("trace, fields, expected", [
    ({"functions": ["zzzzzzzz"]}, {}, "no HashFunction"),
    ({"functions": ["ab"]}, {}, "at least 6 characters"),
    ({"start_minute": 1400, "minutes": 60}, {}, "exceeds the 1440 minutes"),
    ({"durations": None}, {}, "give the scenario a service_time"),
    ({"rate_scale": 2.0, "peak_rate_per_s": 3.0}, {}, "not both"),
    ({}, {"phases": [{"duration_s": 60, "rate_per_s": 1}]}, "either `trace` or `phases`"),
    ({"invocations": "missing.csv"}, {}, "no such trace file"),
    ({"format": "parquet"}, {}, "invalid trace section"),
])
def test_a_bad_trace_section_is_refused_with_a_clear_reason(sample, trace, fields, expected):
    invocations, durations = sample
    section = {"format": "azure", "invocations": invocations.name, "durations": durations.name, **trace}
    section = {k: v for k, v in section.items() if v is not None}
    with pytest.raises(ScenarioError, match=expected):
        load_scenario(scenario_file(invocations.parent, section, **fields))


def test_a_file_in_another_format_is_refused_by_its_header(tmp_path):
    (tmp_path / "inv.csv").write_text("arrival_s,duration_s\n1,2\n")
    with pytest.raises(ScenarioError, match="not an Azure Functions invocations file"):
        load_scenario(scenario_file(tmp_path, {"format": "azure", "invocations": "inv.csv"},
                                    service_time={"dist": "constant", "value": 1}))


def test_a_plain_csv_is_replayed_as_recorded_arrivals_with_their_own_durations(tmp_path):
    rng = np.random.default_rng(7)
    arrivals = np.sort(rng.uniform(0, 200, 300))
    durations = rng.uniform(0.1, 3.0, 300)
    rows = sorted(zip(arrivals, durations), key=lambda r: -r[1])   # out of order on purpose
    with (tmp_path / "calls.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["function", "duration_s", "arrival_s"])
        writer.writerows([["fn", d, a] for a, d in rows])
    sc = load_scenario(scenario_file(tmp_path, {"format": "csv", "path": "calls.csv", "start_s": 50,
                                                "duration_s": 100, "time_scale": 0.5}))
    inside = (arrivals >= 50) & (arrivals < 150)
    assert sc.duration_s == 50 and sc.service_time.dist == "empirical"
    for seed in (0, 5):   # the same tasks in every episode
        got_arrivals, got_service = sc.sample_tasks(np.random.default_rng(seed), sc.duration_s)
        assert got_arrivals == pytest.approx((arrivals[inside] - 50) * 0.5)
        assert got_service == pytest.approx(durations[inside])
    sim = FarmSimulator(sc, seed=1)
    sim.set_target(32)
    sim.advance(sc.duration_s)
    assert sim.tasks_arrived() == int(inside.sum())


def test_a_csv_with_a_bad_number_names_its_line(tmp_path):
    (tmp_path / "calls.csv").write_text("arrival_s,duration_s\n1.0,0.5\nsoon,0.5\n")
    with pytest.raises(ScenarioError, match=r"calls.csv:3: not a number"):
        load_scenario(scenario_file(tmp_path, {"format": "csv", "path": "calls.csv"}))
    (tmp_path / "calls.csv").write_text("when,duration_s\n1.0,0.5\n")
    with pytest.raises(ScenarioError, match="no arrival_s column"):
        load_scenario(scenario_file(tmp_path, {"format": "csv", "path": "calls.csv"}))


def test_the_shipped_scenarios_draw_the_same_tasks_as_before():
    """sample_tasks keeps the random stream of arrivals then service times (the shipped models'
    evaluations and the tables in the docs stay as measured)."""
    for name in shipped_scenarios():
        sc = load_scenario(name)
        rng = np.random.default_rng(11)
        arrivals = sc.sample_arrivals(rng, sc.duration_s)
        service = sc.service_time.sample(rng, len(arrivals))
        got_arrivals, got_service = sc.sample_tasks(np.random.default_rng(11), sc.duration_s)
        assert np.array_equal(arrivals, got_arrivals) and np.array_equal(service, got_service)


def test_eval_scaling_runs_the_trace_sample_it_wrote(tmp_path):
    """The documented path: `eval trace-sample DIR`, then `eval scaling --scenario DIR/azure-sample.json`."""
    cli = [sys.executable, "-m", "p2pfaas.cli", "eval"]
    done = subprocess.run([*cli, "trace-sample", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    scenario = tmp_path / "azure-sample.json"
    assert str(scenario) in done.stdout
    report = tmp_path / "report.json"
    done = subprocess.run([*cli, "scaling", "--scenario", str(scenario), "--policies", "reactive-max,pg",
                           "--episodes", "2", "--no-references", "--no-rules", "--json", str(report)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [result] = json.loads(report.read_text())
    assert result["scenario"] == "azure-sample"
    by_name = {p["name"]: p for p in result["policies"]}
    assert set(by_name) == {"reactive-max", "pg"}
    for policy in by_name.values():
        assert policy["metrics"]["qos_pct"]["mean"] > 50 and policy["metrics"]["mean_workers"]["mean"] >= 1
