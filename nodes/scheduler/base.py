"""The scheduling-algorithm interface: ``schedule(request, view) -> Decision``. An algorithm only
decides; the scheduler service carries the decision out."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Protocol, Sequence

from broker import codes


@dataclass(frozen=True, slots=True)
class SchedulingRequest:
    """What an algorithm may look at when it decides where a request runs."""

    fn: str
    client: str
    request_id: str
    external: bool = False          # arrived over faas.<node>.forward.* (P2PFaaS "External")
    hops: int = 0                   # forwards already done
    peers: tuple[str, ...] = ()     # nodes already visited, origin first
    bypass: bool = False            # X-P2pfaas-Scheduler-Bypass
    force_forward: bool = False     # X-P2pfaas-Scheduler-Forward
    force_reject: bool = False      # X-P2pfaas-Scheduler-Reject
    task_type: float | None = None  # X-P2pfaas-Scheduler-Learning-Task-Type


@dataclass(frozen=True, slots=True)
class LocalLoad:
    running: int
    queued: int
    slots: int          # K, parallel_running_functions_max
    queue_max: int
    queue_enabled: bool

    @property
    def has_room(self) -> bool:
        """A new task could run now or wait in the queue (queued tasks take free slots first)."""
        capacity = self.slots + (self.queue_max if self.queue_enabled else 0)
        return self.running + self.queued < capacity


class SchedulingView(Protocol):
    """The node's view that algorithms decide on (nodes/scheduler/view.py's NodeView)."""

    node_id: str
    # the LearningScheduler's learner and rewards (a nodes.scheduler.learning.LearningContext; None: no learner)
    learning: object | None

    def local_load(self) -> LocalLoad: ...

    def resolve(self, name: str) -> str:
        """A node named by its IP address (P2PFaaS's master), as discovery knows it; else ``name``."""
        ...

    def peers(self) -> Sequence[str]:
        """Alive peers from discovery, excluding this node, in a stable order."""
        ...

    async def probe(self, peer: str) -> int | None:
        """Running + queued of ``peer``; None when the probe failed or timed out."""
        ...


@dataclass(frozen=True, slots=True)
class Execute:
    probing_s: float = 0.0  # time spent probing peers before deciding to stay local


@dataclass(frozen=True, slots=True)
class Forward:
    peer: str
    probing_s: float = 0.0


OVERLOADED = "all slots busy and the queue is full"


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse the call. ``code`` is P2PFaaS's: 401 deliberately rejected (HTTP 503), 400 the job
    cannot be scheduled -- no slot and no queue place (HTTP 500); see :func:`overloaded`."""

    reason: str
    code: int = codes.DELIBERATELY_REJECTED
    probing_s: float = 0.0  # time spent probing peers before giving up


def overloaded(probing_s: float = 0.0) -> Reject:
    """No slot and no queue place: P2PFaaS's "job cannot be scheduled" (400, HTTP 500)."""
    return Reject(OVERLOADED, code=codes.CANNOT_SCHEDULE, probing_s=probing_s)


Decision = Execute | Forward | Reject


class SchedulingAlgorithm(abc.ABC):
    """Base of every algorithm; subclasses register themselves by ``name``."""

    name: ClassVar[str]
    registry: ClassVar[dict[str, type["SchedulingAlgorithm"]]] = {}
    # schedule() never waits on I/O: the service decides in the message callback, not in a task
    instant: ClassVar[bool] = False

    def __init_subclass__(cls, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if "name" in cls.__dict__:
            SchedulingAlgorithm.registry[cls.name] = cls

    @classmethod
    @abc.abstractmethod
    def from_parameters(cls, parameters: Sequence[str]) -> "SchedulingAlgorithm":
        """Build from P2PFaaS string parameters; ValueError with a clear message if invalid."""

    @abc.abstractmethod
    def parameters(self) -> list[str]:
        """The parameters as P2PFaaS strings (round-trips through from_parameters)."""

    @abc.abstractmethod
    async def schedule(self, request: SchedulingRequest, view: SchedulingView) -> Decision: ...

    def describe(self) -> str:
        """Name as P2PFaaS prints it in X-P2pfaas-Scheduler, e.g. ``PowerOfNScheduler(1, 2, true, 1)``."""
        return f"{self.name}({', '.join(self.parameters())})"


def complete_now(coro):
    """The result of a coroutine that finishes without waiting (an ``instant`` algorithm's decision)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("an instant scheduling algorithm waited on I/O; set instant = False on it")


def parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ValueError(f"expected a boolean (true/false), got {value!r}")


def build_algorithm(name: str, parameters: Sequence[str]) -> SchedulingAlgorithm:
    """Instantiate a registered algorithm; ValueError names the known ones."""
    cls = SchedulingAlgorithm.registry.get(name)
    if cls is None:
        known = ", ".join(sorted(SchedulingAlgorithm.registry))
        raise ValueError(f"unknown scheduler {name!r}; known: {known}")
    return cls.from_parameters(list(parameters))
