"""What one setting may ask of the machine: K and the queue at their largest accepted values leave
the node answering (K above what the machine holds is served by as many processes as it holds),
configuration bodies are validated strictly, and direct calls waiting in memory are bounded."""

from __future__ import annotations

import dataclasses

import orjson

from broker.codec import decode
from broker.messages import NodeConfiguration
from broker.subjects import Subjects
from nodes.pool import machine_worker_limit
from nodes.settings import Timings

LARGEST = {"parallel_running_functions_max": 1024, "queue_length_max": 100_000}


async def test_k_and_queue_at_their_largest_values_leave_the_node_answering(node_factory, nc, faas, prefix, tmp_path):
    s = Subjects(prefix)
    limit = machine_worker_limit()
    async with node_factory(k=4, runtime="process", data_dir=tmp_path) as node:
        reply = await nc.request(s.config("n1", "set"), orjson.dumps(LARGEST), timeout=10)
        assert reply.headers["X-P2pfaas-Status"] == "200", reply.data
        assert node.scheduler.main.capacity == 1024          # K slots ...
        assert node.pool.target == min(1024, limit) < 1024   # ... served by what the machine holds
        await node.pool.wait_ready(120)
        answers = [await faas.invoke("n1", "fib", b"15", timeout_s=30) for _ in range(5)]
        assert [a.status for a in answers] == [200] * 5 and answers[0].output == b"610"
    async with node_factory(k=4, runtime="process", data_dir=tmp_path) as node:   # restarted from the saved file
        assert node.store.node.parallel_running_functions_max == 1024
        assert len(node.pool.workers) == min(1024, limit)
        assert (await faas.invoke("n1", "echo", b"again", timeout_s=30)).output == b"again"


async def test_configuration_bodies_are_refused_not_coerced(node_factory, nc, prefix):
    s = Subjects(prefix)
    async with node_factory(k=2, queue=3, runtime="inprocess") as node:
        for bad in (b'{"parallel_running_functions_max": "8"}', b'{"parallel_running_functions_max": 8.5}',
                    b'{"queue_enabled": "yes"}', b'{"parallel_running_functions_max": 1025}',
                    b'{"queue_length_max": 100001}', b'{"parallel_running_functions_max": 0}', b'{"k": 8}', b"[]"):
            reply = await nc.request(s.config("n1", "set"), bad, timeout=5)
            assert reply.headers["X-P2pfaas-Status"] == "400", bad
            assert orjson.loads(reply.data)["message"]
        current = decode(NodeConfiguration, (await nc.request(s.config("n1", "get"), b"", timeout=5)).data)
        assert (current.parallel_running_functions_max, current.queue_length_max) == (2, 3)
        assert node.scheduler.main.capacity == 2


async def test_direct_calls_waiting_in_memory_are_bounded_in_bytes(node_factory, faas, monkeypatch):
    """Whatever queue_length_max says, the inputs of queued direct calls stay within the node's
    memory share: past it a call is refused at once (500, P2PFaaS's 400), not held."""
    import asyncio

    async with node_factory(k=1, queue=1000, runtime="inprocess") as node:
        node.scheduler.queue_bytes_max = 300_000
        body = b"0.5" + b" " * 99_997            # sleep's input, 100 kB
        first = asyncio.create_task(faas.invoke("n1", "sleep", body, timeout_s=30))
        queued = [asyncio.create_task(faas.invoke("n1", "sleep", body, timeout_s=30)) for _ in range(6)]
        answers = await asyncio.gather(first, *queued)
    statuses = sorted(a.status for a in answers)
    assert statuses.count(200) == 4, statuses         # one running, three within 300 kB of queue
    refused = [a for a in answers if a.status != 200]
    assert all(a.status == 500 and a.code == 400 and "bytes of input" in a.message for a in refused)


async def test_health_says_when_async_calls_cannot_be_stored(node_factory, nc, prefix):
    """A full intake (or a full disk) refuses new async work: the node's info says so, and so
    /healthz (broker.control.node_health), before a caller's call is refused for it."""
    from broker.control import control_request, node_health
    from broker.streams import async_stream
    from support import eventually

    s = Subjects(prefix)
    js = nc.jetstream()

    async def health():
        status, data = await control_request(nc, s.info("n1"), b"", 5)
        return node_health("n1", status, data)[1]

    async with node_factory(k=1, runtime="inprocess", timings=Timings(store_check_every_s=0.1)):
        assert await eventually(health, lambda problem: problem is None) is None
        info = await js.stream_info(async_stream(s))
        for i in range(3):   # calls for a node that is not running: they stay stored
            await js.publish(s.async_request("elsewhere", "echo", "dev1", f"r{i}"), b"x")
        await js.update_stream(dataclasses.replace(info.config, max_msgs=3))
        try:
            problem = await eventually(health, lambda problem: problem is not None)
            assert "async intake full: 3 of 3 calls" in problem
        finally:
            await js.update_stream(info.config)
        assert await eventually(health, lambda problem: problem is None) is None
