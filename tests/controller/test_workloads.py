"""Training workloads: the named mixes and the weighted mix syntax of ``train scaling --workloads``."""

from collections import Counter

import pytest
from typer.testing import CliRunner

from controller.env import FarmScalingEnv
from controller.training import default_model_path
from controller.workloads import MixError, parse_mix, training_scenario

SEEDS = range(2**32, 2**32 + 300)


def test_a_mix_draws_its_parts_by_weight_and_the_same_as_the_named_mix():
    counts = Counter(training_scenario("paper:40,bursty:20,mixed:40", seed).name.split("-")[0] for seed in SEEDS)
    # bursty: its 20 % and an eighth of mixed's 40 % (mixed takes a shipped scenario for half its seeds)
    assert 0.32 < counts["paper"] / 300 < 0.48 and 0.17 < counts["bursty"] / 300 < 0.33, counts
    assert counts["generated"] and counts["steady"]   # what "mixed" draws from
    # weights are relative, and "paper:25,mixed:75" is mixed-paper episode for episode
    assert parse_mix("paper:1,mixed:3") == (("paper", 0.25), ("mixed", 0.75))
    for seed in SEEDS[:100]:
        assert training_scenario("paper:1,mixed:3", seed) == training_scenario("mixed-paper", seed)


@pytest.mark.parametrize("spec, words", [
    ("paper:0,mixed:1", "positive weight"), ("paper:x", "positive weight"), ("paper:nan", "positive weight"),
    (":3,mixed:1", "NAME:WEIGHT"), ("mixed-paper:1,bursty:1", "write its parts"), ("nowhere:1", "'nowhere'"),
])
def test_a_bad_mix_is_refused_with_its_reason(spec, words):
    with pytest.raises(MixError, match=words):
        parse_mix(spec)


def test_train_scaling_takes_a_mix_and_names_its_file(tmp_path):
    from p2pfaas.cli import app

    runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})
    result = runner.invoke(app, ["train", "scaling", "pg", "--workloads", "paper:3,spike:1", "--steps", "64",
                                 "--out", str(tmp_path / "m.npz")])
    assert result.exit_code == 0, result.output
    # a family alone too ("paper" was looked up as a scenario file and crashed)
    result = runner.invoke(app, ["train", "scaling", "pg", "--workloads", "paper", "--steps", "64",
                                 "--out", str(tmp_path / "p.npz")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["train", "scaling", "pg", "--workloads", "paper:3,spikey:1"])
    assert result.exit_code == 2 and "'spikey'" in result.output, result.output
    assert default_model_path(tmp_path, "pg", "paper:3,spike:1", "target").name == "scaling-pg-paper-3-spike-1-target.npz"
    assert FarmScalingEnv("paper:3,spike:1", action_mode="target").family == "paper:3,spike:1"
