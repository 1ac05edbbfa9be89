"""Stable-Baselines3 trains on the env unchanged (optional extra)."""

import gymnasium as gym
import pytest
import torch

import controller

pytestmark = pytest.mark.sb3


@pytest.mark.parametrize("algorithm", ["DQN", "PPO"])
def test_sb3_trains_on_the_env(algorithm):
    sb3 = pytest.importorskip("stable_baselines3")
    env = gym.make(controller.ENV_ID, scenario="bursty")
    if algorithm == "DQN":
        model = sb3.DQN("MlpPolicy", env, learning_starts=50, buffer_size=1_000, batch_size=32, seed=0, device="cpu")
    else:
        model = sb3.PPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=2, seed=0, device="cpu")
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    model.learn(total_timesteps=300)
    assert model.num_timesteps >= 300
    after = model.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "learning changed no parameter"
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, deterministic=True)
    assert env.action_space.contains(int(action))
    env.close()


@pytest.fixture
def sb3_model(tmp_path):
    """A PPO model trained on the env for a few hundred steps and saved as SB3 saves it."""
    sb3 = pytest.importorskip("stable_baselines3")
    env = gym.make(controller.ENV_ID, scenario="spike")
    model = sb3.PPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=256)
    path = tmp_path / "mine-ppo.zip"
    model.save(path)
    env.close()
    return path


def test_an_sb3_model_is_evaluated_beside_the_others(sb3_model, tmp_path):
    """Its .zip was refused by `eval scaling`."""
    from typer.testing import CliRunner

    from p2pfaas.cli import app

    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, [
        "eval", "scaling", "--scenario", "spike", "--episodes", "1", "--no-references", "--no-rules",
        "--policies", f"{sb3_model},kpa"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0] for line in result.output.splitlines() if line.split()}
    assert {"mine-ppo.zip", "kpa"} <= rows, result.output
    not_a_model = tmp_path / "junk.zip"
    not_a_model.write_bytes(b"PK not really")
    result = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["eval", "scaling", "--policies", str(not_a_model)])
    assert result.exit_code == 2 and "is not a Stable-Baselines3 model" in result.output, result.output


async def test_an_sb3_model_drives_the_live_controller(sb3_model, node_factory, nc, prefix):
    """`up --controller FILE.zip` / `controller --policy FILE.zip`: it decides (scale commands
    with its name), and says it does not learn online (its weights are not the learner's kind)."""
    from broker.messages import ScaleCommand
    from broker.codec import decode
    from broker.subjects import Subjects
    from controller.live import LiveController
    from controller.policies import resolve_policy
    from nodes.settings import PoolSpec
    from support import Collector, wait_until

    from .conftest import make_scenario

    scenario = make_scenario(step_seconds=0.5, workers={"min": 1, "max": 4, "initial": 1},
                             service_time={"dist": "constant", "value": 0.1})
    policy, name, note = resolve_policy(str(sb3_model), scenario, sb3_model.parent)
    assert name == "mine-ppo.zip" and "does not learn online" in note and not policy.learns_online
    pools = {"farm": PoolSpec(functions=["sleep"], initial=1, min=1, max=4)}
    async with node_factory(k=2, pools=pools, telemetry_period_s=0.5, runtime="inprocess"), \
            Collector(nc, Subjects(prefix).scale("n1", "farm")) as commands:
        async with LiveController(nc, "n1", "farm", policy, scenario, prefix=prefix, policy_name=name) as ctl:
            assert ctl.guard is None   # no online learning for it
            await wait_until(lambda: len(ctl.history) >= 3 and commands.messages, timeout_s=30)
    command = decode(ScaleCommand, commands.messages[-1].data)
    assert command.policy == "mine-ppo.zip" and 1 <= command.target_workers <= 4
