"""What a worker keeps of the calls that ended: this turn's, and those sent, for a node that asks again."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from broker.messages import DirectAnswer, WorkerOutcome
from functions.spec import FunctionInputError

SENT_KEPT = 4096        # outcomes remembered for a node that asks again after a broker outage,
SENT_BYTES = 32 << 20   # and at most this many bytes of their outputs


@dataclass(slots=True)
class Ended:
    """The calls that ended in one turn of the loop, for one node (reply subject)."""
    outcomes: list[dict] = field(default_factory=list)           # WorkerOutcome documents
    outputs: list[bytes] = field(default_factory=list)           # async calls' outputs, for the node
    # direct calls' answers: (context, status, execution_s, output, error)
    answers: list[tuple[DirectAnswer, int, float, bytes, str | None]] = field(default_factory=list)


class SentOutcomes:
    """Outcomes sent, bounded in count (SENT_KEPT) and in bytes of output (SENT_BYTES)."""

    def __init__(self) -> None:
        self._sent: OrderedDict[int, tuple[str, dict, bytes]] = OrderedDict()   # id -> (reply, outcome, output)
        self._bytes = 0

    def remember(self, call_id: int, reply: str, outcome: dict, output: bytes) -> None:
        self._sent[call_id] = (reply, outcome, output)
        self._bytes += len(output)
        while self._sent and (len(self._sent) > SENT_KEPT or self._bytes > SENT_BYTES):
            _, (_, _, dropped) = self._sent.popitem(last=False)
            self._bytes -= len(dropped)

    def again(self, ids: list[int]) -> dict[str, tuple[list[dict], list[bytes]]]:
        """The outcomes among ``ids`` still kept, by the reply subject they went to."""
        by_reply: dict[str, tuple[list[dict], list[bytes]]] = {}
        for call_id in ids:
            sent = self._sent.get(call_id)
            if sent is not None:
                outcomes, outputs = by_reply.setdefault(sent[0], ([], []))
                outcomes.append(sent[1])
                outputs.append(sent[2])
        return by_reply


def failure(fn: str, exc: Exception, execution_s: float) -> WorkerOutcome:
    if isinstance(exc, FunctionInputError):
        return WorkerOutcome(status=400, error=f"{fn}: {exc}", execution_s=execution_s)
    return WorkerOutcome(status=500, error=f"{fn} raised {type(exc).__name__}: {exc}", execution_s=execution_s)


def as_bytes(output: object) -> bytes:
    if isinstance(output, (bytes, bytearray, memoryview)):
        return bytes(output)
    return str(output).encode()
