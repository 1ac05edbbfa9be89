"""The durable intake against a real nats-server: a consumer deleted under a running node is
made again and every stored call still runs; the sweeper never takes a live node for one that
never existed."""

from __future__ import annotations

import asyncio
import logging
import shutil

import orjson
from nats.js.api import DeliverPolicy

from broker.client import FaasClient
from broker.codec import decode
from broker.connection import close_quietly, connect
from broker.control import control_request, node_health
from broker.embedded import NatsServer
from broker.messages import Rejection
from broker.streams import async_stream, ensure_shared_streams, results_stream
from broker.subjects import Subjects
from nodes.intake import AsyncIntake, consumer_name
from nodes.unknown_nodes import UnknownNodeSweeper
from nodes.node import Node
from nodes.settings import NodeSettings
from support import Collector, wait_until


async def test_a_deleted_intake_consumer_is_made_again_and_every_stored_call_runs(node_factory, faas, nc, prefix,
                                                                                  caplog):
    """An operator's ``nats consumer rm`` (or a JetStream store restored without the consumer):
    the intake used to retry its pulls for ever (409 Consumer Deleted, then no responders), and
    the sweeper then refused the live node's calls as "never started"."""
    s, js = Subjects(prefix), nc.jetstream()
    stream, durable = async_stream(s), consumer_name("n1")
    caplog.set_level(logging.WARNING, logger="nodes.intake")
    async with Collector(nc, s.rejects_of("dev1")) as rejects, \
            node_factory(queue=64, unknown_node_after_s=0.5, runtime="inprocess") as node:
        assert (await faas.call_async("n1", "echo", b"before", req="before", timeout_s=20)).status == 200
        held = asyncio.create_task(faas.call_async("n1", "sleep", b"1.0", req="held", timeout_s=30))
        await wait_until(lambda: node.scheduler.main.n_running == 1, timeout_s=10)
        await js.delete_consumer(stream, durable)   # under a call it runs: its message comes again
        # stored around the deletion: the old intake never took them, and after unknown_node_after_s
        # the node's own sweeper refused them (404, "never been started")
        reqs = [f"after{i}" for i in range(20)]
        answers = [faas.expect(req) for req in reqs]
        for req in reqs:
            await faas.submit("n1", "echo", req.encode(), req)
        done = await asyncio.wait_for(asyncio.gather(*answers), 30)
        assert [(a.status, a.output) for a in done] == [(200, req.encode()) for req in reqs], \
            [(a.status, a.message) for a in done if a.status != 200]
        assert (await asyncio.wait_for(held, 30)).status == 200
        # made again as at start: it delivers every call still stored, not only the new ones
        assert (await js.consumer_info(stream, durable)).config.deliver_policy in (None, DeliverPolicy.ALL)
        await wait_until(lambda: node.ingress.intake.healthy, timeout_s=10)
        status, body = await control_request(nc, s.info("n1"), b"", 5.0)
        assert node_health("n1", status, body)[1] is None, orjson.loads(body)
        await asyncio.sleep(1.5)   # past unknown_node_after_s and more than one sweep period
        assert (await faas.call_async("n1", "echo", b"later", req="later", timeout_s=20)).status == 200
        runs = node.metrics.invocations("echo"), node.metrics.invocations("sleep")
    assert runs == (len(reqs) + 2, 1)   # the held call's second delivery was not run again
    gone = [r for r in caplog.records if "consumer" in r.getMessage() and "gone" in r.getMessage()]
    assert len(gone) == 1, [r.getMessage() for r in caplog.records]
    refused = [decode(Rejection, m.data) for m in rejects.messages]
    assert not [r for r in refused if "never been started" in r.reason], refused


async def test_the_sweeper_refuses_only_nodes_neither_alive_nor_itself(nc, prefix):
    """Calls stored for this node and for a peer alive in membership stay, even with no
    consumer made for them yet; only a node nobody has heard of is taken for one that never was."""
    s, js = Subjects(prefix), nc.jetstream()
    await ensure_shared_streams(js, s)
    for node in ("n1", "n2", "ghost"):
        await js.publish(s.async_request(node, "echo", "dev1", f"to-{node}"), b"x")
    alive: list[str] = ["n2"]
    sweeper = UnknownNodeSweeper("n1", nc, s, lambda msg, why: asyncio.sleep(0), alive=lambda: alive,
                                 unknown_after_s=0.2, period_s=60)
    await asyncio.sleep(0.3)
    assert await sweeper.unknown_nodes() == {"ghost"}
    alive.clear()   # n2 silent now (and it never had a consumer): its calls are refused too
    assert await sweeper.unknown_nodes() == {"ghost", "n2"}


async def test_a_store_restored_without_the_intake_consumer_is_found_out_after_the_restart(prefix, tmp_path, caplog):
    """nats-server restarted on a store that lacks the consumer: the node's pulls find nobody
    (no responders, not "Consumer Deleted"), JetStream says the consumer is not found, and the
    intake makes it again."""
    caplog.set_level(logging.WARNING, logger="nodes.intake")
    server = NatsServer(data_dir=tmp_path / "nats", port=None)
    await server.start()
    node = nc = None
    try:
        node = await Node(NodeSettings(node_id="n1", nats_url=server.url, prefix=prefix, data_dir=tmp_path / "node",
                                       learner=False, runtime="inprocess")).start()
        nc = await connect(server.url, "restore-client")
        async with FaasClient(nc, client="dev1", prefix=prefix) as faas:
            assert (await faas.call_async("n1", "echo", b"before", timeout_s=20)).status == 200
            assert server.proc is not None
            server.proc.kill()
            await asyncio.wait_for(server.proc.wait(), 10)
            stores = list((tmp_path / "nats").glob(f"**/streams/{async_stream(Subjects(prefix))}/obs/node-n1"))
            assert len(stores) == 1, stores
            shutil.rmtree(stores[0])
            await server.start()
            answers = await asyncio.gather(*(faas.call_async("n1", "echo", b"after", timeout_s=30) for _ in range(5)))
            assert [a.status for a in answers] == [200] * 5
            await wait_until(lambda: node.ingress.intake.healthy, timeout_s=10)
    finally:
        if nc is not None:
            await close_quietly(nc)
        if node is not None:
            await node.stop()
        await server.stop()
    assert [r for r in caplog.records if "is gone (503" in r.getMessage()], [r.getMessage() for r in caplog.records]


async def test_stopping_the_intake_as_its_pull_request_ends_stops_it(nc, prefix):
    """A stop that came in the same loop turn as the end of the open pull request (every second,
    at its expiry) was swallowed by Python 3.11's ``asyncio.wait_for`` (it returns the result of a
    future that is done instead of raising the cancellation): the intake pulled on for ever and
    the node's stop waited for it for ever (a test's teardown hung 120 s)."""
    s = Subjects(prefix)
    await ensure_shared_streams(nc.jetstream(), s)

    async def take(msg) -> None:
        pass

    for turns in range(6):   # where the window is depends on the loop turns between the two
        intake = await AsyncIntake(f"n{turns}", nc, s, ack_wait_s=10, take=take).start()
        await wait_until(lambda: intake.healthy, timeout_s=10)
        await asyncio.sleep(0.05)   # its pull request is open
        intake._ended.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        try:
            async with asyncio.timeout(5):
                await intake.stop()
        except TimeoutError:
            raise AssertionError(f"the intake did not stop ({turns} loop turns after its pull ended)") from None
        assert all(task.done() for task in intake._tasks) or not intake._tasks


async def test_a_deleted_async_stream_is_made_again_and_async_calls_run(node_factory, faas, nc, prefix, caplog):
    """``nats stream rm`` of the async stream (or a JetStream store lost) under a running node:
    the intake retried binding for ever (stream not found), and every async call was refused
    (no stream answers a submit) until a node restart. Now the intake makes the stream again
    with the settings the node makes it with at start, and binds as usual."""
    s, js = Subjects(prefix), nc.jetstream()
    stream = async_stream(s)
    caplog.set_level(logging.WARNING, logger="nodes.intake")
    async with node_factory(runtime="inprocess") as node:
        assert (await faas.call_async("n1", "echo", b"before", req="before", timeout_s=20)).status == 200
        made = (await js.stream_info(stream)).config
        await js.delete_stream(stream)
        loop = asyncio.get_running_loop()
        deleted_at = loop.time()
        answer = faas.expect("after")
        await faas.submit("n1", "echo", b"after", "after", retry_for_s=15)   # refused until the stream is back
        stored_after_s = loop.time() - deleted_at
        done = await asyncio.wait_for(answer, 20)
        again = (await js.stream_info(stream)).config
        await wait_until(lambda: node.ingress.intake.healthy, timeout_s=10)
        assert (await faas.call_async("n1", "echo", b"later", req="later", timeout_s=20)).status == 200
    assert (done.status, done.output) == (200, b"after")
    assert stored_after_s < 10, stored_after_s
    assert (again.subjects, again.retention, again.max_bytes, again.max_msgs, again.duplicate_window, again.discard) == \
        (made.subjects, made.retention, made.max_bytes, made.max_msgs, made.duplicate_window, made.discard)
    remade = [r for r in caplog.records if "async stream" in r.getMessage() and "making it again" in r.getMessage()]
    assert len(remade) == 1, [r.getMessage() for r in caplog.records]


async def test_a_deleted_results_stream_is_made_again_by_the_node_that_stores_an_answer(node_factory, faas, nc, prefix):
    """The results stream deleted under a running node (no MQTT bridge around to make it again):
    every async answer waited for ever in the node's retry loop (its intake message held, /healthz
    503 with 'unstored'). The node now makes the shared streams again and stores the answer."""
    s, js = Subjects(prefix), nc.jetstream()
    async with node_factory(runtime="inprocess") as node:
        assert (await faas.call_async("n1", "echo", b"before", req="before", timeout_s=20)).status == 200
        await js.delete_stream(results_stream(s))
        answer = await faas.call_async("n1", "echo", b"after", req="after", timeout_s=20)   # published live
        assert answer.status == 200 and answer.output == b"after"
        await wait_until(lambda: node.scheduler.answerer.unstored == 0 and not node.ingress.intake.held, timeout_s=15)
        stored = await faas.stored_answer("dev1", "after")
        assert stored is not None and stored.status == 200 and stored.body == b"after"
