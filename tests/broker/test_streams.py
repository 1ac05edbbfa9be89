"""The streams every node and learner ensures at start, on a real nats-server."""

from __future__ import annotations

import asyncio

import pytest
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NoStreamResponseError

from broker.client import FaasClient
from broker.connection import close_quietly, connect
from broker.embedded import NatsServer
from broker.streams import (MIB, async_stream, deadletter_stream, ensure_node_streams, ensure_shared_streams,
                            experiences_stream, results_stream)
from broker.subjects import Subjects


async def test_ensuring_existing_streams_changes_nothing(nc, prefix):
    """Every node and learner ensures the streams: once they exist, nothing is added or updated
    (adding again would reserve max_bytes twice: nats-server error 10047 on a small disk)."""
    js, s = nc.jetstream(), Subjects(prefix)
    calls: list[str] = []
    add, update = js.add_stream, js.update_stream

    async def counted_add(config, **kw):
        calls.append(f"add {config.name}")
        return await add(config, **kw)

    async def counted_update(config, **kw):
        calls.append(f"update {config.name}")
        return await update(config, **kw)

    js.add_stream, js.update_stream = counted_add, counted_update
    await ensure_shared_streams(js, s)
    await ensure_node_streams(js, s, "n1")
    assert len(calls) == 5 and all(c.startswith("add") for c in calls)
    calls.clear()
    await ensure_shared_streams(js, s)
    await ensure_node_streams(js, s, "n1")
    assert calls == []
    # a stream with another configuration is brought to ours
    info = await js.stream_info(async_stream(s))
    info.config.max_msgs = 10
    await update(info.config)
    await ensure_shared_streams(js, s)
    assert calls == [f"update {async_stream(s)}"]
    assert (await js.stream_info(async_stream(s))).config.max_msgs != 10


async def test_streams_fit_a_small_store(tmp_path):
    """On a store too small for the streams' max_bytes (nats-server reserves them: error 10047),
    each stream takes its share of the room there is, and ensuring them again (every node, every
    restart) keeps them as they are."""
    server = NatsServer(data_dir=tmp_path / "nats", port=None, max_store_bytes=48 * MIB)
    await server.start()
    nc = await connect(server.url, "small-store")
    try:
        js, s = nc.jetstream(), Subjects("small")
        await ensure_node_streams(js, s, "n1")
        await ensure_node_streams(js, s, "n2")
        names = [async_stream(s), results_stream(s), deadletter_stream(s), experiences_stream(s, "n1"),
                 experiences_stream(s, "n2")]
        sizes = {name: (await js.stream_info(name)).config.max_bytes for name in names}
        assert sum(sizes.values()) <= 48 * MIB, sizes
        assert all(size >= MIB for size in sizes.values()), sizes
        assert sizes[async_stream(s)] >= 8 * MIB and sizes[results_stream(s)] >= 8 * MIB, sizes
        await ensure_node_streams(js, s, "n1")
        assert {name: (await js.stream_info(name)).config.max_bytes for name in names} == sizes
        # and they take work: a task stored in the fitted intake
        ack = await js.publish(s.async_request("n1", "echo", "c1", "r1"), b"x", stream=async_stream(s))
        assert ack.seq == 1
    finally:
        await close_quietly(nc)
        await server.stop()


async def test_a_submit_without_acknowledgement_is_tried_again_within_its_patience(nc, prefix):
    """No stream answers yet (as while JetStream elects a leader): a submit with patience is
    stored once the stream is there, once; without patience it fails at its timeout."""
    js, s = nc.jetstream(), Subjects(prefix)
    async with FaasClient(nc, client="dev1", prefix=prefix) as faas:
        with pytest.raises((NoStreamResponseError, NatsTimeout)):
            await faas.submit("n1", "echo", b"x", "impatient", timeout_s=0.5)
        waiting = asyncio.create_task(faas.submit("n1", "echo", b"x", "patient", timeout_s=0.5, retry_for_s=10.0))
        await asyncio.sleep(1.5)   # a few attempts go unanswered
        assert not waiting.done()
        await ensure_shared_streams(js, s)
        await asyncio.wait_for(waiting, 10)
    info = await js.stream_info(async_stream(s))
    assert info.state.messages == 1   # the patient call, stored once


def test_a_deliverys_reply_says_what_nats_py_reads_in_it():
    """delivery_info reads both of nats-server's reply formats as nats-py's Msg.metadata does."""
    import pytest
    from nats.aio.msg import Msg
    from nats.errors import NotJSMessageError

    from broker.fastpath import delivery_info

    for reply in ("$JS.ACK.FAAS_ASYNC.node-n1.3.1042.17.1764650000123456789.12",
                  "$JS.ACK._.ACC123.FAAS_ASYNC.node-n1.1.7.7.1764650000999999999.0.xyz",
                  "$JS.ACK.dom.ACC123.FAAS_ASYNC.node-n1.2.8.9.1764650001000000000.4"):
        meta = Msg.Metadata._from_reply(reply)
        info = delivery_info(reply)
        assert (info.stream_seq, info.num_delivered) == (meta.sequence.stream, meta.num_delivered)
        assert info.timestamp == pytest.approx(meta.timestamp.timestamp(), abs=1e-6)
    for bad in ("", "_INBOX.x.1", "$JS.ACK.too.short"):
        with pytest.raises(NotJSMessageError):
            delivery_info(bad)


async def test_streams_are_ensured_once_jetstream_answers(tmp_path):
    """While JetStream's API has no responder (nats-server starting it, or reloading its accounts:
    a device enrolled while `up` starts), ensuring the streams waits for it instead of failing:
    the MQTT bridge died of it at start, and `up` with it."""
    server = await NatsServer(data_dir=tmp_path / "a", port=None, jetstream=False).start()
    nc = await connect(server.url, "streams-wait")
    try:
        task = asyncio.create_task(ensure_shared_streams(nc.jetstream(), Subjects("twait")))
        # a window in which something must not happen: without JetStream, the ensure keeps trying
        # (before the fix it failed within milliseconds)
        await asyncio.sleep(1.0)
        assert not task.done()
        port = server.port
        await server.stop()
        server = await NatsServer(data_dir=tmp_path / "b", port=port).start()   # JetStream answers now
        await asyncio.wait_for(task, 20)
        names = {s.config.name for s in await nc.jetstream().streams_info()}
        assert async_stream(Subjects("twait")) in names
    finally:
        await close_quietly(nc)
        await server.stop()
