import json

import typer
from typer.testing import CliRunner

from controller.baselines import BASELINES
from controller.commands import BASELINE_NAMES, RL_NAMES, eval_scaling, train_scaling
from controller.evaluation import RL_KINDS, rl_agents

app = typer.Typer()
app.command("eval")(eval_scaling)
app.command("train")(train_scaling)
runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})  # error boxes must not wrap the messages


def test_help_lists_every_policy():
    assert BASELINE_NAMES == tuple(BASELINES) and RL_NAMES == RL_KINDS
    result = runner.invoke(app, ["eval", "--help"])
    assert result.exit_code == 0
    assert "--json" in result.output and "--plots" in result.output
    assert runner.invoke(app, ["train", "--help"]).exit_code == 0


def test_eval_writes_table_json_and_plots(tmp_path):
    out, plots = tmp_path / "r.json", tmp_path / "plots"
    result = runner.invoke(app, ["eval", "--scenario", "spike", "--episodes", "2", "--policies", "keda, fixed-3",
                                 "--json", str(out), "--plots", str(plots)])
    assert result.exit_code == 0, result.output
    assert "keda" in result.output and "QoS %" in result.output
    data = json.loads(out.read_text())
    assert [p["name"] for p in data["policies"]] == ["keda", "fixed-3"] and data["episode_seeds"] == [0, 1]
    assert (plots / "scaling-spike.png").is_file()


def test_bad_input_is_a_clear_usage_error(tmp_path):
    result = runner.invoke(app, ["eval", "--policies", "keda,magic"])
    assert result.exit_code == 2 and "unknown policy magic" in result.output
    result = runner.invoke(app, ["eval", "--scenario", str(tmp_path / "nope.json")])
    assert result.exit_code == 2 and "no such scenario file" in result.output
    result = runner.invoke(app, ["train", "alphago"])
    assert result.exit_code == 2 and "unknown agent" in result.output


def test_eval_trains_missing_models_then_reuses_them(tmp_path):
    assert "sarsa" in rl_agents()
    args = ["eval", "--scenario", "steady", "--episodes", "1", "--policies", "sarsa", "--models-dir", str(tmp_path), "--train-steps", "200"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    model = tmp_path / "scaling-sarsa-steady-unit.pt"
    stamp = model.stat().st_mtime_ns
    assert runner.invoke(app, args).exit_code == 0
    assert model.stat().st_mtime_ns == stamp  # loaded, not retrained
    result = runner.invoke(app, ["train", "sarsa", "--scenario", "steady", "--steps", "100", "--out", str(tmp_path / "m.pt")])
    assert result.exit_code == 0 and (tmp_path / "m.pt").is_file()
