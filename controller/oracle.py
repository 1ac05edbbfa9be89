"""The references every scaling policy is measured against, both chosen with hindsight:
an instant-resize oracle that knows each step's arrivals, and the best fixed pool.

* ``InstantResizeOracle``: before each step it knows the step's arrival rate (the scenario's
  rate function averaged over the step), sizes the pool by square-root staffing of that load
  plus the current backlog, and the farm it runs on resizes instantly (no cold start, no
  scale-down delay). Its one knob, ``beta``, is the smallest that reaches the QoS target on the evaluated
  episodes (``tune_oracle``): no causal policy with cold starts can do better on average.
* ``LookaheadOracle``: knows the arrival rate of the coming steps as far as the longest cold
  start reaches, but runs on the real farm (it pays every cold start and scale-down delay, as a
  policy does). The best a policy with a perfect forecast can do; what lies between it and a
  causal policy is the forecast, what lies between it and the instant oracle is the cold start.
* ``best_fixed_size``: the smallest pool that, never scaling, reaches the QoS target.
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
    """Knows the next step's arrival rate and resizes instantly (on ``SimulatedFarm(instant=True)``)."""

    instant_resize = True

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
        rate = float(sc.rate_at(now + sc.step_seconds * (np.arange(RATE_SAMPLES) + 0.5) / RATE_SAMPLES).mean())
        need = rate * sc.mean_service_s + t.queue_length * sc.mean_service_s / sc.step_seconds
        return staffing(need, self.beta)


def longest_delay(delay) -> float:
    """The longest draw of a cold-start delay (a number, or the top of its distribution)."""
    if isinstance(delay, (int, float)):
        return float(delay)
    return float(getattr(delay, "high", getattr(delay, "value", 0.0)))


class LookaheadOracle(InstantResizeOracle):
    """Sizes the pool for the busiest of the steps its new workers could still serve if started
    now (the next step and every step the longest cold start reaches into), on a farm with cold
    starts: square-root staffing of that need plus the backlog, with the same ``beta`` knob."""

    instant_resize = False

    def __init__(self, scenario: Scenario, beta: float = 1.0, name: str | None = None) -> None:
        super().__init__(scenario, beta, name or f"lookahead oracle (beta {beta:g})")
        self.horizon_steps = 1 + int(np.ceil(longest_delay(scenario.cold_start_seconds) / scenario.step_seconds))

    def decide(self, t: PoolTelemetry, current_target: int) -> int:
        if self.simulator is None:
            raise RuntimeError("the oracle needs the simulator: evaluation.run_episode binds it")
        sc, now = self.scenario, self.simulator.now
        offsets = sc.step_seconds * (np.arange(RATE_SAMPLES) + 0.5) / RATE_SAMPLES
        peak = max(float(sc.rate_at(now + k * sc.step_seconds + offsets).mean()) for k in range(self.horizon_steps))
        need = peak * sc.mean_service_s + t.queue_length * sc.mean_service_s / sc.step_seconds
        return staffing(need, self.beta)


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
