"""P2PFaaS power-of-N choices: ``PowerOfNScheduler [F, T, loss, maxHops]`` and its tau variant."""

from __future__ import annotations

import asyncio
import random
import re
import time
from fractions import Fraction
from typing import Awaitable, Callable, Sequence

from nodes.scheduler.base import (
    Decision,
    Forward,
    LocalLoad,
    SchedulingAlgorithm,
    SchedulingRequest,
    SchedulingView,
    parse_bool,
)
from nodes.scheduler.forward import forwardable_peers, may_forward, parse_uint, run_locally

MAX_TAU_NS = 10_000_000_000   # PowerOfNSchedulerTau's tau: a slower network's probing, emulated (P2PFaaS: 100ms)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign, as Go accepts
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_go_duration(text: str) -> int:
    """Nanoseconds of a Go duration string (``time.ParseDuration``): ``100ms``, ``1.5s``, ``1m30s``."""
    s = text.strip()
    sign = 1
    if s[:1] in ("+", "-"):
        sign, s = (-1 if s[0] == "-" else 1), s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = Fraction(0)
    pos = 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None:
            raise ValueError(
                f"invalid duration {text!r}: expected numbers with units ns, us, ms, s, m, h (e.g. 100ms)"
            )
        total += Fraction(m.group(1)) * _NS_PER_UNIT[m.group(2)]
        pos = m.end()
    return sign * int(total)  # Go truncates sub-nanosecond fractions


def format_go_duration(ns: int) -> str:
    """Canonical text of a duration: whole milliseconds as P2PFaaS prints them (``100ms``), else us/ns."""
    if ns % 1_000_000 == 0:
        return f"{ns // 1_000_000}ms"
    if ns % 1_000 == 0:
        return f"{ns // 1_000}us"
    return f"{ns}ns"


class PowerOfNScheduler(SchedulingAlgorithm):
    """Probe F random peers when our load (running + queued) is at least T.

    * probes run in parallel; a failed probe counts as a fully loaded peer, never an idle one;
    * forward to the least loaded probed peer (ties at random) if strictly below ours, else stay;
    * staying with ``loss`` on and no room here means Reject.
    """

    name = "PowerOfNScheduler"
    DEFAULTS = ("1", "2", "true", "1")

    def __init__(
        self,
        fanout: int = 1,
        threshold: int = 2,
        loss: bool = True,
        max_hops: int = 1,
        *,
        rng: random.Random | None = None,
        clock: Clock = time.perf_counter,
    ) -> None:
        if fanout < 1:
            raise ValueError(f"F (fan-out) must be >= 1, got {fanout}")
        if threshold < 0 or max_hops < 0:
            raise ValueError("T and maxHops must be >= 0")
        self.fanout = fanout
        self.threshold = threshold
        self.loss = loss
        self.max_hops = max_hops
        self.rng = rng or random.Random()
        self.clock = clock

    @classmethod
    def _parse_common(cls, parameters: Sequence[str]) -> tuple[int, int, bool, int]:
        return (
            parse_uint(parameters[0], "F (fan-out)", minimum=1),
            parse_uint(parameters[1], "T (threshold)"),
            parse_bool(parameters[2]),
            parse_uint(parameters[3], "maxHops"),
        )

    @classmethod
    def from_parameters(
        cls, parameters: Sequence[str], *, rng: random.Random | None = None
    ) -> "PowerOfNScheduler":
        params = list(parameters) or list(cls.DEFAULTS)
        if len(params) != 4:
            raise ValueError(f"PowerOfNScheduler takes [F, T, loss, maxHops], got {list(parameters)!r}")
        return cls(*cls._parse_common(params), rng=rng)

    def parameters(self) -> list[str]:
        return [str(self.fanout), str(self.threshold), str(self.loss).lower(), str(self.max_hops)]

    def own_load(self, local: LocalLoad) -> int:
        """The load compared with T and with the probed peers."""
        return local.running + local.queued

    async def after_probing(self, probe_started: float) -> None:
        """Hook run once the probes are back (the tau variant pads here)."""

    async def schedule(self, request: SchedulingRequest, view: SchedulingView) -> Decision:
        load = self.own_load(view.local_load())
        if load < self.threshold or not may_forward(request, self.max_hops):
            return run_locally(view, self.loss)
        candidates = forwardable_peers(request, view)
        if not candidates:
            return run_locally(view, self.loss)

        probed = self.rng.sample(candidates, min(self.fanout, len(candidates)))
        started = self.clock()
        answers = await asyncio.gather(*(view.probe(p) for p in probed), return_exceptions=True)
        probing_s = self.clock() - started
        await self.after_probing(started)

        loads = {p: a for p, a in zip(probed, answers) if isinstance(a, int) and not isinstance(a, bool)}
        if loads:
            best = min(loads.values())
            if best < load:
                peer = self.rng.choice([p for p in probed if loads.get(p) == best])
                return Forward(peer, probing_s=probing_s)
        return run_locally(view, self.loss, probing_s=probing_s)


class PowerOfNSchedulerTau(PowerOfNScheduler):
    """Power-of-N counting running functions only, with probing padded to last at least tau (a
    slower network); ``probing_s`` keeps the measured probe time (as P2PFaaS)."""

    name = "PowerOfNSchedulerTau"
    DEFAULTS = ("1", "2", "true", "1", "100ms")

    def __init__(
        self,
        fanout: int = 1,
        threshold: int = 2,
        loss: bool = True,
        max_hops: int = 1,
        tau_ns: int = 100_000_000,
        *,
        rng: random.Random | None = None,
        clock: Clock = time.perf_counter,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        super().__init__(fanout, threshold, loss, max_hops, rng=rng, clock=clock)
        if tau_ns < 0:
            raise ValueError(f"tau must not be negative, got {format_go_duration(tau_ns)}")
        if tau_ns > MAX_TAU_NS:   # it pads every probing decision: an hour would hold every call an hour
            raise ValueError(f"tau must be at most {format_go_duration(MAX_TAU_NS)} (every probing decision "
                             f"lasts at least tau), got {format_go_duration(tau_ns)}")
        self.tau_ns = tau_ns
        self.sleep = sleep

    @property
    def tau_s(self) -> float:
        return self.tau_ns / 1e9

    @classmethod
    def from_parameters(
        cls, parameters: Sequence[str], *, rng: random.Random | None = None
    ) -> "PowerOfNSchedulerTau":
        params = list(parameters) or list(cls.DEFAULTS)
        if len(params) != 5:
            raise ValueError(
                f"PowerOfNSchedulerTau takes [F, T, loss, maxHops, tau], got {list(parameters)!r}"
            )
        tau_ns = parse_go_duration(params[4])
        if tau_ns < 0:
            raise ValueError(f"tau must not be negative, got {params[4]!r}")
        return cls(*cls._parse_common(params[:4]), tau_ns, rng=rng)

    def parameters(self) -> list[str]:
        return [*super().parameters(), format_go_duration(self.tau_ns)]

    def own_load(self, local: LocalLoad) -> int:
        return local.running

    async def after_probing(self, probe_started: float) -> None:
        remaining = self.tau_s - (self.clock() - probe_started)
        if remaining > 0:
            await self.sleep(remaining)
