"""A process's broker settings: one object read from its environment (broker/settings.py)."""

from __future__ import annotations

import asyncio

import pytest

from broker.connection import close_quietly, connect
from broker.settings import broker_settings
from broker.streams import stream_replicas


def test_a_processs_broker_settings_come_from_its_environment(monkeypatch):
    monkeypatch.setenv("P2PFAAS_TLS_CA", "/data/tls/ca.pem")
    monkeypatch.setenv("P2PFAAS_INBOX_PREFIX", "_INBOX_dev1")
    monkeypatch.setenv("P2PFAAS_STREAM_REPLICAS", "3")
    s = broker_settings()
    assert (s.tls_ca, s.inbox_prefix, s.stream_replicas) == ("/data/tls/ca.pem", "_INBOX_dev1", 3)
    assert stream_replicas() == 3
    for name in ("P2PFAAS_TLS_CA", "P2PFAAS_INBOX_PREFIX", "P2PFAAS_STREAM_REPLICAS"):
        monkeypatch.setenv(name, "")              # empty counts as unset, as for a node's settings
    s = broker_settings()
    assert (s.tls_ca, s.inbox_prefix, s.stream_replicas) == (None, None, 1)


@pytest.mark.parametrize("value", ["0", "7", "three"])
def test_a_replica_count_jetstream_cannot_keep_is_an_error_naming_its_variable(monkeypatch, value):
    monkeypatch.setenv("P2PFAAS_STREAM_REPLICAS", value)
    with pytest.raises(ValueError, match="P2PFAAS_STREAM_REPLICAS"):
        stream_replicas()


async def test_a_connection_takes_the_inbox_prefix_from_the_environment(monkeypatch, nats_server, prefix):
    monkeypatch.setenv("P2PFAAS_INBOX_PREFIX", f"_INBOX_{prefix}")
    asker, answerer = await connect(nats_server.url, "asker"), await connect(nats_server.url, "answerer")
    try:
        seen: list[str] = []

        async def answer(msg) -> None:
            seen.append(msg.reply)
            await msg.respond(b"pong")

        await answerer.subscribe(f"{prefix}.ping", cb=answer)
        await answerer.flush()
        reply = await asyncio.wait_for(asker.request(f"{prefix}.ping", b"ping", timeout=5), 10)
        assert reply.data == b"pong" and seen[0].startswith(f"_INBOX_{prefix}.")
    finally:
        await close_quietly(asker)
        await close_quietly(answerer)
