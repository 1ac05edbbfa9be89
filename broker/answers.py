"""Answers as callers see them: an HTTP-like status, the P2PFaaS headers and a body (errors: ``{code,
message}``); a direct reply has this shape, a stored async answer is rendered into it."""

from __future__ import annotations

import base64
import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import orjson

from broker import codes
from broker import headers as H
from broker.codec import decode
from broker.header_blocks import header_block
from broker.errors import ContractError
from broker.messages import DirectAnswer, ErrorBody, HopTiming, LearningDecision, Rejection, Result, Timings

VERSION = "0.1.0"
SCHEDULER_NAME = "p2pfaas-scheduler"   # GET / of the scheduler API, as P2PFaaS names its service


def seconds_text(value: float) -> str:
    """Seconds as a timing header writes them (6 decimals, shortest form)."""
    return repr(round(value, 6))


def answer_headers(*, status: int, scheduler: str, executed_by: str, hops: Sequence[HopTiming],
                   execution_s: float, queueing_s: float, transit_s: float = 0.0, forwards: int = 0,
                   peers: Sequence[str] = (), peer_ips: Sequence[str] = (), learning: LearningDecision | None = None,
                   retry_after_s: float | None = None, cold_start_s: float = 0.0) -> dict[str, str]:
    """P2PFaaS's response headers of an answer; ``hops``: one entry per node, origin first."""
    out = {H.STATUS: str(status), H.TIMING_TOTAL: orjson.dumps([round(h.total_s, 6) for h in hops]).decode(),
           H.TIMING_EXECUTION: seconds_text(execution_s)}
    out.update(context_headers(scheduler=scheduler, executed_by=executed_by, scheduling=[h.scheduling_s for h in hops],
                               probing=[h.probing_s for h in hops], queueing_s=queueing_s, transit_s=transit_s,
                               forwards=forwards, peers=peers, peer_ips=peer_ips, learning=learning,
                               retry_after_s=retry_after_s, cold_start_s=cold_start_s))
    return out


def context_headers(*, scheduler: str, executed_by: str, scheduling: Sequence[float], probing: Sequence[float],
                    queueing_s: float, transit_s: float = 0.0, forwards: int = 0, peers: Sequence[str] = (),
                    peer_ips: Sequence[str] = (), learning: LearningDecision | None = None,
                    retry_after_s: float | None = None, cold_start_s: float = 0.0) -> dict[str, str]:
    """The headers of :func:`answer_headers` known before the function runs (for the answering worker)."""
    out = {H.VERSION: VERSION, H.SCHEDULER: scheduler,
           H.TIMING_SCHEDULING: orjson.dumps([round(s, 6) for s in scheduling]).decode(),
           H.TIMING_QUEUEING: seconds_text(queueing_s)}
    if forwards or any(p > 0 for p in probing):
        out[H.TIMING_PROBING] = orjson.dumps([round(p, 6) for p in probing]).decode()
    if transit_s:
        out[H.TIMING_TRANSIT] = seconds_text(transit_s)
    if cold_start_s:
        out[H.COLD_START] = seconds_text(cold_start_s)
    if executed_by:
        out[H.EXECUTED_BY] = executed_by
    if forwards:
        ips = [*peer_ips, *[""] * (len(peers) - len(peer_ips))][:len(peers)]
        out.update({H.EXTERNALLY_EXECUTED: "True", H.HOPS: str(forwards), H.PEERS_LIST_ID: orjson.dumps(list(peers)).decode(),
                    H.PEERS_LIST_IP: orjson.dumps(ips).decode()})
    if learning is not None:
        out.update(learning.headers())
    if retry_after_s is not None:
        out[H.RETRY_AFTER] = str(max(1, round(retry_after_s)))
    return out


_TOTAL_LINE = f"{H.TIMING_TOTAL}: ".encode()
_EXECUTION_LINE = f"\r\n{H.TIMING_EXECUTION}: ".encode()


def direct_block(ctx: DirectAnswer, status: int, execution_s: float) -> bytes:
    """A direct answer's header block: ``ctx.headers`` plus status and times, in one pass."""
    total = orjson.dumps([round(max(0.0, time.time() - ctx.arrival), 6)])
    return header_block(b"%s: %d\r\n%s%s%s%s%s\r\n" % (_STATUS_NAME, status, ctx.headers.encode(), _TOTAL_LINE, total,
                                                       _EXECUTION_LINE, seconds_text(execution_s).encode()))


_STATUS_NAME = H.STATUS.encode()


def render_direct(ctx: DirectAnswer, status: int, output: bytes, error: str | None,
                  execution_s: float) -> tuple[bytes, bytes]:
    """(body, header block) of a direct call's answer, the same whether its worker or its node sends it."""
    body = output if status == 200 else error_body(codes.for_status(status), error or "function failed")
    return body, direct_block(ctx, status, execution_s)


def error_body(code: int, message: str) -> bytes:
    return orjson.dumps({"code": code, "message": message})


def name_list(text: str | None) -> list[str]:
    """A peers list header: a JSON array (P2PFaaS) or, as older p2pfaas nodes sent it, a comma list."""
    if not text:
        return []
    if text.lstrip().startswith("["):
        try:
            values = orjson.loads(text)
        except orjson.JSONDecodeError:
            return []
        return [str(v) for v in values] if isinstance(values, list) else []
    return [p.strip() for p in text.split(",") if p.strip()]


def _float_list(text: str | None) -> list[float]:
    try:
        values = orjson.loads(text) if text else []
        return [_finite(float(v)) for v in values] if isinstance(values, list) else []
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return []


def _float(text: str | None) -> float:
    """A timing header's seconds; 0 for what is not a finite number (not a reason to lose the answer)."""
    try:
        return _finite(float(text)) if text else 0.0
    except (TypeError, ValueError):
        return 0.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def status_of(text: str | None, default: int = 200) -> int:
    """An answer's ``X-P2pfaas-Status`` as an HTTP status: 500 for what is not one (not 100-599)."""
    if text is None:
        return default
    text = str(text)
    return int(text) if text.isascii() and text.isdigit() and 100 <= int(text) <= 599 else 500


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer: ``status``, ``headers`` (P2PFaaS's) and ``body`` (the output, or ``{code, message}``)."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def output(self) -> bytes:
        return self.body if self.status == 200 else b""

    @property
    def error(self) -> ErrorBody | None:
        """The ``{code, message}`` of a failed call (None on success or an unreadable body)."""
        if self.status == 200:
            return None
        try:
            return decode(ErrorBody, self.body)
        except ContractError:
            return ErrorBody(code=self.status, message=self.body[:200].decode(errors="replace"))

    @property
    def code(self) -> int:
        """P2PFaaS's code: the status on success, the error body's code otherwise."""
        err = self.error
        return err.code if err is not None else self.status

    @property
    def message(self) -> str:
        err = self.error
        return err.message if err is not None else ""

    @property
    def executed_by(self) -> str:
        return self.headers.get(H.EXECUTED_BY, "")

    @property
    def scheduler(self) -> str:
        return self.headers.get(H.SCHEDULER, "")

    @property
    def hops(self) -> int:
        value = self.headers.get(H.HOPS, "0")
        return int(value) if value.isdigit() else 0

    @property
    def peers(self) -> list[str]:
        return name_list(self.headers.get(H.PEERS_LIST_ID))

    @property
    def peer_ips(self) -> list[str]:
        return name_list(self.headers.get(H.PEERS_LIST_IP))

    @property
    def rejected(self) -> bool:
        """The call was refused and never ran (rejected by an algorithm, or bad input)."""
        return H.REJECTED_BY in self.headers

    @property
    def externally_executed(self) -> bool:
        return H.is_true(self.headers.get(H.EXTERNALLY_EXECUTED))

    @property
    def retry_after_s(self) -> float | None:
        value = self.headers.get(H.RETRY_AFTER)
        return float(value) if value and value.isdigit() else None

    @property
    def learning(self) -> LearningDecision | None:
        return LearningDecision.from_headers(dict(self.headers))

    @property
    def hop_timings(self) -> list[HopTiming]:
        """One entry per node, origin first (node names from the peers list when forwarded)."""
        totals = _float_list(self.headers.get(H.TIMING_TOTAL))
        scheduling = _float_list(self.headers.get(H.TIMING_SCHEDULING))
        probing = _float_list(self.headers.get(H.TIMING_PROBING))
        names = self.peers or [self.executed_by]
        return [HopTiming(node=names[i] if i < len(names) else "", total_s=t,
                          scheduling_s=scheduling[i] if i < len(scheduling) else 0.0,
                          probing_s=probing[i] if i < len(probing) else 0.0) for i, t in enumerate(totals)]

    @property
    def timings(self) -> Timings:
        """This answer's timings: the origin's total and scheduling, the executor's execution."""
        hops = self.hop_timings
        return Timings(
            scheduling_s=hops[0].scheduling_s if hops else 0.0,
            total_s=hops[0].total_s if hops else 0.0,
            execution_s=_float(self.headers.get(H.TIMING_EXECUTION)),
            queueing_s=_float(self.headers.get(H.TIMING_QUEUEING)),
            transit_s=_float(self.headers.get(H.TIMING_TRANSIT)),
            cold_start_s=_float(self.headers.get(H.COLD_START)),
        )

    # -- async answers -------------------------------------------------------------
    @classmethod
    def of_result(cls, result: Result) -> "Answer":
        headers = _ResultHeaders(result)
        if result.status != 200:
            return cls(result.status, error_body(codes.for_status(result.status), result.error or "function failed"), headers)
        if result.output_b64 is not None:
            return cls(200, base64.b64decode(result.output_b64), headers)
        return cls(200, (result.output or "").encode(), headers)

    @classmethod
    def of_rejection(cls, rejection: Rejection) -> "Answer":
        headers = {H.STATUS: str(rejection.http_status), H.VERSION: VERSION, H.SCHEDULER: rejection.scheduler,
                   H.REJECTED_BY: rejection.node}
        if rejection.retry_after_s is not None:
            headers[H.RETRY_AFTER] = str(max(1, round(rejection.retry_after_s)))
        if rejection.learning is not None:
            headers.update(rejection.learning.headers())
        return cls(rejection.http_status, error_body(rejection.code, rejection.reason), headers)

    @classmethod
    def of_stored(cls, kind: str, data: bytes) -> "Answer":
        """An answer read from ``<prefix>.result|reject.<client>.<req>``; ContractError if garbled."""
        if kind == "result":
            return cls.of_result(decode(Result, data))
        return cls.of_rejection(decode(Rejection, data))


class _ResultHeaders(Mapping[str, str]):
    """The P2PFaaS headers of a stored result, rendered when first read (most callers want only the output)."""

    __slots__ = ("_result", "_headers")

    def __init__(self, result: Result) -> None:
        self._result: Result = result
        self._headers: dict[str, str] | None = None

    def _rendered(self) -> dict[str, str]:
        if self._headers is None:
            r = self._result
            self._headers = answer_headers(
                status=r.status, scheduler=r.scheduler, executed_by=r.executed_by,
                hops=r.hop_timings or [HopTiming(node=r.executed_by, total_s=r.timings.total_s,
                                                 scheduling_s=r.timings.scheduling_s)],
                execution_s=r.timings.execution_s, queueing_s=r.timings.queueing_s, transit_s=r.timings.transit_s,
                forwards=r.hops, peers=r.peers, peer_ips=r.peer_ips, learning=r.learning,
                cold_start_s=r.timings.cold_start_s)
        return self._headers

    def __getitem__(self, name: str) -> str:
        return self._rendered()[name]

    def __iter__(self):
        return iter(self._rendered())

    def __len__(self) -> int:
        return len(self._rendered())

    def __repr__(self) -> str:
        return repr(self._rendered())


HEADER_ROOM = 64 * 1024   # of a broker's max_payload, kept for the headers a message gets on its way


def input_limit(max_payload: int, configured: int | None = None) -> int:
    """Largest input on a broker taking ``max_payload`` bytes, leaving room for the headers."""
    limit = max(0, max_payload - HEADER_ROOM)
    return limit if configured is None else min(configured, limit)


def output_limit(max_payload: int) -> int:
    """Largest output an answer may carry: room for the headers and a stored answer's base64."""
    return max(0, (max_payload - HEADER_ROOM) * 3 // 4)
