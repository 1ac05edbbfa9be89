import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import controller
from controller.env import TRAINING_SEED_FLOOR, FarmScalingEnv, RewardConfig, SimulatedFarm
from controller.evaluation import run_episode
from controller.features import LONG_HISTORY, N_REF, OBSERVATION_FIELDS, ObservationBuilder, ScalingActions, need_of, staffing
from controller.scenario import load_scenario

from .conftest import make_scenario, telemetry


@pytest.mark.parametrize("scenario, mode", [("bursty", "unit"), ("bursty", "wide"), ("spike", "target"),
                                            ("generated", "target")])
def test_check_env(scenario, mode):
    env = gym.make(controller.ENV_ID, scenario=scenario, action_mode=mode)
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


@pytest.mark.parametrize("scenario", ["bursty", "generated"])
def test_same_seed_same_episode(scenario):
    actions = [2, 2, 1, 0, 2, 1, 0, 0]
    a = rollout(FarmScalingEnv(scenario, action_mode="target"), 42, actions)
    b = rollout(FarmScalingEnv(scenario, action_mode="target"), 42, actions)
    c = rollout(FarmScalingEnv(scenario, action_mode="target"), 43, actions)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_generated_workloads_change_every_episode_and_stay_in_training_seeds():
    env = FarmScalingEnv("generated", action_mode="target")
    names = {env.reset(seed=s)[1]["scenario"] for s in range(5)}
    assert len(names) == 5 and all(int(n.removeprefix("generated-")) >= TRAINING_SEED_FLOOR for n in names)
    with pytest.raises(ValueError, match="backend"):
        FarmScalingEnv("generated", backend=SimulatedFarm(load_scenario("steady")))


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
    # without the panic rule, which may raise the pool of 3 between periods (test_panic.py)
    env = FarmScalingEnv(make_scenario(workers={"min": 3, "max": 5, "initial": 4}), action_mode="wide", panic=False)
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


def test_target_actions_jump_to_square_root_staffing_or_keep():
    sc = make_scenario(workers={"min": 1, "max": 30, "initial": 4})
    env = FarmScalingEnv(sc, action_mode="target")
    _, info = env.reset(seed=0)
    need = need_of(info["telemetry"], sc)
    _, _, _, _, info = env.step(4)  # need + 4 sqrt(need)
    assert info["target"] == staffing(need, 4.0) and info["target"] > 4 and info["changed"]
    _, _, _, _, kept = env.step(0)  # keep
    assert (kept["target"], kept["changed"]) == (info["target"], False)


def test_target_action_sizes_from_the_recent_need_or_the_peak_with_a_dead_band_on_shrinking():
    sc = make_scenario()   # 2 s service, 5 s steps
    observed = ObservationBuilder(sc)
    for rate in (4.0, 1.0, 2.0):   # loads 8, 2, 4 workers
        observed(telemetry(arrival_rate=rate))
    assert (observed.need, observed.peak) == (4.0, 8.0)   # need: the last two periods; peak: the last six
    actions = ScalingActions("target")
    assert (actions.n, actions.keep) == (7, 0)
    assert [actions.target(a, 1, observed) for a in range(7)] == [1, 6, 8, 10, 12, 11, 14]
    assert actions.target(1, 7, observed) == 7     # 6 < 7: shrinking by one worker is within the dead band
    assert actions.target(1, 9, observed) == 6     # a real shrink happens
    assert actions.nearest(1, 10, observed) == 3 and actions.nearest(5, 5, observed) == 0
    assert ScalingActions("unit").keep == 1 and ScalingActions("wide").nearest(5, 20, observed) == 8


def test_observation_carries_the_trend():
    sc = make_scenario()  # constant 2 s service, deadline 4 s, 5 s steps, max 16 workers
    build = ObservationBuilder(sc)
    first = build(telemetry(arrival_rate=1.0, queue_length=0, workers_ready=4, completed=5, met_deadline=5))
    t = telemetry(queue_length=20, workers_ready=6, workers_starting=2, arrival_rate=3.0, throughput=2.5,
                  latency_p95_s=30.0, qos=0.5, completed=4, met_deadline=2)
    obs = build(t)
    assert obs.dtype == np.float32 and obs.shape == first.shape == (len(OBSERVATION_FIELDS),)
    fields = dict(zip(OBSERVATION_FIELDS, obs.tolist()))
    load, backlog = 3.0 * 2, 20 * 2 / 5
    want = {"load": load / N_REF, "load_trend": (load - 2) / N_REF, "load_peak": load / N_REF,
            "load_spread": (load - 2) / N_REF, "backlog": backlog / N_REF, "backlog_growth": backlog / N_REF,
            "ready": 6 / N_REF, "starting": 2 / N_REF, "headroom": (8 - load - backlog) / np.sqrt(load + backlog),
            "qos": 0.5, "latency_p95": 30 / 4, "cold_start": 0.0, "capacity": 16 / N_REF, "deadline_slack": 1.0,
            "load_peak_long": load / N_REF, "since_peak_long": 0.0}
    for name, value in want.items():
        assert fields[name] == pytest.approx(value, rel=1e-5), name
    build.reset()
    np.testing.assert_array_equal(build(t)[1], 0.0)  # no history: no trend


def test_the_long_memory_fields_remember_a_surge_the_short_window_has_forgotten():
    sc = make_scenario()   # 2 s service
    build, short = ObservationBuilder(sc), ObservationBuilder(sc, 14)
    loads = [1.0] * 3 + [5.0] * 2 + [2.0] * 10   # a surge, then calm for longer than HISTORY periods
    for rate in loads:
        obs, first = build(telemetry(arrival_rate=rate)), short(telemetry(arrival_rate=rate))
    fields = dict(zip(OBSERVATION_FIELDS, obs.tolist()))
    assert fields["load_peak"] == pytest.approx(4 / N_REF)          # the last six periods: calm
    assert fields["load_peak_long"] == pytest.approx(10 / N_REF)    # the surge, 10 periods ago
    assert fields["since_peak_long"] == pytest.approx(10 / LONG_HISTORY)
    np.testing.assert_array_equal(first, obs[:14])   # a model of 14 fields sees what it always saw
    with pytest.raises(ValueError, match="14 or 16"):
        ObservationBuilder(sc, 15)
    env = FarmScalingEnv("spike", action_mode="target", observation_size=14)
    assert env.observation_space.shape == (14,) and env.reset(seed=1)[0].shape == (14,)


def test_reward_prices_worker_seconds_and_misses():
    sc = make_scenario()  # mean service 2 s
    cfg = RewardConfig(miss_cost=40, change_penalty=0.01)
    full = telemetry(workers_ready=16, completed=10, met_deadline=10, qos=1.0, period_s=8.0)
    assert cfg.reward(full, sc, changed=False) == pytest.approx(-16 / N_REF)
    assert cfg.reward(full, sc, changed=True) == pytest.approx(-16 / N_REF - 0.01)
    late = telemetry(workers_ready=4, workers_stopping=2, completed=10, met_deadline=8, qos=0.8, period_s=8.0)
    assert cfg.reward(late, sc, changed=False) == pytest.approx(-(6 + 40 * 2 * 2 / 8) / N_REF)
    stalled = telemetry(workers_ready=0, queue_length=5, completed=0, qos=1.0)
    assert cfg.missed(stalled) == 5
    assert cfg.missed(telemetry(queue_length=0, completed=0, qos=1.0)) == 0


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


@pytest.mark.parametrize("panic", [True, False])
def test_evaluation_loop_matches_the_env(panic):
    """Training (the env) and evaluation run the same farm, the panic rule between periods included."""
    sc = load_scenario("spike")
    env = FarmScalingEnv(sc, panic=panic)
    _, info = env.reset(seed=5)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 3, sc.steps).tolist()
    total = sum(env.step(a)[1] for a in actions)
    result = run_episode(sc, Replay(actions, env.deltas), info["episode_seed"], panic=panic)
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
