"""The fast path's contract with nats-py (broker/fastpath.py): the pinned version, the internals
each override stands on, and, for the JetStream pieces taken by hand, the same outcome as
nats-py's own way on a real server. The client's overrides are exercised in test_connection.py
(each of those tests fails when its override is gone)."""

from __future__ import annotations

import asyncio
import inspect
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StreamConfig
from nats.js.errors import APIError, BadRequestError, NoStreamResponseError, ServiceUnavailableError
from nats.protocol import parser as nats_parser

from broker import fastpath
from broker.fastpath import MessageParser, NatsClient, ack_now, delivery, pull_subject, store_error
from support import eventually, wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_nats_py_is_the_pinned_version():
    """The overrides are written against one nats-py: pyproject pins it, and that is the one here."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [pin] = [d for d in deps if d.replace(" ", "").startswith("nats-py")]
    assert re.fullmatch(r"nats-py==[0-9.]+", pin.split("#")[0].strip()), f"nats-py is not pinned: {pin!r}"
    assert version("nats-py") == pin.split("==")[1].strip()


@pytest.mark.parametrize("method, parameters", [
    ("_process_msg", ["self", "sid", "subject", "reply", "data", "headers"]),     # lean subscriptions
    ("_remove_sub", ["self", "sid", "max_msgs"]),                                  # ... and their end
    ("_send_publish", ["self", "subject", "reply", "payload", "payload_size", "headers"]),   # header blocks
    ("_flush_pending", ["self", "force_flush"]),                                  # no Future per publish
    ("_send_command", ["self", "cmd", "priority"]),
])
def test_the_client_methods_the_overrides_replace_have_their_shape(method, parameters):
    assert list(inspect.signature(getattr(Client, method)).parameters) == parameters
    assert getattr(NatsClient, method) is not getattr(Client, method) or method == "_send_command"


def test_the_header_reader_replaces_nats_pys_and_reads_as_it_does():
    """nats-py reads a message's header block with ``_parse_header_lines`` (a static method): ours
    stands in its place, and gives its result."""
    raw = b"NATS/1.0\r\nX-P2pfaas-Status: 200\r\nNats-Msg-Id: a.b\r\nX-Empty:\r\n\r\n"[len(b"NATS/1.0\r\n"):]
    assert list(inspect.signature(Client._parse_header_lines).parameters) == ["raw"]
    assert NatsClient._parse_header_lines is not Client._parse_header_lines
    assert NatsClient._parse_header_lines(raw) == Client._parse_header_lines(raw)


async def test_a_connected_client_has_the_state_the_overrides_read(nc):
    """``send`` and ``_flush_pending`` read nats-py's write state; the parser is ours."""
    assert isinstance(nc, NatsClient) and isinstance(nc._ps, MessageParser)
    assert isinstance(nc._flush_queue, asyncio.Queue) and isinstance(nc._flusher_task, asyncio.Task)
    assert isinstance(nc._pending, list) and isinstance(nc._pending_data_size, int)
    assert isinstance(nc._max_pending_size, int) and nc._max_payload > 0
    assert isinstance(fastpath._SUBJECT_BAD, re.Pattern)


def test_the_parser_state_the_message_parser_drives_is_nats_pys():
    parser = nats_parser.Parser(object())
    for name, kind in (("buf", bytearray), ("state", int), ("needed", int), ("header_needed", int), ("msg_arg", dict)):
        assert isinstance(getattr(parser, name), kind), name
    assert (nats_parser.AWAITING_CONTROL_LINE, nats_parser.AWAITING_MSG_PAYLOAD) == (1, 2)
    assert MessageParser.parse is not nats_parser.Parser.parse


def test_the_message_internals_deliveries_read_are_there():
    assert callable(Msg.Metadata._get_metadata_fields) and callable(Msg._check_reply)
    assert {Msg.Ack.StreamSeq, Msg.Ack.NumDelivered, Msg.Ack.Timestamp} <= set(range(20))
    msg = Msg(_client=None, subject="s", reply="r", data=b"")   # type: ignore[arg-type]
    assert msg._client is None and msg._ackd is False


def test_from_error_raises_the_kind_store_error_returns():
    for code, kind in ((400, BadRequestError), (503, ServiceUnavailableError), (418, APIError)):
        with pytest.raises(kind):
            APIError.from_error({"code": code, "err_code": 1, "description": "x"})
        assert type(store_error(b'{"error": {"code": %d, "err_code": 1, "description": "x"}}' % code, {})) is kind


async def test_the_pull_subject_is_where_nats_py_sends_its_own_pull(nc, prefix):
    js = nc.jetstream()
    stream, durable = f"{prefix.upper()}_PULL", "puller"
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{prefix}.pull.>"]))
    seen: list[str] = []

    async def on_pull(msg) -> None:
        seen.append(msg.subject)
    sub = await nc.subscribe("$JS.API.CONSUMER.MSG.NEXT.>", cb=on_pull)
    try:
        await js.publish(f"{prefix}.pull.one", b"1")
        puller = await js.pull_subscribe(f"{prefix}.pull.>", durable=durable, stream=stream)
        [msg] = await puller.fetch(1, timeout=5)
        await msg.ack()
        await wait_until(lambda: bool(seen), timeout_s=5)
        assert seen[0] == pull_subject(js, stream, durable)
        assert pull_subject(JetStreamContext(nc, domain="hub"), stream, durable).startswith("$JS.hub.API.")
    finally:
        await sub.unsubscribe()
        await js.delete_stream(stream)


async def test_a_store_sent_by_hand_reads_as_js_publish_reads(nc, prefix):
    """Stored, no stream for the subject, a stream that refuses: store_error says what nats-py's
    js.publish raises (or that it was stored), for the same publish."""
    js = nc.jetstream()
    stream = f"{prefix.upper()}_STORE"
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{prefix}.store.>"], max_msgs=1,
                                     discard=DiscardPolicy.NEW))
    inbox = nc.new_inbox()
    answers: asyncio.Queue = asyncio.Queue()
    sub = await nc.subscribe(inbox, cb=answers.put)

    async def by_hand(subject: str) -> Exception | None:
        nc.send(subject, b"x", reply=inbox)
        msg = await asyncio.wait_for(answers.get(), 5)
        return store_error(msg.data, msg.headers or {})

    async def by_nats_py(subject: str) -> Exception | None:
        try:
            await js.publish(subject, b"x", timeout=5)
        except APIError as exc:
            return exc
        return None

    try:
        assert await by_hand(f"{prefix}.store.a") is None                      # stored
        refused_by_hand, refused = await by_hand(f"{prefix}.store.b"), await by_nats_py(f"{prefix}.store.c")
        assert type(refused_by_hand) is type(refused) and refused_by_hand.err_code == refused.err_code   # full
        assert isinstance(await by_hand(f"{prefix}.nostream.x"), NoStreamResponseError)
        with pytest.raises(NoStreamResponseError):
            await js.publish(f"{prefix}.nostream.y", b"x", timeout=5)
    finally:
        await sub.unsubscribe()
        await js.delete_stream(stream)


async def test_a_delivery_taken_by_hand_is_acknowledged_as_nats_py_acknowledges(nc, prefix):
    js = nc.jetstream()
    stream, durable = f"{prefix.upper()}_ACK", "acker"
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{prefix}.ack.>"]))
    try:
        await js.publish(f"{prefix}.ack.one", b"1")
        puller = await js.pull_subscribe(f"{prefix}.ack.>", durable=durable, stream=stream)
        [pulled] = await puller.fetch(1, timeout=5)
        msg = delivery(nc, pulled.subject, pulled.reply, pulled.data, pulled.headers or {})
        assert msg.metadata.sequence.stream == pulled.metadata.sequence.stream
        ack_now(msg)
        with pytest.raises(Exception):
            ack_now(msg)   # nats-py's: already acknowledged
        await eventually(lambda: js.consumer_info(stream, durable), lambda info: info.ack_floor.stream_seq == 1, 5)
    finally:
        await js.delete_stream(stream)
