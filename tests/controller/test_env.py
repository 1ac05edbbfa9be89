import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import controller
from controller.env import (
    OBSERVATION_FIELDS,
    TRAINING_SEED_FLOOR,
    FarmScalingEnv,
    RewardConfig,
    SimulatedFarm,
    observation_from_telemetry,
)
from controller.evaluation import run_episode
from controller.scenario import load_scenario

from .conftest import make_scenario, telemetry


@pytest.mark.parametrize("mode", ["unit", "wide"])
def test_check_env(mode):
    env = gym.make(controller.ENV_ID, scenario="bursty", action_mode=mode)
    check_env(env.unwrapped)
    env.close()


def test_registered_with_gymnasium():
    env = gym.make(controller.ENV_ID, scenario="spike", action_mode="wide")
    assert isinstance(env.unwrapped, FarmScalingEnv)
    assert env.unwrapped.scenario.name == "spike"
    assert env.action_space == gym.spaces.Discrete(9)
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    env.close()


def rollout(env, seed, actions):
    obs, info = env.reset(seed=seed)
    trace = [obs]
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        trace += [obs, reward, terminated, truncated]
    return trace


def test_same_seed_same_episode():
    actions = [2, 2, 1, 0, 2, 1, 0, 0]
    a = rollout(FarmScalingEnv("bursty"), 42, actions)
    b = rollout(FarmScalingEnv("bursty"), 42, actions)
    c = rollout(FarmScalingEnv("bursty"), 43, actions)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_episode_end_and_training_seeds():
    env = FarmScalingEnv("bursty")
    _, info = env.reset(seed=0)
    assert info["episode_seed"] >= TRAINING_SEED_FLOOR
    steps, truncated = 0, False
    while not truncated:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert not terminated and env.observation_space.contains(obs)
        steps += 1
    assert steps == env.scenario.steps == 30
    assert info["totals"].duration_s == 31 * 8
    _, second = env.reset()
    assert second["episode_seed"] != info.get("episode_seed") and second["episode_seed"] >= TRAINING_SEED_FLOOR


def test_actions_move_the_target_within_bounds():
    env = FarmScalingEnv(make_scenario(workers={"min": 3, "max": 5, "initial": 4}), action_mode="wide")
    env.reset(seed=0)
    _, _, _, _, info = env.step(8)  # +4, clamped to 5
    assert (info["target"], info["changed"]) == (5, True)
    _, _, _, _, info = env.step(5)  # +1 at the cap: no change, no scaling penalty
    assert (info["target"], info["changed"]) == (5, False)
    _, _, _, _, info = env.step(0)  # -4 -> 1, clamped to 3
    assert info["target"] == 3 and info["telemetry"].workers_ready + info["telemetry"].workers_starting == 3
    with pytest.raises(ValueError, match="invalid action"):
        env.step(9)
    with pytest.raises(ValueError, match="action_mode"):
        FarmScalingEnv("bursty", action_mode="huge")


def test_observation_formula():
    sc = make_scenario()  # constant 2 s service, deadline 4 s, 5 s steps, max 16 workers
    t = telemetry(queue_length=20, workers_ready=6, workers_starting=2, arrival_rate=3.0, throughput=2.5,
                  latency_mean_s=2.0, latency_max_s=30.0, qos=0.5, completed=4, met_deadline=2)
    obs = observation_from_telemetry(t, sc)
    assert obs.dtype == np.float32 and obs.shape == (len(OBSERVATION_FIELDS),)
    backlog, load = 20 * 2 / 5, 3.0 * 2
    want = [backlog / 16, 6 / 16, 2 / 16, load / 16, 5 / 16, 0.5, 4.0, 0.5, (load + backlog - 8) / 16]
    np.testing.assert_allclose(obs, want, rtol=1e-6)  # latency_max clipped at 4 deadlines


def test_reward_formula():
    cfg = RewardConfig()
    full = telemetry(workers_ready=16, completed=10, met_deadline=10, qos=1.0)
    assert cfg.reward(full, 32, changed=False) == pytest.approx(-0.2 * 16 / 32)
    assert cfg.reward(full, 32, changed=True) == pytest.approx(-0.1 - 0.02)
    short = telemetry(workers_ready=0, workers_starting=0, completed=100, met_deadline=98, qos=0.98)
    assert cfg.reward(short, 32, changed=False) == pytest.approx(-0.1)  # one target-gap of ten
    awful = telemetry(workers_ready=0, completed=10, met_deadline=1, qos=0.1)
    assert cfg.reward(awful, 32, changed=False) == pytest.approx(-1.0)  # saturated
    stalled = telemetry(workers_ready=0, queue_length=5, completed=0, qos=1.0)
    assert cfg.qos_shortfall(stalled) == 1.0
    idle = telemetry(workers_ready=0, queue_length=0, completed=0, qos=1.0)
    assert cfg.qos_shortfall(idle) == 0.0


class Replay:
    """A policy that replays env actions, to compare the evaluation loop with the env."""

    name = "replay"

    def __init__(self, actions, deltas):
        self.actions, self.deltas = actions, deltas

    def reset(self):
        self.i = 0

    def decide(self, t, current_target):
        self.i += 1
        return current_target + self.deltas[self.actions[self.i - 1]]


def test_evaluation_loop_matches_the_env():
    sc = load_scenario("bursty")
    env = FarmScalingEnv(sc)
    _, info = env.reset(seed=5)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 3, sc.steps).tolist()
    total = sum(env.step(a)[1] for a in actions)
    result = run_episode(sc, Replay(actions, env.deltas), info["episode_seed"])
    assert result.episode_return == pytest.approx(total)
    assert result.totals == env.backend.totals()


def test_backend_is_pluggable():
    sc = make_scenario()

    class Recording(SimulatedFarm):
        def __init__(self, scenario):
            super().__init__(scenario)
            self.applied = []

        def apply(self, target_workers):
            self.applied.append(target_workers)
            super().apply(target_workers)

    backend = Recording(sc)
    env = FarmScalingEnv(sc, backend=backend)
    env.reset(seed=0)
    env.step(2)
    env.step(0)
    assert backend.applied == [5, 4]
