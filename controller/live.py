"""The live controller: pool telemetry in, scale commands and learning experiences out.

Every telemetry sample of ``faas.<node>.telemetry.<pool>`` is one control step:
the policy (an RL agent or a baseline, same ``ScalingPolicy`` protocol as in the
simulator) picks a target, published on ``faas.<node>.scale.<pool>``; the step
before it becomes a ``ScalingExperience`` on ``faas.<node>.experience.<pool>``
(durable), which the learner trains on.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.codec import decode, encode
from broker.errors import ContractError
from broker.messages import PoolTelemetry, ScaleCommand, ScalingExperience
from broker.subjects import Subjects
from controller.baselines import RLPolicy, ScalingPolicy
from controller.env import ACTION_DELTAS, RewardConfig, observation_from_telemetry
from controller.scenario import Scenario

log = logging.getLogger(__name__)


def action_index(delta: int, deltas: Sequence[int]) -> int:
    """The env action closest to a baseline's change of target (for experiences)."""
    return int(np.argmin([abs(d - delta) for d in deltas]))


@dataclass
class ControlStep:
    telemetry: PoolTelemetry
    target: int
    reward: float | None = None


@dataclass
class LiveController:
    nc: Client
    node: str
    pool: str
    policy: ScalingPolicy
    scenario: Scenario
    prefix: str = "faas"
    reward: RewardConfig = field(default_factory=RewardConfig)
    deltas: Sequence[int] = ACTION_DELTAS["unit"]
    policy_name: str = ""
    on_step: Callable[[ControlStep], None] | None = None   # e.g. the CLI's log line
    history: list[ControlStep] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.subjects = Subjects(self.prefix)
        self.js = self.nc.jetstream()
        self.target = self.scenario.workers.initial
        self._previous: tuple[np.ndarray, int, bool] | None = None
        self._sub = None
        self._lock = asyncio.Lock()
        self.stepped = asyncio.Event()

    async def start(self) -> "LiveController":
        self.policy.reset()
        await self._publish_target("initial")
        self._sub = await self.nc.subscribe(self.subjects.telemetry(self.node, self.pool), cb=self._on_telemetry)
        return self

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def __aenter__(self) -> "LiveController":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _on_telemetry(self, msg: Msg) -> None:
        try:
            telemetry = decode(PoolTelemetry, msg.data)
        except ContractError as exc:
            log.warning("controller: bad telemetry on %s: %s", msg.subject, exc)
            return
        async with self._lock:  # one step at a time, in order
            await self.step(telemetry)

    async def step(self, telemetry: PoolTelemetry) -> int:
        bounds = self.scenario.workers
        obs = observation_from_telemetry(telemetry, self.scenario)
        wanted = self.policy.decide(telemetry, self.target)
        target = min(bounds.max, max(bounds.min, int(wanted)))
        action = (self.policy.last_action if isinstance(self.policy, RLPolicy) and self.policy.last_action is not None
                  else action_index(target - self.target, self.deltas))
        changed = target != self.target
        reward = None
        if self._previous is not None:
            # the previous decision's outcome is this period's telemetry
            prev_obs, prev_action, prev_changed = self._previous
            reward = self.reward.reward(telemetry, bounds.max, prev_changed)
            experience = ScalingExperience(node=self.node, pool=self.pool, observation=prev_obs.tolist(),
                                           action=prev_action, reward=reward, next_observation=obs.tolist(),
                                           policy=self.policy_name)
            try:
                await self.js.publish(self.subjects.experience(self.node, self.pool), encode(experience), timeout=2.0)
            except Exception as exc:  # learning data is best effort; control goes on
                log.warning("controller: experience not stored: %s", exc)
        self._previous = (obs, action, changed)
        self.target = target
        self.history.append(ControlStep(telemetry, target, reward))
        await self._publish_target("changed" if changed else "kept")
        if self.on_step is not None:
            self.on_step(self.history[-1])
        self.stepped.set()
        return target

    async def _publish_target(self, reason: str) -> None:
        command = ScaleCommand(node=self.node, pool=self.pool, target_workers=self.target,
                               reason=reason, policy=self.policy_name)
        await self.nc.publish(self.subjects.scale(self.node, self.pool), encode(command))
