"""P2PFaaS ``ForwardScheduler [maxHops]``, plus the forwarding rules every algorithm shares."""

from __future__ import annotations

import random
from typing import Sequence

from nodes.scheduler.base import (
    Decision,
    Execute,
    Forward,
    SchedulingAlgorithm,
    SchedulingRequest,
    SchedulingView,
    overloaded,
)

UINT32_MAX = 2**32 - 1


def parse_uint(value: str, what: str, *, minimum: int = 0) -> int:
    """A base-10 unsigned integer as Go's ``strconv.ParseUint(v, 10, 32)`` reads it."""
    v = value.strip()
    if not v.isdigit() or not v.isascii():
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    n = int(v)
    if n < minimum or n > UINT32_MAX:
        raise ValueError(f"{what} must be between {minimum} and {UINT32_MAX}, got {n}")
    return n


def forwardable_peers(request: SchedulingRequest, view: SchedulingView) -> list[str]:
    """Alive peers the request has not visited yet (nor this node), in the view's stable order:
    that rule keeps every forward chain loop-free."""
    visited = set(request.peers)
    visited.add(view.node_id)
    return [p for p in view.peers() if p not in visited]


def may_forward(request: SchedulingRequest, max_hops: int) -> bool:
    """A request may move on only while ``hops < max_hops``: 0 means never forward (P2PFaaS would
    still forward a client request once; docs/scheduling.md)."""
    return request.hops < max_hops


def run_locally(view: SchedulingView, loss: bool, probing_s: float = 0.0) -> Decision:
    """Execute here; with ``loss``, reject instead when no slot and no queue place is free."""
    if loss and not view.local_load().has_room:
        return overloaded(probing_s)
    return Execute(probing_s=probing_s)


class ForwardScheduler(SchedulingAlgorithm):
    """Forward every request to one random unvisited peer while the hop budget lasts, else run here."""

    name = "ForwardScheduler"
    instant = True

    def __init__(self, max_hops: int = 1, *, rng: random.Random | None = None) -> None:
        if max_hops < 0:
            raise ValueError(f"maxHops must be >= 0, got {max_hops}")
        self.max_hops = max_hops
        self.rng = rng or random.Random()

    @classmethod
    def from_parameters(
        cls, parameters: Sequence[str], *, rng: random.Random | None = None
    ) -> "ForwardScheduler":
        if not parameters:
            return cls(rng=rng)
        if len(parameters) != 1:
            raise ValueError(f"ForwardScheduler takes one parameter [maxHops], got {list(parameters)!r}")
        return cls(parse_uint(parameters[0], "maxHops"), rng=rng)

    def parameters(self) -> list[str]:
        return [str(self.max_hops)]

    async def schedule(self, request: SchedulingRequest, view: SchedulingView) -> Decision:
        if not may_forward(request, self.max_hops):
            return Execute()
        peers = forwardable_peers(request, view)
        if not peers:
            return Execute()
        return Forward(self.rng.choice(peers))
