"""One node's learner: consumes the node's durable experiences, trains one model per purpose
(scheduling, each scaled pool), answers ``act`` and control requests and publishes weights."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from broker import headers as H
from broker.codec import decode, encode
from broker.lifecycle import still_wanted
from broker.messages import (ErrorBody, LearnerAction, LearnerActRequest, LearnerParameters, LearnerStats,
                             LearnerTrainSample, LearnerWeights, ScalingExperience, SchedulingExperience)
from broker.streams import ensure_node_streams, experiences_stream
from broker.subjects import SCHEDULING_MODEL, LearnerVerb, Subjects, pool_of_model, scaling_model
from nodes.learner.eid_window import EidWindow
from nodes.learner.models import CheckpointStore, ModelSlot, is_true
from nodes.learner.settings import LearnerSettings

log = logging.getLogger(__name__)

STATUS_HEADER = H.STATUS   # the HTTP bridge answers with this status
DURABLE = "learner"
FETCH_TIMEOUT_S = 0.5
UNKNOWN_LOG_PERIOD_S = 60.0   # refused requests for unknown models: one log line per period at most


class NodeLearner:
    """The models of one node, its experience consumer and its request/reply subjects."""

    def __init__(self, nc: Client, settings: LearnerSettings, node: str) -> None:
        self.nc, self.settings, self.node = nc, settings, node
        self.subjects = Subjects(settings.prefix)
        self.store = CheckpointStore(settings.learner_dir(node))
        self.slots: dict[str, ModelSlot] = {}
        self.window = EidWindow(2, settings.max_pending_samples)
        self.stream_seq = self.checkpoint_seq = 0   # the last sequence applied to the models, and checkpointed
        self.malformed = 0
        self._subs: list = []
        self._pull: Any = None
        self._task: asyncio.Task | None = None
        self._stopping = asyncio.Event()
        self._last_publish = 0.0
        self._dropped = False        # the checkpoint holds models not kept any more: rewrite it
        self.unknown_models = 0      # requests naming a model this learner does not keep (answered 404)
        self._unknown_logged = -UNKNOWN_LOG_PERIOD_S

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        self._restore()
        await self._bind_consumer()
        handlers: dict[LearnerVerb, Callable[[ModelSlot, bytes], bytes]] = {
            "act": self._act, "parameters.get": self._parameters_get, "parameters.set": self._parameters_set,
            "stats": self._stats, "reset": self._reset, "weights.get": self._weights_get,
            "weights.set": self._weights_set,
        }
        for verb, handler in handlers.items():
            self._subs.append(await self.nc.subscribe(self.subjects.learner_all_models(self.node, verb),
                                                      cb=self._serving(handler)))
        self._task = asyncio.create_task(self._run(), name=f"learner-{self.node}")
        log.info("learner %s up: %s, stream position %d", self.node,
                 ", ".join(f"{s.name}={s.algorithm}" for s in self.slots.values()), self.stream_seq)

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
        self._stopping.set()
        if self._task is not None:
            # safe at any await: stream_seq moves before each ack, so what was applied is in the
            # checkpoint below and a redelivery of it is skipped
            self._task.cancel()
            ended = (await asyncio.gather(self._task, return_exceptions=True))[0]
            if isinstance(ended, Exception):   # CancelledError is no Exception: the usual end
                log.error("learner %s: consumer failed", self.node, exc_info=ended)
        self.checkpoint()
        if self._pull is not None:
            try:
                await self._pull.unsubscribe()
            except Exception as exc:  # the connection may already be gone
                log.debug("learner %s: unsubscribe: %s", self.node, exc)

    def _restore(self) -> None:
        restored = self.store.load(self.settings.seed)
        if restored is not None:
            self.stream_seq = self.checkpoint_seq = restored.stream_seq
            self.malformed = restored.malformed
            wanted = {SCHEDULING_MODEL: self.settings.scheduling_agent}
            for name, slot in restored.slots.items():
                if name not in self.settings.models:   # a pool no longer configured, or a name made up by a client
                    log.warning("learner %s: checkpointed model %s is none of this learner's models (%s): dropped",
                                self.node, name, ", ".join(self.settings.models))
                    self._dropped = True
                    continue
                want = wanted.get(name, self.settings.scaling_agent)
                if slot.algorithm != want:
                    log.warning("learner %s: checkpointed model %s is %s, the settings want %s: starting it afresh",
                                self.node, name, slot.algorithm, want)
                    continue
                self.slots[name] = slot
            self.window.restore(restored.window, restored.window_trained, restored.window_fed)
        if SCHEDULING_MODEL not in self.slots:
            s = self.settings
            slot = ModelSlot(SCHEDULING_MODEL, s.scheduling_agent, s.scheduling_actions, s.scheduling_obs_dim,
                             s.scheduling_parameters, s.seed)
            if s.scheduling_obs_dim:
                slot.ensure(s.scheduling_obs_dim)
            self.slots[SCHEDULING_MODEL] = slot
        if self._dropped:   # their files go now, not at the next change
            self.checkpoint(force=True)

    def _start_from_shipped(self, slot: ModelSlot) -> None:
        """An empty scheduling table just sized to the shipped table's actions starts from its Q-values
        and average reward (P2PFaaS's API users keep an empty 2-action table)."""
        from nodes.learner.algorithms.portable import load_portable

        path = self.settings.scheduling_model
        if path is None or slot.algorithm != "dsarsa" or slot.agent.q or slot.experiences:
            return
        try:
            shipped, _ = load_portable(path)
        except (OSError, ValueError) as exc:  # IncompatibleWeights is a ValueError
            log.warning("learner %s: scheduling model %s not usable (%s): starting empty", self.node, path, exc)
            return
        if shipped.algorithm != "dsarsa" or shipped.n_actions != slot.n_actions:
            return
        slot.agent.q = {state: row.copy() for state, row in shipped.q.items()}
        slot.agent.average_reward = shipped.average_reward
        slot.dirty = slot.fresh = True
        log.info("learner %s: scheduling model starts from %s (%d states)", self.node, path, len(shipped.q))

    async def _bind_consumer(self) -> None:
        """The durable consumer resumes right after the checkpoint, the truth: after a kill the
        server may be ahead of it, so unless exactly there the consumer is recreated there."""
        js = self.nc.jetstream()
        stream = experiences_stream(self.subjects, self.node)
        last_seq = (await js.stream_info(stream)).state.last_seq
        if last_seq < self.stream_seq:  # the broker's store was wiped: its sequences restarted
            log.warning("learner %s: stream %s ends at %d, before the checkpoint's %d: reading it from the start "
                        "(the models are kept)", self.node, stream, last_seq, self.stream_seq)
            self.stream_seq = 0
        try:
            info = await js.consumer_info(stream, DURABLE)
            if info.num_ack_pending or info.num_redelivered or info.ack_floor is None \
                    or info.ack_floor.stream_seq != self.stream_seq or info.delivered.stream_seq != self.stream_seq:
                log.info("learner %s: stream consumer at %s, checkpoint at %d: replaying from the checkpoint",
                         self.node, info.ack_floor.stream_seq if info.ack_floor else "?", self.stream_seq)
                await js.delete_consumer(stream, DURABLE)
                info = None
        except NotFoundError:
            info = None
        if info is None:
            config = ConsumerConfig(durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, ack_wait=self.settings.ack_wait_s,
                                    max_ack_pending=max(1000, 2 * self.settings.fetch_batch),
                                    description=f"learner of {self.node}")
            if self.stream_seq:
                config.deliver_policy, config.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, self.stream_seq + 1
            await js.add_consumer(stream, config)
        self._pull = await js.pull_subscribe_bind(durable=DURABLE, stream=stream)

    # -- experiences ------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_checkpoint = loop.time()
        while not self._stopping.is_set():
            still_wanted()
            try:
                try:
                    msgs = await self._pull.fetch(self.settings.fetch_batch, timeout=FETCH_TIMEOUT_S)
                except (NatsTimeout, asyncio.TimeoutError):
                    msgs = []
                for msg in msgs:
                    await self._handle(msg)
                    await asyncio.sleep(0)  # each training step holds the loop: let act requests in between
                await self._publish_weights()
                if loop.time() - last_checkpoint >= self.settings.checkpoint_period_s:
                    last_checkpoint = loop.time()
                    self.checkpoint()
            except Exception as exc:  # disconnected, reconnecting: try again shortly (the loop never ends on one error)
                log.warning("learner %s: %s: %s", self.node, type(exc).__name__, exc)
                await self._bind_again_if_gone()
                await asyncio.sleep(FETCH_TIMEOUT_S)

    async def _bind_again_if_gone(self) -> None:
        """The experience consumer or its stream was deleted under the learner: make both again as
        at start (fetching would fail for ever otherwise)."""
        js, stream = self.nc.jetstream(), experiences_stream(self.subjects, self.node)
        try:
            await js.consumer_info(stream, DURABLE, timeout=1.0)
            return
        except NotFoundError:
            pass
        except Exception as exc:  # JetStream away or busy: the usual retry
            log.debug("learner %s: consumer lookup: %s", self.node, exc)
            return
        log.warning("learner %s: experience consumer %s of %s is gone; making it again", self.node, DURABLE, stream)
        old = self._pull
        try:
            await ensure_node_streams(js, self.subjects, self.node)
            await self._bind_consumer()
        except Exception as exc:  # the next failed fetch tries again
            log.warning("learner %s: experience consumer not made again (%s); retrying", self.node, exc)
            return
        try:
            await old.unsubscribe()
        except Exception as exc:
            log.debug("learner %s: unsubscribe: %s", self.node, exc)

    async def _handle(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self.stream_seq:  # already in the model (a redelivery)
            await msg.ack()
            return
        try:
            node, pool = self.subjects.parse_experience(msg.subject)
            if pool is None:
                self._on_reward(decode(SchedulingExperience, msg.data))
            else:
                self._on_scaling(pool, decode(ScalingExperience, msg.data))
        except ValueError as exc:  # ContractError, InvalidToken/Subject, a model refusing it
            self._refuse(msg, str(exc))
        except Exception as exc:  # a bug must not stop the learner or loop on one message
            log.exception("learner %s: experience %d on %s failed", self.node, seq, msg.subject)
            self._refuse(msg, f"{type(exc).__name__}: {exc}")
        self.stream_seq = seq
        await msg.ack()

    def _refuse(self, msg: Msg, reason: str) -> None:
        self.malformed += 1
        log.warning("learner %s: experience %d on %s refused (acknowledged, not retried): %s",
                    self.node, msg.metadata.sequence.stream, msg.subject, reason)

    def _on_reward(self, exp: SchedulingExperience) -> None:
        if exp.node and exp.node != self.node:
            raise ValueError(f"experience of node {exp.node!r} on the reward subject of {self.node!r}")
        sample = LearnerTrainSample(eid=exp.eid, state=exp.state, action=exp.action, reward=exp.reward)
        slot = self.slots[SCHEDULING_MODEL]
        slot.ensure(len(sample.state))  # a DQN takes its state size from the first state
        slot.check_state(sample.state)
        slot.check_action(sample.action)
        self.window.size = getattr(slot.config, "window_size", 2)  # DQN: every consecutive pair
        if self.window.add(sample):
            for run in self.window.take():
                slot.train_window(run)

    def _on_scaling(self, pool: str, exp: ScalingExperience) -> None:
        if (exp.node, exp.pool) != (self.node, pool):
            raise ValueError(f"experience of {exp.node}/{exp.pool} on the subject of {self.node}/{pool}")
        if pool not in self.settings.pools:
            raise ValueError(f"pool {pool!r} is none of this learner's pools ({', '.join(self.settings.pools)})")
        self._slot(scaling_model(pool)).update(exp.observation, exp.action, exp.reward, exp.next_observation,
                                                exp.done)

    # -- models, weights and checkpoints ----------------------------------------------
    def _slot(self, model: str) -> ModelSlot:
        """The model named ``model``, made on first use if the settings name it; any other name is
        refused (nothing bounds the names a client may send)."""
        slot = self.slots.get(model)
        if slot is None:
            pool = pool_of_model(model)
            if pool is None or model not in self.settings.models:
                self._unknown(model)
                raise LookupError(f"node {self.node} has no model {model!r}; its models: "
                                  f"{', '.join(self.settings.models)} (the pools of its settings)")
            s = self.settings
            slot = self.slots[model] = ModelSlot(model, s.scaling_agent, s.scaling_actions, None,
                                                 s.scaling_parameters, s.seed)
        return slot

    def _unknown(self, model: str) -> None:
        """Counted (``stats.unknown_models``) and logged at most once per period, whoever floods it."""
        self.unknown_models += 1
        now = time.monotonic()
        if now - self._unknown_logged >= UNKNOWN_LOG_PERIOD_S:
            self._unknown_logged = now
            log.warning("learner %s: request for model %r refused (404): not one of %s; %d refused so far; "
                        "a scaled pool must be in the node's settings", self.node, model[:64],
                        ", ".join(self.settings.models), self.unknown_models)

    async def _publish_weights(self, force: bool = False) -> None:
        now = asyncio.get_running_loop().time()
        if not force and now - self._last_publish < self.settings.weights_period_s:
            return
        self._last_publish = now
        for slot in self.slots.values():
            if not (slot.fresh and slot.exists):
                continue
            slot.fresh = False
            data = encode(slot.weights(self.node))
            if len(data) > self.nc.max_payload:
                log.warning("learner %s: weights of %s are %d bytes, over the broker's %d: not published "
                            "(local policies keep the previous ones)", self.node, slot.name, len(data),
                            self.nc.max_payload)
                continue
            await self.nc.publish(self.subjects.learner(self.node, slot.name, "weights"), data)
            slot.weights_published += 1

    def checkpoint(self, force: bool = False) -> None:
        """Commit every model with the stream position it includes (when anything changed)."""
        if not force and self.stream_seq == self.checkpoint_seq and not any(s.dirty for s in self.slots.values()):
            return
        try:
            self.store.commit(self.slots, self.window.samples.values(), self.stream_seq, self.malformed,
                              self.window.trained, self.window.fed)
        except Exception as exc:  # disk full, permissions, a value the manifest cannot hold: keep serving,
            # the stream still holds it all
            log.error("learner %s: checkpoint failed (retried next period): %s: %s", self.node, type(exc).__name__, exc)
            return
        self.checkpoint_seq = self.stream_seq

    # -- request/reply ------------------------------------------------------------------
    def _serving(self, handler: Callable[[ModelSlot, bytes], bytes]):
        async def serve(msg: Msg) -> None:
            status = 200
            try:
                _, model, _ = self.subjects.parse_learner(msg.subject)
                body = handler(self._slot(model), msg.data)
            except LookupError as exc:
                status, body = 404, encode(ErrorBody(code=404, message=str(exc)))
            except ValueError as exc:
                status, body = 400, encode(ErrorBody(code=400, message=str(exc)))
            except Exception as exc:
                log.exception("learner %s: %s failed", self.node, msg.subject)
                status, body = 500, encode(ErrorBody(code=500, message=f"{type(exc).__name__}: {exc}"))
            if msg.reply and len(body) > self.nc.max_payload:   # e.g. a grown table's weights: say so, not silence
                status, body = 413, encode(ErrorBody(code=413, message=(
                    f"the answer is {len(body)} bytes, over the broker's message limit of {self.nc.max_payload}")))
            if msg.reply:  # no header means 200: the act hot path stays a plain reply
                try:
                    await self.nc.publish(msg.reply, body, headers={STATUS_HEADER: str(status)} if status != 200 else None)
                except Exception as exc:  # the connection is gone: the caller's timeout tells it
                    log.warning("learner %s: answer on %s not sent: %r", self.node, msg.subject, exc)
        return serve

    def _act(self, slot: ModelSlot, data: bytes) -> bytes:
        request = decode(LearnerActRequest, data)
        action, eps = slot.act(request.state, request.explore)
        if request.explore:
            slot.dirty = True  # epsilon decayed: keep it across restarts
        return encode(LearnerAction(action=action, eps=eps, model=slot.name, algorithm=slot.algorithm))

    def _parameters_get(self, slot: ModelSlot, data: bytes) -> bytes:
        return encode(LearnerParameters(slot.parameters()))

    def _parameters_set(self, slot: ModelSlot, data: bytes) -> bytes:
        values = decode(LearnerParameters, data).root
        parameters = slot.set_parameters(values)
        if slot.name == SCHEDULING_MODEL and is_true(values.get("reset")):
            self.window.clear()
        if slot.name == SCHEDULING_MODEL and "actions_n" in values:
            self._start_from_shipped(slot)
        self.checkpoint()
        return encode(LearnerParameters(parameters))

    def _stats(self, slot: ModelSlot, data: bytes) -> bytes:
        return encode(LearnerStats(
            node=self.node, model=slot.name, algorithm=slot.algorithm, obs_dim=slot.obs_dim or 0,
            n_actions=slot.n_actions, exists=slot.exists, experiences=slot.experiences,
            pending=len(self.window) if slot.name == SCHEDULING_MODEL else 0, malformed=self.malformed,
            stream_seq=self.stream_seq, checkpoint_seq=self.checkpoint_seq,
            weights_published=slot.weights_published, agent=slot.stats(), unknown_models=self.unknown_models,
        ))

    def _reset(self, slot: ModelSlot, data: bytes) -> bytes:
        slot.reset()
        if slot.name == SCHEDULING_MODEL:
            self.window.clear()
        self.checkpoint()  # a restart must not bring the forgotten model back
        return self._stats(slot, data)

    def _weights_set(self, slot: ModelSlot, data: bytes) -> bytes:
        """Continue training from these weights; answers the model's stats (``experiences``: the version)."""
        weights = decode(LearnerWeights, data)
        if weights.model != slot.name:
            raise ValueError(f"weights of model {weights.model!r} sent to model {slot.name!r}")
        slot.seed(weights)
        self.checkpoint()
        return self._stats(slot, data)

    def _weights_get(self, slot: ModelSlot, data: bytes) -> bytes:
        if not slot.exists:
            raise LookupError(f"model {slot.name} of {self.node} has no weights yet: it has not seen a state")
        return encode(slot.weights(self.node))
