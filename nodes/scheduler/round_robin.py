"""P2PFaaS ``RoundRobinWithMasterScheduler [isMaster, master, loss]``."""

from __future__ import annotations

import ipaddress
import re
from typing import Sequence

from broker import codes
from nodes.scheduler.base import (
    Decision,
    Execute,
    Forward,
    Reject,
    SchedulingAlgorithm,
    SchedulingRequest,
    SchedulingView,
    parse_bool,
)
from nodes.scheduler.forward import forwardable_peers, run_locally

_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class RoundRobinWithMasterScheduler(SchedulingAlgorithm):
    """Centralised round robin, the baseline of the P2PFaaS experiments. A slave forwards client
    requests to the master (runs them here if it is not alive) and runs forwarded ones; the master
    rejects client requests and deals forwarded ones to the next node of ``peers() + [itself]``,
    skipping nodes on the request's path. ``loss`` rejects what should run here without room.
    The master is named by node id or, as in P2PFaaS, by IP address (the view resolves it)."""

    name = "RoundRobinWithMasterScheduler"
    instant = True

    def __init__(self, is_master: bool, master: str = "", loss: bool = True) -> None:
        if master and not (_NODE_ID.fullmatch(master) or _is_ip(master)):
            raise ValueError(f"master must be a node id of [A-Za-z0-9_-]{{1,64}} or an IP address, got {master!r}")
        if not is_master and not master:
            raise ValueError("a slave (isMaster=false) needs the master's node id")
        self.is_master = is_master
        self.master = master
        self.loss = loss
        self._next = 0  # position of the next node in the dealing cycle

    @classmethod
    def from_parameters(cls, parameters: Sequence[str]) -> "RoundRobinWithMasterScheduler":
        if len(parameters) != 3:
            raise ValueError(
                "RoundRobinWithMasterScheduler takes [isMaster, master, loss], "
                f"got {list(parameters)!r}"
            )
        return cls(parse_bool(parameters[0]), parameters[1].strip(), parse_bool(parameters[2]))

    def parameters(self) -> list[str]:
        return [str(self.is_master).lower(), self.master, str(self.loss).lower()]

    async def schedule(self, request: SchedulingRequest, view: SchedulingView) -> Decision:
        if self.is_master:
            if not request.external:
                return Reject("the round-robin master only dispatches requests from its slaves",
                              code=codes.CANNOT_SCHEDULE)   # HTTP 500, not a load rejection
            return self._deal(request, view)
        master = view.resolve(self.master)
        if request.external or master == view.node_id:
            return run_locally(view, self.loss)
        if master in forwardable_peers(request, view):
            return Forward(master)
        return run_locally(view, self.loss)

    def _deal(self, request: SchedulingRequest, view: SchedulingView) -> Decision:
        cycle = [*view.peers(), view.node_id]
        allowed = set(forwardable_peers(request, view)) | {view.node_id}
        for step in range(len(cycle)):
            node = cycle[(self._next + step) % len(cycle)]
            if node in allowed:
                self._next = (self._next + step + 1) % len(cycle)
                return run_locally(view, self.loss) if node == view.node_id else Forward(node)
        return Execute()  # unreachable: this node is always in the cycle
