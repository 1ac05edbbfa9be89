"""The live controller: each telemetry sample of a pool is one control step. The policy's target
goes out as a ``ScaleCommand`` (with the deciding model version), the step before it as a durable
``ScalingExperience`` for the node's learner; an RL policy's weights follow the learner under a
``ModelGuard``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg

from broker import headers as H
from broker.lifecycle import cancel_and_wait, still_wanted
from broker.codec import decode, encode
from broker.errors import ContractError
from broker.messages import (ErrorBody, LearnerWeights, PolicySwitch, PolicySwitched, PoolPulse, PoolTelemetry, ScaleCommand,
                             ScalingExperience)
from broker.subjects import Subjects, scaling_model
from controller.baselines import RLPolicy, ScalingPolicy
from controller.features import OBSERVATION_FIELDS, ObservationBuilder, RewardConfig, ScalingActions
from controller.online import ONLINE_OVERRIDES, ModelGuard, online_weights
from controller.panic import PanicRule
from controller.scenario import Scenario

log = logging.getLogger(__name__)

HISTORY_KEPT = 1000   # control steps kept in memory (~1.7 kB each; a controller runs for days)

@dataclass
class ControlStep:
    telemetry: PoolTelemetry
    target: int
    reward: float | None = None
    model_version: str = ""


def experience_fields(policy: ScalingPolicy) -> int:
    """The observation fields of ``policy``'s experiences: an RL model's own, all for a baseline."""
    return policy.observe.size if isinstance(policy, RLPolicy) else len(OBSERVATION_FIELDS)


@dataclass
class LiveController:
    nc: Client
    node: str
    pool: str
    policy: ScalingPolicy
    scenario: Scenario
    prefix: str = "faas"
    reward: RewardConfig = field(default_factory=RewardConfig)
    actions: ScalingActions | None = None    # default: the RL policy's, else "target"
    policy_name: str = ""
    on_step: Callable[[ControlStep], None] | None = None   # e.g. the CLI's log line
    on_panic: Callable[[PoolPulse, int, int], None] | None = None   # (pulse, old target, new): the CLI's line
    history: deque[ControlStep] = field(default_factory=lambda: deque(maxlen=HISTORY_KEPT))
    learn_online: bool = True                # RL policies: seed the learner, pull its weights, guard them
    guard_options: dict[str, Any] = field(default_factory=dict)   # ModelGuard keyword arguments
    models_dir: Path = Path("data/models")  # where a policy switched to at run time is looked up
    learner_retry_s: float = 30.0            # a learner that did not answer is asked again this often
    silence_s: float | None = None           # no telemetry this long is said (default: 3 control periods)
    react_between_periods: bool | None = None   # the panic rule on the pool's pulses; None: for RL policies

    def __post_init__(self) -> None:
        self.subjects = Subjects(self.prefix)
        self.js = self.nc.jetstream()
        self.target = self.scenario.workers.initial   # until the pool's first telemetry says how large it is
        self._adopted = False
        rl = isinstance(self.policy, RLPolicy)
        if self.actions is None:
            self.actions = self.policy.actions if rl else ScalingActions("target")
        self.observe = ObservationBuilder(self.scenario, experience_fields(self.policy))
        self.guard = (ModelGuard(self.policy, **self._guard_options)
                      if rl and self.learn_online and self.policy.learns_online else None)
        self.local = None
        self.learner_note = ""
        self._previous: tuple[np.ndarray, int, bool] | None = None
        self._sub = None
        self._switch_sub = None
        self._pulse_sub = None
        self.panic = PanicRule(self.scenario)
        self.panics = 0            # targets raised between decisions
        self._reseeding = False
        self._learner_tried_at: float | None = None   # loop time of the last try that found no learner
        self._connecting = False
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        if self.silence_s is None:
            self.silence_s = 3 * self.scenario.step_seconds
        self._heard_at = 0.0       # loop time of the last telemetry (or of the start)
        self._silent = False       # the silence has been said
        self._watch: asyncio.Task | None = None

    @property
    def model_version(self) -> str:
        return getattr(self.policy, "version", "")

    async def start(self) -> "LiveController":
        self.policy.reset()
        self.observe.reset()
        if self.guard is not None:
            await self._connect_learner()
        # no target of our own yet: a restarted controller takes the pool over at its first telemetry's
        # size, instead of cutting it back to the initial size and cold-starting the difference again
        self._sub = await self.nc.subscribe(self.subjects.telemetry(self.node, self.pool), cb=self._on_telemetry)
        self._switch_sub = await self.nc.subscribe(self.subjects.pool_policy(self.node, self.pool), cb=self._on_switch)
        self._pulse_sub = await self.nc.subscribe(self.subjects.pulse(self.node, self.pool), cb=self._on_pulse)
        self._heard_at = asyncio.get_running_loop().time()
        self._watch = asyncio.create_task(self._watch_silence(), name=f"controller-{self.node}-{self.pool}-silence")
        return self

    async def stop(self) -> None:
        for sub in (self._sub, self._switch_sub, self._pulse_sub):
            if sub is not None:
                await sub.unsubscribe()
        self._sub = self._switch_sub = self._pulse_sub = None
        await cancel_and_wait(self._watch)
        self._watch = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.local is not None:
            await self.local.stop()
            self.local = None

    async def __aenter__(self) -> "LiveController":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the learner ----------------------------------------------------------------
    async def _connect_learner(self, retry: bool = False) -> None:
        """Seed the pool's learner model with our weights unless a controller seeded it, then follow
        its publications. Without a learner our weights decide; asked again every ``learner_retry_s``."""
        from nodes.learner.client import LearnerError, LocalPolicy, RemotePolicy

        model = scaling_model(self.pool)
        remote = RemotePolicy(self.nc, self.node, model, prefix=self.prefix, timeout_s=5.0)
        guard, agent = self.guard, self.policy.agent   # a policy switch may replace them while the learner answers
        self._learner_tried_at = None
        local, adopted = None, False
        try:
            try:
                current = await remote.weights()
                # seeded by a controller (its online settings), not made by the learner from its defaults
                compatible = (current.algorithm, current.obs_dim, current.n_actions) == \
                             (agent.algorithm, agent.obs_dim, agent.n_actions) and \
                    all(current.config.get(k) == v for k, v in ONLINE_OVERRIDES.get(agent.algorithm, {}).items())
            except LearnerError as exc:
                if exc.status != 404:
                    raise
                compatible = False
            if self.guard is not guard:   # switched meanwhile: the new policy seeds the learner itself
                return
            if not compatible:
                stats = await remote.set_weights(online_weights(self.node, self.pool, agent))
                guard.floor_version = stats.experiences
            local = LocalPolicy(self.nc, self.node, model, prefix=self.prefix, on_update=self._on_weights)
            await local.start()
            if self.guard is guard:
                self.local, adopted = local, True
        except Exception as exc:   # LearnerError, a broker error: the policy's own weights go on deciding
            if self.guard is guard:
                self._learner_tried_at = asyncio.get_running_loop().time()
                if not retry:   # said once, not every retry
                    self.learner_note = (f"no online learning: the learner of {self.node} did not answer ({exc}); "
                                         f"asked again every {self.learner_retry_s:g} s")
                    log.warning("controller %s/%s: %s", self.node, self.pool, self.learner_note)
            return
        finally:
            if local is not None and not adopted:   # failed half-way, cancelled (stop), or another policy decides now
                with contextlib.suppress(Exception):   # the connection going: nothing more comes on it anyway
                    await local.stop()
        if not adopted:
            return
        self.learner_note = f"learning online through {self.node}'s learner (model {model})"
        if retry:   # the counterpart of the warning that said it did not answer
            log.warning("controller %s/%s: the learner answers now: %s", self.node, self.pool, self.learner_note)

    async def _retry_learner(self) -> None:
        self._connecting = True
        try:
            await self._connect_learner(retry=True)
        finally:
            self._connecting = False

    def _on_weights(self, weights: LearnerWeights, agent: Any) -> None:
        if self.guard is not None and (weights.algorithm, weights.n_actions) == (self.policy.agent.algorithm,
                                                                                 self.policy.agent.n_actions):
            self.guard.offer(agent, weights.version)

    async def _reseed_learner(self) -> None:
        from nodes.learner.client import RemotePolicy

        guard = self.guard   # a policy switch may replace it while the learner answers
        if guard is None:
            return
        self._reseeding = True
        try:
            remote = RemotePolicy(self.nc, self.node, scaling_model(self.pool), prefix=self.prefix, timeout_s=5.0)
            stats = await remote.set_weights(online_weights(self.node, self.pool, guard.anchor))
        except Exception as exc:  # LearnerError, a broker error: the known-good weights decide, tried again
            log.warning("controller %s/%s: learner not reset to the known-good weights (tried again next period): %s",
                        self.node, self.pool, exc)
            return
        finally:
            self._reseeding = False
        if self.guard is guard:   # else another policy decides now and has seeded the learner itself
            guard.reseeded(stats.experiences)

    # -- switching policy at run time (the dashboard's control) -------------------------
    async def _on_switch(self, msg: Msg) -> None:
        """Answers ``PolicySwitched`` once the new policy decides, or 400 and the old one keeps deciding."""
        from controller.policies import resolve_policy

        try:
            switch = decode(PolicySwitch, msg.data)
            if (switch.node, switch.pool) != (self.node, self.pool):
                raise ValueError(f"this controller scales {self.node}/{self.pool}, not {switch.node}/{switch.pool}")
            policy, name, note = await asyncio.to_thread(resolve_policy, switch.policy, self.scenario, self.models_dir)
        except (ContractError, ValueError) as exc:
            log.warning("controller %s/%s: policy switch refused: %s", self.node, self.pool, exc)
            return await self._reply(msg, 400, encode(ErrorBody(code=400, message=str(exc))))
        async with self._lock:   # between two control steps
            previous = self.policy_name
            try:
                await self._use(policy, name)
            except Exception as exc:   # a bug: the asker hears it, not a timeout
                log.exception("controller %s/%s: switch to %s failed", self.node, self.pool, name)
                return await self._reply(msg, 500, encode(ErrorBody(code=500, message=(
                    f"switch to {name} failed: {type(exc).__name__}: {exc}; deciding now: {self.policy_name}"))))
        log.info("controller %s/%s: policy %s -> %s (asked by %s)", self.node, self.pool, previous, name,
                 switch.requested_by or "?")
        notes = "; ".join(n for n in (note, self.learner_note) if n)
        await self._reply(msg, 200, encode(PolicySwitched(node=self.node, pool=self.pool, policy=name,
                                                          previous=previous, note=notes)))

    async def _use(self, policy: ScalingPolicy, name: str) -> None:
        """Decide with ``policy`` from the next period on; no experience pairs the two policies' steps."""
        local, self.local = self.local, None
        rl = isinstance(policy, RLPolicy)
        self.policy, self.policy_name = policy, name
        self.actions = policy.actions if rl else ScalingActions("target")
        size = experience_fields(policy)
        if size != self.observe.size:   # its experiences carry the new model's own fields
            self.observe = ObservationBuilder(self.scenario, size)
        self.guard = ModelGuard(policy, **self._guard_options) if rl and self.learn_online and policy.learns_online \
            else None
        self.learner_note = ""
        self._previous = None
        policy.reset()
        if local is not None:   # the old policy's weights subscription
            try:
                await local.stop()
            except Exception as exc:  # the connection is going: nothing more will come on it anyway
                log.warning("controller %s/%s: the old policy's weights subscription: %r", self.node, self.pool, exc)
        if self.guard is not None:
            await self._connect_learner()   # never fails: without a learner the policy's weights decide

    @property
    def _guard_options(self) -> dict[str, Any]:
        return {"miss_cost": self.reward.miss_cost, **self.guard_options}

    async def _reply(self, msg: Msg, status: int, body: bytes) -> None:
        if not msg.reply:
            return
        try:
            await self.nc.publish(msg.reply, body, headers={H.STATUS: str(status)})
        except Exception as exc:  # the connection is gone: the asker's timeout tells it
            log.warning("controller %s/%s: policy switch answer not sent: %r", self.node, self.pool, exc)

    # -- control steps ----------------------------------------------------------------
    async def _watch_silence(self) -> None:
        """Say once when the pool's telemetry stops (or never comes): nothing is decided then."""
        loop = asyncio.get_running_loop()
        while True:
            still_wanted()
            wait_s = self._heard_at + self.silence_s - loop.time()
            await asyncio.sleep(wait_s if wait_s > 0 else self.silence_s)   # silent already: look again later
            quiet_s = loop.time() - self._heard_at
            if quiet_s >= self.silence_s and not self._silent:
                self._silent = True
                log.warning("controller %s/%s: no telemetry of %s/%s for %.0f s%s: nothing is decided until it comes; "
                            "check that node %s runs and has pool %s", self.node, self.pool, self.node, self.pool,
                            quiet_s, "" if self.history else " (none yet)", self.node, self.pool)

    async def _on_telemetry(self, msg: Msg) -> None:
        try:
            telemetry = decode(PoolTelemetry, msg.data)
        except ContractError as exc:
            log.warning("controller: bad telemetry on %s: %s", msg.subject, exc)
            return
        self._heard_at = asyncio.get_running_loop().time()
        if self._silent:
            self._silent = False
            log.warning("controller %s/%s: telemetry of %s/%s is back", self.node, self.pool, self.node, self.pool)
        async with self._lock:  # one step at a time, in order
            try:
                await self.step(telemetry)
            except Exception:   # one bad period (a policy's bug, a broker blip) must not end the control loop
                log.exception("controller %s/%s: control step failed; the target stays %d", self.node, self.pool,
                              self.target)

    @property
    def reacts(self) -> bool:
        """Whether the panic rule raises the target between decisions (RL policies are trained with it)."""
        return isinstance(self.policy, RLPolicy) if self.react_between_periods is None else self.react_between_periods

    async def _on_pulse(self, msg: Msg) -> None:
        try:
            pulse = decode(PoolPulse, msg.data)
        except ContractError as exc:
            log.warning("controller: bad pulse on %s: %s", msg.subject, exc)
            return
        async with self._lock:   # never between a decision and its scale command
            if not self._adopted or not self.reacts:
                return
            raised = self.panic.react(pulse, self.target)
            if raised is None:
                return
            log.info("controller %s/%s: raised between decisions (panic), %d arrivals in %.1f s, %d queued for %d "
                     "workers: %d -> %d",
                     self.node, self.pool, pulse.arrivals, pulse.window_s, pulse.queue_length,
                     pulse.workers_ready + pulse.workers_starting, self.target, raised)
            previous, self.target = self.target, raised
            self.panics += 1
            await self._publish_target("panic")
            if self.on_panic is not None:
                self.on_panic(pulse, previous, raised)

    async def step(self, telemetry: PoolTelemetry) -> int:
        bounds = self.scenario.workers
        if not self._adopted:   # the pool as it is now: our current target
            self._adopted = True
            self.target = bounds.clamp(telemetry.workers_ready + telemetry.workers_starting)
        if self.guard is not None and (self.guard.observe(telemetry)
                                       or (self.guard.awaiting_reseed and not self._reseeding)):
            self._background(self._reseed_learner())   # a rollback; or a re-seed that failed, tried again
        if (self.guard is not None and self.local is None and self._learner_tried_at is not None
                and not self._connecting
                and asyncio.get_running_loop().time() - self._learner_tried_at >= self.learner_retry_s):
            self._connecting = True   # one try at a time
            self._background(self._retry_learner())
        obs = self.observe(telemetry)
        wanted = self.policy.decide(telemetry, self.target)
        if self.guard is not None:
            self.guard.shadow(self.target, wanted)
        target = bounds.clamp(wanted)
        if isinstance(self.policy, RLPolicy) and self.policy.last_action is not None:
            action = self.policy.last_action
        else:
            action = self.actions.nearest(self.target, target, self.observe)
        changed = target != self.target
        reward = None
        last = self.history[-1].telemetry if self.history else None
        if last is not None and telemetry.time - last.time > 2.5 * max(telemetry.period_s, self.scenario.step_seconds):
            self._previous = None   # a silence (the node down): the decision before it had no outcome seen
        if self._previous is not None:   # the previous decision's outcome is this period
            prev_obs, prev_action, prev_changed = self._previous
            reward = self.reward.reward(telemetry, self.scenario, prev_changed)
            experience = ScalingExperience(node=self.node, pool=self.pool, observation=prev_obs.tolist(),
                                           action=prev_action, reward=reward, next_observation=obs.tolist(),
                                           policy=self.policy_name)
            # stored in the background: while JetStream is away (2 s per try) the scale command is not late
            self._background(self._store_experience(experience))
        self._previous = (obs, action, changed)
        self.target = target
        self.history.append(ControlStep(telemetry, target, reward, self.model_version))
        await self._publish_target("changed" if changed else "kept")
        if self.on_step is not None:
            self.on_step(self.history[-1])
        return target

    async def _store_experience(self, experience: ScalingExperience) -> None:
        try:
            await self.js.publish(self.subjects.experience(self.node, self.pool), encode(experience), timeout=2.0)
        except Exception as exc:  # learning data is best effort; control goes on
            log.warning("controller: experience not stored: %s", exc)

    def _background(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish_target(self, reason: str) -> None:
        command = ScaleCommand(node=self.node, pool=self.pool, target_workers=self.target,
                               reason=reason, policy=self.policy_name, model_version=self.model_version)
        await self.nc.publish(self.subjects.scale(self.node, self.pool), encode(command))
