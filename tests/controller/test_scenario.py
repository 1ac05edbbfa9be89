import json
from pathlib import Path

import numpy as np
import pytest

from controller.scenario import ScenarioError, load_scenario, shipped_scenarios

from .conftest import make_scenario


def write(tmp_path: Path, data, name="s.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def base() -> dict:
    return make_scenario().model_dump(mode="json", exclude={"max_steps"})


def test_shipped_scenarios_load_by_name():
    assert shipped_scenarios() == ["bursty", "diurnal", "spike", "steady"]
    for name in shipped_scenarios():
        sc = load_scenario(name)
        assert sc.name == name
        assert (sc.steps + 1) * sc.step_seconds <= sc.duration_s


def test_bursty_is_the_papers_setting():
    sc = load_scenario("bursty")
    assert (sc.step_seconds, sc.steps) == (8, 30)
    assert (sc.workers.min, sc.workers.max, sc.workers.initial) == (1, 32, 12)
    assert (sc.cold_start_seconds.low, sc.cold_start_seconds.high) == (5, 9)
    assert sc.service_time.dist == "gamma" and sc.mean_service_s == pytest.approx(1.5, abs=0.05)
    assert sc.deadline.factor == 2
    assert [p.pattern for p in sc.phases] == ["constant", "constant", "sine", "sine"]
    assert sc.phases[1].rate_per_s > 2 * sc.phases[0].rate_per_s  # the surge


def test_load_from_path_and_default_max_steps(tmp_path):
    sc = load_scenario(write(tmp_path, base()))
    assert sc.max_steps == 19  # 100 s of phases, 5 s steps, one warm-up step
    assert load_scenario(str(write(tmp_path, base()))) == sc
    assert load_scenario(sc) is sc


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"workers": {"min": 1, "max": 4, "initial": 8}}, "min <= initial <= max"),
        ({"max_steps": 20}, "exceeds the phases' total 100 s"),
        ({"bogus": 1}, "bogus"),
        ({"service_time": {"dist": "weibull", "a": 1}}, "weibull"),
        ({"phases": [{"duration_s": 10, "rate_per_s": 1, "pattern": "sine", "amplitude_per_s": 2, "period_s": 5}]}, "negative"),
        ({"phases": [{"duration_s": 10, "rate_per_s": 1, "pattern": "spike", "spike_rate_per_s": 5, "spike_start_s": 8, "spike_duration_s": 5}]}, "spike ends after"),
        ({"cold_start_seconds": {"dist": "uniform", "low": 5, "high": 1}}, "below low"),
        ({"step_seconds": 0}, "greater than 0"),
        ({"phases": []}, "at least 1"),
    ],
)
def test_invalid_fields_are_named(tmp_path, change, message):
    data = base() | change
    with pytest.raises(ScenarioError, match="invalid scenario") as err:
        load_scenario(write(tmp_path, data))
    assert message in str(err.value)
    assert str(tmp_path / "s.json") in str(err.value)


def test_unknown_name_lists_shipped():
    with pytest.raises(ScenarioError, match="unknown scenario 'nope'.*bursty"):
        load_scenario("nope")


def test_missing_file_and_bad_json(tmp_path):
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_scenario(tmp_path / "missing.json")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_scenario(write(tmp_path, '{"name": "x",'))
    with pytest.raises(ScenarioError, match="JSON object"):
        load_scenario(write(tmp_path, "[1, 2]"))


def test_yaml_loads_or_says_what_is_missing(tmp_path):
    path = write(tmp_path, json.dumps(base()), name="s.yaml")  # JSON is valid YAML
    try:
        import yaml  # noqa: F401
    except ImportError:
        with pytest.raises(ScenarioError, match="pyyaml"):
            load_scenario(path)
    else:
        assert load_scenario(path).name == "test"


def test_distribution_means_include_clamping():
    sc = make_scenario(service_time={"dist": "gamma", "shape": 4, "scale": 0.375})
    assert sc.mean_service_s == 1.5
    clamped = make_scenario(service_time={"dist": "exponential", "mean": 1.0, "max": 1.0})
    assert clamped.mean_service_s == pytest.approx(1 - np.exp(-1), rel=0.01)  # E[min(X, 1)]
    draws = clamped.service_time.sample(np.random.default_rng(1), 10_000)
    assert draws.max() == 1.0 and draws.mean() == pytest.approx(clamped.mean_service_s, rel=0.02)
    lognormal = make_scenario(service_time={"dist": "lognormal", "mu": 0.0, "sigma": 0.5})
    assert lognormal.mean_service_s == pytest.approx(np.exp(0.125))


def test_deadline_is_factor_times_own_service_clamped():
    sc = make_scenario(deadline={"factor": 2, "min": 1.0, "max": 5.0})
    assert sc.deadline.for_service(np.array([0.2, 1.0, 4.0])).tolist() == [1.0, 2.0, 5.0]
    assert sc.mean_deadline_s == 4.0  # constant 2 s service


def test_thinning_follows_the_rate():
    sc = make_scenario(
        phases=[
            {"duration_s": 200, "rate_per_s": 5, "pattern": "sine", "amplitude_per_s": 5, "period_s": 200},
            {"duration_s": 100, "rate_per_s": 1, "pattern": "spike", "spike_rate_per_s": 20, "spike_start_s": 40, "spike_duration_s": 20},
        ]
    )
    arrivals = np.concatenate([sc.sample_arrivals(np.random.default_rng(s), sc.duration_s) for s in range(20)])
    assert np.all(np.diff(sc.sample_arrivals(np.random.default_rng(0), sc.duration_s)) >= 0)
    rising = np.sum(arrivals < 100) / 20      # expected 500 + 5 * 200 / pi = 818.3
    falling = np.sum((arrivals >= 100) & (arrivals < 200)) / 20  # 181.7
    spike = np.sum((arrivals >= 240) & (arrivals < 260)) / 20    # 400
    quiet = np.sum(arrivals >= 260) / 20                          # 40
    for got, want in ((rising, 818.3), (falling, 181.7), (spike, 400), (quiet, 40)):
        assert abs(got - want) < 4 * np.sqrt(want / 20) + 1
    assert sc.rate_at(np.array([50.0, 250.0, 999.0])).tolist() == pytest.approx([5 + 5 * np.sin(np.pi / 2), 20, 0])
