import json

import typer
from typer.testing import CliRunner

from controller.commands import BASELINE_NAMES, RL_NAMES, eval_scaling, train_scaling
from controller.policies import model_for
from controller.training import rl_agents, shipped_model, sidecar_of

app = typer.Typer()
app.command("eval")(eval_scaling)
app.command("train")(train_scaling)
runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})  # error boxes must not wrap the messages


def test_help_lists_every_policy():
    result = runner.invoke(app, ["eval", "--help"])
    assert result.exit_code == 0
    assert "--json" in result.output and "--plots" in result.output and "--markdown" in result.output
    assert runner.invoke(app, ["train", "--help"]).exit_code == 0


def test_eval_writes_tables_targets_json_markdown_and_plots(tmp_path):
    out, plots, md = tmp_path / "r.json", tmp_path / "plots", tmp_path / "t.md"
    result = runner.invoke(app, ["eval", "--scenario", "spike", "--episodes", "2", "--policies", "keda, reactive-avg, sarsa",
                                 "--json", str(out), "--plots", str(plots), "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    assert "keda" in result.output and "QoS %" in result.output and "oracle" in result.output
    assert "RL targets" in result.output   # the shipped sarsa model, checked against the references
    (data,) = json.loads(out.read_text())
    names = [p["name"] for p in data["policies"]]
    assert names[:3] == ["keda", "reactive-avg", "sarsa"] and data["episode_seeds"] == [0, 1]
    assert any(n.startswith("oracle") for n in names) and any("smallest" in n for n in names)
    assert any(p["role"] == "rule" and "best of 12 rules" in p["name"] for p in data["policies"])   # peers
    assert (plots / "scaling-spike.png").is_file() and "| **sarsa** |" in md.read_text()


def test_bad_input_is_a_clear_usage_error(tmp_path):
    result = runner.invoke(app, ["eval", "--policies", "keda,magic"])
    assert result.exit_code == 2 and "unknown policy 'magic'" in result.output
    result = runner.invoke(app, ["eval", "--scenario", str(tmp_path / "nope.json")])
    assert result.exit_code == 2 and "no such scenario file" in result.output
    result = runner.invoke(app, ["train", "alphago"])
    assert result.exit_code == 2 and "unknown agent" in result.output
    result = runner.invoke(app, ["train", "dqn", "--action-mode", "huge"])
    assert result.exit_code == 2 and "target" in result.output


def test_train_writes_a_model_that_eval_then_prefers_over_the_shipped_one(tmp_path):
    assert "sarsa" in rl_agents()
    model = tmp_path / "scaling-sarsa-mixed-target.npz"   # where eval and up look for your own model
    result = runner.invoke(app, ["train", "sarsa", "--steps", "200", "--seed", "3", "--out", str(model)])
    assert result.exit_code == 0, result.output
    meta = json.loads(sidecar_of(model).read_text())
    assert meta["seed"] == 3 and meta["steps"] == 200 and meta["workloads"] == "mixed"
    assert model_for("sarsa", tmp_path) == (model, False)
    assert model_for("sarsa", tmp_path / "elsewhere") == (shipped_model("sarsa"), True)
    result = runner.invoke(app, ["eval", "--scenario", "steady", "--episodes", "1", "--policies", "sarsa",
                                 "--no-references", "--no-rules", "--models-dir", str(tmp_path),
                                 "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    (data,) = json.loads((tmp_path / "r.json").read_text())
    assert [p["name"] for p in data["policies"]] == ["sarsa"]


def test_train_scaling_warm_start_records_how_the_model_was_made(tmp_path):
    model = tmp_path / "ws.npz"
    result = runner.invoke(app, ["train", "pg", "--workloads", "spike", "--steps", "64", "--warm-start", "2",
                                 "--learning-rate", "3e-4", "--out", str(model)])
    assert result.exit_code == 0, result.output
    meta = json.loads(sidecar_of(model).read_text())
    assert meta["warm_start"]["episodes"] == 2 and sum(meta["warm_start"]["best_actions"].values()) == 2
    assert meta["learning_rate"] == 3e-4 and "--warm-start 2" in meta["command"]
    result = runner.invoke(app, ["train", "sarsa", "--warm-start", "2"])
    assert result.exit_code == 2 and "warm start" in result.output


def test_train_scaling_prices_a_miss_as_asked_and_says_so(tmp_path):
    """--miss-cost is the training env's price of a missed deadline (risk-aware training); the
    sidecar records the reward the env trained with."""
    model = tmp_path / "cautious.npz"
    result = runner.invoke(app, ["train", "pg", "--workloads", "spike", "--steps", "64", "--miss-cost", "90",
                                 "--out", str(model)])
    assert result.exit_code == 0, result.output
    meta = json.loads(sidecar_of(model).read_text())
    assert meta["reward"]["miss_cost"] == 90.0
    default = tmp_path / "default.npz"
    assert runner.invoke(app, ["train", "pg", "--workloads", "spike", "--steps", "64", "--out", str(default)]).exit_code == 0
    assert json.loads(sidecar_of(default).read_text())["reward"]["miss_cost"] == 60.0
    result = runner.invoke(app, ["train", "pg", "--miss-cost", "-1", "--out", str(tmp_path / "no.npz")])
    assert result.exit_code == 2 and "--miss-cost" in result.output


def test_train_scaling_from_model_goes_on_training_that_model(tmp_path):
    """Fine-tuning starts from the saved weights (not new ones), keeps the base's digest and sidecar
    (``--ship`` may overwrite the base), and refuses a model of another agent or action space."""
    import hashlib

    import torch

    from controller.env import FarmScalingEnv
    from controller.training import continued_agent, load_model

    base = shipped_model("pg")
    env = FarmScalingEnv("spike", action_mode="target")
    started, _ = continued_agent(base, "pg", "target", env, learning_rate=None)
    shipped, _ = load_model(base)
    for a, b in zip(started.network.parameters(), shipped.network.parameters()):
        assert torch.equal(a, b)   # the very weights of the file, not a fresh network

    model = tmp_path / "tuned.npz"
    result = runner.invoke(app, ["train", "pg", "--workloads", "spike", "--steps", "2048", "--seed", "5",
                                 "--learning-rate", "1e-3", "--from-model", str(base), "--out", str(model)])
    assert result.exit_code == 0, result.output
    meta = json.loads(sidecar_of(model).read_text())
    assert meta["from_model"]["sha256"] == hashlib.sha256(base.read_bytes()).hexdigest()
    assert meta["from_model"]["metadata"]["command"] == json.loads(sidecar_of(base).read_text())["command"]
    assert f"--from-model {base}" in meta["command"] and meta["learning_rate"] == 1e-3
    tuned, _ = load_model(model)
    moved = [float((a - b).abs().max()) for a, b in zip(tuned.network.state_dict().values(), shipped.network.state_dict().values())]
    assert max(moved) > 0 and max(moved) < 1.0   # one rollout of updates away from the base

    for args, words in ((["train", "sarsa", "--from-model", str(base)], "its agent is 'pg', not 'sarsa'"),
                        (["train", "pg", "--action-mode", "unit", "--from-model", str(base)], "its action mode"),
                        (["train", "pg", "--from-model", str(tmp_path / "none.npz")], "none.npz"),
                        (["train", "pg", "--warm-start", "2", "--from-model", str(base)], "warm start")):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and words in result.output, (args, result.output)


def test_widen_gives_a_model_of_14_fields_the_long_memory_ones_and_it_decides_as_before(tmp_path):
    """``--widen``: an older model (14 observation fields; the shipped DQN) goes on training with all
    16; zero weights for the new fields, so before training it acts exactly as it did."""
    import numpy as np

    from controller.env import FarmScalingEnv
    from controller.features import OBSERVATION_FIELDS
    from controller.training import continued_agent, load_model

    base = shipped_model("dqn")
    old, _ = load_model(base)
    assert old.obs_dim == 14
    wide, _ = continued_agent(base, "dqn", "target", FarmScalingEnv("spike", action_mode="target"), None, widen=True)
    rng = np.random.default_rng(3)
    for obs in rng.uniform(0, 1, (200, len(OBSERVATION_FIELDS))).astype(np.float32):
        assert wide.act(obs, explore=False) == old.act(obs[:14], explore=False)

    model = tmp_path / "tuned.npz"
    result = runner.invoke(app, ["train", "dqn", "--workloads", "spike", "--steps", "300", "--from-model", str(base),
                                 "--widen", "--out", str(model)])
    assert result.exit_code == 0, result.output
    assert load_model(model)[0].obs_dim == 16 and "--widen" in json.loads(sidecar_of(model).read_text())["command"]
    result = runner.invoke(app, ["train", "dqn", "--steps", "300", "--from-model", str(base), "--out", str(model)])
    assert result.exit_code == 0, result.output   # without --widen: its own 14 fields
    assert load_model(model)[0].obs_dim == 14
    for args, words in ((["train", "sarsa", "--from-model", str(shipped_model("sarsa")), "--widen"], "no input layer"),
                        (["train", "pg", "--widen"], "needs --from-model")):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and words in result.output, (args, result.output)


def test_eval_tables_read_whole_at_80_columns():
    """Every table of `eval scaling` within 80 columns, every policy, peer and rule name whole on
    its line (a terminal cut them: "fixed-…"); the rules' and references' notes in a legend."""
    from p2pfaas.cli import app as p2pfaas

    result = runner.invoke(p2pfaas, ["eval", "scaling", "--scenario", "paper", "--episodes", "1"], terminal_width=80,
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert not [line for line in lines if len(line) > 80] and "…" not in result.output, result.output
    rows = {line.split("  ")[0].strip() for line in lines}
    for name in (*BASELINE_NAMES, *RL_NAMES, "best rule", "oracle", "lookahead oracle"):
        assert name in rows, (name, result.output)
    assert any(line.startswith("fixed-") for line in lines), result.output
    for title in ("scenario paper", "RL targets: QoS and the limit", "RL targets: the peers",
                  "the paper's setting: its own targets"):
        assert any(line.startswith(title) for line in lines), (title, result.output)
    rule = next(line for line in lines if line.startswith("best rule: "))
    assert "best of 12 rules" in rule, rule   # the rule's name and note whole on one line
    peers = lines[next(i for i, line in enumerate(lines) if line.startswith("RL targets: the peers")) + 3]
    assert peers.split()[:2] == ["paper", "dqn"], peers
