"""One invocation inside a node, from the moment it arrives to its answer: a direct call (or a
peer's forward) is answered on its reply subject; an async call holds its JetStream message,
acknowledged only once the answer is stored (:mod:`nodes.answering`)."""

from __future__ import annotations

import base64
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

from nats.aio.msg import Msg

from broker.messages import LearningDecision, Timings
from broker.subjects import Invocation
from nodes.scheduler.base import SchedulingRequest

_ids = itertools.count(1)

Direct = Callable[["Call"], "dict | None"]   # a DirectAnswer document, or None (the node answers)


@dataclass(eq=False, slots=True)
class Call:
    inv: Invocation
    payload: bytes
    request: SchedulingRequest
    arrival: float                 # unix time it reached this node (async: when the intake stored it)
    timeout_s: float               # the function's time limit
    reply: str = ""                # direct call or forward: where the answer goes
    held: Msg | None = None        # async call: its intake message, acked once answered
    released: "Callable[[Call, bool], None] | None" = None   # async call: tells its ingress (acked, or handed back)
    deadline_s: float | None = None   # QoS deadline (farm tasks), for telemetry
    wanted_until: float = 0.0      # direct call: unix time its caller stops waiting (0: it says nothing)
    queued: bool = False           # it found no free slot: it waits in its pool's queue
    entered: int = 0               # its place in the order calls entered its pool's lines
    transit_s: float = 0.0         # caller -> node (direct calls that say when they were sent)
    waited_s: float = 0.0          # async: stored -> taken from the intake
    deliveries: int = 1            # async: this is its n-th delivery
    pool: str = ""
    scheduler: str = ""            # the algorithm that decided (the origin's, for a forward)
    scheduled_at: float = 0.0
    probing_s: float = 0.0
    dispatched_at: float = 0.0
    notices: bool = False          # forward: its peer reads "still holding it" notices (nodes/forwarding.py)
    noticed_at: float = 0.0        # ... and was last told so then
    worker: str = ""
    learning: LearningDecision | None = None
    tracing_id: str = ""           # X-P2pfaas-Scheduler-Task-Tracing-Id, passed on to peers
    peer_ips: tuple[str, ...] = ()    # forward: the IP of each node in request.peers
    cold_from: float = 0.0         # unix time it came to a pool with no worker to take it (0: one could)
    cold_start_s: float = 0.0      # ... and waited this long for the pool's first worker
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def key(self) -> str:
        return self.inv.call_key

    @property
    def fn(self) -> str:
        return self.inv.fn

    @property
    def is_async(self) -> bool:
        return self.held is not None

    def release(self, answered: bool) -> None:
        """Its intake message was acknowledged (``answered``) or handed back: its ingress is told."""
        if self.released is not None:
            self.released(self, answered)

    @property
    def scheduling_s(self) -> float:
        return max(0.0, self.scheduled_at - self.arrival - self.waited_s)

    @property
    def queueing_s(self) -> float:
        return self.waited_s + max(0.0, self.dispatched_at - self.scheduled_at) if self.dispatched_at else self.waited_s


def result_document(call: Call, node: str, ip: str, status: int, error: str | None, execution_s: float,
                    total_s: float, output: bytes) -> dict:
    """The JSON document of the ``Result`` of a call this node ran, written from its own validated
    call on every async answer's path (tests/nodes/test_answering.py checks it against the contract)."""
    forwarded = call.request.external
    peers = [*call.request.peers, node] if forwarded else []
    ips = [*call.peer_ips, *[""] * (len(call.request.peers) - len(call.peer_ips)), ip] if forwarded else []
    text, b64 = output_fields(output).values()
    return {
        "request_id": call.inv.request_id, "client": call.inv.client, "fn": call.fn, "status": status,
        "output": text, "output_b64": b64, "error": error, "executed_by": node, "origin": peers[0] if peers else node,
        "hops": call.request.hops if forwarded else 0, "peers": peers, "peer_ips": ips, "scheduler": call.scheduler,
        "timings": {"scheduling_s": call.scheduling_s, "queueing_s": call.queueing_s, "execution_s": float(execution_s),
                    "total_s": total_s, "transit_s": call.transit_s, "cold_start_s": call.cold_start_s},
        "hop_timings": [{"node": node, "arrival": call.arrival, "scheduling_s": call.scheduling_s,
                         "probing_s": call.probing_s, "total_s": total_s}],
        "finished_at": time.time(),
        "learning": call.learning.model_dump(mode="json") if call.learning is not None else None,
    }


def output_fields(output: bytes) -> dict[str, str | None]:
    """A function's output as a stored answer carries it: text when it is UTF-8, else base64."""
    try:
        return {"output": output.decode(), "output_b64": None}
    except UnicodeDecodeError:
        return {"output": None, "output_b64": base64.b64encode(output).decode()}


def timings_of(call: Call, execution_s: float, total_s: float, queueing_s: float | None = None) -> Timings:
    """The ``Timings`` of a call's answer (``queueing_s``: the peer's, for a call it ran)."""
    return Timings(scheduling_s=call.scheduling_s, queueing_s=call.queueing_s if queueing_s is None else queueing_s,
                   execution_s=execution_s, total_s=total_s, transit_s=call.transit_s, cold_start_s=call.cold_start_s)


def calls_document(calls: list[Call], direct: Direct) -> dict:
    """The ``WorkerCalls`` document of ``calls``, written without building the models (a hot path)."""
    return {"calls": [{"fn": c.fn, "timeout_s": c.timeout_s, "answer": direct(c), "id": c.id, "size": len(c.payload)}
                      for c in calls]}
