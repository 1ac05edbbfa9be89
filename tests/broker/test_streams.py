"""The streams every node and learner ensures at start, on a real nats-server."""

from __future__ import annotations

from broker.streams import async_stream, ensure_node_streams, ensure_shared_streams
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
    assert len(calls) == 4 and all(c.startswith("add") for c in calls)
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
