"""A node's load, configuration and scheduler, and the notice that it is gone."""

from __future__ import annotations

import time

from pydantic import ConfigDict, Field

from broker.messages.base import Contract


class NodeGone(Contract):
    """On ``<prefix>.<node>.gone``: the node stopped (``by``: it, or a worker that saw it die)."""

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
