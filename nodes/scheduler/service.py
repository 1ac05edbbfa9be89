"""The scheduler service: consumes the node's durable request stream and carries out decisions.

Per request: validate (subject, function, size) -> ask the algorithm -> enqueue on
the task stream, forward to a peer, or publish a rejection; the request is
acknowledged only after that publish succeeded, so nothing accepted is lost.
Every node on the path appends its arrival/scheduling/probing times to the
``X-P2pfaas-Hop-Timings`` header; the executing worker turns them into
``Result.hop_timings``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Sequence

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import BadRequestError, NotFoundError

from broker import headers as H
from broker.codec import decode, encode
from broker.errors import ContractError, InvalidSubject, InvalidToken
from broker.messages import HopTiming, HopTrail, LearningDecision, Rejection
from broker.streams import requests_stream, results_stream, tasks_stream
from broker.subjects import Invocation, Subjects
from functions.registry import FunctionRegistry
from nodes.accounting import Accounts
from nodes.config_store import ConfigStore
from nodes.metrics import NodeMetrics
from nodes.scheduler.algorithms import build_algorithm, decide
from nodes.scheduler.base import (
    Execute,
    Forward,
    LocalLoad,
    Reject,
    SchedulingAlgorithm,
    SchedulingRequest,
)
from nodes.settings import NodeSettings

log = logging.getLogger(__name__)

SCHEDULER_DURABLE = "scheduler"
BATCH = 64


class SchedulerService:
    def __init__(self, settings: NodeSettings, nc: Client, registry: FunctionRegistry,
                 store: ConfigStore, metrics: NodeMetrics, peers: "PeerSource | None" = None) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = Subjects(settings.prefix)
        self.registry = registry
        self.store = store
        self.metrics = metrics
        self.accounts = Accounts(self.node_id, {p: spec.functions for p, spec in settings.pools.items()})
        self.algorithm: SchedulingAlgorithm = build_algorithm(store.scheduler.name, store.scheduler.parameters)
        self._peers = peers
        self._tasks: list[asyncio.Task] = []
        self._subs: list = []
        self._stopping = asyncio.Event()
        self.rng = random.Random()
        self.learning = None  # the node's LearningContext (nodes/scheduler/learning.py): view.learning

    @property
    def load(self):
        """Load of the node's main pool: the K slots that the algorithms reason about."""
        return self.accounts.default.load

    # -- SchedulingView ---------------------------------------------------
    def local_load(self) -> LocalLoad:
        c = self.store.node
        return LocalLoad(self.load.n_running, self.load.n_queued, c.parallel_running_functions_max,
                         c.queue_length_max, c.queue_enabled)

    def peers(self) -> Sequence[str]:
        return self._peers.peers() if self._peers else ()

    async def probe(self, peer: str) -> int | None:
        return await self._peers.probe(peer) if self._peers else None

    # -- lifecycle ----------------------------------------------------------
    async def start(self, backlogs: dict[str, int] | None = None) -> None:
        """``backlogs``: tasks each pool still has in the stream from a previous run."""
        for pool, count in (backlogs or {}).items():
            self.accounts.get(pool).load.unknown = count
        self._subs.append(await self.nc.subscribe(self.subjects.task_event(self.node_id, "started"), cb=self._on_started))
        self._subs.append(await self.nc.subscribe(self.subjects.task_event(self.node_id, "done"), cb=self._on_done))
        stream = requests_stream(self.subjects, self.node_id)
        config = ConsumerConfig(durable_name=SCHEDULER_DURABLE, ack_policy=AckPolicy.EXPLICIT,
                                ack_wait=30.0, max_deliver=-1, max_ack_pending=-1)
        try:
            await self.js.add_consumer(stream, config)
        except BadRequestError as exc:
            if exc.err_code != 10148:
                raise
        sub = await self.js.pull_subscribe_bind(durable=SCHEDULER_DURABLE, stream=stream)
        self._subs.append(sub)
        self._tasks.append(asyncio.create_task(self._consume(sub), name=f"{self.node_id}-scheduler"))

    async def stop(self) -> None:
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # the connection may already be gone at shutdown
                log.debug("unsubscribe: %s", exc)

    def set_algorithm(self, name: str, parameters: list[str]) -> SchedulingAlgorithm:
        self.algorithm = build_algorithm(name, parameters)  # ValueError leaves the old one in place
        return self.algorithm

    # -- events -------------------------------------------------------------
    async def _on_started(self, msg: Msg) -> None:
        try:
            event = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            return
        self.accounts.get(event.get("p")).load.started(event["k"])
        self._update_gauges()

    async def _on_done(self, msg: Msg) -> None:
        try:
            event = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            return
        account = self.accounts.get(event.get("p"))
        account.load.done(event["k"])
        fn, status = event.get("fn", "?"), int(event.get("s", 0))
        if status:
            account.stats.completed(event.get("t", 0.0), event.get("d"), status == 200)
            self.metrics.results.labels(node=self.node_id, fn=fn, status=str(status)).inc()
            if status == 200:
                self.metrics.execution.labels(node=self.node_id, fn=fn).observe(event.get("e", 0.0))
                self.metrics.total.labels(node=self.node_id, fn=fn).observe(event.get("t", 0.0))
            else:
                self.metrics.error({400: "bad_input", 504: "timeout", 404: "unknown_function"}.get(status, "function_error"))
        self._update_gauges()

    def _update_gauges(self) -> None:
        self.metrics.running.set(self.load.n_running)
        self.metrics.queued.set(self.load.n_queued)

    # -- the consume loop -----------------------------------------------------
    async def _consume(self, sub) -> None:
        while not self._stopping.is_set():
            try:
                msgs = await sub.fetch(BATCH, timeout=0.5)
            except (NatsTimeout, asyncio.TimeoutError):
                continue
            except Exception as exc:  # broker blip: keep the loop alive
                log.warning("scheduler fetch failed: %s", exc)
                await asyncio.sleep(0.2)
                continue
            # Decisions are taken in order (admission depends on them);
            # the resulting publishes run concurrently.
            pending = [await self._schedule(msg) for msg in msgs]
            await asyncio.gather(*(p for p in pending if p is not None))

    async def _schedule(self, msg: Msg):
        h = msg.headers or {}
        stored_at = msg.metadata.timestamp.timestamp()
        arrival = float(h.get(H.ARRIVAL) or stored_at)  # entered the system (origin)
        try:
            inv = self.subjects.parse_invocation(msg.subject)
        except (InvalidSubject, InvalidToken) as exc:
            return self._refuse_malformed(msg, str(exc))
        # reached this node: a forward when the peer's stream stored it
        hop_arrival = stored_at if inv.kind == "forward" else arrival
        spec = self.registry.get(inv.fn)
        if spec is None:
            return self._refuse(msg, inv, 404, 404, f"unknown function {inv.fn!r}; this node has: {', '.join(self.registry.names())}", "unknown_function")
        if len(msg.data) > self.settings.max_payload_bytes:
            return self._refuse(msg, inv, 413, 413, f"payload of {len(msg.data)} bytes exceeds the limit of {self.settings.max_payload_bytes}", "too_large")
        if not msg.data and spec.requires_input:
            return self._refuse(msg, inv, 400, 400, f"{inv.fn} needs an input payload; it was empty", "empty_payload")
        if self.accounts.seen(inv.call_key):
            log.info("duplicate request %s ignored (already scheduled or answered)", inv.call_key)
            return msg.ack()
        if msg.metadata.num_delivered > 1 and await self._answered(inv):
            return msg.ack()

        request = SchedulingRequest(
            fn=inv.fn, client=inv.client, request_id=inv.request_id,
            external=inv.kind == "forward", hops=int(h.get(H.HOPS, 0) or 0),
            peers=tuple(p for p in h.get(H.PEERS_LIST_ID, "").split(",") if p),
            bypass=H.is_true(h.get(H.BYPASS)), force_forward=H.is_true(h.get(H.FORWARD)),
            force_reject=H.is_true(h.get(H.REJECT)),
            task_type=_float_or_none(h.get(H.TASK_TYPE)),
        )
        algorithm = self.algorithm
        account = self.accounts.for_fn(inv.fn)
        if account is self.accounts.default or request.force_reject:
            decision = await decide(algorithm, request, self)
        else:
            decision = Execute()  # a dedicated (autoscaled) pool queues every task: scaling, not admission, keeps its QoS
        if self.learning is not None:  # X-P2pfaas-Scheduler-Learning-* ride with the task, forward or rejection
            msg.headers = h = self.learning.annotate(inv.call_key, request, decision, h)
        scheduled_at = time.time()
        here = HopTiming(node=self.node_id, arrival=hop_arrival,
                         scheduling_s=max(0.0, scheduled_at - hop_arrival), probing_s=decision.probing_s)
        trail = self._trail(h if request.external else {}, here)
        if isinstance(decision, Execute):
            account.load.enqueued(inv.call_key)
            account.stats.arrived()
            self._update_gauges()
            self.metrics.requests.labels(node=self.node_id, fn=inv.fn, outcome="scheduled").inc()
            return self._enqueue(msg, inv, request, algorithm, arrival, scheduled_at, trail, account)
        if isinstance(decision, Forward):
            self.metrics.requests.labels(node=self.node_id, fn=inv.fn, outcome="forwarded").inc()
            return self._forward(msg, inv, request, decision, algorithm, arrival, trail)
        assert isinstance(decision, Reject)
        self.metrics.requests.labels(node=self.node_id, fn=inv.fn, outcome="rejected").inc()
        # P2PFaaS: 401 deliberately rejected -> HTTP 503 (try again); 400 cannot schedule -> HTTP 500
        overloaded = decision.code == 401
        return self._refuse(msg, inv, decision.code, 503 if overloaded else 500, decision.reason, "rejected",
                            retry_after_s=1.0 if overloaded else None,
                            scheduler=(request.external and h.get(H.SCHEDULER_NAME)) or algorithm.describe(),
                            count_error=False, learning=LearningDecision.from_headers(h))

    def _trail(self, h: dict, here: HopTiming) -> str:
        """The hop-timings header with this node's entry appended (a garbled one restarts here).

        Only forwards carry a trail; a client's own header is ignored (``h`` is empty then).
        """
        hops: list[HopTiming] = []
        if h.get(H.HOP_TIMINGS):
            try:
                hops = list(decode(HopTrail, h[H.HOP_TIMINGS].encode()).hops)
            except ContractError as exc:
                log.warning("ignoring malformed %s header: %s", H.HOP_TIMINGS, exc)
        return encode(HopTrail(hops=[*hops, here])).decode()

    async def _enqueue(self, msg: Msg, inv: Invocation, request: SchedulingRequest, algorithm: SchedulingAlgorithm,
                       arrival: float, scheduled_at: float, trail: str, account) -> None:
        h = msg.headers or {}
        task_headers = {
            H.MSG_ID: f"task.{inv.call_key}",
            H.CLIENT: inv.client, H.REQUEST_ID: inv.request_id,
            H.ORIGIN: request.peers[0] if request.peers else self.node_id,
            H.ARRIVAL: repr(arrival), H.SENT_AT: repr(time.time()),
            H.SCHEDULING_S: repr(scheduled_at - arrival),
            # the origin's algorithm is the one the caller configured (P2PFaaS reports it)
            H.SCHEDULER_NAME: (request.external and h.get(H.SCHEDULER_NAME)) or algorithm.describe(),
            H.HOPS: str(request.hops), H.PEERS_LIST_ID: ",".join(request.peers),
            H.HOP_TIMINGS: trail,
        }
        for passthrough in (H.TIMEOUT, H.DEADLINE, H.TRACING_ID, H.TASK_TYPE, *H.LEARNING):
            if passthrough in h:
                task_headers[passthrough] = h[passthrough]
        await self._publish_then_ack(msg, self.subjects.task(self.node_id, inv.fn), msg.data, task_headers,
                                     tasks_stream(self.subjects, self.node_id), undo=(account, inv.call_key))

    async def _forward(self, msg: Msg, inv: Invocation, request: SchedulingRequest, decision: Forward,
                       algorithm: SchedulingAlgorithm, arrival: float, trail: str) -> None:
        """Publish to ``faas.<peer>.forward...``: the peer's durable request stream stores it, so a
        peer that is down runs it when it returns (docs/p2p.md)."""
        headers = dict(msg.headers or {})
        peers = list(request.peers) or [self.node_id]
        if peers[-1] != self.node_id:
            peers.append(self.node_id)
        headers.update({
            H.MSG_ID: f"fwd.{decision.peer}.{inv.call_key}",
            H.ARRIVAL: repr(arrival), H.HOPS: str(request.hops + 1),
            H.PEERS_LIST_ID: ",".join(peers),
            H.SCHEDULER_NAME: (request.external and headers.get(H.SCHEDULER_NAME)) or algorithm.describe(),
            H.HOP_TIMINGS: trail,
        })
        headers.pop(H.FORWARD, None)
        subject = self.subjects.forward(decision.peer, inv.fn, inv.client, inv.request_id)
        await self._publish_then_ack(msg, subject, msg.data, headers, None)

    async def _publish_then_ack(self, msg: Msg, subject: str, data: bytes, headers: dict,
                                stream: str | None, undo: tuple | None = None) -> None:
        try:
            await self.js.publish(subject, data, headers=headers, stream=stream, timeout=5.0)
        except Exception as exc:
            # not acknowledged -> JetStream redelivers the request later
            log.warning("could not publish to %s (%s); request will be retried", subject, exc)
            if undo:
                account, key = undo
                account.load.cancel(key)
            await msg.nak(delay=1.0)
            return
        await msg.ack()

    def _refuse(self, msg: Msg, inv: Invocation, code: int, http_status: int, reason: str, kind: str,
                *, retry_after_s: float | None = None, scheduler: str = "", count_error: bool = True,
                learning: LearningDecision | None = None):
        if count_error:
            self.metrics.error(kind)
            log.warning("refused %s %s: %s", inv.fn, inv.call_key, reason)
        rejection = Rejection(request_id=inv.request_id, client=inv.client, fn=inv.fn, code=code,
                              http_status=http_status, reason=reason, node=self.node_id,
                              retry_after_s=retry_after_s, scheduler=scheduler, learning=learning)
        return self._publish_then_ack(msg, self.subjects.reject(inv.client, inv.request_id), encode(rejection),
                                      {H.MSG_ID: f"reject.{inv.call_key}"}, results_stream(self.subjects))

    def _refuse_malformed(self, msg: Msg, reason: str):
        self.metrics.error("invalid_subject")
        log.warning("refused malformed subject %r: %s", msg.subject, reason)
        ids = self.subjects.salvage_reply_to(msg.subject)
        client, req = ids if ids else ("invalid", "invalid")
        subject = self.subjects.reject(*ids) if ids else self.subjects.invalid()
        parts = msg.subject.split(".")
        fn = parts[3] if len(parts) > 3 else ""
        rejection = Rejection(request_id=req, client=client, fn=fn[:64], code=400, http_status=400,
                              reason=f"malformed subject {msg.subject!r}: {reason}", node=self.node_id)
        return self._publish_then_ack(msg, subject, encode(rejection), {}, results_stream(self.subjects))

    async def _answered(self, inv: Invocation) -> bool:
        for subject in (self.subjects.result(inv.client, inv.request_id), self.subjects.reject(inv.client, inv.request_id)):
            try:
                await self.js.get_last_msg(results_stream(self.subjects), subject)
                return True
            except NotFoundError:
                continue
        return False


class PeerSource:
    """What the scheduler needs from discovery (filled in by the peer-to-peer layer)."""

    def peers(self) -> Sequence[str]:
        return ()

    async def probe(self, peer: str) -> int | None:
        return None


def _float_or_none(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None
