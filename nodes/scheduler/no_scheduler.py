"""P2PFaaS ``NoScheduler [loss]``: always run locally; with loss, reject when full."""

from __future__ import annotations

from typing import Sequence

from nodes.scheduler.base import (
    Decision,
    Execute,
    Reject,
    SchedulingAlgorithm,
    SchedulingRequest,
    SchedulingView,
    parse_bool,
)


class NoScheduler(SchedulingAlgorithm):
    name = "NoScheduler"
    instant = True

    def __init__(self, loss: bool = True) -> None:
        self.loss = loss

    @classmethod
    def from_parameters(cls, parameters: Sequence[str]) -> "NoScheduler":
        if len(parameters) > 1:
            raise ValueError("NoScheduler takes one parameter: [loss]")
        return cls(parse_bool(parameters[0]) if parameters else True)

    def parameters(self) -> list[str]:
        return [str(self.loss).lower()]

    async def schedule(self, request: SchedulingRequest, view: SchedulingView) -> Decision:
        if self.loss and not view.local_load().has_room:
            return Reject("all slots busy and the queue is full")
        return Execute()
