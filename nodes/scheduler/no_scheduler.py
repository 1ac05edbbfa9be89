"""P2PFaaS ``NoScheduler [loss]``: always run locally; with loss, reject when full."""

from __future__ import annotations

from typing import Sequence

from nodes.scheduler.base import (
    Decision,
    Execute,
    SchedulingAlgorithm,
    SchedulingRequest,
    SchedulingView,
    overloaded,
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

    def describe(self) -> str:
        return self.name  # P2PFaaS prints no parameters for it

    async def schedule(self, request: SchedulingRequest, view: SchedulingView) -> Decision:
        if self.loss and not view.local_load().has_room:
            return overloaded()
        return Execute()
