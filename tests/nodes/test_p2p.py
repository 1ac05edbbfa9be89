"""Peer-to-peer on real nodes over a real nats-server: discovery, forwarding, hop timings,
maxHops, failed probes, a peer that goes away holding forwarded work, round robin."""

from __future__ import annotations

import asyncio
import socket
import struct

import orjson
import pytest

from broker import headers as H
from broker.codec import decode, encode
from broker.messages import MachineAnnouncement, NodeGone, PeerList, Result
from broker.subjects import Subjects, machine_token
from nodes.forwarding import FORWARD_GRACE_S
from nodes.settings import Timings
from support import Collector, cluster, FAST, http_for, wait_until

# heartbeats every 0.1 s; a silent peer stays "alive" for 5 s, long enough to
# send it work after it stopped (the cases below are about exactly that)
async def test_forwarded_result_reaches_caller_with_path_and_hop_timings(node_factory, faas, nc, prefix):
    async with cluster(node_factory, ("n1", ("ForwardScheduler", ["1"])), ("n2", ("NoScheduler", ["true"]))):
        answer = await faas.invoke("n1", "sleep", b"0.05", timeout_s=20)
        stored = await faas.call_async("n1", "sleep", b"0.05", timeout_s=20)
        async with http_for(nc, "n1", prefix) as http:
            r = await http.post("/function/echo", content=b"hi")
            peers = (await http.get("/list")).json()
    assert answer.status == 200 and answer.executed_by == "n2" and answer.externally_executed
    assert answer.hops == 1 and answer.peers == ["n1", "n2"] and answer.scheduler == "ForwardScheduler(1)"
    assert [h.node for h in answer.hop_timings] == ["n1", "n2"]
    origin, executor = answer.hop_timings
    assert origin.total_s == pytest.approx(answer.timings.total_s, abs=0.01)
    assert origin.total_s >= executor.total_s >= answer.timings.execution_s >= 0.05

    assert stored.status == 200 and stored.executed_by == "n2" and stored.peers == ["n1", "n2"]
    assert [h.node for h in stored.hop_timings] == ["n1", "n2"]

    assert r.status_code == 200 and r.content == b"hi"
    assert r.headers[H.EXTERNALLY_EXECUTED] == "True" and r.headers[H.HOPS] == "1"
    assert r.headers[H.PEERS_LIST_ID] == '["n1","n2"]' and r.headers[H.SCHEDULER] == "ForwardScheduler(1)"
    assert orjson.loads(r.headers[H.PEERS_LIST_IP]) == ["", ""]   # these test nodes advertise no address
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
    for res in answers:
        # with 3 nodes a chain can be 2 forwards long: maxHops cuts it shorter, never longer
        assert res.hops == expected_hops and res.peers[0] == "n1"
        assert len(set(res.peers)) == len(res.peers) == expected_hops + 1   # no node visited twice
        assert res.executed_by == res.peers[-1] and [h.node for h in res.hop_timings] == res.peers


@pytest.mark.parametrize("scheduler", [("PowerOfNScheduler", ["1", "1", "true", "1"]),
                                       ("PowerOfNSchedulerTau", ["1", "1", "true", "1", "50ms"])])
async def test_power_of_n_forwards_to_a_lighter_peer(node_factory, faas, scheduler):
    async with cluster(node_factory, ("n1", scheduler), ("n2", ("NoScheduler", ["true"])), k=1, queue=5) as (n1, _):
        busy = asyncio.create_task(faas.invoke("n1", "sleep", b"1.0", timeout_s=20))   # load 0 < T: stays
        await wait_until(lambda: n1.scheduler.main.n_running == 1, 10)
        res = await faas.invoke("n1", "echo", b"x", timeout_s=20)
        assert (await busy).executed_by == "n1"
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
        await wait_until(lambda: n1.scheduler.main.n_running == 1, 10)
        res = await faas.invoke("n1", "echo", b"x", timeout_s=20)
        await busy
        failed = [s.value for m in n1.metrics.errors.collect() for s in m.samples
                  if s.name.endswith("_total") and s.labels["kind"] == "probe_failed"]
    # it probed (load 1 >= T), the probe failed, so n2 counted as fully loaded: not chosen
    assert res.hop_timings[0].probing_s > 0
    assert res.executed_by == "n1" and res.hops == 0
    assert failed == [1.0]   # and counted (the direct discovery.probe calls above are not the scheduler's)


async def test_peer_going_away_mid_call_fails_a_direct_call_and_reruns_an_async_one(node_factory, faas, nc, prefix):
    """What the workers of a killed node announce (``gone``): a direct call fails at once with
    P2PFaaS's "forward failed"; an async one is delivered again and answered exactly once."""
    s = Subjects(prefix)
    gone = encode(NodeGone(node="n2", by="n2-w1", reason="node process ended"))
    async with cluster(node_factory, ("n1", ("ForwardScheduler", ["1"])), ("n2", ("NoScheduler", ["true"]))) as (n1, n2):
        direct = asyncio.create_task(faas.invoke("n1", "sleep", b"3", timeout_s=30))
        await wait_until(lambda: n2.scheduler.main.n_running == 1, 10)
        await nc.publish(s.gone("n2"), gone)
        answer = await asyncio.wait_for(direct, 2)
        assert answer.status == 500 and answer.code == 403 and "went away" in answer.message
        assert errors(n1).get("forward_failed") == 1.0   # once (it was counted twice)
        # the direct call's run on n2 goes on (n2 is alive): wait for it to end, or the check
        # below sees it instead of the async call and announces n2 gone before the forward
        await wait_until(lambda: n2.scheduler.main.n_running == 0, 10)

        async with Collector(nc, s.result("dev1", "again")) as results:
            fut = faas.expect("again")
            await faas.submit("n1", "sleep", b"0.5", "again")
            await wait_until(lambda: n2.scheduler.main.n_running >= 1, 10)
            await nc.publish(s.gone("n2"), gone)
            stored = await asyncio.wait_for(fut, 20)
            await asyncio.sleep(1.0)   # the first run also ends: its late answer must not be stored twice
        assert stored.status == 200 and len(results.messages) == 1
        assert decode(Result, results.messages[0].data).status == 200
        assert errors(n1).get("forward_failed") == 2.0 and "worker_lost" not in errors(n1)   # not also as a worker lost


def errors(node) -> dict[str, float]:
    return {s.labels["kind"]: s.value for m in node.metrics.errors.collect() for s in m.samples
            if s.name.endswith("_total")}


async def test_peer_falling_silent_fails_its_forwarded_call_when_discovery_removes_it(node_factory, faas):
    """A peer cut off without a word (no ``gone``: its host died, the network split): once
    discovery removes it (silent for ``remove_after`` periods), the direct call forwarded to it
    fails with "forward failed" at once, not at its 30 s timeout."""
    quick = dict(suspect_after=3, remove_after=6)   # 0.1 s heartbeats: removed after 0.6 s of silence
    async with cluster(node_factory, ("n1", ("ForwardScheduler", ["1"]), quick),
                       ("n2", ("NoScheduler", ["true"]), quick)) as (n1, n2):
        call = asyncio.create_task(faas.invoke("n1", "sleep", b"8", timeout_s=30))
        await wait_until(lambda: n2.scheduler.main.n_running == 1, 10)
        await n2.discovery.stop()                   # n2 still runs the call, but says nothing more
        started = asyncio.get_running_loop().time()
        answer = await asyncio.wait_for(call, 15)
        waited = asyncio.get_running_loop().time() - started
    assert answer.status == 500 and answer.code == 403 and "removed by discovery" in answer.message, answer.message
    assert waited < 6   # before the call itself could have ended (8 s), let alone its timeout


@pytest.mark.parametrize("answer", ["lost", "long"])
async def test_a_forward_whose_peer_falls_silent_fails_and_a_long_one_does_not(node_factory, faas, monkeypatch, answer):
    """Both nodes stay up and in each other's view, but the peer's answer to a forwarded call is lost
    in transit (a server of the cluster dying with it in its buffers): the origin hears neither the
    answer nor the notices a peer sends while it holds the call, and fails it ("forward failed")
    after forward_silent_after_s -- not at its timeout plus the grace (an hour for sleep). A forwarded
    call that runs longer than that is not failed: its peer notices that it still runs it."""
    from nodes import forwarding
    # the sweep (every 0.5 s) sends the notices
    timings = Timings(forward_silent_after_s=1.5, forward_notice_every_s=0.3)
    lost: list[bytes] = []
    if answer == "lost":
        on_reply = forwarding.Forwarder._on_reply

        async def lossy(self, call, msg):
            if msg.data and not lost:   # the answer, not a notice: never arrives
                lost.append(msg.data)
                return
            await on_reply(self, call, msg)
        monkeypatch.setattr(forwarding.Forwarder, "_on_reply", lossy)
    async with cluster(node_factory, ("n1", ("ForwardScheduler", ["1"])), ("n2", ("NoScheduler", ["true"])),
                       timings=timings):
        started = asyncio.get_running_loop().time()
        got = await asyncio.wait_for(faas.invoke("n1", "sleep", b"0.2" if answer == "lost" else b"3", timeout_s=60), 20)
        waited = asyncio.get_running_loop().time() - started
    if answer == "lost":
        assert lost and got.status == 500 and got.code == 403 and "fell silent" in got.message, got.message
        assert waited < 6   # 0.2 s of run + 1.5 s of silence, not 60 s + 5
    else:
        assert got.status == 200 and got.executed_by == "n2" and waited >= 3, (got.message, waited)


async def test_peer_stopping_gracefully_finishes_the_forwarded_call(node_factory, faas):
    async with node_factory(node_id="n1", scheduler=("ForwardScheduler", ["1"]), **FAST) as n1:
        async with node_factory(node_id="n2", **FAST) as n2:
            await wait_until(lambda: list(n1.discovery.peers()) == ["n2"], 10)
            call = asyncio.create_task(faas.invoke("n1", "sleep", b"0.8", timeout_s=20))
            await wait_until(lambda: n2.scheduler.main.n_running == 1, 10)
        answer = await call   # n2 stopped while running it: it finished and answered first
    assert answer.status == 200 and answer.executed_by == "n2"


async def test_origin_stopping_gracefully_relays_what_its_peer_was_running(node_factory, faas, nc, prefix):
    """A node that stops waits for what it forwarded as for what it runs: before, it dropped those
    calls, and their callers got "went away" while the peer was about to answer."""
    s = Subjects(prefix)
    async with node_factory(node_id="n2", **FAST) as n2, Collector(nc, s.result("dev1", "forwarded")) as results:
        async with node_factory(node_id="n1", scheduler=("ForwardScheduler", ["1"]), **FAST) as n1:
            await wait_until(lambda: list(n1.discovery.peers()) == ["n2"], 10)
            direct = asyncio.create_task(faas.invoke("n1", "sleep", b"1", timeout_s=20))
            await faas.submit("n1", "sleep", b"1", "forwarded")
            await wait_until(lambda: n2.scheduler.main.n_running == 2, 10)
            stopping = asyncio.get_running_loop().time()
        stopped = asyncio.get_running_loop().time() - stopping   # n1 stopped (it left its `async with`)
        answer = await asyncio.wait_for(direct, 5)
        await wait_until(lambda: results.messages, 5)
        await asyncio.sleep(0.5)   # nothing stored twice
    stored = decode(Result, results.messages[0].data)
    assert answer.status == 200 and answer.executed_by == "n2" and answer.peers == ["n1", "n2"], answer
    assert stored.status == 200 and stored.executed_by == "n2" and len(results.messages) == 1
    assert stopped < 5


async def test_origin_stopping_answers_503_what_its_peer_does_not_answer_within_the_grace(node_factory, faas,
                                                                                      monkeypatch):
    async with node_factory(node_id="n2", **FAST) as n2:
        async with node_factory(node_id="n1", scheduler=("ForwardScheduler", ["1"]), timings=Timings(stop_grace_s=0.5),
                                **FAST) as n1:
            await wait_until(lambda: list(n1.discovery.peers()) == ["n2"], 10)
            direct = asyncio.create_task(faas.invoke("n1", "sleep", b"5", timeout_s=20))
            await wait_until(lambda: n2.scheduler.main.n_running == 1, 10)
        answer = await asyncio.wait_for(direct, 5)
    assert answer.status == 503 and "n1 stopped before its peer n2 answered" in answer.message, answer


async def test_a_forward_may_wait_in_its_peers_queue_longer_than_its_timeout(node_factory, faas):
    """The call's timeout bounds its execution: the peer says it still holds a call queued, and the
    origin waits as it would in its own queue. Before, a forward queued at its peer past the timeout
    plus 5 s failed ("did not answer") while the peer still ran it: an async call ran twice."""
    limit = {H.TIMEOUT: "0.5"}   # the origin used to give up after 0.5 + 5 s
    async with cluster(node_factory, ("n1", ("ForwardScheduler", ["1"])),
                       ("n2", ("NoScheduler", ["false"]), {"k": 1, "queue": 20})) as (n1, n2):
        direct = [asyncio.create_task(faas.invoke("n1", "sleep", b"0.45", headers=limit, timeout_s=30)) for _ in range(10)]
        await wait_until(lambda: n2.scheduler.main.n_queued >= 9, 10)
        stored = [asyncio.create_task(faas.call_async("n1", "sleep", b"0.45", headers=limit, timeout_s=30)) for _ in range(4)]
        answers = await asyncio.gather(*direct, *stored)   # the last ones wait about 6 s at n2
        await wait_until(lambda: n2.scheduler.main.n_running == n2.scheduler.main.n_queued == 0, 10)
    assert [(a.status, a.executed_by) for a in answers] == [(200, "n2")] * 14, [a.message for a in answers]
    ran = sum(s.value for m in n2.metrics.results.collect() for s in m.samples
              if s.name.endswith("_total") and s.labels["fn"] == "sleep")
    assert ran == 14   # each once


async def test_calls_queued_for_a_sender_that_went_away_are_dropped_not_run(node_factory, faas, nc, prefix):
    """What a dead node forwarded and its peer still holds queued is not run: nobody waits for its
    answer (an async one runs again at its origin), and it held queue places live callers needed."""
    s = Subjects(prefix)
    async with cluster(node_factory, ("n1", ("ForwardScheduler", ["1"])),
                       ("n2", ("NoScheduler", ["false"]), {"k": 1, "queue": 10})) as (n1, n2):
        calls = [asyncio.create_task(faas.invoke("n1", "sleep", b"1", timeout_s=30)) for _ in range(4)]
        await wait_until(lambda: n2.scheduler.main.n_running == 1 and n2.scheduler.main.n_queued == 3, 10)
        # what n1's workers say when its process dies (n1 itself lives on here, to see what n2 does)
        await nc.publish(s.gone("n1"), encode(NodeGone(node="n1", by="n1-w1", reason="node process ended")))
        await wait_until(lambda: n2.scheduler.main.n_queued == 0, 2)
        assert n2.scheduler.main.n_running == 1   # what runs finishes
        await asyncio.gather(*calls, return_exceptions=True)   # their callers were told n1 went away
        await wait_until(lambda: n2.scheduler.main.n_running == 0, 5)
        ran = sum(s.value for m in n2.metrics.results.collect() for s in m.samples
                  if s.name.endswith("_total") and s.labels["fn"] == "sleep")
        dropped = [s.value for m in n2.metrics.errors.collect() for s in m.samples
                   if s.name.endswith("_total") and s.labels["kind"] == "sender_gone"]
    assert ran == 1 and dropped == [3.0]


async def test_a_forward_carries_what_is_left_of_its_callers_wait(node_factory, faas, nc, prefix):
    """The peer does not run a forwarded call still queued there once its caller stopped waiting;
    the forward says what is left of the caller's wait (the origin spent some of it)."""
    async with cluster(node_factory, ("n1", ("ForwardScheduler", ["1"])),
                       ("n2", ("NoScheduler", ["false"]), {"k": 1, "queue": 10})) as (n1, n2), \
            Collector(nc, Subjects(prefix).forwards_of("n2")) as forwards:
        busy = asyncio.create_task(faas.invoke("n1", "sleep", b"1.5", timeout_s=30))
        await wait_until(lambda: n2.scheduler.main.n_running == 1, 10)
        impatient = [asyncio.create_task(faas.invoke("n1", "sleep", b"1", timeout_s=0.3)) for _ in range(2)]
        patient = asyncio.create_task(faas.invoke("n1", "sleep", b"0.1", timeout_s=30))
        first, last = await asyncio.gather(busy, patient)
        for call in impatient:
            with pytest.raises(asyncio.TimeoutError):
                await call
        gone = errors(n2).get("caller_gone")
    assert (first.status, first.executed_by, last.status, last.executed_by) == (200, "n2", 200, "n2")
    assert gone == 2.0 and last.timings.queueing_s < 3.0   # not behind 2 s of abandoned calls
    waits = sorted(float(m.headers[H.WAIT]) for m in forwards.messages)
    assert len(waits) == 4 and 0 < waits[0] < 0.3 and 0 < waits[-1] < 30   # less than the callers gave


async def test_round_robin_master_deals_over_the_alive_nodes(node_factory, faas):
    slave = ("RoundRobinWithMasterScheduler", ["false", "n3", "true"])
    master = ("RoundRobinWithMasterScheduler", ["true", "", "true"])
    async with cluster(node_factory, ("n1", slave), ("n2", slave), ("n3", master)):
        executed = [await faas.invoke("n1", "echo", b"x", timeout_s=20) for _ in range(4)]
        own = await faas.invoke("n3", "echo", b"x", timeout_s=20)
    # n1 -> master n3 -> round robin over n1, n2, n3 skipping n1 (already on the path)
    assert [r.executed_by for r in executed] in (["n2", "n3", "n2", "n3"], ["n3", "n2", "n3", "n2"])
    assert all(r.peers[:2] == ["n1", "n3"] for r in executed)
    assert own.code == 400 and own.status == 500


async def test_peer_list_subject(node_factory, nc, prefix):
    async with cluster(node_factory, ("n1", ("NoScheduler", ["true"])), ("n2", ("NoScheduler", ["true"])),
                       address="http://10.1.2.3:18080", group="edge"):
        reply = await nc.request(Subjects(prefix).peers("n1"), b"", timeout=5)
    rows = decode(PeerList, reply.data).root
    assert [(r.name, r.ip, r.address, r.group_name, r.alive) for r in rows] == [
        ("n2", "10.1.2.3", "http://10.1.2.3:18080", "edge", True)]   # P2PFaaS: ip is the machine's address


# -- an original P2PFaaS node (a machine that speaks HTTP) dying mid-call ---------------------------
class DyingMachine:
    """The HTTP side of an original P2PFaaS node on one port (its ``/list`` and ``/peer/function``),
    a real socket server that dies during the forwarded calls it takes, each as ``behaviours`` says
    in turn: "reset" (its process is killed: the kernel resets the connection and refuses new ones),
    "stall" (its host freezes: the connection stays open and nothing comes), "trickle" (it sends an
    answer's head, then a byte now and then, never the whole answer)."""

    def __init__(self, *behaviours: str) -> None:
        self.behaviours, self.jobs = list(behaviours), 0
        self.server: asyncio.Server | None = None
        self.port = 0
        self._held: list[asyncio.StreamWriter] = []

    async def start(self) -> "DyingMachine":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        for writer in self._held:
            writer.transport.abort()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"POST /peer/function/"):   # its discovery: an empty list
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                         b"Connection: close\r\n\r\n[]")
            await writer.drain()
            writer.close()
            return
        self.jobs += 1
        behaviour = self.behaviours.pop(0)
        if behaviour == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.server.close()        # the process is gone: nobody listens on its port any more
            writer.transport.abort()   # and the kernel resets what it held
            return
        self._held.append(writer)
        if behaviour == "trickle":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
            while not writer.is_closing():
                writer.write(b" ")
                await asyncio.sleep(0.3)


MACHINE_IP = "127.0.0.1"


def with_machine(machine: DyingMachine) -> dict:
    """A node's settings naming ``machine`` as an init server (its scheduler and discovery ports)."""
    return dict(FAST, init_servers=[MACHINE_IP], peer_scheduler_port=machine.port, peer_discovery_port=machine.port)


async def test_p2pfaas_machine_killed_mid_call_fails_the_call_at_once_and_is_not_chosen_again(node_factory, faas,
                                                                                               nc, prefix):
    """A call forwarded over HTTP to an original P2PFaaS node whose process is killed during it:
    the direct caller gets "forward failed" at once (as for a p2pfaas peer that went away), and the
    machine is no longer scheduled: it was chosen again for every call until 20 failed polls
    (40 min) declared it dead, each failing the same way. It is scheduled again once it
    announces itself. An async call forwarded to it is delivered again and runs here, once (it
    went to the dead machine on every delivery and was dead-lettered)."""
    machine = await DyingMachine("reset", "reset").start()
    peer = machine_token(MACHINE_IP)
    try:
        async with node_factory(node_id="n1", scheduler=("ForwardScheduler", ["1"]), **with_machine(machine)) as n1:
            assert list(n1.discovery.peers()) == [peer]
            started = asyncio.get_running_loop().time()
            answer = await asyncio.wait_for(faas.invoke("n1", "echo", b"x", timeout_s=30), 10)
            assert asyncio.get_running_loop().time() - started < 2
            assert answer.status == 500 and answer.code == 403 and "forward failed" in answer.message, answer.message
            assert machine.jobs == 1 and list(n1.discovery.peers()) == []
            again = await faas.invoke("n1", "echo", b"y", timeout_s=20)
            assert again.status == 200 and again.executed_by == "n1" and again.hops == 0

            await machine.start()   # it runs again and polls our list (it announces itself): scheduled again
            await n1.discovery.on_register(encode(MachineAnnouncement(ip=MACHINE_IP)))
            assert list(n1.discovery.peers()) == [peer]
            async with Collector(nc, Subjects(prefix).result("dev1", "m1")) as results:
                stored = await asyncio.wait_for(faas.call_async("n1", "echo", b"z", req="m1", timeout_s=30), 20)
                await asyncio.sleep(0.5)
            assert machine.jobs == 2
            assert stored.status == 200 and stored.executed_by == "n1" and stored.output == b"z"
            assert len(results.messages) == 1
    finally:
        await machine.stop()


async def test_p2pfaas_machine_falling_silent_mid_call_fails_the_call_within_its_timeout(node_factory, faas):
    """A machine that stops answering during a forwarded call (its host froze; or it sends the
    head of an answer and then a byte now and then): the call fails with "forward failed" past its
    timeout plus the forwarding grace, as a silent p2pfaas peer's does, never later (a trickling
    answer held it for as long as bytes kept coming, one per read timeout)."""
    machine = await DyingMachine("stall", "trickle").start()
    try:
        async with node_factory(node_id="n1", scheduler=("ForwardScheduler", ["1"]), **with_machine(machine)) as n1:
            started = asyncio.get_running_loop().time()
            calls = [faas.invoke("n1", "echo", b"x", headers={H.TIMEOUT: "1"}, timeout_s=60) for _ in range(2)]
            answers = await asyncio.wait_for(asyncio.gather(*calls), 15)
            waited = asyncio.get_running_loop().time() - started
            for answer in answers:
                assert answer.status == 500 and answer.code == 403 and "forward failed" in answer.message, answer.message
            assert machine.jobs == 2 and waited < 1 + FORWARD_GRACE_S + 2
            assert list(n1.discovery.peers()) == []   # not chosen again until it answers a poll
    finally:
        await machine.stop()
