"""broker/connection.py: the client every component connects with."""

from __future__ import annotations

import asyncio
import random

from nats.aio.client import Client

from broker.connection import NatsClient


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
