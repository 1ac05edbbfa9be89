"""Message contracts: every JSON payload that crosses a broker.

Frozen pydantic v2 models with ``extra="forbid"``; encode/decode only through
:mod:`broker.codec` so the wire format lives in one place.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, RootModel, model_validator

from broker import headers as H


class Contract(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# a number that must be finite: what feeds a model or a policy (one NaN or Infinity in a reward
# or an observation would poison every weight it trains; JSON parsers accept both literals)
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class HopTiming(Contract):
    """Timings of one node on a request's path (P2PFaaS ``peers_list`` entry).

    ``arrival`` is when the request reached that node (unix time; for a peer,
    when its durable stream stored the forward); ``total_s`` runs from there to
    the result, so it is filled in by the worker that executes the request.
    """

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

    ``status`` is an HTTP-like code (200 ok, 400 bad input, 404 unknown
    function, 413 too large, 500 function error, 504 timeout); ``output`` is the
    function's output as text when it is UTF-8, else base64 in ``output_b64``.
    """

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

    ``code`` follows P2PFaaS (401 deliberately rejected, ...) or the HTTP code of
    a validation error (400, 404, 413); ``http_status`` is what the HTTP bridge
    answers.
    """

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
    """The calls of a :class:`WorkerStatusRequest` the worker still runs; the others it never got
    or finished (their outcomes were sent again just before this answer)."""

    running: list[int] = Field(default_factory=list)


class NodeGone(Contract):
    """On ``<prefix>.<node>.gone``: the node stopped (``by`` is the node itself, or one of its
    workers that saw it die); callers waiting on it fail at once."""

    node: str
    by: str
    reason: str = ""
    at: float = Field(default_factory=time.time)


class NodeLoad(Contract):
    """Answer of the load probe ``faas.<node>.load`` (P2PFaaS /monitoring/load)."""

    node: str
    running: int
    queued: int
    parallel_running_functions_max: int
    queue_length_max: int
    queue_enabled: bool
    scheduler: str = ""        # the algorithm deciding, as X-P2pfaas-Scheduler names it


class NodeConfiguration(Contract):
    """P2PFaaS ``/configuration`` body; persisted by the node. Strict: ``"8"`` for a number or
    ``"yes"`` for a boolean is refused, not read as one (as P2PFaaS's Go decoder refuses them)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    parallel_running_functions_max: int = Field(default=4, ge=1, le=1024)
    queue_length_max: int = Field(default=4, ge=0, le=100_000)
    queue_enabled: bool = True


class SchedulerConfiguration(Contract):
    """P2PFaaS ``/configuration/scheduler`` body: parameters are strings."""

    name: str = "NoScheduler"
    parameters: list[str] = Field(default_factory=list)   # none: the algorithm's defaults

    def describe(self) -> str:
        """As P2PFaaS prints it in ``X-P2pfaas-Scheduler``, e.g. ``PowerOfNScheduler(1, 2, true, 1)``."""
        return f"{self.name}({', '.join(self.parameters)})"


class SchedulerChange(Contract):
    """A ``/configuration/scheduler`` change: the algorithm must be named (an empty body is refused,
    never read as NoScheduler); parameters left out are the algorithm's defaults, which the
    answer lists."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=64)
    parameters: list[str] = Field(default_factory=list, max_length=16)


def _not_ours(name: str) -> str:
    if name.upper().startswith("P2PFAAS_"):
        raise ValueError(f"{name}: P2PFAAS_ variables are the platform's")
    return name


EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"), AfterValidator(_not_ours)]
LabelName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,252}$")]


SecretName = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")]   # OpenFaaS's (DNS labels)
DEFAULT_ZERO_AFTER_S = 60.0   # a pool that may scale to zero does after this long without a call


class FunctionScaling(Contract):
    """A function's own pool of workers: ``min``..``max`` of them. With ``min`` 0 the pool scales to
    zero after ``zero_after_s`` without a call (default DEFAULT_ZERO_AFTER_S) and its next call
    wakes it (the call waits for the cold start, it is not refused). ``policy``: the scaling
    policy the stack's controller runs for it (a name of controller/names.py; ``off``: none, the
    pool keeps the size it is given)."""

    min: int = Field(default=1, ge=0, le=256)
    max: int = Field(default=16, ge=1, le=256)
    zero_after_s: float | None = Field(default=None, gt=0, le=86400)
    policy: str = Field(default="kpa", pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")

    @model_validator(mode="after")
    def _bounds(self) -> "FunctionScaling":
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        if self.zero_after_s is not None and self.min > 0:
            raise ValueError("zero_after_s needs min 0: a pool scales to zero only if it may have no worker")
        return self

    @property
    def idle_s(self) -> float | None:
        """Seconds without a call before the pool scales to zero (None: it never does)."""
        return (self.zero_after_s or DEFAULT_ZERO_AFTER_S) if self.min == 0 else None


class FunctionLimits(Contract):
    """What one worker of a function's own pool may use: memory in bytes (a process's address
    space, a container's memory) and CPUs (a container's share; a process's CPU time per second)."""

    memory_bytes: int | None = Field(default=None, ge=16 * 1024 * 1024, le=1 << 40)
    cpus: float | None = Field(default=None, gt=0, le=256)


class FunctionDeployment(Contract):
    """Deploy on ``faas.<node>.functions.deploy``, and a function of the catalogue
    (nodes/catalogue.py): ``reference`` is ``package.module:callable`` or ``image:<ref>`` (an
    OpenFaaS-style image), as ``p2pfaas up --function name=reference``; ``env_vars`` reach the
    function's environment (its workers', or its container's), OpenFaaS's ``envVars``.

    ``timeout_s`` and ``concurrency`` (calls one worker runs at once) replace the function's own.
    ``scaling``, ``secrets`` (names of the deployment's secrets, read with
    ``functions.secret(name)``) and ``limits`` give it a pool of its own: workers shared with other
    functions could neither be scaled for it nor keep its secrets from the others' code."""

    service: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    reference: str = Field(min_length=1, max_length=512)
    env_vars: dict[EnvName, Annotated[str, Field(max_length=4096)]] = Field(default_factory=dict, max_length=64)
    labels: dict[LabelName, Annotated[str, Field(max_length=256)]] = Field(default_factory=dict, max_length=64)
    annotations: dict[LabelName, Annotated[str, Field(max_length=4096)]] = Field(default_factory=dict,
                                                                                 max_length=64)
    timeout_s: float | None = Field(default=None, gt=0, le=86400)
    concurrency: int | None = Field(default=None, ge=1, le=1024)
    scaling: FunctionScaling | None = None
    secrets: list[SecretName] = Field(default_factory=list, max_length=32)
    limits: FunctionLimits | None = None

    @property
    def own_pool(self) -> bool:
        return self.scaling is not None or bool(self.secrets) or self.limits is not None


class FunctionScale(Contract):
    """On ``faas.<node>.functions.scale`` (``replicas``) and ``.delete`` / ``.scale_delay`` (``service`` only)."""

    service: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    replicas: int | None = Field(default=None, ge=0, le=1024)


class FunctionInfo(Contract):
    """One function as OpenFaaS's ``GET /system/functions`` lists it. ``replicas`` are the workers
    that may run it (its pool's size), ``availableReplicas`` those ready; ``image`` is the image of
    an image function, else ``p2pfaas``; ``envProcess`` its ``module:callable``."""

    name: str
    image: str
    envProcess: str = ""
    envVars: dict[str, str] = Field(default_factory=dict)
    invocationCount: int = 0
    replicas: int
    availableReplicas: int
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    limits: dict[str, str] | None = None   # OpenFaaS's {memory: "256Mi", cpu: "0.5"}


class SecretChange(Contract):
    """On ``faas.<node>.secrets.create|update|delete`` (OpenFaaS's ``/system/secrets`` body:
    ``name`` and, but for a delete, ``value``)."""

    name: str = Field(min_length=1, max_length=63)
    value: str | None = Field(default=None, max_length=65536)
    mode: Literal["create", "update", "set"] = "set"   # create: not if it exists; update: only if it does


class FunctionList(RootModel[list[FunctionInfo]]):
    model_config = ConfigDict(frozen=True)


class ScaleDelay(Contract):
    """P2PFaaS's ``/monitoring/scale-delay/{fn}``: seconds to add one worker to the function's pool."""

    approximate_delay: float
    error_margin: float
    attempts: int


class Heartbeat(Contract):
    """Membership heartbeat on ``faas.membership.<group>.<node>``."""

    node: str
    address: str = ""
    group: str = "default"
    running: int = 0
    queued: int = 0
    parallel_running_functions_max: int = 0
    queue_length_max: int = 0
    version: str = ""
    time: float = Field(default_factory=time.time)
    scheduler: str = ""                                       # e.g. PowerOfNScheduler(1, 2, true, 1)
    forwards: dict[str, int] = Field(default_factory=dict)    # forwards to each peer since the last heartbeat


class PeerInfo(Contract):
    """One alive peer, as a row of P2PFaaS discovery ``GET /list``."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    id: int = Field(alias="_id")   # order of first sighting
    ip: str                        # the machine's IP address (the host of its advertised address)
    name: str                      # node id
    group_name: str
    ping: float                    # one-way delay of the newest heartbeat, seconds
    last_update: int               # unix seconds of the newest heartbeat
    alive: bool
    dead_polls: int                # heartbeat periods missed since
    address: str = ""              # what the peer advertises (e.g. its HTTP bridge's URL)
    protocol: Literal["nats", "http"] = "nats"   # how this node reaches it (http: an original P2PFaaS node)


class MachineAnnouncement(Contract):
    """A P2PFaaS machine announcing itself (``User-Agent: Machine`` and the ``p2pfaas-machine-*``
    headers of discovery's ``GET /list``), on ``faas.<node>.discovery.register``; the answer is
    the node's :class:`PeerList`."""

    ip: str = Field(min_length=1, max_length=64)
    name: str = Field(default="", max_length=256)
    group_name: str = Field(default="", max_length=256)


class DiscoveryConfiguration(Contract):
    """P2PFaaS discovery's ``/configuration`` body (``faas.<node>.discovery.config.get|set``)."""

    machine_ip: str = ""
    machine_id: str = ""
    machine_group_name: str = ""
    init_servers: list[str] = Field(default_factory=list)


class PeerList(RootModel[list[PeerInfo]]):
    """Answer of ``faas.<node>.peers``: a bare JSON array, as P2PFaaS ``GET /list``."""

    model_config = ConfigDict(frozen=True)


class PoolTelemetry(Contract):
    """One control-period sample of a worker pool, on ``faas.<node>.telemetry.<pool>``.

    The simulator produces exactly this too, so the autoscaling environment has
    the same observation whether it runs offline or on the live system.
    """

    node: str
    pool: str
    time: float
    period_s: float
    queue_length: int          # waiting tasks (JetStream pending + ack-pending not yet running)
    in_service: int            # tasks being executed right now
    workers_ready: int
    workers_starting: int
    workers_stopping: int = 0
    arrivals: int              # tasks that arrived in the period
    completed: int             # tasks finished in the period
    met_deadline: int          # of those, how many met their deadline
    arrival_rate: FiniteFloat        # arrivals / period_s
    throughput: FiniteFloat          # completed / period_s
    latency_mean_s: FiniteFloat
    latency_p95_s: FiniteFloat
    latency_max_s: FiniteFloat
    qos: FiniteFloat                 # met_deadline / completed (1.0 when nothing completed)


class PoolPulse(Contract):
    """A pool's state between control periods, every tick (2 s), on ``faas.<node>.pulse.<pool>``:
    what the controller's reaction between decisions reads (controller/panic.py). The simulator
    makes the same pulses."""

    node: str
    pool: str
    time: float
    window_s: float = Field(gt=0)    # since the previous pulse
    arrivals: int = Field(ge=0)      # in the window
    queue_length: int = Field(ge=0)
    workers_ready: int = Field(ge=0)
    workers_starting: int = Field(ge=0)


class ScaleCommand(Contract):
    """Target worker count for a pool, on ``faas.<node>.scale.<pool>``."""

    node: str
    pool: str
    target_workers: int = Field(ge=0, le=4096)
    reason: str = Field(default="", max_length=500)
    policy: str = Field(default="", max_length=64)
    at: float = Field(default_factory=time.time)
    model_version: str = ""       # the weights that decided an RL policy's target ("shipped", "online-<n>")


class PolicySwitch(Contract):
    """Request on ``faas.<node>.policy.<pool>``: let the pool's controller decide with another
    policy (a name ``p2pfaas controller --policy`` takes: dqn, kpa, fixed-8, ...). The controller
    answers :class:`PolicySwitched`, or an ``ErrorBody`` with ``X-P2pfaas-Status: 400`` for a
    policy it cannot run (unknown name, no trained model); nobody answering means no controller."""

    node: str
    pool: str
    policy: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    requested_by: str = ""


class PolicySwitched(Contract):
    """Answer of a :class:`PolicySwitch`: the policy now deciding and the one it replaced."""

    node: str
    pool: str
    policy: str
    previous: str = ""
    note: str = ""          # e.g. where an RL policy was loaded from


class SchedulingExperience(Contract):
    """P2PFaaS learner sample on ``faas.<node>.reward``."""

    eid: int
    state: list[float]
    action: int
    reward: float
    node: str = ""

    @property
    def msg_id(self) -> str:
        """Its JetStream message id: the reward stream keeps the first sample per EID, whoever
        sends it (the node's deadline reward or a client's), so none is counted twice."""
        return f"reward.{self.node}.{self.eid}"


class ScalingExperience(Contract):
    """Autoscaling transition on ``faas.<node>.experience.<pool>``."""

    node: str
    pool: str
    observation: list[FiniteFloat]
    action: int
    reward: FiniteFloat
    next_observation: list[FiniteFloat]
    done: bool = False
    policy: str = ""
    at: float = Field(default_factory=time.time)


class ErrorBody(Contract):
    """JSON error body of the HTTP bridge: ``{code, message}``."""

    code: int
    message: str


Status = Literal["ok", "error"]


# -- learner (docs/learner.md) ------------------------------------------------------


def _state_from_text(value: Any) -> Any:
    """P2PFaaS sends states as ``"f1,f2,..."``; lists pass through."""
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",")]
        if not value.strip() or any(not item for item in items):
            raise ValueError(f"state {value!r} is not a comma-separated list of numbers")
        return items
    return value


StateVector = Annotated[list[FiniteFloat], Field(min_length=1, max_length=4096), BeforeValidator(_state_from_text)]


class LearnerActRequest(Contract):
    """Request on ``faas.<node>.learner.<model>.act``. ``explore`` is P2PFaaS's /act:
    epsilon-greedy, and epsilon decays; ``explore=False`` is greedy and changes nothing."""

    state: StateVector
    explore: bool = True


class LearnerAction(Contract):
    """Answer of ``act``: the action and the epsilon the decision used (``X-P2pfaas-Eps``)."""

    action: int
    eps: float
    model: str
    algorithm: str


class LearnerTrainSample(Contract):
    """One scheduling sample as P2PFaaS's learner API takes it (``/learner/train``,
    ``/learner/train_batch``): the state may be ``"a,b"`` text or a list of numbers."""

    eid: int = Field(ge=0)
    state: StateVector
    action: int = Field(ge=0)
    reward: FiniteFloat


class LearnerTrainBatch(RootModel[list[LearnerTrainSample]]):
    """Body of ``POST /learner/train_batch``: a JSON array of samples."""

    model_config = ConfigDict(frozen=True)


class LearnerParameters(RootModel[dict[str, Any]]):
    """Hyper-parameters of a model by name (``parameters.get`` / ``parameters.set``); values
    may be strings as P2PFaaS sends them. ``"reset": true`` in a set rebuilds the model."""

    model_config = ConfigDict(frozen=True)


class LearnerWeights(Contract):
    """What acting needs, published on ``faas.<node>.learner.<model>.weights`` (and the
    answer of ``weights.get``): enough to rebuild the agent and ``set_weights`` it."""

    node: str
    model: str
    algorithm: str
    obs_dim: int
    n_actions: int
    config: dict[str, Any]
    version: int                  # experiences applied to the model so far
    weights_b64: str              # Agent.get_weights(), base64
    at: float = Field(default_factory=time.time)


class LearnerStats(Contract):
    """Answer of ``faas.<node>.learner.<model>.stats``."""

    node: str
    model: str
    algorithm: str
    obs_dim: int
    n_actions: int
    exists: bool                  # False until the first act/experience creates the model
    experiences: int              # applied to this model
    pending: int                  # scheduling samples waiting for their successor EID
    malformed: int                # experiences of the node refused (logged, acknowledged)
    stream_seq: int               # last experience-stream sequence applied (all models of the node)
    checkpoint_seq: int           # stream sequence of the newest checkpoint on disk
    weights_published: int
    agent: dict[str, Any] = Field(default_factory=dict)
    unknown_models: int = 0       # requests to the node's learner naming a model it does not keep (404)
