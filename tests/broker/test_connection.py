"""broker/connection.py: the client every component connects with."""

from __future__ import annotations

import asyncio
import random

import pytest
from nats import errors as nats_errors
from nats.aio.client import Client

from broker.fastpath import NatsClient
from support import wait_until


def _blocks(seed: int, count: int, alphabet: list[bytes]) -> list[bytes]:
    rnd = random.Random(seed)
    return [b"".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40))) for _ in range(count)]


def test_header_reader_gives_what_nats_py_gives():
    """The faster reader is a drop-in: same dict as nats-py's for any block, including names with
    whitespace inside (dropped), empty names, missing colons, control characters and non-ASCII."""
    tricky = [b"a", b"B", b"-", b"1", b":", b" ", b"\t", b"\r\n", b"\r", b"\n", b"\x0b", b"\x0c", b"\x1c", b"\x1f"]
    ascii_blocks = _blocks(1, 40_000, tricky)
    mixed_blocks = _blocks(2, 20_000, [*tricky, b"\xc3\xa9", b"\xff", b"\x85"])
    for block in ascii_blocks + mixed_blocks:
        assert NatsClient._parse_header_lines(block) == Client._parse_header_lines(block), block
    assert any(NatsClient._parse_header_lines(b) for b in ascii_blocks)   # the corpus does hold headers


async def test_headers_survive_the_wire(nc, prefix):
    """End to end through nats-server: what is published is what the subscriber reads (a
    non-ASCII value takes nats-py's own reader)."""
    assert isinstance(nc, NatsClient)
    got: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on_msg(msg) -> None:
        if not got.done():
            got.set_result(msg.headers)

    subject = f"{prefix}.headers.check"
    sub = await nc.subscribe(subject, cb=on_msg)
    sent = {"X-P2pfaas-Status": "200", "X-P2pfaas-Timing-Total-Seconds-List": "[0.000466]",
            "X-P2pfaas-Scheduler": "NoScheduler(false)", "X-Note": "cr\u00e8me br\u00fbl\u00e9e", "Empty": ""}
    await nc.publish(subject, b"x", headers=sent)
    try:
        assert await asyncio.wait_for(got, 5) == sent
    finally:
        await sub.unsubscribe()


async def _written(client: Client, headers: dict) -> bytes | type[Exception]:
    """The command ``client`` would write for one publish with ``headers`` (or the error it raises)."""
    sent: list[bytes] = []

    async def capture(command: bytes, priority: bool = False) -> None:
        sent.append(command)

    client._send_command = capture      # type: ignore[method-assign]
    client._flush_queue = None          # not connected: nothing to kick
    try:
        await client._send_publish("a.b", "_INBOX.x", b"payload", 7, headers)
    except nats_errors.BadHeaderError as exc:
        return type(exc)
    return sent[0]


async def test_header_writer_gives_what_nats_py_gives():
    """Every publish with headers writes the bytes nats-py would, and refuses the names it refuses."""
    rnd = random.Random(4)
    names = ["X-P2pfaas-Status", "Nats-Msg-Id", " Padded ", "", "   ", "bad name", "bad:name", "Caf\u00e9", "ok_~!#"]
    values = ["200", "", " spaced ", "a\r\nInjected: yes", "\n", "cr\u00e8me", "[0.000466]", "\t"]
    ours, theirs = NatsClient(), Client()
    for _ in range(3000):
        headers = {rnd.choice(names): rnd.choice(values) for _ in range(rnd.randint(0, 6))}
        for _ in range(2):   # the second time the names come from the writer's memory
            assert await _written(ours, headers) == await _written(theirs, headers), headers
    assert await _written(ours, {"bad name": "x"}) is nats_errors.BadHeaderError


@pytest.mark.parametrize("headers", [None, {}])
async def test_publish_without_headers_is_nats_pys(headers):
    assert await _written(NatsClient(), headers) == await _written(Client(), headers)


async def test_publishes_are_flushed_without_a_future_each(nc, prefix):
    """A burst of publishes, with and without headers, all reach a subscriber without a forced
    flush; the flusher is handed tokens that are already done, never a Future per publish; a
    forced flush (nats-py's PING/PONG) still works."""
    assert isinstance(nc, NatsClient)
    n, got = 2_000, []
    done = asyncio.Event()

    async def on_msg(msg) -> None:
        got.append(msg.data)
        if len(got) == n:
            done.set()

    subject = f"{prefix}.flush.check"
    sub = await nc.subscribe(subject, cb=on_msg)
    await nc.flush()
    queue = nc._flush_queue
    assert queue is not None
    kicks: list[object] = []
    put = queue.put_nowait

    def spy(item) -> None:
        kicks.append(item)
        put(item)

    queue.put_nowait = spy   # type: ignore[method-assign]
    try:
        for i in range(n):
            await nc.publish(subject, str(i).encode(), headers={"X-N": str(i)} if i % 2 else None)
            if i % 500 == 0:
                await asyncio.sleep(0)   # let the flusher run: later publishes kick it again
        await asyncio.wait_for(done.wait(), 10)
    finally:
        del queue.put_nowait
        await sub.unsubscribe()
    assert got == [str(i).encode() for i in range(n)]
    assert kicks and not any(isinstance(k, asyncio.Future) for k in kicks)
    await asyncio.wait_for(nc.flush(), 5)


async def test_close_quietly_returns_when_the_broker_went_away_meanwhile(tmp_path):
    """``p2pfaas farm run`` ended with a ConnectionResetError traceback when the stack stopped under
    it: closing a connection whose broker is gone (reconnecting, its socket reset) is not an error."""
    from broker.connection import close_quietly, connect
    from broker.embedded import NatsServer

    server = NatsServer(data_dir=tmp_path / "nats", port=None, mqtt_port=0)
    await server.start()
    try:
        conn = await connect(server.url, "goes-away")
        sub = await conn.subscribe("anything")
        await conn.publish("anything", b"x")   # something pending as the broker goes
    finally:
        await server.stop()
    await wait_until(lambda: not conn.is_connected, timeout_s=10)
    await asyncio.wait_for(close_quietly(conn, sub), 10)
    assert conn.is_closed


async def test_send_writes_what_publish_writes_and_refuses_what_it_refuses():
    """``send`` (no coroutine, a block already rendered) writes the command ``publish`` would, and
    refuses a subject with whitespace, a closed connection and a message over the broker's limit
    (headers counted, as nats-server counts them)."""
    from broker.fastpath import _encode_headers

    headers = {"X-P2pfaas-Status": "200", "X-Note": "a\r\nb"}
    ours = NatsClient()
    ours._status, ours._flush_queue, ours._max_payload = Client.CONNECTED, None, 64   # no flusher to kick
    for hdrs in (headers, None):
        ours._pending = []
        ours.send("a.b", b"payload", reply="_INBOX.x", headers=_encode_headers(hdrs) if hdrs else b"")
        assert ours._pending == [await _written(Client(), hdrs)]
    for subject, reply in (("a b", ""), ("a.b\r\nPUB x 1", ""), ("", ""), ("a.b", "in box")):
        with pytest.raises(nats_errors.BadSubjectError):
            ours.send(subject, b"x", reply=reply)
    with pytest.raises(nats_errors.MaxPayloadError):
        ours.send("a.b", b"x" * 40, headers=b"H" * 30)
    ours._status = Client.CLOSED
    with pytest.raises(nats_errors.ConnectionClosedError):
        ours.send("a.b", b"x")


async def test_sent_messages_reach_a_subscriber_in_order(nc, prefix):
    """Through nats-server: a burst of ``send``s, with and without a header block, arrive in order,
    headers intact, without a forced flush."""
    from broker.connection import header_block, header_text

    subject, got, done = f"{prefix}.send.check", [], asyncio.Event()

    async def on_msg(msg) -> None:
        got.append((msg.data, msg.headers))
        if len(got) == 500:
            done.set()

    sub = await nc.subscribe(subject, cb=on_msg)
    await nc.flush()
    try:
        for i in range(500):
            block = header_block(header_text({"X-N": str(i)}).encode()) if i % 2 else b""
            nc.send(subject, str(i).encode(), headers=block)
        await asyncio.wait_for(done.wait(), 10)
    finally:
        await sub.unsubscribe()
    assert got == [(str(i).encode(), {"X-N": str(i)} if i % 2 else None) for i in range(500)]


async def test_header_blocks_read_in_the_read_loop_give_what_nats_py_gives():
    """``parse_header_block`` (no coroutine) is nats-py's ``_process_headers`` for any block, inline
    status lines included; ``HeaderBlock.get`` finds one header in the bytes exactly as the whole
    parse would, whatever the block holds (repeated names, spaces, non-ASCII, a description)."""
    from broker.header_blocks import HeaderBlock, parse_header_block

    rnd = random.Random(9)
    client = Client()
    starts = [b"NATS/1.0\r\n", b"NATS/1.0 503\r\n", b"NATS/1.0 100 Idle Heartbeat\r\n", b"NATS/1.0 404 No Messages\r\n",
              b"NATS/1.0 xx\r\n"]
    names = [b"X-P2pfaas-Status", b"Status", b"X-P2pfaas-Status-More", b" X-P2pfaas-Status", b"X-P2pfaas-Status ",
             b"Nats-Msg-Id", b"Description"]
    values = [b"200", b" 503 ", b"", b"caf\xc3\xa9", b"X-P2pfaas-Status: 1", b"a:b"]
    names_asked = ["X-P2pfaas-Status", "Status", "Description", "Nats-Msg-Id", "Missing"]
    for _ in range(20_000):
        lines = b"".join(rnd.choice(names) + b":" + rnd.choice(values) + b"\r\n" for _ in range(rnd.randint(0, 5)))
        block = rnd.choice(starts) + lines + b"\r\n"
        expected = await client._process_headers(block)
        assert parse_header_block(block) == expected, block
        for name in names_asked:
            assert HeaderBlock(block).get(name) == (expected or {}).get(name), (block, name)
        assert dict(HeaderBlock(block)) == (expected or {})


async def test_a_lean_subscription_gets_every_message_in_order_and_survives_a_bad_one(nc, prefix):
    """Messages of a lean subscription reach its handler as they are read, in order, with their raw
    header block; one that makes the handler raise is logged and the next still comes; after
    unsubscribe nothing more does."""
    from broker.header_blocks import HeaderBlock

    subject, got = f"{prefix}.lean.check", []

    def handler(subj: str, reply: str, data: bytes, block: bytes) -> None:
        if data == b"13":
            raise RuntimeError("a handler's bug")
        got.append((subj, reply, data, dict(HeaderBlock(block)) if block else None))

    sub = await nc.subscribe_lean(subject, handler)
    for i in range(200):
        await nc.publish(subject, str(i).encode(), reply="r.x" if i % 3 else "", headers={"X-N": str(i)} if i % 2 else None)
    await wait_until(lambda: len(got) == 199, timeout_s=10)
    assert got == [(subject, "r.x" if i % 3 else "", str(i).encode(), {"X-N": str(i)} if i % 2 else None)
                   for i in range(200) if i != 13]
    await sub.unsubscribe()
    await nc.publish(subject, b"late")
    await nc.flush()
    assert sub._id not in nc._lean and len(got) == 199


async def test_the_message_parser_makes_the_calls_nats_pys_makes_however_the_stream_is_cut():
    """MSG and HMSG (with and without reply, empty payloads, headers only), PING, PONG, +OK, INFO
    and -ERR in one stream, cut at random places: the same calls, in the same order, as nats-py's
    parser; a malformed message line is refused as nats-py refuses it."""
    from nats.errors import ProtocolError
    from nats.protocol.parser import Parser

    from broker.fastpath import MessageParser

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        async def _process_msg(self, *args) -> None:
            self.calls.append(("msg", *args))

        async def _process_ping(self) -> None:
            self.calls.append(("ping",))

        async def _process_pong(self) -> None:
            self.calls.append(("pong",))

        async def _process_info(self, info) -> None:
            self.calls.append(("info", info))

        async def _process_err(self, err) -> None:
            self.calls.append(("err", err))

    rnd = random.Random(6)

    def op() -> bytes:
        kind = rnd.choice(["msg", "hmsg", "hmsg", "ping", "pong", "ok", "info", "err"])
        subject = rnd.choice([b"a.b", b"faas.n1.request.echo.c.r1", b"_INBOX.x.1"])
        reply = rnd.choice([b"", b"_INBOX.y.2"])
        payload = rnd.choice([b"", b"hello", b"MSG a 1 5\r\n", bytes(rnd.randrange(256) for _ in range(40))])
        sep = rnd.choice([b" ", b"  ", b"\t"])
        if kind == "msg":
            return sep.join([b"MSG", subject, b"7", *([reply] if reply else []), str(len(payload)).encode()]) + b"\r\n" + payload + b"\r\n"
        if kind == "hmsg":
            hdr = rnd.choice([b"NATS/1.0\r\nA: b\r\n\r\n", b"NATS/1.0 503\r\n\r\n"])
            return sep.join([b"HMSG", subject, b"9", *([reply] if reply else []), str(len(hdr)).encode(),
                             str(len(hdr) + len(payload)).encode()]) + b"\r\n" + hdr + payload + b"\r\n"
        return {"ping": b"PING\r\n", "pong": b"PONG\r\n", "ok": b"+OK\r\n", "info": b'INFO {"a":1}\r\n',
                "err": b"-ERR 'Slow Consumer'\r\n"}[kind]

    for _ in range(300):
        stream = b"".join(op() for _ in range(rnd.randint(1, 25)))
        cuts = sorted(rnd.sample(range(1, len(stream)), min(len(stream) - 1, rnd.randint(0, 8))))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
        ours, theirs = Recorder(), Recorder()
        our_parser, their_parser = MessageParser(ours), Parser(theirs)
        for chunk in chunks:
            await our_parser.parse(chunk)
            await their_parser.parse(chunk)
        assert ours.calls == theirs.calls, stream
        assert not our_parser.buf and not their_parser.buf
    for bad in (b"MSG a.b x 5\r\nhello\r\n", b"HMSG a.b 1 z 9\r\nNATS/1.0\r\n\r\n"):
        with pytest.raises(ProtocolError):
            await MessageParser(Recorder()).parse(bad)
        with pytest.raises(ProtocolError):
            await Parser(Recorder()).parse(bad)
