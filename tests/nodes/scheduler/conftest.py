"""A tiny in-memory SchedulingView and helpers to walk forward chains, for pure algorithm tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

import pytest

from nodes.scheduler.base import LocalLoad, SchedulingRequest


def room(running: int = 0, queued: int = 0, slots: int = 8, queue_max: int = 0,
         queue_enabled: bool = False) -> LocalLoad:
    return LocalLoad(running, queued, slots, queue_max, queue_enabled)


@dataclass
class FakeView:
    """``peer_loads[p]`` is what probing ``p`` answers (None = the probe fails, an exception is raised)."""

    node_id: str = "n0"
    load: LocalLoad = field(default_factory=room)
    peer_loads: dict[str, int | None | BaseException] = field(default_factory=dict)
    probed: list[str] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    learning: None = None

    def local_load(self) -> LocalLoad:
        return self.load

    def resolve(self, name: str) -> str:
        return name

    def peers(self) -> list[str]:
        return [p for p in self.peer_loads if p != self.node_id]

    async def probe(self, peer: str) -> int | None:
        self.probed.append(peer)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0)  # let the other probes start: shows whether they overlap
        self.in_flight -= 1
        answer = self.peer_loads[peer]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def client_request(**kw: object) -> SchedulingRequest:
    return SchedulingRequest(fn="echo", client="c1", request_id="r1", **kw)  # type: ignore[arg-type]


def forwarded(request: SchedulingRequest, by: str) -> SchedulingRequest:
    """What the service sends on: hops + 1, the forwarding node appended to the path."""
    return replace(request, external=True, hops=request.hops + 1, peers=(*request.peers, by))


class Fakes:
    """Reached through the ``fake`` fixture: ``fake.View``, ``fake.load``, ``fake.request``, ``fake.forwarded``."""

    View = FakeView
    load = staticmethod(room)
    request = staticmethod(client_request)
    forwarded = staticmethod(forwarded)


@pytest.fixture(scope="session")
def fake() -> type[Fakes]:
    return Fakes
