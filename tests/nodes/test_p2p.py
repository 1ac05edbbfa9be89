"""Peer-to-peer on real nodes over a real nats-server: discovery, forwarding, hop timings,
maxHops, failed probes, a peer that dies holding forwarded work, round robin."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from broker import headers as H
from broker.codec import decode
from broker.messages import PeerList
from broker.streams import requests_stream
from broker.subjects import Subjects
from support import cluster, FAST, http_for, wait_until

# heartbeats every 0.1 s; a silent peer stays "alive" for 5 s, long enough to
# send it work after it stopped (the cases below are about exactly that)
async def test_forwarded_result_reaches_caller_with_path_and_hop_timings(node_factory, faas, nc, prefix):
    async with cluster(node_factory, ("n1", ("ForwardScheduler", ["1"])), ("n2", ("NoScheduler", ["true"]))):
        answer = await faas.invoke("n1", "sleep", b"0.05", timeout_s=20)
        async with http_for(nc, "n1", prefix) as http:
            r = await http.post("/function/echo", content=b"hi")
            peers = (await http.get("/list")).json()
    res = answer.result
    assert answer.status == 200 and res.executed_by == "n2" and res.origin == "n1"
    assert res.hops == 1 and res.peers == ["n1", "n2"] and res.scheduler == "ForwardScheduler(1)"
    assert [h.node for h in res.hop_timings] == ["n1", "n2"]
    origin, executor = res.hop_timings
    assert origin.total_s == pytest.approx(res.timings.total_s, abs=0.01)
    assert origin.total_s >= executor.total_s >= res.timings.execution_s >= 0.05
    assert executor.arrival >= origin.arrival + origin.scheduling_s - 0.01

    assert r.status_code == 200 and r.content == b"hi"
    assert r.headers[H.EXTERNALLY_EXECUTED] == "True" and r.headers[H.HOPS] == "1"
    assert r.headers[H.PEERS_LIST_ID] == "n1,n2" and r.headers[H.SCHEDULER] == "ForwardScheduler(1)"
    for name in (H.TIMING_TOTAL, H.TIMING_SCHEDULING, H.TIMING_PROBING):
        values = orjson.loads(r.headers[name])
        assert len(values) == 2 and all(v >= 0 for v in values), name
    assert [p["name"] for p in peers] == ["n2"] and peers[0]["alive"] and "_id" in peers[0]


@pytest.mark.parametrize("max_hops, expected_hops", [(1, 1), (2, 2), (5, 2)])
async def test_max_hops_bounds_forward_chains(node_factory, faas, nc, prefix, max_hops, expected_hops):
    s = Subjects(prefix)
    fwd = ("ForwardScheduler", ["1"])
    async with cluster(node_factory, ("n1", fwd), ("n2", fwd), ("n3", fwd)):
        for node in ("n1", "n2", "n3"):  # re-parameterised at run time, over the configuration subject
            body = orjson.dumps({"name": "ForwardScheduler", "parameters": [str(max_hops)]})
            reply = await nc.request(s.scheduler_config(node, "set"), body, timeout=5)
            assert reply.headers["X-P2pfaas-Status"] == "200"
        answers = await asyncio.gather(*(faas.invoke("n1", "echo", b"x", timeout_s=20) for _ in range(4)))
    for answer in answers:
        res = answer.result
        # with 3 nodes a chain can be 2 forwards long: maxHops cuts it shorter, never longer
        assert res.hops == expected_hops and res.peers[0] == "n1"
        assert len(set(res.peers)) == len(res.peers) == expected_hops + 1   # no node visited twice
        assert res.executed_by == res.peers[-1] and [h.node for h in res.hop_timings] == res.peers


@pytest.mark.parametrize("scheduler", [("PowerOfNScheduler", ["1", "1", "true", "1"]),
                                       ("PowerOfNSchedulerTau", ["1", "1", "true", "1", "50ms"])])
async def test_power_of_n_forwards_to_a_lighter_peer(node_factory, faas, scheduler):
    async with cluster(node_factory, ("n1", scheduler), ("n2", ("NoScheduler", ["true"])), k=1, queue=5) as (n1, _):
        busy = asyncio.create_task(faas.invoke("n1", "sleep", b"1.0", timeout_s=20))   # load 0 < T: stays
        await wait_until(lambda: n1.scheduler.load.n_running == 1, 10)
        answer = await faas.invoke("n1", "echo", b"x", timeout_s=20)
        assert (await busy).result.executed_by == "n1"
    res = answer.result
    assert res.executed_by == "n2" and res.hops == 1
    origin = res.hop_timings[0]
    assert origin.probing_s > 0                       # it probed n2 ...
    if scheduler[0] == "PowerOfNSchedulerTau":        # ... and padded probing to tau (shows in scheduling)
        assert origin.scheduling_s >= 0.05


async def test_failed_probe_of_a_stopped_peer_counts_as_loaded(node_factory, faas):
    power = ("PowerOfNScheduler", ["1", "1", "true", "1"])
    async with node_factory(node_id="n1", scheduler=power, k=1, queue=5, **FAST) as n1:
        async with node_factory(node_id="n2", k=1, **FAST):
            await wait_until(lambda: list(n1.discovery.peers()) == ["n2"], 10)
            assert await n1.discovery.probe("n2") == 0
        # n2 is stopped, but n1 still believes it alive (the suspect window is long)
        assert list(n1.discovery.peers()) == ["n2"] and await n1.discovery.probe("n2") is None
        busy = asyncio.create_task(faas.invoke("n1", "sleep", b"1.0", timeout_s=20))
        await wait_until(lambda: n1.scheduler.load.n_running == 1, 10)
        answer = await faas.invoke("n1", "echo", b"x", timeout_s=20)
        await busy
    res = answer.result
    # it probed (load 1 >= T), the probe failed, so n2 counted as fully loaded: not chosen
    assert res.hop_timings[0].probing_s > 0
    assert res.executed_by == "n1" and res.hops == 0


async def test_peer_that_dies_holding_forwarded_work_runs_it_when_it_returns(node_factory, faas, nc, prefix, tmp_path):
    js = nc.jetstream()
    n2_dir = tmp_path / "n2"
    async with node_factory(node_id="n1", scheduler=("ForwardScheduler", ["1"]), **FAST) as n1:
        async with node_factory(node_id="n2", data_dir=n2_dir, **FAST):
            await wait_until(lambda: list(n1.discovery.peers()) == ["n2"], 10)
        fut = faas.expect("held")
        await faas.submit("n1", "echo", b"kept", "held")
        stream = requests_stream(Subjects(prefix), "n2")

        async def held_by_n2() -> bool:
            return (await js.stream_info(stream)).state.messages == 1

        for _ in range(200):  # bounded: the forward lands in n2's durable stream while n2 is down
            if await held_by_n2():
                break
            await asyncio.sleep(0.02)
        assert await held_by_n2() and not fut.done()
        async with node_factory(node_id="n2", data_dir=n2_dir, **FAST):
            answer = await asyncio.wait_for(fut, 20)
    assert answer.status == 200 and answer.output == b"kept"
    assert answer.result.executed_by == "n2" and answer.result.hops == 1 and answer.result.peers == ["n1", "n2"]


async def test_round_robin_master_deals_over_the_alive_nodes(node_factory, faas):
    slave = ("RoundRobinWithMasterScheduler", ["false", "n3", "true"])
    master = ("RoundRobinWithMasterScheduler", ["true", "", "true"])
    async with cluster(node_factory, ("n1", slave), ("n2", slave), ("n3", master)):
        executed = [(await faas.invoke("n1", "echo", b"x", timeout_s=20)).result for _ in range(4)]
        own = await faas.invoke("n3", "echo", b"x", timeout_s=20)
    # n1 -> master n3 -> round robin over n1, n2, n3 skipping n1 (already on the path)
    assert [r.executed_by for r in executed] in (["n2", "n3", "n2", "n3"], ["n3", "n2", "n3", "n2"])
    assert all(r.peers[:2] == ["n1", "n3"] for r in executed)
    assert own.rejection is not None and own.rejection.code == 400 and own.status == 500


async def test_peer_list_subject(node_factory, nc, prefix):
    async with cluster(node_factory, ("n1", ("NoScheduler", ["true"])), ("n2", ("NoScheduler", ["true"])),
                       address="http://here", group="edge"):
        reply = await nc.request(Subjects(prefix).peers("n1"), b"", timeout=5)
    rows = decode(PeerList, reply.data).root
    assert [(r.name, r.ip, r.group_name, r.alive) for r in rows] == [("n2", "http://here", "edge", True)]
