"""nats-server killed (-9) and restarted under a node with calls on the wire: no call keeps its
slot until its function's timeout (sleep's is an hour), no async task runs twice, every one is
answered exactly once; a direct caller hears of the outage at once. Each test has its own
nats-server (the session's is shared)."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.js.errors import NotFoundError

from broker.client import FaasClient
from broker.connection import close_quietly, connect
from broker.embedded import NatsServer
from broker.errors import NodeUnavailable
from broker.messages import NodeConfiguration, Result, SchedulerConfiguration
from broker.codec import decode
from broker.streams import results_stream
from broker.subjects import Subjects
from nodes.node import Node
from nodes.settings import NodeSettings
from support import eventually, wait_until

TASKS = 40


async def crash_and_restart(server: NatsServer, down_s: float = 0.5) -> None:
    assert server.proc is not None
    server.proc.kill()
    await asyncio.wait_for(server.proc.wait(), 10)
    await asyncio.sleep(down_s)
    await server.start()


@pytest.fixture
async def own_server(tmp_path):
    server = NatsServer(data_dir=tmp_path / "nats", port=None)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def settings(server: NatsServer, prefix: str, tmp_path, k: int = 4) -> NodeSettings:
    return NodeSettings(node_id="n1", nats_url=server.url, prefix=prefix, data_dir=tmp_path / "node", learner=False,
                        runtime="process", initial=NodeConfiguration(parallel_running_functions_max=k, queue_length_max=64),
                        initial_scheduler=SchedulerConfiguration(name="NoScheduler", parameters=["false"]))


async def test_async_calls_on_the_wire_when_nats_server_dies_run_once_and_free_their_slots(own_server, prefix, tmp_path):
    node = await Node(settings(own_server, prefix, tmp_path)).start()
    nc = await connect(own_server.url, "outage-client")
    try:
        assert node.pool is not None
        await node.pool.wait_ready(60)
        async with FaasClient(nc, client="dev1", prefix=prefix) as faas:
            for i in range(TASKS):
                await faas.submit("n1", "sleep", b"0.3", f"r{i}")
            await wait_until(lambda: node.metrics.invocations("sleep") >= 4, 20)   # some ran, some run, most wait
            await crash_and_restart(own_server)
            started = time.monotonic()
            # every task answered, and no slot held by a call lost with the broker (its timeout: 1 h)
            await wait_until(lambda: node.metrics.invocations("sleep") >= TASKS, 90)
            await wait_until(lambda: node.scheduler.main.n_running + node.scheduler.main.n_queued == 0, 30)
            js, s = nc.jetstream(), Subjects(prefix)

            async def stored(i: int) -> Result | None:   # an answer is counted before its store is acknowledged
                try:
                    return decode(Result, (await js.get_last_msg(results_stream(s), s.result("dev1", f"r{i}"))).data)
                except NotFoundError:
                    return None
            for i in range(TASKS):
                result = await eventually(lambda i=i: stored(i), lambda r: r is not None, timeout_s=30)
                assert result.status == 200, (i, result)
            recovered_s = time.monotonic() - started
            await asyncio.sleep(2.0)   # the window in which a second run would still be counted
        runs = node.metrics.invocations("sleep")
    finally:
        await close_quietly(nc)
        await node.stop()
    assert runs == TASKS, f"{runs - TASKS} task(s) ran twice"
    assert recovered_s < 60


async def test_a_direct_call_fails_at_once_when_the_broker_connection_drops(own_server, prefix, tmp_path):
    node = await Node(settings(own_server, prefix, tmp_path, k=2)).start()
    nc = await connect(own_server.url, "outage-client")
    try:
        assert node.pool is not None
        await node.pool.wait_ready(60)
        async with FaasClient(nc, client="dev1", prefix=prefix) as faas:
            call = asyncio.create_task(faas.invoke("n1", "sleep", b"5", timeout_s=120))
            await wait_until(lambda: node.scheduler.main.n_running == 1, 10)
            started = time.monotonic()
            await crash_and_restart(own_server)
            with pytest.raises(NodeUnavailable, match="connection to NATS dropped"):
                await asyncio.wait_for(call, 10)
            assert time.monotonic() - started < 10
            # the node frees the slot (the worker finishes, its outcome comes or it says it has none)
            await wait_until(lambda: node.scheduler.main.n_running == 0, 30)
            answer = await faas.invoke("n1", "echo", b"after", timeout_s=30)
            assert answer.status == 200 and answer.body == b"after"
            # the async intake pulled again as soon as the node was back, not at its lost pull
            # request's expiry: an async call made now is answered
            assert node.ingress.intake.pulls_after_reconnect >= 1
            stored = await faas.call_async("n1", "echo", b"async after", timeout_s=30)
            assert stored.status == 200 and stored.body == b"async after"
    finally:
        await close_quietly(nc)
        await node.stop()
