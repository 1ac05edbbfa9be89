"""A call's answers, timings and errors, and what a node and its workers tell each other about calls."""

from __future__ import annotations

import time

from pydantic import Field

from broker import headers as H
from broker.messages.base import Contract


class HopTiming(Contract):
    """Timings of one node on a request's path (P2PFaaS ``peers_list`` entry).

    ``arrival``: when the request reached that node (unix time; a peer: when its stream stored the
    forward); ``total_s`` runs from there to the result (filled in by the worker that runs it)."""

    node: str
    arrival: float = 0.0
    scheduling_s: float = 0.0
    probing_s: float = 0.0
    total_s: float = 0.0


class Timings(Contract):
    """Per-request timings in seconds, measured like P2PFaaS: ``scheduling_s`` is the time the
    scheduler spent deciding (probes included); ``transit_s`` (caller to node) and ``queueing_s``
    (waiting for a worker) are reported on their own; ``total_s`` runs from arrival to answer."""

    scheduling_s: float = 0.0
    queueing_s: float = 0.0
    execution_s: float = 0.0
    total_s: float = 0.0
    transit_s: float = 0.0
    cold_start_s: float = 0.0   # waiting for its pool to wake from zero (part of queueing_s)


class LearningDecision(Contract):
    """A LearningScheduler's decision for one request (docs/learning.md): the experience id,
    the state it acted on, the action and the epsilon it used. Travels as the
    ``X-P2pfaas-Scheduler-Learning-{Eid,State,Action,Eps}`` headers and is answered to the caller."""

    eid: int = Field(ge=0)
    state: list[float]
    action: int = Field(ge=0)
    eps: float = 0.0

    def headers(self) -> dict[str, str]:
        """The four headers, P2PFaaS style (the state as ``"f1,f2,..."``)."""
        return {H.LEARNING_EID: str(self.eid), H.LEARNING_STATE: ",".join(f"{v:g}" for v in self.state),
                H.LEARNING_ACTION: str(self.action), H.LEARNING_EPS: repr(self.eps)}

    @classmethod
    def from_headers(cls, headers: dict[str, str] | None) -> "LearningDecision | None":
        """The decision carried by ``headers`` (names in any case); None when absent or garbled."""
        if not headers:
            return None
        if H.LEARNING_EID not in headers:  # e.g. an HTTP client's lower-cased names
            lower = {name.lower(): value for name, value in headers.items()}
            headers = {name: lower[name.lower()] for name in H.LEARNING if name.lower() in lower}
        try:
            return cls(eid=int(headers[H.LEARNING_EID]), action=int(headers[H.LEARNING_ACTION]),
                       state=[float(v) for v in headers[H.LEARNING_STATE].split(",") if v.strip()],
                       eps=float(headers[H.LEARNING_EPS]))
        except (KeyError, ValueError):
            return None


class Result(Contract):
    """Outcome of an invocation, published on ``faas.result.<client>.<req>``.

    ``status`` is HTTP-like (200 ok, 400 bad input, 404 unknown function, 413 too large, 500 function
    error, 504 timeout); ``output`` is the output as text when it is UTF-8, else base64 in ``output_b64``."""

    request_id: str
    client: str
    fn: str
    status: int
    output: str | None = None
    output_b64: str | None = None
    error: str | None = None
    executed_by: str
    origin: str
    hops: int = 0
    peers: list[str] = Field(default_factory=list)
    peer_ips: list[str] = Field(default_factory=list)   # the IP address of each node in ``peers``
    scheduler: str = ""
    timings: Timings = Timings()
    hop_timings: list[HopTiming] = Field(default_factory=list)
    finished_at: float = Field(default_factory=time.time)
    learning: LearningDecision | None = None   # set when a LearningScheduler decided it


class Rejection(Contract):
    """A request the system refused, published on ``faas.reject.<client>.<req>``.

    ``code`` follows P2PFaaS (401 deliberately rejected, ...) or is a validation error's HTTP code
    (400, 404, 413); ``http_status`` is what the HTTP bridge answers."""

    request_id: str
    client: str
    fn: str
    code: int
    http_status: int
    reason: str
    node: str
    retry_after_s: float | None = None
    scheduler: str = ""
    at: float = Field(default_factory=time.time)
    learning: LearningDecision | None = None   # set when a LearningScheduler decided it


class DirectAnswer(Contract):
    """What a worker needs to answer a direct call's caller itself (one hop less than through its
    node): where (``reply``), since when (``arrival``: the total time runs from there) and the
    node's side of the P2PFaaS headers, rendered when it dispatched the call (``headers``: header
    lines, each ending in CRLF; :func:`broker.answers.context_headers`). The worker adds the
    status, the total and the execution time (:func:`broker.answers.direct_block`)."""

    reply: str = Field(min_length=1)
    arrival: float
    headers: str = Field(default="", pattern=r"^([^\r\n]+\r\n)*$")


class WorkerCall(Contract):
    """One call in a :class:`WorkerCalls` batch: run ``fn`` on its payload within ``timeout_s``;
    with ``answer``, answer the caller directly too. ``id`` is the node's (echoed in the outcome),
    ``size`` the payload's length in the batch's payload section."""

    fn: str
    timeout_s: float = Field(gt=0)
    answer: DirectAnswer | None = None
    id: int = 0
    size: int = Field(default=0, ge=0)


class WorkerCalls(Contract):
    """Node -> worker on ``<prefix>.<node>.worker.<name>``: the calls the node dispatched to this
    worker in one turn of its loop, framed (:func:`broker.codec.frame`) with their payloads back to
    back. The outcomes come back on the message's reply subject, as :class:`WorkerOutcomes`, in as
    many messages as it takes (calls end at different times)."""

    calls: list[WorkerCall] = Field(min_length=1)


class WorkerOutcome(Contract):
    """How call ``id`` ended; ``size``: its output's length in the batch's payload section.

    ``status``: 200 ok, 400 the function refused its input, 404 unknown function,
    500 it raised, 504 it overran its timeout (the worker then recycles itself)."""

    id: int = 0
    status: int
    error: str | None = None
    execution_s: float = 0.0
    retiring: bool = False      # the worker exits after this answer (it recycles itself)
    answered: bool = False      # the worker answered the caller itself (``WorkerCall.answer``): no output here
    size: int = Field(default=0, ge=0)


class WorkerOutcomes(Contract):
    """Worker -> node: the calls of one :class:`WorkerCalls` batch that ended in one turn of the
    worker's loop, framed with their outputs back to back. ``error``: the batch itself was
    unreadable (every call in it failed)."""

    outcomes: list[WorkerOutcome] = Field(default_factory=list)
    error: str | None = None


class WorkerStatusRequest(Contract):
    """Node -> worker on ``<prefix>.<node>.worker.<name>.status`` after the broker connection came
    back: which of these calls do you still run? The worker first sends again the outcomes of those
    it finished (they may have been lost with the broker), then answers :class:`WorkerStatus`."""

    ids: list[int] = Field(max_length=100_000)


class WorkerStatus(Contract):
    """The calls of a :class:`WorkerStatusRequest` the worker still runs (the others' outcomes sent again)."""

    running: list[int] = Field(default_factory=list)


class ErrorBody(Contract):
    """JSON error body of the HTTP bridge: ``{code, message}``."""

    code: int
    message: str
