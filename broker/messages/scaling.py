"""Pool telemetry and pulses, scale commands, policy switches, and the experiences learners learn from."""

from __future__ import annotations

import time

from pydantic import Field

from broker.messages.base import Contract, FiniteFloat


class PoolTelemetry(Contract):
    """One control-period sample of a worker pool, on ``faas.<node>.telemetry.<pool>``.

    The simulator produces the same, so the autoscaling environment observes alike offline and live."""

    node: str
    pool: str
    time: float
    period_s: float
    queue_length: int          # waiting tasks (JetStream pending + ack-pending not yet running)
    in_service: int            # tasks being executed right now
    workers_ready: int
    workers_starting: int
    workers_stopping: int = 0
    arrivals: int              # tasks that arrived in the period
    completed: int             # tasks finished in the period
    met_deadline: int          # of those, how many met their deadline
    arrival_rate: FiniteFloat        # arrivals / period_s
    throughput: FiniteFloat          # completed / period_s
    latency_mean_s: FiniteFloat
    latency_p95_s: FiniteFloat
    latency_max_s: FiniteFloat
    qos: FiniteFloat                 # met_deadline / completed (1.0 when nothing completed)


class PoolPulse(Contract):
    """A pool's state between control periods, every tick (2 s), on ``faas.<node>.pulse.<pool>``:
    what the controller's reaction between decisions reads (controller/panic.py). The simulator
    makes the same pulses."""

    node: str
    pool: str
    time: float
    window_s: float = Field(gt=0)    # since the previous pulse
    arrivals: int = Field(ge=0)      # in the window
    queue_length: int = Field(ge=0)
    workers_ready: int = Field(ge=0)
    workers_starting: int = Field(ge=0)


class ScaleCommand(Contract):
    """Target worker count for a pool, on ``faas.<node>.scale.<pool>``."""

    node: str
    pool: str
    target_workers: int = Field(ge=0, le=4096)
    reason: str = Field(default="", max_length=500)
    policy: str = Field(default="", max_length=64)
    at: float = Field(default_factory=time.time)
    model_version: str = ""       # the weights that decided an RL policy's target ("shipped", "online-<n>")


class PolicySwitch(Contract):
    """Request on ``faas.<node>.policy.<pool>``: let the pool's controller decide with another
    policy (a name ``p2pfaas controller --policy`` takes: dqn, kpa, fixed-8, ...). The controller
    answers :class:`PolicySwitched`, or an ``ErrorBody`` with ``X-P2pfaas-Status: 400`` for a
    policy it cannot run (unknown name, no trained model); nobody answering means no controller."""

    node: str
    pool: str
    policy: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    requested_by: str = ""


class PolicySwitched(Contract):
    """Answer of a :class:`PolicySwitch`: the policy now deciding and the one it replaced."""

    node: str
    pool: str
    policy: str
    previous: str = ""
    note: str = ""          # e.g. where an RL policy was loaded from


class SchedulingExperience(Contract):
    """P2PFaaS learner sample on ``faas.<node>.reward``."""

    eid: int
    state: list[float]
    action: int
    reward: float
    node: str = ""

    @property
    def msg_id(self) -> str:
        """Its JetStream message id: the reward stream keeps one sample per EID, whoever sends it."""
        return f"reward.{self.node}.{self.eid}"


class ScalingExperience(Contract):
    """Autoscaling transition on ``faas.<node>.experience.<pool>``."""

    node: str
    pool: str
    observation: list[FiniteFloat]
    action: int
    reward: FiniteFloat
    next_observation: list[FiniteFloat]
    done: bool = False
    policy: str = ""
    at: float = Field(default_factory=time.time)
