"""What reaches a node from outside, validated where it enters: a :class:`~nodes.calls.Call`, or a
:class:`Refusal` saying what was wrong. Nothing here raises on bad input."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from broker import codes
from broker import headers as H
from broker.answers import name_list
from broker.errors import InvalidSubject, InvalidToken
from broker.header_blocks import HeaderBlock
from broker.subjects import TOKEN_RE, Invocation, Subjects
from functions.registry import FunctionRegistry
from nodes.calls import Call
from nodes.scheduler.base import SchedulingRequest

MAX_HOPS = 64                       # a forward chain longer than this is refused
MAX_TIMEOUT_S = 24 * 3600.0
MAX_TEXT = 256                      # tracing ids and scheduler names
PLAUSIBLE_CLOCK_SKEW_S = 3600.0     # a caller's send time further off than this is ignored


@dataclass(frozen=True, slots=True)
class Refusal:
    code: int           # P2PFaaS's catalogue code in the error body (broker/codes.py)
    http_status: int
    reason: str
    kind: str           # metric label: bad_input, unknown_function, too_large, empty_payload, ...


def bad(reason: str, kind: str = "bad_input") -> Refusal:
    return Refusal(codes.INPUT_NOT_VALID, 400, reason, kind)


class Inbound:
    """Turns one node's incoming messages into calls."""

    def __init__(self, subjects: Subjects, node: str, registry: FunctionRegistry, max_payload_bytes: int) -> None:
        self.subjects, self.node, self.registry = subjects, node, registry
        self.max_payload_bytes = max_payload_bytes

    def invocation(self, subject: str) -> Invocation | Refusal:
        try:
            inv = self.subjects.parse_invocation(subject)
        except (InvalidSubject, InvalidToken) as exc:
            return bad(f"malformed subject {subject!r}: {exc}", "malformed_subject")
        if inv.node != self.node:
            return bad(f"{subject!r} is addressed to node {inv.node!r}, not {self.node!r}", "malformed_subject")
        return inv

    def call(self, inv: Invocation, payload: bytes, headers: Mapping[str, str] | None, *, arrival: float,
             reply: str = "") -> Call | Refusal:
        """The call, or why it cannot be one (unknown function, size, empty input, bad header)."""
        spec = self.registry.get(inv.fn)
        if spec is None:
            return Refusal(codes.NOT_FOUND, 404, f"unknown function {inv.fn!r}; this node has: {', '.join(self.registry.names())}",
                           "unknown_function")
        if len(payload) > self.max_payload_bytes:
            return Refusal(codes.INPUT_NOT_VALID, 413, f"payload of {len(payload)} bytes exceeds the limit of {self.max_payload_bytes}",
                           "too_large")
        if not payload and spec.requires_input:
            return bad(f"{inv.fn} needs an input payload; it was empty", "empty_payload")
        h = headers.parsed() if isinstance(headers, HeaderBlock) else headers or {}
        try:
            external = inv.kind == "forward"
            hops = _int(h, H.HOPS, 0, MAX_HOPS) if external else 0
            peers = _peers(h.get(H.PEERS_LIST_ID, "")) if external else ()
            peer_ips = tuple(name_list(h.get(H.PEERS_LIST_IP)))[:len(peers)] if external else ()
            timeout_s = _positive(h, H.TIMEOUT, MAX_TIMEOUT_S)
            deadline_s = _positive(h, H.DEADLINE, MAX_TIMEOUT_S)
            wait_s = _positive(h, H.WAIT, math.inf) if reply else None
            task_type = _number(h, H.TASK_TYPE)
            sent_at = _number(h, H.SENT_AT)
            tracing = _text(h, H.TRACING_ID)
            scheduler = _text(h, H.SCHEDULER_NAME) if external else ""
        except ValueError as exc:
            return bad(str(exc))
        request = SchedulingRequest(
            fn=inv.fn, client=inv.client, request_id=inv.request_id, external=external, hops=hops, peers=peers,
            bypass=H.is_true(h.get(H.BYPASS)), force_forward=H.is_true(h.get(H.FORWARD)),
            force_reject=H.is_true(h.get(H.REJECT)), task_type=task_type,
        )
        transit = arrival - sent_at if sent_at is not None and abs(arrival - sent_at) < PLAUSIBLE_CLOCK_SKEW_S else 0.0
        call = Call(inv=inv, payload=payload, request=request, arrival=arrival, reply=reply,
                    timeout_s=timeout_s or spec.timeout_s, deadline_s=deadline_s, transit_s=max(0.0, transit),
                    scheduler=scheduler, tracing_id=tracing, peer_ips=peer_ips,
                    notices=external and bool(reply) and H.is_true(h.get(H.NOTICES)),
                    wanted_until=arrival + wait_s if wait_s is not None else 0.0)
        return call


def _number(h: Mapping[str, str], name: str) -> float | None:
    raw = h.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"header {name}: {raw[:40]!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"header {name}: {raw[:40]!r} must be a finite number >= 0")
    return value


def _positive(h: Mapping[str, str], name: str, maximum: float) -> float | None:
    value = _number(h, name)
    if value is not None and not 0 < value <= maximum:
        raise ValueError(f"header {name}: {value:g} must be > 0 and <= {maximum:g}")
    return value


def _int(h: Mapping[str, str], name: str, low: int, high: int) -> int:
    raw = h.get(name)
    if raw is None or raw == "":
        return low
    if not raw.strip().isdigit() or not low <= int(raw) <= high:
        raise ValueError(f"header {name}: {raw[:40]!r} is not an integer in {low}..{high}")
    return int(raw)


def _peers(raw: str) -> tuple[str, ...]:
    peers = tuple(name_list(raw))
    if len(peers) > MAX_HOPS or not all(TOKEN_RE.match(p) for p in peers):
        raise ValueError(f"header {H.PEERS_LIST_ID}: {raw[:80]!r} is not a list of at most {MAX_HOPS} node ids")
    return peers


def _text(h: Mapping[str, str], name: str) -> str:
    raw = h.get(name, "")
    if len(raw) > MAX_TEXT or not raw.isprintable():
        raise ValueError(f"header {name}: at most {MAX_TEXT} printable characters")
    return raw
