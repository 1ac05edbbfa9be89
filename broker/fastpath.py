"""Every override of nats-py's internals (the pinned version), in one place: the request path's fast path.
Each gives nats-py's result for any input and has a contract test (tests/broker/test_fastpath.py)."""

from __future__ import annotations

import logging
from typing import Callable, Mapping, NamedTuple

import orjson
from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.client import _SUBJECT_INVALID_RE as _SUBJECT_BAD   # what publish refuses (CRLF would inject commands)
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError
from nats.protocol import command as nats_command
from nats.protocol.parser import AWAITING_CONTROL_LINE, AWAITING_MSG_PAYLOAD, MAX_CONTROL_LINE_SIZE, Parser

from broker import headers as H
from broker.header_blocks import encode_headers as _encode_headers
from broker.header_blocks import parse_header_lines

log = logging.getLogger(__name__)

LeanHandler = Callable[[str, str, bytes, bytes], None]   # (subject, reply, data, header block)


class NatsClient(Client):
    """nats-py's client made for the request path: lean subscriptions, :meth:`send`, faster header blocks
    and message lines (tests/broker/test_connection.py compares them with nats-py's on random inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self._lean: dict[int, LeanHandler] = {}   # sid -> handler (subscribe_lean)
        self._ps = MessageParser(self)

    async def subscribe_lean(self, subject: str, handler: LeanHandler, queue: str = "") -> Subscription:
        """Messages go straight to ``handler(subject, reply, data, raw header block or b"")`` from the read
        loop (no Msg, queue or task): it must not block or await; what it raises is logged."""
        sub = await self.subscribe(subject, queue=queue, cb=_never_called)
        self._lean[sub._id] = handler
        return sub

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:
        handler = self._lean.get(sid)
        if handler is None:
            return await super()._process_msg(sid, subject, reply, data, headers)
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        try:
            handler(subject.decode(), reply.decode(), data, headers or b"")
        except Exception:  # one bad message must not stop the connection's reader
            log.exception("handling a message on %s", subject.decode(errors="replace"))

    def _remove_sub(self, sid: int, max_msgs: int = 0) -> None:
        self._lean.pop(sid, None)
        super()._remove_sub(sid, max_msgs)

    async def _send_publish(self, subject: str, reply: str, payload: bytes, payload_size: int,
                            headers: dict | None) -> None:
        if not headers:
            return await super()._send_publish(subject, reply, payload, payload_size, headers)
        if subject == "":
            raise nats_errors.BadSubjectError
        command = nats_command.hpub_cmd(subject, reply, _encode_headers(headers), payload)
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += payload_size
        await self._send_command(command)
        if self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()

    async def _flush_pending(self, force_flush: bool = False):
        """Wake the flusher with a token already done, not nats-py's Future and ``Queue.put`` per publish
        that nobody waits for unless ``force_flush``; every other case is nats-py's own."""
        queue, flusher = self._flush_queue, self._flusher_task
        if (force_flush or queue is None or queue.full() or flusher is None or flusher.done()
                or not self.is_connected):
            return await super()._flush_pending(force_flush)
        queue.put_nowait(_NOBODY_WAITS)   # type: ignore[arg-type]

    def send(self, subject: str, payload: bytes = b"", *, reply: str = "", headers: bytes = b"") -> None:
        """``publish`` without a coroutine (nats-py's checks and errors), ``headers`` a block already
        rendered. Unlike ``publish`` it never waits for a full outbound buffer to drain: what it
        sends is bounded by the calls in flight (K)."""
        if not subject or _SUBJECT_BAD.search(subject) or (reply and _SUBJECT_BAD.search(reply)):
            raise nats_errors.BadSubjectError
        if self.is_closed:
            raise nats_errors.ConnectionClosedError
        if self.is_draining_pubs:
            raise nats_errors.ConnectionDrainingError
        size = len(payload) + len(headers)
        if not self.is_connected and (self._max_pending_size <= 0
                                      or size + self._pending_data_size > self._max_pending_size):
            raise nats_errors.OutboundBufferLimitError
        if size > self._max_payload:   # nats-server counts the headers too, and closes a connection that sends more
            raise nats_errors.MaxPayloadError
        if headers:
            command = b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), reply.encode(), len(headers), size, headers, payload)
        else:
            command = b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), size, payload)
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += len(payload)
        self._pending.append(command)
        self._pending_data_size += len(command)
        queue = self._flush_queue
        if queue is not None and queue.empty() and self.is_connected:   # else the reconnect sends it
            queue.put_nowait(_NOBODY_WAITS)   # type: ignore[arg-type]

    _parse_header_lines = staticmethod(parse_header_lines)


async def _never_called(msg: Msg) -> None:   # a lean subscription's messages never reach its queue
    raise AssertionError("a lean subscription's message took nats-py's path")


class _NobodyWaits:
    """What the flusher is handed for a flush no one waits for: it only asks whether it is done."""

    @staticmethod
    def done() -> bool:
        return True


_NOBODY_WAITS = _NobodyWaits()


class MessageParser(Parser):
    """nats-py's protocol parser, with MSG and HMSG lines split at their spaces instead of matched
    against its regular expressions; every other line, and anything malformed, goes to nats-py's own."""

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        buf.extend(data)
        while buf:
            if self.state == AWAITING_MSG_PAYLOAD:
                if len(buf) < self.needed + 2:
                    return
                arg = self.msg_arg
                await self._deliver(arg["subject"], arg["sid"], arg["reply"])
                continue
            head = buf[:5]
            if head[:4] != b"MSG " and head != b"HMSG ":
                return await super().parse()   # PING, PONG, INFO, +OK, -ERR: nats-py's way
            end = buf.find(b"\r\n")
            if end < 0:
                if len(buf) > MAX_CONTROL_LINE_SIZE:
                    return await super().parse()   # nats-py says what is wrong with it
                return
            args = bytes(buf[:end]).split()
            with_headers = args[0] == b"HMSG"
            if len(args) not in ((5, 6) if with_headers else (4, 5)) or not all(a.isdigit() for a in args[-2 if with_headers else -1:]) \
                    or not args[2].isdigit():
                return await super().parse()   # malformed: nats-py raises its ProtocolError
            subject, sid = args[1], int(args[2])
            reply = args[3] if len(args) == (6 if with_headers else 5) else b""
            self.needed = int(args[-1])
            self.header_needed = int(args[-2]) if with_headers else 0
            del buf[:end + 2]
            self.state = AWAITING_MSG_PAYLOAD
            if len(buf) >= self.needed + 2:
                await self._deliver(subject, sid, reply)
            else:
                self.msg_arg["subject"], self.msg_arg["sid"], self.msg_arg["reply"] = subject, sid, reply

    async def _deliver(self, subject: bytes, sid: int, reply: bytes) -> None:
        buf, needed, header_needed = self.buf, self.needed, self.header_needed
        if header_needed > 0:
            hdr: bytes | None = bytes(buf[:header_needed])
            payload = bytes(buf[header_needed:needed])
            self.header_needed = 0
        else:
            hdr, payload = None, bytes(buf[:needed])
        del buf[:needed + 2]
        self.state = AWAITING_CONTROL_LINE
        await self.nc._process_msg(sid, subject, reply, payload, hdr)


_V1_TOKENS = 9   # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>


class DeliveryInfo(NamedTuple):
    """What a delivery's reply subject says (nats-py's ``Msg.metadata``, the fields a node reads)."""

    stream_seq: int
    num_delivered: int
    timestamp: float   # unix seconds the message was stored


def delivery_info(reply: str) -> DeliveryInfo:
    """The :class:`DeliveryInfo` of a JetStream reply subject (either format), as nats-py reads it."""
    tokens = Msg.Metadata._get_metadata_fields(reply)
    if len(tokens) == _V1_TOKENS:
        return DeliveryInfo(int(tokens[5]), int(tokens[4]), int(tokens[7]) / 1e9)
    return DeliveryInfo(int(tokens[Msg.Ack.StreamSeq]), int(tokens[Msg.Ack.NumDelivered]),
                        int(tokens[Msg.Ack.Timestamp]) / 1e9)


def delivery(nc: Client, subject: str, reply: str, data: bytes, headers: Mapping[str, str]) -> Msg:
    """A message taken by a lean handler (broker.connection.listen), as nats-py's ``Msg``."""
    return Msg(_client=nc, subject=subject, reply=reply, data=data, headers=headers or None)   # type: ignore[arg-type]


def ack_now(msg: Msg) -> None:
    """``await msg.ack()`` without a coroutine (with nats-py's errors), sent with this turn's writes."""
    msg._check_reply()
    nc = msg._client
    if not isinstance(nc, NatsClient):
        raise TypeError("ack_now needs a connection made by broker.connection.connect")
    nc.send(msg.reply)
    msg._ackd = True


def pull_subject(js: JetStreamContext, stream: str, durable: str) -> str:
    """The subject a pull request for ``durable`` of ``stream`` goes to, under the API prefix."""
    return f"{js._prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"


def store_error(data: bytes, headers: Mapping[str, str]) -> Exception | None:
    """A JetStream publish acknowledgement as nats-py's ``js.publish`` would raise it (None: stored, or a
    duplicate stored before), for a store sent with :meth:`NatsClient.send` to a reply subject of ours."""
    if not data:
        if headers.get(H.NATS_STATUS) == "503":
            return NoStreamResponseError()   # no stream takes this subject, or JetStream is away
        return APIError(description=f"empty JetStream acknowledgement ({dict(headers)})")
    try:
        reply = orjson.loads(data)
    except orjson.JSONDecodeError:
        return APIError(description=f"unreadable JetStream acknowledgement: {data[:80]!r}")
    if not isinstance(reply, dict):
        return APIError(description=f"unreadable JetStream acknowledgement: {data[:80]!r}")
    if "error" in reply:
        try:
            APIError.from_error(reply["error"])   # raises the kind nats-py raises for that code
        except APIError as exc:
            return exc
    if "seq" not in reply:
        return APIError(description=f"JetStream acknowledgement without a sequence: {data[:80]!r}")
    return None
