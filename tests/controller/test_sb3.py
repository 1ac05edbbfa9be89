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
