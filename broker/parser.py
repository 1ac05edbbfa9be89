"""The NATS protocol parser of :class:`~broker.connection.NatsClient`: nats-py's, with message
lines split instead of matched against its regular expressions (everything else is nats-py's)."""

from __future__ import annotations

from nats.protocol.parser import AWAITING_CONTROL_LINE, AWAITING_MSG_PAYLOAD, MAX_CONTROL_LINE_SIZE, Parser


class MessageParser(Parser):
    """nats-py's protocol parser, with messages (MSG, HMSG: all but a handful of what a busy
    connection reads) split at their spaces instead of matched against its regular expressions
    one after the other; every other line, and anything malformed, goes to nats-py's own. The
    same calls for any stream, however it is cut (tests/broker/test_connection.py)."""

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
