"""What happened to every call of one transport: sent, accepted, answered, refused, and the
counts of the fault tables (definitions in bench/README.md, "Fault suite")."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

LOAD, AFTER = "load", "after"   # phases: under the fault, and after the system recovered
CANNOT_SCHEDULE = 400           # P2PFaaS's code of a call refused for want of a slot
EXAMPLES = 3


@dataclass
class Call:
    phase: str
    sent_at: float = field(default_factory=time.monotonic)
    accepted: bool = False
    refused: str | None = None                               # why it was not accepted
    answers: list[tuple[int, bytes]] = field(default_factory=list)   # (status, payload) as received
    reason: str = ""                                         # of the first answer, when it is an error
    code: int | None = None                                  # ... and its P2PFaaS code
    late: str | None = None                                  # answered only by a look-up at the end

    @property
    def answered(self) -> bool:
        return bool(self.answers)

    @property
    def status(self) -> int | None:
        return self.answers[0][0] if self.answers else None


@dataclass
class Row:
    transport: str
    sent: int
    accepted: int
    answered: int
    errors: int          # answered, but not with status 200
    overload: int        # async: accepted, then refused because the node was busy (never right)
    refused: int
    lost: int
    duplicated: int | None   # None: no dedup on this path (direct calls), shown as "-"
    redelivered: int     # the same answer received again (MQTT QoS 1 / at-least-once), not a duplicate
    after_sent: int
    after_ok: int
    reasons: dict[str, int]
    examples: dict[str, list[str]] = field(default_factory=dict)   # a few lost / duplicated ids, for diagnosis

    @property
    def recovered(self) -> bool:
        return self.after_sent > 0 and self.after_ok == self.after_sent


class Ledger:
    """Calls of one transport by request id; ``direct`` transports have no dedup to check."""

    def __init__(self, transport: str, direct: bool) -> None:
        self.transport, self.direct = transport, direct
        self.calls: dict[str, Call] = {}
        self.stored_duplicates: set[str] = set()   # more than one answer kept in the results stream
        self.unanswered_but_stored: set[str] = set()   # a device never got an answer the system stored

    def sent(self, req: str, phase: str) -> Call:
        call = self.calls[req] = Call(phase)
        return call

    def accepted(self, req: str) -> None:
        if req in self.calls:
            self.calls[req].accepted = True

    def refused(self, req: str, reason: str) -> None:
        call = self.calls.get(req)
        if call is not None and not call.accepted:
            call.refused = reason

    def answered(self, req: str, status: int, payload: bytes, error: bytes = b"") -> None:
        """An answer: its status, the payload as received (what tells two answers apart) and,
        for an error, its ``{code, message}`` body."""
        call = self.calls.get(req)
        if call is None:   # answers to ids we never sent are not ours (another run, another client)
            return
        if not call.answers and status != 200:
            call.reason = _first_line(error or payload)
            call.code = _code(error or payload)
        call.answers.append((status, payload))

    def pending(self) -> list[str]:
        """Async calls still waiting for their answer (accepted or not yet acknowledged)."""
        return [req for req, c in self.calls.items() if not c.answered and c.refused is None]

    def row(self) -> Row:
        reasons: Counter[str] = Counter()
        examples: dict[str, list[str]] = {"lost": [], "duplicated": []}
        accepted = answered = errors = overload = refused = lost = duplicated = redelivered = 0
        after_sent = after_ok = 0
        for req, call in self.calls.items():
            distinct = {payload for _, payload in call.answers}
            accepted += call.accepted or (self.direct and call.answered)
            if call.answered:
                answered += 1
                if call.status != 200:
                    errors += 1
                    overload += not self.direct and call.code == CANNOT_SCHEDULE
                    reasons[f"answer {call.status}: {call.reason}"] += 1
                if call.late:
                    reasons[call.late] += 1
                if call.refused is not None:
                    reasons[f"answered although refused ({call.refused})"] += 1
            elif call.refused is not None:
                refused += 1
                reasons[f"refused: {call.refused}"] += 1
            else:
                lost += 1
                why = "accepted, never answered" if call.accepted else "no answer, no acknowledgement"
                if req in self.unanswered_but_stored:
                    why += " (its answer is in the results stream)"
                reasons[f"lost: {why}"] += 1
                if len(examples["lost"]) < EXAMPLES:
                    examples["lost"].append(req)
            if len(distinct) > 1 or req in self.stored_duplicates:
                duplicated += 1
                if len(examples["duplicated"]) < EXAMPLES:
                    examples["duplicated"].append(
                        f"{req}: " + " | ".join(p[:300].decode(errors="replace") for p in distinct))
            redelivered += len(call.answers) > len(distinct)
            if call.phase == AFTER:
                after_sent += 1
                after_ok += call.status == 200
        return Row(self.transport, len(self.calls), accepted, answered, errors, overload, refused, lost,
                   None if self.direct else duplicated, redelivered, after_sent, after_ok, dict(reasons),
                   {k: v for k, v in examples.items() if v})


def _code(payload: bytes) -> int | None:
    """The ``code`` of an error body (``{code, message}``, or a stored rejection's JSON)."""
    import orjson

    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, int) else None


def _first_line(payload: bytes, limit: int = 70) -> str:
    """A short, stable reason from an answer body: its ``message`` (ids and numbers would split
    one cause into many rows, so digits are folded)."""
    import orjson

    try:
        body = orjson.loads(payload)
        text = str(body.get("message") or body.get("reason") or body) if isinstance(body, dict) else str(body)
    except orjson.JSONDecodeError:
        text = payload[:200].decode(errors="replace")
    text = "".join("#" if ch.isdigit() else ch for ch in text.splitlines()[0] if text) if text else ""
    while "##" in text:
        text = text.replace("##", "#")
    return text[:limit]
