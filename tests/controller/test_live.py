"""The live controller over a real nats-server: telemetry in, scale commands and experiences out."""

from __future__ import annotations


import pytest

from broker.codec import decode, encode
from broker.messages import ScaleCommand, ScalingExperience
from broker.streams import ensure_node_streams
from broker.subjects import Subjects
from controller.baselines import RLPolicy, make_baseline
from controller.live import LiveController, action_index
from nodes.learner.algorithms import AGENTS
from support import Collector, wait_until

from .conftest import make_scenario, telemetry


def test_action_index_maps_changes_to_the_nearest_env_action():
    assert [action_index(d, (-1, 0, 1)) for d in (-5, -1, 0, 1, 7)] == [0, 0, 1, 2, 2]


@pytest.mark.parametrize("policy_name", ["reactive-avg", "dqn"])
async def test_controller_scales_on_telemetry_and_publishes_experiences(nc, prefix, policy_name):
    s = Subjects(prefix)
    scenario = make_scenario(workers={"min": 1, "max": 16, "initial": 2})
    if policy_name == "dqn":
        policy = RLPolicy("dqn", AGENTS["dqn"](obs_dim=9, n_actions=3, seed=0), scenario)
    else:
        policy = make_baseline(policy_name, scenario)
    await ensure_node_streams(nc.jetstream(), s, "n1")
    async with Collector(nc, s.scale("n1", "farm")) as commands, \
            Collector(nc, s.experience("n1", "farm")) as experiences:
        async with LiveController(nc, "n1", "farm", policy, scenario, prefix=prefix, policy_name=policy_name) as ctl:
            await wait_until(lambda: len(commands.messages) >= 1)  # the initial target
            burst = telemetry(node="n1", pool="farm", workers_ready=2, arrival_rate=4.0, queue_length=20,
                              arrivals=32, completed=8, met_deadline=2, qos=0.25, latency_mean_s=6.0, latency_max_s=9.0)
            for _ in range(3):
                await nc.publish(s.telemetry("n1", "farm"), encode(burst))
            await wait_until(lambda: len(ctl.history) == 3 and len(experiences.messages) == 2)
    targets = [decode(ScaleCommand, m.data).target_workers for m in commands.messages]
    assert targets[0] == 2 and len(targets) == 4
    if policy_name == "reactive-avg":
        assert targets[-1] > 2  # a burst makes the reactive controller add workers
    exp = decode(ScalingExperience, experiences.messages[0].data)
    assert len(exp.observation) == 9 and exp.action in (0, 1, 2) and exp.reward < 0 and exp.policy == policy_name
