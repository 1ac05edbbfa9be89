"""Knative's panic mode between control periods: every ``tick_s`` pulse, ``need = rate x S + queue
x S / period``; at ``threshold`` x the workers (ready + starting) the target rises at once to
``ceil(need + headroom x sqrt(need))`` (never lowered: the policy does that). The simulator and the
live controller run this same rule."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from broker.messages import PoolPulse
from controller.scenario import Scenario

TICK_S = 2.0          # Knative's autoscaler tick
# Knative panics at 200 % of the capacity there is; a surge of 1.4-2x met a lean pool for a whole
# period at that, the generated workloads' costliest episodes (docs/autoscaling.md)
THRESHOLD = 1.4
HEADROOM = 2.0        # the raised target's square-root staffing: need + 2 sqrt(need)


@dataclass(frozen=True)
class PanicRule:
    scenario: Scenario
    tick_s: float = TICK_S
    threshold: float = THRESHOLD
    headroom: float = HEADROOM

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
        raised = min(self.scenario.workers.max, math.ceil(need + self.headroom * math.sqrt(need)))
        return raised if raised > target else None


def default_settings() -> dict[str, float]:
    """The rule the simulator and the controller run unless told otherwise, as a model's sidecar records it."""
    return {f.name: f.default for f in fields(PanicRule) if f.name != "scenario"}
