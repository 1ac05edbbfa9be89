"""The causal rules that are the RL policies' peers next to the baselines: each target action every
period, and square-root staffing of the recent peak need with hysteresis (docs/autoscaling.md)."""

from __future__ import annotations

import math

from controller.baselines import RLPolicy
from controller.evaluation import RULE, PolicySpec
from controller.features import ScalingActions, action_names, need_of, staffing


class Constant:
    """An 'agent' that always answers the same target action."""

    def __init__(self, action: int, n_actions: int) -> None:
        self.action, self.n_actions = action, n_actions

    def act(self, obs, explore: bool = False) -> int:
        return self.action


class Hysteresis:
    """Square-root staffing of the recent peak need, changed only when the headroom leaves a band."""

    def __init__(self, scenario, beta: float, low: float, high: float) -> None:
        self.scenario, self.beta, self.low, self.high = scenario, beta, low, high
        self.name = f"hysteresis beta {beta:g} band [{low:g}, {high:g}]"

    def reset(self) -> None:
        self.needs: list[float] = []

    def decide(self, t, current: int) -> int:
        self.needs.append(need_of(t, self.scenario))
        need = max(self.needs[-2:])
        headroom = (current - need) / math.sqrt(max(1.0, need))
        return staffing(need, self.beta) if not self.low <= headroom <= self.high else current


def rules() -> list[PolicySpec]:
    """Every causal rule, as specs built per scenario (role ``rule``)."""
    n = ScalingActions("target").n
    specs = [PolicySpec(f"always {name}", lambda sc, a=a, name=name: RLPolicy(name, Constant(a, n), sc, "target"), RULE)
             for a, name in enumerate(action_names("target")) if a > 0]
    for beta in (2.0, 3.0, 4.0):
        for low, high in ((1.0, 4.0), (1.5, 6.0)):
            specs.append(PolicySpec(f"hysteresis beta {beta:g} band [{low:g}, {high:g}]",
                                    lambda sc, b=beta, lo=low, hi=high: Hysteresis(sc, b, lo, hi), RULE))
    return specs
