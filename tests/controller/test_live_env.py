"""The Gymnasium env on the live system (LiveFarm backend), the emitter, and `top`'s view."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from gymnasium.utils.passive_env_checker import (
    check_action_space,
    check_observation_space,
    env_reset_passive_checker,
    env_step_passive_checker,
)

from controller.baselines import make_baseline
from controller.emitter import FarmEmitter, PoolMeter
from controller.env import FarmScalingEnv
from controller.live import LiveController
from controller.live_env import LiveFarm
from nodes.settings import PoolSpec
from p2pfaas.top import watch

from .conftest import make_scenario


def rendered(renderable) -> str:
    """What ``p2pfaas top`` prints, as text."""
    from rich.console import Console
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()

SCENARIO = make_scenario(step_seconds=0.3, max_steps=6, workers={"min": 1, "max": 3, "initial": 1},
                         service_time={"dist": "constant", "value": 0.05},
                         phases=[{"duration_s": 4.0, "rate_per_s": 8.0}])
POOLS = {"farm": PoolSpec(functions=["sleep"], initial=1, min=1, max=3, period_s=0.3)}


async def test_env_api_checks_pass_on_the_live_pool(node_factory, nats_server, prefix):
    """Gymnasium's API checks (spaces, reset/step types and bounds). ``check_env``'s same-seed
    determinism check cannot hold for a live system, so it runs on the simulator only."""
    async with node_factory(pools=POOLS, runtime="inprocess") as node:
        def run() -> tuple:
            env = FarmScalingEnv(SCENARIO, backend=LiveFarm(nats_server.url, "n1", "farm", SCENARIO, prefix=prefix))
            try:
                check_action_space(env.action_space)
                check_observation_space(env.observation_space)
                env_reset_passive_checker(env, seed=0)
                for action in (0, 1, 2):
                    env_step_passive_checker(env, action)
                obs, info = env.reset(seed=1)
                steps = [env.step(2) for _ in range(3)]  # add workers
                return obs, steps, env.unwrapped.backend.totals()
            finally:
                env.unwrapped.backend.close()

        obs, steps, totals = await asyncio.to_thread(run)
        assert obs.shape == (16,) and obs.dtype == np.float32
        assert steps[-1][4]["target"] == 3
        assert node.pools["farm"].target == 3          # the env's actions reached the real pool
        assert totals.duration_s > 0


async def test_emitter_runs_a_scenario_and_measures_qos_and_the_pools_worker_seconds(node_factory, nc, prefix):
    async with node_factory(pools=POOLS, runtime="inprocess"):
        progress: list[float] = []
        async with PoolMeter(nc, "n1", "farm", prefix=prefix) as meter:
            policy = make_baseline("fixed-2", SCENARIO)
            async with LiveController(nc, "n1", "farm", policy, SCENARIO, prefix=prefix, policy_name="fixed-2"):
                report = await FarmEmitter(nc, "n1", SCENARIO, seed=3, prefix=prefix, grace_s=10).run(
                    lambda fraction, _: progress.append(fraction))
    assert report.submitted >= 5 and report.completed == report.submitted and report.lost == 0
    assert report.qos > 0.5 and progress and progress[-1] <= 1.0
    totals = meter.totals()
    assert totals is not None and totals.duration_s > 0 and 1.0 <= totals.mean_workers <= 2.0
    assert totals.worker_seconds == pytest.approx(totals.mean_workers * totals.duration_s)
    assert totals.max_workers == 2 and totals.scaling_actions == 1 and set(meter.policies) == {"fixed-2"}


async def test_top_sees_nodes_and_pools(node_factory, nats_server, prefix):
    async with node_factory(pools=POOLS, runtime="inprocess", heartbeat_period_s=0.2, telemetry_period_s=0.2):
        view = await watch(nats_server.url, prefix, duration_s=1.0, live=False)
    assert "n1" in view.nodes and {("n1", "default"), ("n1", "farm")} <= set(view.pools)
    text = rendered(view.render())
    assert "n1" in text and "farm" in text and "default" in text, text


async def test_top_shows_who_scales_a_pool_and_the_model_version(node_factory, nats_server, nc, prefix):
    from controller.baselines import RLPolicy
    from nodes.learner.algorithms import AGENTS

    policy = RLPolicy("dqn", AGENTS["dqn"](14, 7), SCENARIO, "target")
    async with node_factory(pools=POOLS, runtime="inprocess", telemetry_period_s=0.2), \
            LiveController(nc, "n1", "farm", policy, SCENARIO, prefix=prefix, policy_name="dqn"):
        view = await watch(nats_server.url, prefix, duration_s=1.0, live=False)
    command = view.commands[("n1", "farm")]
    assert (command.policy, command.model_version) == ("dqn", "shipped")   # (this node runs no learner)
    text = rendered(view.render())
    assert "scaling" in text and "policy" in text and "shipped" in text   # the scaling table


async def test_a_live_env_whose_pool_sends_no_telemetry_says_which_and_where(nats_server, prefix):
    """No node has that pool: reset() raised a bare TimeoutError() after the sample timeout, with
    nothing saying what it waited for."""
    def run() -> str:
        farm = LiveFarm(nats_server.url, "n1", "nosuchpool", SCENARIO, prefix=prefix, sample_timeout_s=0.5)
        try:
            farm.reset(seed=0)
        except TimeoutError as exc:
            return str(exc)
        finally:
            farm.close()
        return "no error"

    message = await asyncio.to_thread(run)
    assert "no telemetry of n1/nosuchpool" in message and "0.5 s" in message, message
