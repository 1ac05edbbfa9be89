"""Reaction between control periods: Knative's panic mode, for a pool whose policy decides once
per period.

Every ``tick_s`` (a ``PoolPulse``: the arrivals since the last tick, the queue, the workers) the
rule estimates the workers the pool needs now, ``need = rate x S + queue x S / period`` (S the
scenario's mean service time: the queue drained within one period). When that is at least
``threshold`` x the workers it has (ready + starting; Knative panics at 200 %), it raises the
target at once to the square-root staffing of the need, ``ceil(need + sqrt(need))``, clamped to
the pool's bounds. It never lowers a target: the policy does that at its next decision, with a
whole period's telemetry. The simulator (training and evaluation) and the live controller run
this same rule on the same pulses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.messages import PoolPulse
from controller.scenario import Scenario

TICK_S = 2.0          # Knative's autoscaler tick
THRESHOLD = 2.0       # Knative's panic threshold: 200 % of the capacity there is


@dataclass(frozen=True)
class PanicRule:
    scenario: Scenario
    tick_s: float = TICK_S
    threshold: float = THRESHOLD

    def need(self, pulse: PoolPulse) -> float:
        service = self.scenario.mean_service_s
        rate = pulse.arrivals / pulse.window_s if pulse.window_s > 0 else 0.0
        return rate * service + pulse.queue_length * service / self.scenario.step_seconds

    def react(self, pulse: PoolPulse, target: int) -> int | None:
        """A higher target when the pool panics, else None."""
        need = self.need(pulse)
        capacity = max(1, pulse.workers_ready + pulse.workers_starting)
        if need < self.threshold * capacity:
            return None
        raised = min(self.scenario.workers.max, math.ceil(need + math.sqrt(need)))
        return raised if raised > target else None
