"""The internal reject scheduler (header ``X-P2pfaas-Scheduler-Reject``)."""

from __future__ import annotations

from typing import Sequence

from nodes.scheduler.base import Decision, Reject, SchedulingAlgorithm, SchedulingRequest, SchedulingView


class RejectScheduler(SchedulingAlgorithm):
    name = "RejectScheduler"
    instant = True

    @classmethod
    def from_parameters(cls, parameters: Sequence[str]) -> "RejectScheduler":
        if parameters:
            raise ValueError("RejectScheduler takes no parameters")
        return cls()

    def parameters(self) -> list[str]:
        return []

    async def schedule(self, request: SchedulingRequest, view: SchedulingView) -> Decision:
        return Reject("rejected on request (X-P2pfaas-Scheduler-Reject)")
