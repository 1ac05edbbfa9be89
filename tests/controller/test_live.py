"""The live controller over a real nats-server: telemetry in, scale commands and experiences out;
with a real learner, the online weights pulled back into the policy and the rollback."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from broker.codec import decode, encode
from broker.messages import ScaleCommand, ScalingExperience
from broker.streams import ensure_node_streams
from broker.subjects import Subjects, scaling_model
from controller.baselines import RLPolicy, make_baseline
from controller.features import ObservationBuilder
from controller.live import LiveController
from controller.online import SHIPPED
from nodes.learner.algorithms import AGENTS
from nodes.learner.client import RemotePolicy
from nodes.learner.models import agent_from_weights
from nodes.learner.service import LearnerService
from nodes.learner.settings import LearnerSettings
from support import Collector, eventually, wait_until

from .conftest import make_scenario, telemetry

SCENARIO = make_scenario(workers={"min": 1, "max": 16, "initial": 2})
BURST = dict(node="n1", pool="farm", workers_ready=2, arrival_rate=4.0, queue_length=20, arrivals=32, completed=8,
             met_deadline=2, qos=0.25, latency_mean_s=6.0, latency_max_s=9.0)


def dqn(seed: int = 0):
    return AGENTS["dqn"](obs_dim=14, n_actions=7, seed=seed)


@pytest.mark.parametrize("policy_name", ["reactive-avg", "dqn"])
async def test_controller_scales_on_telemetry_and_publishes_experiences(nc, prefix, policy_name):
    s = Subjects(prefix)
    if policy_name == "dqn":
        policy = RLPolicy("dqn", dqn(), SCENARIO, "target")
    else:
        policy = make_baseline(policy_name, SCENARIO)
    await ensure_node_streams(nc.jetstream(), s, "n1")
    async with Collector(nc, s.scale("n1", "farm")) as commands, \
            Collector(nc, s.experience("n1", "farm")) as experiences:
        # no learner runs here: an RL policy keeps its own weights
        async with LiveController(nc, "n1", "farm", policy, SCENARIO, prefix=prefix, policy_name=policy_name) as ctl:
            for _ in range(3):
                await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**BURST)))
            await wait_until(lambda: len(ctl.history) == 3 and len(experiences.messages) == 2)
    targets = [decode(ScaleCommand, m.data) for m in commands.messages]
    assert len(targets) == 3   # one per period: none of its own before the pool's first telemetry
    if policy_name == "reactive-avg":
        assert targets[-1].target_workers > 2 and targets[-1].model_version == ""
    else:
        assert {t.model_version for t in targets} == {SHIPPED} and "did not answer" in ctl.learner_note
    exp = decode(ScalingExperience, experiences.messages[0].data)
    # a model's own fields (this DQN of an older release takes 14); a baseline's carry them all
    assert len(exp.observation) == (14 if policy_name == "dqn" else 16) and 0 <= exp.action < 7 and exp.reward < 0 and exp.policy == policy_name


class Keeps:
    """A policy that keeps whatever target it is given (and remembers it)."""
    name = "keeps"

    def __init__(self) -> None:
        self.given: list[int] = []

    def reset(self) -> None:
        self.given.clear()

    def decide(self, t, current_target: int) -> int:
        self.given.append(current_target)
        return current_target


async def test_a_restarted_controller_takes_the_pool_over_as_it_is(nc, prefix):
    """Restarted (by up's supervisor) while its pool runs 9 workers, 2 of them still starting,
    the controller sends nothing until the pool's telemetry says so, then decides from 9:
    before, it sent the scenario's initial size (2) at once and the pool lost 7 workers."""
    s = Subjects(prefix)
    await ensure_node_streams(nc.jetstream(), s, "n1")
    policy = Keeps()
    async with Collector(nc, s.scale("n1", "farm")) as commands:
        async with LiveController(nc, "n1", "farm", policy, SCENARIO, prefix=prefix, policy_name="keeps") as ctl:
            await nc.flush()
            await asyncio.sleep(0.3)   # the window in which a command of its own would have come
            assert commands.messages == []
            await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**dict(BURST, workers_ready=7),
                                                                         workers_starting=2)))
            await wait_until(lambda: len(commands.messages) == 1)
    command = decode(ScaleCommand, commands.messages[0].data)
    assert policy.given == [9] and (command.target_workers, command.reason) == (9, "kept") and ctl.target == 9


@pytest.fixture
def learner_settings(nats_server, prefix, tmp_path):
    return LearnerSettings(node_ids=["n1"], nats_url=nats_server.url, prefix=prefix, data_dir=tmp_path,
                           weights_period_s=0.05, checkpoint_period_s=0.5, scheduling_model=None,
                           pools=["farm"])


def acts_like(a, b, scenario=SCENARIO, n: int = 40) -> bool:
    rng = np.random.default_rng(0)
    build = ObservationBuilder(scenario, a.obs_dim)
    observations = [build(telemetry(arrival_rate=float(r), queue_length=int(q), workers_ready=int(w)))
                    for r, q, w in zip(rng.uniform(0, 8, n), rng.integers(0, 30, n), rng.integers(1, 16, n))]
    return all(a.act(o) == b.act(o) for o in observations)


async def learner_acts_like(remote: RemotePolicy, agent, timeout_s: float = 10.0) -> bool:
    """Poll the learner's weights (bounded) until they act like ``agent``."""
    try:
        await eventually(remote.weights, lambda w: acts_like(agent_from_weights(w), agent), timeout_s, 0.1)
    except AssertionError:
        return False
    return True


async def test_controller_seeds_the_learner_pulls_its_online_weights_and_rolls_back(nc, prefix, learner_settings):
    s = Subjects(prefix)
    shipped = dqn(seed=1)
    policy = RLPolicy("dqn", shipped, SCENARIO, "target")
    guard = {"reference_periods": 3, "trial_periods": 3, "min_tasks": 10}
    async with LearnerService(nc, learner_settings), Collector(nc, s.scale("n1", "farm")) as commands:
        remote = RemotePolicy(nc, "n1", scaling_model("farm"), prefix=prefix)
        async with LiveController(nc, "n1", "farm", policy, SCENARIO, prefix=prefix, policy_name="dqn",
                                  guard_options=guard) as ctl:
            assert "learning online" in ctl.learner_note
            seeded = await remote.weights()     # the learner continues from the controller's weights
            assert seeded.algorithm == "dqn" and seeded.config["learning_starts"] == 32
            assert not acts_like(AGENTS["dqn"](14, 7), shipped)   # (the comparison can fail: another net acts otherwise)
            good = dict(BURST, completed=10, met_deadline=10, qos=1.0)
            for i in range(40):                 # 40 periods: 39 experiences, past learning_starts
                await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**good, time=100.0 + i)))
                await wait_until(lambda i=i: len(ctl.history) == i + 1)
            # the learner trained and published; the controller pulled the new weights into its policy
            await wait_until(lambda: ctl.model_version.startswith("online-"), timeout_s=20)
            online = ctl.policy.agent
            assert online is not shipped and ctl.guard.online_version > ctl.guard.floor_version
            assert acts_like(online, ctl.local.agent)
            # the online weights now do far worse than the shipped model did: rolled back
            bad = dict(BURST, completed=10, met_deadline=2, qos=0.2)
            for i in range(3):
                await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**bad, time=200.0 + i)))
            await wait_until(lambda: ctl.guard.rollbacks == 1 and not ctl.guard.awaiting_reseed)
            # the shipped weights decide again: the shipped agent, or the learner's copy of it reset at a
            # newer version (the reset weights are published once; nothing has been trained on them yet)
            assert acts_like(ctl.policy.agent, shipped)
            assert await learner_acts_like(remote, shipped)   # the learner restarts from the shipped weights
    versions = [decode(ScaleCommand, m.data).model_version for m in commands.messages]
    first_online = next(i for i, v in enumerate(versions) if v.startswith("online-"))
    assert versions[0] == SHIPPED and SHIPPED in versions[first_online:]   # rolled back after deciding online


async def test_the_controller_switches_policy_on_request_and_refuses_what_it_cannot_run(nc, prefix, tmp_path):
    """A PolicySwitch (the dashboard's control) on faas.<node>.policy.<pool>: the controller answers
    PolicySwitched and its next decisions carry the new policy; an unknown policy, a malformed
    request or another pool is a 400 with the reason, and the old policy keeps deciding."""
    from broker import headers as H
    from broker.messages import ErrorBody, PolicySwitch, PolicySwitched

    s = Subjects(prefix)
    await ensure_node_streams(nc.jetstream(), s, "n1")
    ask = lambda body: nc.request(s.pool_policy("n1", "farm"), body, timeout=10)   # noqa: E731
    async with Collector(nc, s.scale("n1", "farm")) as commands:
        async with LiveController(nc, "n1", "farm", make_baseline("reactive-avg", SCENARIO), SCENARIO, prefix=prefix,
                                  policy_name="reactive-avg", models_dir=tmp_path) as ctl:
            reply = await ask(encode(PolicySwitch(node="n1", pool="farm", policy="fixed-5", requested_by="test")))
            assert reply.headers[H.STATUS] == "200"
            switched = decode(PolicySwitched, reply.data)
            assert (switched.policy, switched.previous) == ("fixed-5", "reactive-avg")
            await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**BURST)))
            await wait_until(lambda: len(ctl.history) == 1)
            for body, why in ((encode(PolicySwitch(node="n1", pool="farm", policy="nosuchpolicy")), "unknown policy"),
                              (encode(PolicySwitch(node="n1", pool="other", policy="kpa")), "not n1/other"),
                              (b"{not json", "JSON")):
                reply = await ask(body)
                assert reply.headers[H.STATUS] == "400" and why in decode(ErrorBody, reply.data).message, body
            await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**BURST)))
            await wait_until(lambda: len(ctl.history) == 2)
            assert ctl.policy_name == "fixed-5"
    last = decode(ScaleCommand, commands.messages[-1].data)
    assert (last.policy, last.target_workers) == ("fixed-5", 5)


async def test_a_switch_to_a_model_of_fewer_fields_stores_experiences_of_its_own_size(nc, prefix, tmp_path):
    """A baseline's experiences carry all 16 fields; after a switch to the shipped DQN (14 fields, an
    older release's model) they carry its 14, which its learner model takes."""
    from broker.messages import PolicySwitch

    s = Subjects(prefix)
    await ensure_node_streams(nc.jetstream(), s, "n1")
    async with Collector(nc, s.experience("n1", "farm")) as experiences:
        async with LiveController(nc, "n1", "farm", make_baseline("reactive-avg", SCENARIO), SCENARIO, prefix=prefix,
                                  policy_name="reactive-avg", models_dir=tmp_path) as ctl:
            for i in range(2):
                await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**BURST, time=100.0 + i)))
                await wait_until(lambda i=i: len(ctl.history) == i + 1 and len(experiences.messages) == i)
            await nc.request(s.pool_policy("n1", "farm"), encode(PolicySwitch(node="n1", pool="farm", policy="dqn")),
                             timeout=10)
            for i in range(2, 4):
                await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**BURST, time=100.0 + i)))
                await wait_until(lambda i=i: len(ctl.history) == i + 1)
            await wait_until(lambda: len(experiences.messages) == 2)   # none pairs the two policies' steps
    sizes = [(e.policy, len(e.observation)) for e in (decode(ScalingExperience, m.data) for m in experiences.messages)]
    assert sizes == [("reactive-avg", 16), ("dqn", 14)]


async def test_a_learner_that_comes_up_after_the_controller_is_seeded_and_followed(nc, prefix, learner_settings):
    """The node's learner was not answering when the controller started (the node restarting, or
    `p2pfaas controller` started first): the controller said so once and never learned online
    until it was restarted itself. Now it tries the learner again while it runs."""
    s = Subjects(prefix)
    await ensure_node_streams(nc.jetstream(), s, "n1")
    # DQN: the learner also makes a DQN of its own defaults from the experiences stored meanwhile
    policy = RLPolicy("dqn", dqn(seed=2), SCENARIO, "target")
    async with LiveController(nc, "n1", "farm", policy, SCENARIO, prefix=prefix, policy_name="dqn",
                              learner_retry_s=0.2) as ctl:
        assert "did not answer" in ctl.learner_note and ctl.local is None
        async with LearnerService(nc, learner_settings):
            remote = RemotePolicy(nc, "n1", scaling_model("farm"), prefix=prefix)
            for i in range(40):
                await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**BURST, time=100.0 + i)))
                await wait_until(lambda i=i: len(ctl.history) == i + 1)
                if ctl.local is not None:
                    break
                await asyncio.sleep(0.1)
            assert ctl.local is not None and "learning online" in ctl.learner_note, ctl.learner_note
            assert (await remote.weights()).config["learning_starts"] == 32   # seeded with the controller's weights
            assert await learner_acts_like(remote, policy.agent)


async def test_telemetry_that_stops_is_said_and_no_experience_spans_the_silence(nc, prefix, caplog):
    """A controller whose pool sends nothing (a wrong --pool, the node down) printed nothing at all,
    and when the telemetry came back it paired its last decision before the silence with the first
    period after it: one experience of a transition that never happened. Now the silence is said
    (once), so is the telemetry's return, and the learner gets no experience across the gap."""
    scenario = make_scenario(step_seconds=0.2, workers={"min": 1, "max": 16, "initial": 2})
    s = Subjects(prefix)
    await ensure_node_streams(nc.jetstream(), s, "n1")

    async def send(at: float) -> None:
        await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**dict(BURST, period_s=0.2), time=at)))

    async with Collector(nc, s.experience("n1", "farm")) as experiences, \
            LiveController(nc, "n1", "farm", Keeps(), scenario, prefix=prefix, policy_name="keeps") as ctl:
        await wait_until(lambda: "no telemetry of n1/farm" in caplog.text, timeout_s=5)   # none yet
        await send(100.0)
        await send(100.2)
        await wait_until(lambda: len(ctl.history) == 2 and len(experiences.messages) == 1)
        caplog.clear()
        await wait_until(lambda: "no telemetry of n1/farm" in caplog.text, timeout_s=5)   # the node stops
        assert caplog.text.count("no telemetry of n1/farm") == 1                          # said once
        await send(130.0)                      # back, 30 s of its time later (the node restarted)
        await send(130.2)
        await wait_until(lambda: len(ctl.history) == 4 and len(experiences.messages) == 2)
        await nc.flush()
        await asyncio.sleep(0.3)               # time for an experience across the gap to show up
        assert len(experiences.messages) == 2, [decode(ScalingExperience, m.data) for m in experiences.messages]
        assert "telemetry of n1/farm is back" in caplog.text


async def test_a_model_the_learner_made_from_other_policies_experiences_is_not_taken_for_ours(
        nc, prefix, learner_settings):
    """A baseline decided first (up --controller reactive-max, or before a switch from the
    dashboard): its experiences made the learner create a DQN of its own defaults (random weights,
    learning from the 1,000th experience, epsilon from 1). A DQN controller then took that model for
    one it had trained online before a restart: it did not seed it, and after 8 periods the
    learner's versions of that model decided. Now a model without the online settings is seeded."""
    s = Subjects(prefix)
    await ensure_node_streams(nc.jetstream(), s, "n1")
    async with LearnerService(nc, learner_settings):
        remote = RemotePolicy(nc, "n1", scaling_model("farm"), prefix=prefix)
        async with LiveController(nc, "n1", "farm", make_baseline("reactive-avg", SCENARIO), SCENARIO,
                                  prefix=prefix, policy_name="reactive-avg") as ctl:
            for i in range(3):
                await nc.publish(s.telemetry("n1", "farm"), encode(telemetry(**BURST, time=100.0 + i)))
            await wait_until(lambda: len(ctl.history) == 3)

        async def made() -> bool:
            try:
                return (await remote.weights()).algorithm == "dqn"
            except Exception:
                return False
        await eventually(made, bool, timeout_s=10)   # the learner made its own DQN from those experiences
        assert (await remote.weights()).config["learning_starts"] == 1000
        shipped = dqn(seed=3)
        async with LiveController(nc, "n1", "farm", RLPolicy("dqn", shipped, SCENARIO, "target"), SCENARIO,
                                  prefix=prefix, policy_name="dqn") as ctl:
            assert "learning online" in ctl.learner_note
            seeded = await remote.weights()
            assert seeded.config["learning_starts"] == 32 and acts_like(agent_from_weights(seeded), shipped)
