"""Scaling policies: the paper's reactive controllers, KEDA, Knative KPA, Kubernetes HPA, a fixed
pool, and ``RLPolicy`` for an RL agent; each maps a period's telemetry and the current target to a
target. The reactive ones take the mean service time from the scenario (as the paper's did) or,
with ``estimate_service``, by Little's law; KEDA, KPA and HPA need none, like the real ones."""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol, runtime_checkable

import numpy as np

from broker.messages import PoolTelemetry
from controller.features import ObservationBuilder, ScalingActions, observation_size
from controller.scenario import Scenario


@runtime_checkable
class ScalingPolicy(Protocol):
    name: str

    def reset(self) -> None:
        ...

    def decide(self, t: PoolTelemetry, current_target: int) -> int:
        """The workers wanted after this period (the caller clamps to the bounds)."""
        ...


class ServiceTimeEstimate:
    """The mean service time: fixed, or an exponentially smoothed Little's-law estimate."""

    def __init__(self, fixed_s: float | None, prior_s: float, smoothing: float = 0.3) -> None:
        self.fixed_s, self.prior_s, self.smoothing = fixed_s, prior_s, smoothing
        self.reset()

    def reset(self) -> None:
        self.value = self.fixed_s if self.fixed_s is not None else self.prior_s

    def update(self, t: PoolTelemetry) -> float:
        if self.fixed_s is None and t.throughput > 0 and t.in_service > 0:
            sample = t.in_service / t.throughput
            self.value += self.smoothing * (sample - self.value)
        return self.value


class ScaleDownStabilisation:
    """Kubernetes': up at once, down only to the highest recommendation of the last ``window_s``."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.history: deque[tuple[float, int]] = deque()

    def reset(self) -> None:
        self.history.clear()

    def apply(self, now: float, desired: int, current: int) -> int:
        self.history.append((now, desired))
        while self.history[0][0] < now - self.window_s:
            self.history.popleft()
        if desired > current:
            return desired
        return min(current, max(r for _, r in self.history))


class _Baseline:
    name = "baseline"

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario

    def reset(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class Reactive(_Baseline):
    """``ceil(arrival rate x task time + queue x service / step)``, the task time the period's mean
    (``on="mean"``) or max latency: the paper's two reactive controllers."""

    def __init__(self, scenario: Scenario, on: str = "mean", estimate_service: bool = False) -> None:
        super().__init__(scenario)
        if on not in {"mean", "max"}:
            raise ValueError(f"on must be 'mean' or 'max', got {on!r}")
        self.on = on
        self.name = "reactive-avg" if on == "mean" else "reactive-max"
        fixed = None if estimate_service else scenario.mean_service_s
        self.service = ServiceTimeEstimate(fixed, prior_s=scenario.mean_service_s)

    def reset(self) -> None:
        self.service.reset()

    def decide(self, t: PoolTelemetry, current_target: int) -> int:
        service = self.service.update(t)
        task_time = (t.latency_mean_s if self.on == "mean" else t.latency_max_s) if t.completed else service
        return math.ceil(t.arrival_rate * task_time + t.queue_length * service / self.scenario.step_seconds)


class KedaLag(_Baseline):
    """KEDA's NATS JetStream scaler: ``ceil(lag / lag_threshold)``, lag = queued + in service (the
    minimum up to ``activation``), with the HPA's 300 s scale-down stabilisation."""

    name = "keda"

    def __init__(self, scenario: Scenario, lag_threshold: float = 10, activation: int = 0, stabilisation_s: float = 300) -> None:
        super().__init__(scenario)
        self.lag_threshold, self.activation = lag_threshold, activation
        self.stabilisation = ScaleDownStabilisation(stabilisation_s)

    def reset(self) -> None:
        super().reset()
        self.stabilisation.reset()

    def decide(self, t: PoolTelemetry, current_target: int) -> int:
        lag = t.queue_length + t.in_service
        desired = math.ceil(lag / self.lag_threshold) if lag > self.activation else self.scenario.workers.min
        return self.stabilisation.apply(t.time, desired, current_target)


class KnativeKPA(_Baseline):
    """Knative's KPA on concurrency (queued + in service): ``ceil(average / (concurrency x utilisation))``
    over the 60 s stable window, or the 6 s panic window (only the latest sample with longer periods)
    once that wants 2x the ready workers; panic never scales down and ends a stable window after its
    condition does. Down by at most ready / 2 per decision."""

    name = "kpa"

    def __init__(
        self,
        scenario: Scenario,
        container_concurrency: float = 1.0,
        target_utilisation: float = 0.7,
        stable_window_s: float = 60.0,
        panic_window_s: float = 6.0,
        panic_threshold: float = 2.0,
        max_scale_down_rate: float = 2.0,
        max_scale_up_rate: float = 1000.0,
    ) -> None:
        super().__init__(scenario)
        self.target = container_concurrency * target_utilisation
        self.stable_window_s, self.panic_window_s = stable_window_s, panic_window_s
        self.panic_threshold = panic_threshold
        self.max_scale_down_rate, self.max_scale_up_rate = max_scale_down_rate, max_scale_up_rate
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.samples: deque[tuple[float, int]] = deque()
        self.panic_since: float | None = None

    def _average(self, now: float, window_s: float) -> float:
        recent = [c for at, c in self.samples if at > now - window_s] or [self.samples[-1][1]]
        return sum(recent) / len(recent)

    def decide(self, t: PoolTelemetry, current_target: int) -> int:
        now = t.time
        self.samples.append((now, t.queue_length + t.in_service))
        while self.samples[0][0] <= now - self.stable_window_s:
            self.samples.popleft()
        stable = math.ceil(self._average(now, self.stable_window_s) / self.target)
        panic = math.ceil(self._average(now, self.panic_window_s) / self.target)
        ready = max(t.workers_ready, 1)
        if panic / ready >= self.panic_threshold:
            self.panic_since = now  # entering, or extending, panic mode
        elif self.panic_since is not None and now - self.panic_since >= self.stable_window_s:
            self.panic_since = None
        desired = max(panic, current_target) if self.panic_since is not None else stable
        low = math.ceil(ready / self.max_scale_down_rate)
        high = math.ceil(ready * self.max_scale_up_rate)
        return min(high, max(low, desired))


class HorizontalPodAutoscaler(_Baseline):
    """Kubernetes HPA on utilisation (busy / target workers; starting ones idle, like unready pods):
    ``ceil(current x utilisation / target)`` outside the 0.1 tolerance, 300 s down-stabilisation."""

    name = "hpa"

    def __init__(self, scenario: Scenario, target_utilisation: float = 0.8, tolerance: float = 0.1, stabilisation_s: float = 300) -> None:
        super().__init__(scenario)
        self.target_utilisation, self.tolerance = target_utilisation, tolerance
        self.stabilisation = ScaleDownStabilisation(stabilisation_s)

    def reset(self) -> None:
        super().reset()
        self.stabilisation.reset()

    def decide(self, t: PoolTelemetry, current_target: int) -> int:
        current = max(current_target, 1)
        ratio = (t.in_service / current) / self.target_utilisation
        desired = current_target if abs(ratio - 1.0) <= self.tolerance else math.ceil(current * ratio)
        return self.stabilisation.apply(t.time, desired, current_target)


class FixedSize(_Baseline):
    """A pool that never scales (``workers`` defaults to the scenario's initial size)."""

    def __init__(self, scenario: Scenario, workers: int | None = None) -> None:
        super().__init__(scenario)
        self.workers = scenario.workers.initial if workers is None else workers
        self.name = "fixed" if workers is None else f"fixed-{workers}"

    def decide(self, t: PoolTelemetry, current_target: int) -> int:
        return self.workers


class RLPolicy:
    """An agent (``act(obs, explore) -> action``) as a ``ScalingPolicy``; keeps the last observation
    and action for the live controller's experiences, ``version`` names the weights deciding."""

    def __init__(self, name: str, agent, scenario: Scenario, actions: ScalingActions | str = "unit",
                 explore: bool = False, version: str = "") -> None:
        self.actions = actions if isinstance(actions, ScalingActions) else ScalingActions(actions)
        n_actions = getattr(agent, "n_actions", self.actions.n)
        if n_actions != self.actions.n:
            raise ValueError(f"{name}: the agent has {n_actions} actions, action mode {self.actions.mode!r} {self.actions.n}")
        self.name, self.agent, self.scenario, self.explore, self.version = name, agent, scenario, explore, version
        self.observe = ObservationBuilder(scenario, observation_size(agent))
        self.last_observation: np.ndarray | None = None
        self.last_action: int | None = None

    def reset(self) -> None:
        self.observe.reset()
        self.last_observation, self.last_action = None, None

    @property
    def learns_online(self) -> bool:
        """Its weights can seed the node's learner (not a Stable-Baselines3 model's)."""
        return getattr(self.agent, "online", True)

    def rebind(self, scenario: Scenario) -> None:
        """Decide on ``scenario`` from the next ``reset()`` on (an online run changes workloads)."""
        self.scenario, self.observe = scenario, ObservationBuilder(scenario, self.observe.size)

    def decide(self, t: PoolTelemetry, current_target: int) -> int:
        obs = self.observe(t)
        action = int(self.agent.act(obs, explore=self.explore))
        self.last_observation, self.last_action = obs, action
        return self.actions.target(action, current_target, self.observe)


BASELINES = {
    "reactive-avg": lambda sc: Reactive(sc, on="mean"),
    "reactive-max": lambda sc: Reactive(sc, on="max"),
    "keda": KedaLag,
    "kpa": KnativeKPA,
    "hpa": HorizontalPodAutoscaler,
    "fixed": FixedSize,
}


def make_baseline(name: str, scenario: Scenario) -> ScalingPolicy:
    """A baseline of ``BASELINES`` (or ``fixed-<n>``) by name."""
    if name in BASELINES:
        return BASELINES[name](scenario)
    size = name.removeprefix("fixed-")
    if name.startswith("fixed-") and size.isdigit():
        return FixedSize(scenario, workers=int(size))
    raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}, fixed-<n>")
