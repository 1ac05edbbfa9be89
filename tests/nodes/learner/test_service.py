"""The learner service against a real nats-server: act, training from the durable experience
stream, weights and LocalPolicy, run-time parameters, restarts, SIGKILL, malformed input."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import statistics
import sys
import time

import numpy as np
import orjson
import pytest
from nats.js.errors import NotFoundError

from broker.codec import encode
from broker.messages import LearnerTrainSample, LearnerWeights, ScalingExperience, SchedulingExperience
from broker.streams import experiences_stream
from broker.subjects import Subjects
from nodes.learner.client import LearnerError, LocalPolicy, RemotePolicy
from nodes.learner.eid_window import EidWindow
from nodes.learner.models import ModelSlot
from nodes.learner.service import DURABLE, STATUS_HEADER, LearnerService
from nodes.learner.settings import LearnerSettings
from support import eventually

X, Y = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]   # scheduling states: action 1 is right in X, 0 in Y
A, B = [0.1, 0.9], [0.9, 0.1]             # pool observations: add (2) is right in A, remove (0) in B
FAST_DQN = {"learning_starts": 16, "batch_size": 16, "gamma": 0.0, "learning_rate": 0.01,
            "exploration_steps": 1, "target_network_frequency": 50}


@pytest.fixture
def settings(nats_server, prefix, tmp_path):
    def make(**overrides) -> LearnerSettings:
        values = dict(node_ids=["n1"], nats_url=nats_server.url, prefix=prefix, data_dir=tmp_path,
                      weights_period_s=0.05, checkpoint_period_s=0.2, scaling_parameters=FAST_DQN,
                      scaling_actions=3, scheduling_model=None, pools=["fib"])
        values.update(overrides)
        return LearnerSettings(**values)
    return make


def scheduling_samples(first: int, count: int, seed: int = 0) -> list[SchedulingExperience]:
    """EIDs first..first+count-1 alternating X/Y, random actions, reward 1 for the right one."""
    rng = np.random.default_rng(seed + first)
    out = []
    for eid in range(first, first + count):
        state = X if eid % 2 == 0 else Y
        action = int(rng.integers(2))
        out.append(SchedulingExperience(eid=eid, state=state, action=action,
                                        reward=float(action == (1 if state is X else 0))))
    return out


def reference_table(samples: list[SchedulingExperience], parameters: dict) -> dict:
    """The Q-table the service must end with: the same windows, trained in-process."""
    slot, window = ModelSlot("scheduling", "dsarsa", 2, parameters=parameters), EidWindow(5, 1000)
    for s in samples:
        if window.add(LearnerTrainSample(eid=s.eid, state=s.state, action=s.action, reward=s.reward)):
            for run in window.take():
                slot.train_window(run)
    return slot.agent.q


async def publish(nc, prefix: str, experiences, node: str = "n1") -> None:
    js, subjects = nc.jetstream(), Subjects(prefix)
    for exp in experiences:
        if isinstance(exp, ScalingExperience):
            await js.publish(subjects.experience(node, exp.pool), encode(exp))
        else:
            await js.publish(subjects.reward(node), encode(exp))


async def stats_until(policy: RemotePolicy, predicate, timeout_s: float = 20.0):
    """Poll the learner's stats until ``predicate(stats)`` (a 503, the learner starting, is polled
    again); AssertionError after the timeout."""
    async def stats():
        try:
            return await policy.stats()
        except LearnerError as exc:
            if exc.status != 503:
                raise
            return exc
    return await eventually(stats, lambda s: not isinstance(s, LearnerError) and predicate(s), timeout_s)


def table_of(weights) -> dict:
    from nodes.learner.models import agent_from_weights
    return agent_from_weights(weights).q


def same_table(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.allclose(a[k], b[k], rtol=0, atol=1e-12) for k in a)


async def test_act_round_trip_and_bad_requests(settings, nc, prefix):
    async with LearnerService(nc, settings()):
        remote = RemotePolicy(nc, "n1", prefix=prefix)
        first = await remote.act([3.0, 1.0, 0.0])
        second = await remote.act([3.0, 1.0, 0.0])
        assert first.action in (0, 1) and first.algorithm == "dsarsa" and first.model == "scheduling"
        assert first.eps == pytest.approx(0.9) and second.eps == pytest.approx(0.9 * 0.99)  # P2PFaaS decay
        greedy = await remote.act([3.0, 1.0, 0.0], explore=False)
        assert greedy.eps == 0.0 and (await remote.stats()).agent["inferences"] == 2

        samples = []
        for _ in range(200):
            start = time.perf_counter()
            await remote.act([3.0, 1.0, 0.0], explore=False)
            samples.append(time.perf_counter() - start)
        print(f"act round trip: median {statistics.median(samples) * 1e6:.0f} us")  # measured in bench/, not asserted

        subject = Subjects(prefix).learner("n1", "scheduling", "act")
        for body in (b"{", b'{"state": []}', b'{"state": ["x"]}', b'{"state": [1], "extra": 1}'):
            reply = await nc.request(subject, body, timeout=2)
            assert reply.headers[STATUS_HEADER] == "400" and orjson.loads(reply.data)["code"] == 400
        with pytest.raises(LearnerError) as err:
            await RemotePolicy(nc, "n1", "nomodel", prefix=prefix).act([1.0])
        assert err.value.status == 404
        assert (await remote.act([1.0])).action in (0, 1)  # still serving


async def test_training_from_rewards_changes_the_policy(settings, nc, prefix):
    async with LearnerService(nc, settings(scheduling_parameters={"alpha": 0.2})):
        remote = RemotePolicy(nc, "n1", prefix=prefix)
        assert (await remote.act(X, explore=False)).action == 1  # untrained: the safe default, run here
        samples = scheduling_samples(0, 200)
        await publish(nc, prefix, samples)
        stats = await stats_until(remote, lambda s: s.stream_seq == 200)
        # windows of 5: the last 4 EIDs wait for their successor, EID 0 for a predecessor arriving late
        assert stats.experiences == 196 and stats.pending == 5
        assert (await remote.act(X, explore=False)).action == 1
        assert (await remote.act(Y, explore=False)).action == 0
        assert same_table(table_of(await remote.weights()), reference_table(samples, {"alpha": 0.2}))


async def test_a_reward_arriving_after_its_successor_is_still_trained(settings, nc, prefix):
    """The EID-window defect: EID 10 published after 11..30 (its successor long trained) was dropped."""
    async with LearnerService(nc, settings(scheduling_parameters={"alpha": 0.2})):
        remote = RemotePolicy(nc, "n1", prefix=prefix)
        samples = scheduling_samples(10, 21)
        late, rest = samples[0], samples[1:]
        await publish(nc, prefix, rest)
        before = await stats_until(remote, lambda s: s.stream_seq == 20)
        await publish(nc, prefix, [late])
        after = await stats_until(remote, lambda s: s.stream_seq == 21)
        # windows of 5: before it, 16 links were trained and 27 -> 28 -> 29 -> 30 waited; the late EID 10 made
        # a window: every link of the 21 contiguous samples is trained, each once (the defect left 10 out)
        assert (before.experiences, after.experiences, after.pending) == (16, 20, 2)
        assert same_table(table_of(await remote.weights()), reference_table(rest + [late], {"alpha": 0.2}))


async def test_scaling_experiences_train_a_per_pool_model(settings, nc, prefix):
    rng = np.random.default_rng(1)
    experiences = []
    for i in range(400):
        obs = A if i % 2 == 0 else B
        action = int(rng.integers(3))
        reward = float(action == (2 if obs is A else 0))
        experiences.append(ScalingExperience(node="n1", pool="fib", observation=obs, action=action, reward=reward,
                                             next_observation=obs, done=True))
    async with LearnerService(nc, settings()):
        fib = RemotePolicy(nc, "n1", "scaling-fib", prefix=prefix)
        assert not (await fib.stats()).exists  # created by the pool's first experience or act
        await publish(nc, prefix, experiences)
        stats = await stats_until(fib, lambda s: s.experiences == 400, timeout_s=40)
        assert stats.algorithm == "dqn" and stats.obs_dim == 2 and stats.n_actions == 3
        assert stats.agent["global_step"] == 400
        assert (await fib.act(A, explore=False)).action == 2
        assert (await fib.act(B, explore=False)).action == 0
        with pytest.raises(LearnerError) as err:   # no pool "other" in the settings: no such model
            await RemotePolicy(nc, "n1", "scaling-other", prefix=prefix).stats()
        assert err.value.status == 404
        assert (await RemotePolicy(nc, "n1", prefix=prefix).stats()).experiences == 0  # scheduling untouched


async def test_weights_published_and_local_policy_acts_like_the_service(settings, nc, prefix):
    probes = [X, Y, [0.0, 0.0, 1.0], [5.0, 2.0, 1.0]]
    async with LearnerService(nc, settings(scheduling_parameters={"alpha": 0.2})):
        remote = RemotePolicy(nc, "n1", prefix=prefix)
        async with LocalPolicy(nc, "n1", prefix=prefix) as local:
            assert local.ready and local.version == 0  # the untrained table, fetched at start
            samples = scheduling_samples(0, 100)
            await publish(nc, prefix, samples)
            await stats_until(remote, lambda s: s.stream_seq == 100)
            await local.wait_version(96)
            assert local.updates >= 2 and (await remote.stats()).weights_published >= 1
            for state in probes:
                assert local.act(state).action == (await remote.act(state, explore=False)).action
            assert same_table(local.agent.q, reference_table(samples, {"alpha": 0.2}))
            assert local.act(X, explore=True).eps == pytest.approx(0.9)  # exploration is the copy's own

        await publish(nc, prefix, [ScalingExperience(node="n1", pool="fib", observation=A, action=1, reward=0.0,
                                                     next_observation=B) for _ in range(40)])
        fib = RemotePolicy(nc, "n1", "scaling-fib", prefix=prefix)
        await stats_until(fib, lambda s: s.experiences == 40)
        async with LocalPolicy(nc, "n1", "scaling-fib", prefix=prefix) as local_fib:
            await local_fib.wait_version(40)
            for obs in (A, B, [0.5, 0.5], [2.0, -1.0]):
                assert local_fib.act(obs).action == (await fib.act(obs, explore=False)).action


async def test_parameters_at_run_time(settings, nc, prefix):
    async with LearnerService(nc, settings()):
        remote = RemotePolicy(nc, "n1", prefix=prefix)
        defaults = await remote.parameters()
        assert defaults["actions_n"] == 2 and defaults["alpha"] == 0.01 and defaults["window_size"] == 5
        changed = await remote.set_parameters({"alpha": "0.5", "epsilon_decay_enabled": "false", "actions_n": 4})
        assert changed["alpha"] == 0.5 and changed["epsilon_decay_enabled"] is False and changed["actions_n"] == 4
        assert await remote.parameters() == changed
        assert {(await remote.act([1.0])).eps for _ in range(3)} == {0.9}  # no decay any more
        # a number the checkpoint could not hold (it stopped the learner's loop once) or NaN: refused
        for bad in ({"alpha": "abc"}, {"no_such": 1}, {"window_size": 1}, {"window_size": "1" * 25},
                    {"alpha": "nan"}, {"alpha": "1e400"}):
            with pytest.raises(LearnerError) as err:
                await remote.set_parameters(bad)
            assert err.value.status == 400, bad
        assert await remote.parameters() == changed  # refused changes change nothing
        reply = await nc.request(Subjects(prefix).learner("n1", "scheduling", "parameters.set"), b"[1, 2]", timeout=2)
        assert reply.headers[STATUS_HEADER] == "400"

        fib = RemotePolicy(nc, "n1", "scaling-fib", prefix=prefix)
        assert (await fib.set_parameters({"hidden_sizes": [16]}))["hidden_sizes"] == [16]  # before it exists
        await fib.act(A)
        assert (await fib.set_parameters({"learning_rate": "0.002"}))["learning_rate"] == 0.002
        with pytest.raises(LearnerError, match="reset"):
            await fib.set_parameters({"hidden_sizes": [32, 32]})
        rebuilt = await fib.set_parameters({"hidden_sizes": [32, 32], "reset": True})
        assert rebuilt["hidden_sizes"] == [32, 32] and (await fib.weights()).config["hidden_sizes"] == [32, 32]
        for bad in ({"learning_starts": "1e300"}, {"learning_rate": "NaN"}, {"hidden_sizes": [1e300]}):
            with pytest.raises(LearnerError) as err:
                await fib.set_parameters(bad)
            assert err.value.status == 400, bad


async def test_restart_keeps_the_model_and_the_stream_position(settings, nc, prefix, tmp_path):
    first, second = scheduling_samples(0, 100), scheduling_samples(100, 50)
    async with LearnerService(nc, settings(scheduling_parameters={"alpha": 0.2})):
        remote = RemotePolicy(nc, "n1", prefix=prefix)
        await publish(nc, prefix, first)
        await stats_until(remote, lambda s: s.stream_seq == 100)
        await remote.act(X)  # epsilon decays once: part of the state too
    assert (tmp_path / "nodes" / "n1" / "learner" / "learner.json").exists()

    await publish(nc, prefix, second)  # while the learner is down
    async with LearnerService(nc, settings()) as service:  # the checkpoint's parameters win
        stats = await stats_until(remote, lambda s: s.stream_seq == 150)
        assert stats.checkpoint_seq >= 100 and stats.agent["epsilon"] == pytest.approx(0.9 * 0.99)
        assert (await remote.parameters())["alpha"] == 0.2
        assert same_table(table_of(await remote.weights()), reference_table(first + second, {"alpha": 0.2}))
        assert service["n1"].slots["scheduling"].experiences == 148


async def test_sigkill_resumes_where_it_was(nats_server, nc, prefix, tmp_path):
    cmd = [sys.executable, "-m", "p2pfaas.cli", "learner", "--node", "n1", "--nats-url", nats_server.url,
           "--prefix", prefix, "--data-dir", str(tmp_path), "--checkpoint-period", "0.1"]
    log = tmp_path / "learner.log"
    remote = RemotePolicy(nc, "n1", prefix=prefix)
    batches = [scheduling_samples(0, 100), scheduling_samples(100, 50), scheduling_samples(150, 50)]

    async def launch():
        with open(log, "ab") as out:
            return await asyncio.create_subprocess_exec(*cmd, stdout=out, stderr=out)
    proc = await launch()
    try:
        await stats_until(remote, lambda s: True, timeout_s=40)  # up (torch import takes a while)
        await publish(nc, prefix, batches[0])
        await stats_until(remote, lambda s: s.checkpoint_seq == 100)
        await publish(nc, prefix, batches[1])
        await stats_until(remote, lambda s: s.stream_seq == 150)
        proc.kill()  # SIGKILL: no checkpoint on the way out
        assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL
        # what the last checkpoint holds is no longer in the stream: only the checkpoint can bring it back
        await nc.jetstream().purge_stream(experiences_stream(Subjects(prefix), "n1"), seq=101)

        proc = await launch()
        restored = await stats_until(remote, lambda s: True, timeout_s=40)
        assert restored.checkpoint_seq >= 100 and restored.experiences >= 96
        await publish(nc, prefix, batches[2])
        final = await stats_until(remote, lambda s: s.stream_seq == 200)
        assert final.experiences == 196 and final.malformed == 0
        assert same_table(table_of(await remote.weights()), reference_table(sum(batches, []), {}))
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 15)
    assert proc.returncode == 0, log.read_text()[-2000:]


async def test_malformed_experiences_do_not_stop_the_service(settings, nc, prefix):
    js, s = nc.jetstream(), Subjects(prefix)
    async with LearnerService(nc, settings()):
        remote = RemotePolicy(nc, "n1", prefix=prefix)
        await js.publish(s.reward("n1"), b"not json")
        await js.publish(s.reward("n1"), b'{"eid": 1, "state": [1], "action": 0}')           # no reward
        await js.publish(s.reward("n1"), encode(SchedulingExperience(eid=2, state=[1.0], action=7, reward=1.0)))
        await js.publish(s.reward("n1"), encode(SchedulingExperience(eid=3, state=[1.0], action=1, reward=1.0,
                                                                     node="n2")))
        await js.publish(s.experience("n1", "fib"), encode(ScalingExperience(
            node="n1", pool="other", observation=A, action=0, reward=0.0, next_observation=A)))
        await js.publish(s.experience("n1", "fib"), encode(ScalingExperience(
            node="n1", pool="fib", observation=[1.0, 2.0, 3.0], action=0, reward=0.0, next_observation=A)))
        # one Infinity in a reward would make every weight NaN: refused as malformed (JSON parsers take it)
        await js.publish(s.experience("n1", "fib"), b'{"node": "n1", "pool": "fib", "observation": ' +
                         str(A).encode() + b', "action": 0, "reward": Infinity, "next_observation": ' + str(A).encode() + b'}')
        await publish(nc, prefix, scheduling_samples(0, 10))
        stats = await stats_until(remote, lambda st: st.stream_seq == 17)
        assert stats.malformed == 7 and stats.experiences == 8
        info = await js.consumer_info(experiences_stream(s, "n1"), DURABLE)
        assert info.num_ack_pending == 0 and info.num_redelivered == 0 and info.num_pending == 0
        assert (await remote.act(X)).action in (0, 1)


async def test_a_model_nobody_configured_is_refused_not_made(settings, nc, prefix, tmp_path, caplog):
    """Any name a client sent became a model (a DQN with its replay memory, then a file in the
    checkpoint): whoever may reach the learner could fill its memory and disk. The models are the
    scheduling model and one per pool of the settings; any other name is 404 with the models there
    are (counted, logged once per period), another pool's experience is refused as malformed, and
    a model the checkpoint holds but the settings no longer name is dropped at start, its file too."""
    js, s = nc.jetstream(), Subjects(prefix)
    directory = tmp_path / "nodes" / "n1" / "learner"
    ghost = LearnerWeights(node="n1", model="scaling-ghost", algorithm="dqn", obs_dim=2, n_actions=3, config={},
                           version=0, weights_b64="")
    async with LearnerService(nc, settings()) as service:
        remote = RemotePolicy(nc, "n1", prefix=prefix)
        requests = [lambda p: p.act(A), lambda p: p.stats(), lambda p: p.parameters(), lambda p: p.reset(),
                    lambda p: p.set_parameters({"hidden_sizes": [16]}), lambda p: p.weights(),
                    lambda p: p.set_weights(ghost)]
        for name in ("scaling-ghost", "scaling-x1", "nomodel"):
            for request in requests:
                with pytest.raises(LearnerError) as err:
                    await request(RemotePolicy(nc, "n1", name, prefix=prefix))
                assert err.value.status == 404 and "scheduling, scaling-fib" in err.value.message, err.value
        await js.publish(s.experience("n1", "ghost"), encode(ScalingExperience(
            node="n1", pool="ghost", observation=A, action=0, reward=0.0, next_observation=A)))
        stats = await stats_until(remote, lambda st: st.stream_seq == 1)
        assert stats.malformed == 1 and stats.unknown_models == 3 * len(requests)
        assert set(service["n1"].slots) == {"scheduling"}
        assert sum("refused (404)" in r.getMessage() for r in caplog.records) == 1   # not one line per request
        assert (await RemotePolicy(nc, "n1", "scaling-fib", prefix=prefix).act(A)).model == "scaling-fib"
    assert set(orjson.loads((directory / "learner.json").read_bytes())["models"]) == {"scheduling", "scaling-fib"}

    async with LearnerService(nc, settings(pools=["fib", "ghost"])):   # a pool the node had once
        await RemotePolicy(nc, "n1", "scaling-ghost", prefix=prefix).act(A)
    assert any(p.name.startswith("scaling-ghost.") for p in directory.glob("*.pt"))
    async with LearnerService(nc, settings()):
        with pytest.raises(LearnerError) as err:
            await RemotePolicy(nc, "n1", "scaling-ghost", prefix=prefix).stats()
        assert err.value.status == 404
    assert set(orjson.loads((directory / "learner.json").read_bytes())["models"]) == {"scheduling", "scaling-fib"}
    assert sorted(p.name.split(".")[0] for p in directory.glob("*.pt")) == ["scaling-fib", "scheduling"]


def test_a_nodes_learner_keeps_a_model_per_pool_of_the_node(tmp_path):
    from nodes.settings import NodeSettings, PoolSpec

    node = NodeSettings(node_id="n1", data_dir=tmp_path, pools={"farm": PoolSpec(functions=["sleep"])})
    assert LearnerSettings.for_node(node).models == ["scheduling", "scaling-default", "scaling-farm"]
    with pytest.raises(ValueError):
        LearnerSettings(pools=["a.b"])


async def test_shared_learner_keeps_each_node_apart(settings, nc, prefix):
    async with LearnerService(nc, settings(node_ids=["n1", "n2"], scheduling_parameters={"alpha": 0.2})):
        n1, n2 = RemotePolicy(nc, "n1", prefix=prefix), RemotePolicy(nc, "n2", prefix=prefix)
        await publish(nc, prefix, scheduling_samples(0, 50), node="n2")
        await stats_until(n2, lambda s: s.stream_seq == 50)
        assert (await n1.stats()).experiences == 0 and (await n2.stats()).experiences == 48
        assert (await n2.act(Y, explore=False)).action == 0 and (await n1.act(Y, explore=False)).action == 1


async def test_a_learning_scheduler_sized_model_starts_from_the_shipped_table(settings, nc, prefix):
    from nodes.learner.algorithms.portable import load_portable
    from nodes.learner.settings import SHIPPED_SCHEDULING_MODEL

    shipped, meta = load_portable(SHIPPED_SCHEDULING_MODEL)
    assert meta["purpose"] == "scheduling" and "train scheduling" in meta["command"] and "seed" in meta
    async with LearnerService(nc, settings(node_ids=["n1", "n2"], scheduling_model=SHIPPED_SCHEDULING_MODEL)):
        n1, n2 = RemotePolicy(nc, "n1", prefix=prefix), RemotePolicy(nc, "n2", prefix=prefix)
        assert (await n1.stats()).agent["states"] == 0        # P2PFaaS's API: an empty 2-action table
        await n1.set_parameters({"actions_n": shipped.n_actions})   # what a LearningScheduler does
        await n2.set_parameters({"actions_n": 3})                    # another size: the table stays empty
        assert (await n1.stats()).agent["states"] == len(shipped.q) and (await n2.stats()).agent["states"] == 0
        assert same_table(table_of(await n1.weights()), shipped.q)
        full_here = [0.0, 0.0, 2.0, 2.0]   # type 0, no free slot here, two peers with room: forward, never reject
        assert (await n1.act(full_here, explore=False)).action >= 3


async def test_local_policy_keeps_acting_with_the_last_good_weights_when_new_ones_fail_half_way(nc, prefix):
    """Weights of the right shape whose last tensor is wrong: loading them fails after the first
    tensors were copied into the agent that acts (the controller holds that very object); the
    last good weights go back in, and the agent acts as before."""
    import base64

    import torch

    from broker.messages import LearnerWeights
    from nodes.learner.algorithms import AGENTS
    from nodes.learner.algorithms.agent import IncompatibleWeights, from_bytes, to_bytes

    good_agent = AGENTS["dqn"](obs_dim=3, n_actions=4, seed=1)
    other = AGENTS["dqn"](obs_dim=3, n_actions=4, seed=2)

    def weights(agent, data: bytes | None = None, version: int = 1) -> LearnerWeights:
        return LearnerWeights(node="n1", model="scaling-fib", algorithm="dqn", obs_dim=3, n_actions=4,
                              config=dataclasses.asdict(good_agent.config), version=version,
                              weights_b64=base64.b64encode(data or agent.get_weights()).decode())

    broken = from_bytes(other.get_weights())
    last = list(broken["state"]["q_network"])[-1]
    broken["state"]["q_network"][last] = torch.zeros(7)   # the wrong size: load_state_dict fails there
    local = LocalPolicy(nc, "n1", "scaling-fib", prefix=prefix)
    await local._apply(weights(good_agent))
    acting = local.agent
    before = {k: v.clone() for k, v in acting.q_network.state_dict().items()}
    with pytest.raises(IncompatibleWeights):
        await local._apply(weights(other, to_bytes(broken), version=2))
    assert local.agent is acting and local.weights.version == 1
    after = acting.q_network.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)   # not half other's


async def test_a_deleted_experience_stream_is_made_again_and_learning_goes_on(settings, nc, prefix, caplog):
    """``nats stream rm`` of a node's experience stream under a running learner: every fetch
    failed for ever (a warning each time) and the models learned nothing more until a restart.
    Now the learner makes the stream and its consumer again, and reads the new stream."""
    js, stream = nc.jetstream(), experiences_stream(Subjects(prefix), "n1")
    caplog.set_level(logging.WARNING, logger="nodes.learner.service")
    async with LearnerService(nc, settings(scheduling_parameters={"alpha": 0.2})):
        remote = RemotePolicy(nc, "n1", prefix=prefix)
        await publish(nc, prefix, scheduling_samples(0, 20))
        before = await stats_until(remote, lambda s: s.stream_seq == 20)
        await js.delete_stream(stream)
        async def made_again() -> bool:   # the node's rewards have a stream to go to again
            try:
                return bool(await js.stream_info(stream))
            except NotFoundError:
                return False
        await eventually(made_again, bool)
        await publish(nc, prefix, scheduling_samples(20, 20))
        after = await stats_until(remote, lambda s: s.stream_seq == 20 and s.experiences > before.experiences)
    assert after.experiences > before.experiences
    remade = [r for r in caplog.records if "is gone; making it again" in r.getMessage()]
    assert len(remade) == 1, [r.getMessage() for r in caplog.records]
