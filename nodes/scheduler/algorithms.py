"""Every scheduling algorithm, registered, and :func:`decide`, where request headers override them.
Precedence as in P2PFaaS's ``/function``: ``X-P2pfaas-Scheduler-Bypass`` (run here, loss on),
``-Forward`` (a random unvisited peer, else here), ``-Reject`` (401), then the algorithm. A Forward
to this node or a node already on the path runs here, so no chain can loop."""

from __future__ import annotations

import logging
import random

from nodes.scheduler.base import (
    Decision,
    Execute,
    Forward,
    SchedulingAlgorithm,
    SchedulingRequest,
    SchedulingView,
    build_algorithm,
)
# Importing every algorithm module registers it: a new one must be imported here too.
from nodes.scheduler.forward import ForwardScheduler
from nodes.scheduler.learning import LearningScheduler
from nodes.scheduler.no_scheduler import NoScheduler
from nodes.scheduler.power_of_n import PowerOfNScheduler, PowerOfNSchedulerTau
from nodes.scheduler.rejector import RejectScheduler
from nodes.scheduler.round_robin import RoundRobinWithMasterScheduler

__all__ = [
    "ForwardScheduler",
    "LearningScheduler",
    "NoScheduler",
    "PowerOfNScheduler",
    "PowerOfNSchedulerTau",
    "RejectScheduler",
    "RoundRobinWithMasterScheduler",
    "build_algorithm",
    "decide",
    "forced_algorithm",
    "known_algorithms",
]

log = logging.getLogger(__name__)

_REJECT = RejectScheduler()
_BYPASS = NoScheduler(loss=True)
_FORWARD = ForwardScheduler(1)
_shared_rng = random.Random()


def forced_algorithm(request: SchedulingRequest) -> SchedulingAlgorithm | None:
    """The algorithm a request header forces, None when the configured one decides."""
    if request.bypass:
        return _BYPASS
    if request.force_forward:
        return _FORWARD
    if request.force_reject:
        return _REJECT
    return None


def known_algorithms() -> list[str]:
    """Names accepted by ``/configuration/scheduler``, sorted."""
    return sorted(SchedulingAlgorithm.registry)


async def decide(
    algorithm: SchedulingAlgorithm,
    request: SchedulingRequest,
    view: SchedulingView,
    *,
    rng: random.Random | None = None,
) -> Decision:
    """Header overrides, then ``algorithm`` (module docstring). ``rng`` drives the forced forward
    (default: the algorithm's own, else a module-wide generator)."""
    forced = forced_algorithm(request)
    if forced is _FORWARD:
        forced = ForwardScheduler(1, rng=rng or getattr(algorithm, "rng", None) or _shared_rng)
    if forced is not None:
        return await forced.schedule(request, view)
    decision = await algorithm.schedule(request, view)
    if isinstance(decision, Forward) and (
        decision.peer == view.node_id or decision.peer in request.peers
    ):
        log.warning(
            "%s forwarded request %s back to visited node %s; running it here",
            algorithm.describe(), request.request_id, decision.peer,
        )
        return Execute(probing_s=decision.probing_s)
    return decision
