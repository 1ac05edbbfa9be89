"""Dead letters: the async tasks a node would not run again (nodes/answering.py); a redrive stores one again
under a new request id ``<id>-r<seq>`` (its old call was answered already), then removes the letter."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from broker import headers as H
from broker.errors import FaasError
from broker.streams import deadletter_stream
from broker.subjects import Subjects, check_node

STORE_TIMEOUT_S = 10.0
REQUEST_ID_MAX = 64


class DeadLetterError(FaasError, ValueError):
    """No such dead letter, or one that cannot be redriven (no intake subject kept)."""


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    node: str              # the node that dead-lettered it
    fn: str
    client: str
    request_id: str
    reason: str
    at: float              # unix time it was dead-lettered (0: unknown)
    subject: str           # its intake subject ("" for a letter older than redrive)
    payload: bytes = field(repr=False)
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def call_key(self) -> str:
        return f"{self.client}.{self.request_id}" if self.client else ""

    def summary(self) -> dict:
        """What `deadletters list --json` prints of it (the payload: its size)."""
        return {"seq": self.seq, "node": self.node, "function": self.fn, "call": self.call_key,
                "reason": self.reason, "at": self.at, "bytes": len(self.payload)}


def _letter(subjects: Subjects, msg) -> DeadLetter:
    headers = dict(msg.headers or {})
    node, fn = msg.subject.split(".")[2:4]   # <prefix>.deadletter.<node>.<fn>
    subject = headers.get(H.DEAD_LETTER_SUBJECT, "")
    client = request_id = ""
    if subject:
        try:
            inv = subjects.parse_invocation(subject)
            client, request_id = inv.client, inv.request_id
        except ValueError:
            subject = ""
    try:
        at = float(headers.get(H.DEAD_LETTER_AT, "0"))
    except ValueError:
        at = 0.0
    return DeadLetter(seq=msg.seq, node=node, fn=fn, client=client, request_id=request_id,
                      reason=headers.get(H.DEAD_LETTER_REASON, ""), at=at, subject=subject,
                      payload=msg.data or b"", headers=headers)


async def dead_letters(js: JetStreamContext, subjects: Subjects, *, node: str | None = None,
                       fn: str | None = None, limit: int = 1000) -> list[DeadLetter]:
    """The oldest ``limit`` dead letters (of ``node``, of ``fn``), oldest first."""
    wanted = f"{subjects.prefix}.deadletter.{check_node(node) if node else '*'}.{fn or '*'}"
    stream, out, seq = deadletter_stream(subjects), [], 1
    while len(out) < limit:
        try:
            msg = await js.get_msg(stream, seq, subject=wanted, next=True)
        except NotFoundError:   # no more (or no stream yet)
            break
        out.append(_letter(subjects, msg))
        seq = msg.seq + 1
    return out


async def dead_letter(js: JetStreamContext, subjects: Subjects, seq: int) -> DeadLetter:
    try:
        return _letter(subjects, await js.get_msg(deadletter_stream(subjects), seq))
    except NotFoundError:
        raise DeadLetterError(f"no dead letter {seq} (redriven or removed already, or never one)") from None


async def redrive(js: JetStreamContext, subjects: Subjects, letter: DeadLetter, *,
                  to_node: str | None = None) -> tuple[str, str]:
    """Store ``letter``'s task again (in ``to_node``'s intake), remove it: (new key, node)."""
    if not letter.subject:
        raise DeadLetterError(f"dead letter {letter.seq} has no intake subject kept (dead-lettered by an "
                              "older node): it cannot be redriven")
    target = subjects.parse_invocation(letter.subject)
    node = check_node(to_node) if to_node else target.node
    suffix = f"-r{letter.seq}"
    new_id = letter.request_id[:REQUEST_ID_MAX - len(suffix)] + suffix
    key = f"{letter.client}.{new_id}"
    headers = {k: v for k, v in letter.headers.items()   # not the dead-letter store's own (Nats-Expected-Stream)
               if k not in (H.DEAD_LETTER_REASON, H.DEAD_LETTER_SUBJECT, H.DEAD_LETTER_AT)
               and not k.lower().startswith("nats-")}
    headers[H.MSG_ID], headers[H.REDRIVEN_FROM], headers[H.SENT_AT] = key, letter.call_key, repr(time.time())
    await js.publish(subjects.async_request(node, letter.fn, letter.client, new_id), letter.payload,
                     headers=headers, timeout=STORE_TIMEOUT_S)
    try:
        await js.delete_msg(deadletter_stream(subjects), letter.seq)
    except NotFoundError:   # removed meanwhile (a redrive racing this one): the task is stored once anyway
        pass
    return key, node
