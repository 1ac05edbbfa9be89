"""JetStream deliveries taken in the read loop: a pulled message as nats-py's ``Msg`` (its acks
work as usual), what its reply subject says of it, and an acknowledgement without a coroutine.

A node's async intake takes every call this way: nats-py's path (a ``Msg`` through a queue, its
headers parsed, its metadata as datetimes) cost the node some 15 µs a task (bench/README.md).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.connection import NatsClient

_V1_TOKENS = 9   # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>


class DeliveryInfo(NamedTuple):
    """What a delivery's reply subject says (nats-py's ``Msg.metadata``, the fields a node reads)."""

    stream_seq: int
    num_delivered: int
    timestamp: float   # unix seconds the message was stored


def delivery_info(reply: str) -> DeliveryInfo:
    """The :class:`DeliveryInfo` of a JetStream reply subject (both of nats-server's formats);
    nats-py's NotJSMessageError for a subject that is not one."""
    tokens = Msg.Metadata._get_metadata_fields(reply)
    if len(tokens) == _V1_TOKENS:
        return DeliveryInfo(int(tokens[5]), int(tokens[4]), int(tokens[7]) / 1e9)
    return DeliveryInfo(int(tokens[Msg.Ack.StreamSeq]), int(tokens[Msg.Ack.NumDelivered]),
                        int(tokens[Msg.Ack.Timestamp]) / 1e9)


def delivery(nc: Client, subject: str, reply: str, data: bytes, headers: Mapping[str, str]) -> Msg:
    """A message taken by a lean handler (broker.connection.listen), as nats-py's ``Msg``."""
    return Msg(_client=nc, subject=subject, reply=reply, data=data, headers=headers or None)   # type: ignore[arg-type]


def ack_now(msg: Msg) -> None:
    """``await msg.ack()`` without a coroutine (nats-py's errors: not a JetStream message, already
    acknowledged); the acknowledgement leaves with whatever else this turn of the loop sends."""
    msg._check_reply()
    nc = msg._client
    if not isinstance(nc, NatsClient):
        raise TypeError("ack_now needs a connection made by broker.connection.connect")
    nc.send(msg.reply)
    msg._ackd = True
