"""The fault suite's harness (``bench/faults.py``, ``tests/faults``): ``p2pfaas up`` under a
steady open-loop load on every transport while its parts are killed one at a time."""

from fault_suite.faults import Fault, all_faults
from fault_suite.report import print_reports, verdict
from fault_suite.runner import FaultReport, Options, run_session

__all__ = ["Fault", "FaultReport", "Options", "all_faults", "plan", "print_reports", "run_session", "verdict"]


def plan(names: list[str], share_stack: bool) -> list[tuple[str, list[Fault]]]:
    """Sessions (an ``up --mqtt`` mode and the faults run on one stack, in order): each fault in
    each of its modes on a fresh stack, or, with ``share_stack``, one stack per mode for every
    fault that needs no tmpfs (the disk fault always gets its own)."""
    faults = all_faults()
    chosen = [faults[n] for n in names]
    if not share_stack:
        return [(mode, [f]) for f in chosen for mode in f.modes]
    out: list[tuple[str, list[Fault]]] = []
    for mode in ("nats", "mosquitto"):
        shared = [f for f in chosen if mode in f.modes and not f.tmpfs]
        if shared:
            out.append((mode, shared))
    out += [(mode, [f]) for f in chosen if f.tmpfs for mode in f.modes]
    return out
