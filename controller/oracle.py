"""The hindsight references every scaling policy is measured against: the instant-resize oracle
(knows each step's arrival rate, no cold starts), the lookahead oracle (knows the rates as far as
the longest cold start reaches, pays every cold start) and the best fixed pool (``smallest_passing``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from broker.messages import PoolTelemetry
from controller.features import staffing
from controller.scenario import Scenario
from controller.simulator import FarmSimulator

RATE_SAMPLES = 32          # points of the rate function averaged over a step
ORACLE_BETAS: tuple[float, ...] = tuple(b / 4 for b in range(0, 25))   # 0, 0.25, .. 6


class InstantResizeOracle:
    """Square-root staffing of the coming step's known load plus the backlog, on a farm that
    resizes instantly (``SimulatedFarm(instant=True)``); ``beta`` is tuned by ``tune_oracle``."""

    instant_resize = True
    horizon_steps = 1   # steps ahead whose arrival rate it knows; it sizes for the busiest

    def __init__(self, scenario: Scenario, beta: float = 1.0, name: str | None = None) -> None:
        self.scenario, self.beta = scenario, beta
        self.name = name or f"oracle (beta {beta:g})"
        self.simulator: FarmSimulator | None = None

    def bind(self, simulator: FarmSimulator) -> None:
        """The simulator of the episode about to run (its drawn arrivals are the oracle's knowledge)."""
        self.simulator = simulator

    def reset(self) -> None:
        pass

    def decide(self, t: PoolTelemetry, current_target: int) -> int:
        if self.simulator is None:
            raise RuntimeError("the oracle needs the simulator: evaluation.run_episode binds it")
        sc, now = self.scenario, self.simulator.now
        offsets = sc.step_seconds * (np.arange(RATE_SAMPLES) + 0.5) / RATE_SAMPLES
        peak = max(float(sc.rate_at(now + k * sc.step_seconds + offsets).mean()) for k in range(self.horizon_steps))
        need = peak * sc.mean_service_s + t.queue_length * sc.mean_service_s / sc.step_seconds
        return staffing(need, self.beta)


def longest_delay(delay) -> float:
    """The longest draw of a cold-start delay (a number, or the top of its distribution)."""
    if isinstance(delay, (int, float)):
        return float(delay)
    return float(getattr(delay, "high", getattr(delay, "value", 0.0)))


class LookaheadOracle(InstantResizeOracle):
    """Sizes for the busiest step that workers started now could still serve (the next one and
    every one the longest cold start reaches into), on the farm with cold starts."""

    instant_resize = False

    def __init__(self, scenario: Scenario, beta: float = 1.0, name: str | None = None) -> None:
        super().__init__(scenario, beta, name or f"lookahead oracle (beta {beta:g})")
        self.horizon_steps = 1 + int(np.ceil(longest_delay(scenario.cold_start_seconds) / scenario.step_seconds))


def smallest_passing(candidates: Sequence, passes: Callable[[object], bool]):
    """The first candidate that passes, by bisection (``passes`` must be monotone); None if none does."""
    low, high, found = 0, len(candidates) - 1, None
    while low <= high:
        middle = (low + high) // 2
        if passes(candidates[middle]):
            found, high = candidates[middle], middle - 1
        else:
            low = middle + 1
    return found
