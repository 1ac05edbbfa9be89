"""One set of scaling-policy names for every command (``ppo`` was refused by ``up`` after 15 s,
and ``eval --policies`` refused the model file that ``up --controller`` takes)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from controller.baselines import BASELINES
from controller.names import ALIASES, BASELINE_NAMES, RL_NAMES, PolicyNameError, canonical, rl_agent
from controller.policies import resolve_policy
from controller.scenario import load_scenario
from controller.training import RL_KINDS, train_agent
from p2pfaas.cli import app

runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})


def test_the_names_are_the_policies_that_exist():
    assert set(BASELINE_NAMES) == set(BASELINES) - {"fixed"} and RL_NAMES == RL_KINDS
    assert all(target in (*RL_NAMES, *BASELINE_NAMES) for target in ALIASES.values())


def test_aliases_and_nearest_names(tmp_path):
    assert canonical("ppo") == "pg" and canonical("reactive") == "reactive-avg" and rl_agent("ppo") == "pg"
    assert canonical("fixed-3") == "fixed-3" and canonical("off", off=True) == "off"
    with pytest.raises(PolicyNameError, match=r"unknown policy 'off': .*known: auto, dqn, pg \(ppo\)"):
        canonical("off")
    with pytest.raises(PolicyNameError, match="unknown policy 'auto'"):
        canonical("auto", auto=False)
    with pytest.raises(PolicyNameError, match="did you mean sarsa"):
        canonical("sarsaa")
    with pytest.raises(PolicyNameError, match="worker count of 1 or more"):
        canonical("fixed-x")
    with pytest.raises(PolicyNameError, match="no model file"):
        canonical(str(tmp_path / "none.npz"))
    with pytest.raises(PolicyNameError, match=r"unknown agent 'kpa': available: dqn, pg, sarsa \(ppo: pg\)"):
        rl_agent("kpa")


def test_ppo_and_a_model_file_everywhere(tmp_path):
    sc = load_scenario("spike")
    _, name, note = resolve_policy("ppo", sc, tmp_path)   # what up --controller and controller --policy run
    assert name == "pg" and "RL policy pg" in note
    model = train_agent("sarsa", "generated", 100, seed=1, out=tmp_path / "mine.npz").path
    result = runner.invoke(app, ["eval", "scaling", "--scenario", "spike", "--episodes", "1", "--no-references",
                                 "--no-rules", "--policies", f"ppo,{model},reactive"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0] for line in result.output.splitlines() if line.split()}
    assert {"pg", "mine.npz", "reactive-avg"} <= rows, result.output
    result = runner.invoke(app, ["eval", "scaling", "--policies", "pg,ppo"])
    assert result.exit_code == 2 and "a policy is named twice: pg, pg" in result.output, result.output
    result = runner.invoke(app, ["train", "scaling", "alphago"])
    assert result.exit_code == 2 and "unknown agent 'alphago'" in result.output, result.output
