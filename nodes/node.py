"""One p2pfaas node: scheduler + discovery services, worker pool and control plane (load,
configuration, metrics over NATS request/reply). ``async with Node(settings)`` runs it."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import APIError, ServiceUnavailableError
from prometheus_client import generate_latest

from broker.codec import decode, encode
from broker.connection import close_quietly, connect
from broker.errors import ContractError
from broker.messages import ErrorBody, NodeConfiguration, NodeLoad, ScaleCommand, SchedulerConfiguration
from broker.streams import ensure_node_streams
from broker.subjects import Subjects
from functions.registry import FunctionRegistry, default_registry
from nodes.config_store import ConfigStore
from nodes.discovery.service import DiscoveryService
from nodes.learner.service import LearnerService
from nodes.learner.settings import LearnerSettings
from nodes.metrics import NodeMetrics
from nodes.pool import WorkerPool
from nodes.worker import DEFAULT_POOL
from nodes.scheduler.learning import LearningContext
from nodes.scheduler.service import PeerSource, SchedulerService
from nodes.settings import NodeSettings

log = logging.getLogger(__name__)

VERSION = "0.1.0"
STATUS_HEADER = "X-P2pfaas-Status"
JETSTREAM_READY_TIMEOUT_S = 30.0  # a fresh NATS cluster elects its JetStream leader first


class Node:
    def __init__(self, settings: NodeSettings, registry: FunctionRegistry | None = None,
                 peers: PeerSource | None = None) -> None:
        """``peers`` replaces discovery (tests, fixed topologies); by default the node runs its own."""
        self.settings = settings
        self.subjects = Subjects(settings.prefix)
        self.registry = registry or default_registry(settings.functions)
        self.metrics = NodeMetrics(settings.node_id)
        self.store = ConfigStore(settings.node_dir, settings.initial, settings.initial_scheduler)
        self.nc: Client | None = None
        self.pool: WorkerPool | None = None          # the main pool: K slots, all other functions
        self.pools: dict[str, WorkerPool] = {}       # every pool by name, the main one as "default"
        self._telemetry: asyncio.Task | None = None
        self.scheduler: SchedulerService | None = None
        self.discovery: DiscoveryService | None = None
        self.learner: LearnerService | None = None
        self._peers = peers
        self._subs: list = []
        self.started_at = time.time()

    async def start(self) -> "Node":
        self.nc = await connect(self.settings.nats_servers, f"node-{self.settings.node_id}")
        js = self.nc.jetstream()
        await _when_jetstream_ready(lambda: ensure_node_streams(js, self.subjects, self.settings.node_id))
        if self.settings.learner:  # before the scheduler, so a LearningScheduler can use it
            self.learner = await LearnerService(self.nc, LearnerSettings.for_node(self.settings)).start()
        await self._start_pools(js)
        peers = self._peers
        if peers is None:
            self.discovery = peers = DiscoveryService(self.settings, self.nc, self.current_load)
        self.scheduler = SchedulerService(self.settings, self.nc, self.registry, self.store,
                                          self.metrics, peers)
        sched = self.scheduler  # the LearningScheduler's link to the learner, task types and rewards
        self.scheduler.learning = LearningContext.for_node(self.nc, self.settings,
                                                           lambda: (sched.load.running, sched.load.outstanding))
        await self.scheduler.start({name: await pool.backlog() for name, pool in self.pools.items()})
        if self.discovery:
            await self.discovery.start()
        node = self.settings.node_id
        s = self.subjects
        for subject, handler in (
            (s.load(node), self._on_load),
            (s.config(node, "get"), self._on_config_get),
            (s.config(node, "set"), self._on_config_set),
            (s.scheduler_config(node, "get"), self._on_scheduler_get),
            (s.scheduler_config(node, "set"), self._on_scheduler_set),
            (s.metrics(node), self._on_metrics),
            (s.info(node), self._on_info),
        ):
            self._subs.append(await self.nc.subscribe(subject, cb=handler))
        for name in self.pools:
            self._subs.append(await self.nc.subscribe(s.scale(node, name), cb=self._on_scale))
        self._telemetry = asyncio.create_task(self._publish_telemetry(), name=f"{node}-telemetry")
        log.info("node %s up: K=%d queue=%d scheduler=%s", node,
                 self.store.node.parallel_running_functions_max, self.store.node.queue_length_max,
                 self.scheduler.algorithm.describe())
        return self

    async def stop(self) -> None:
        if self._telemetry:
            self._telemetry.cancel()
            await asyncio.gather(self._telemetry, return_exceptions=True)
        if self.discovery:  # silence first: peers stop choosing us within suspect_after periods
            await self.discovery.stop()
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
        if self.scheduler:
            await self.scheduler.stop()
        await asyncio.gather(*(pool.stop() for pool in self.pools.values()))
        if self.scheduler and self.scheduler.learning:
            await self.scheduler.learning.stop()
        if self.learner:
            await self.learner.stop()
        if self.nc and not self.nc.is_closed:
            await close_quietly(self.nc)

    async def __aenter__(self) -> "Node":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- worker pools ---------------------------------------------------------
    async def _start_pools(self, js) -> None:
        """The main pool first (its consumer may have to shrink its filter before a
        dedicated pool's consumer can take those subjects), then the dedicated ones."""
        dedicated = self.settings.pools
        taken = {fn for spec in dedicated.values() for fn in spec.functions}
        main_filter = None
        if taken:
            main_filter = [self.subjects.task(self.settings.node_id, fn)
                           for fn in self.registry.names() if fn not in taken]
        self.pool = WorkerPool(self.settings, js, self.subjects, DEFAULT_POOL, main_filter)
        self.pools = {DEFAULT_POOL: self.pool}
        await self.pool.start(self.store.node.parallel_running_functions_max)
        for name, spec in dedicated.items():
            pool = WorkerPool(self.settings, js, self.subjects, name,
                              [self.subjects.task(self.settings.node_id, fn) for fn in spec.functions])
            self.pools[name] = pool
            await pool.start(spec.initial)

    async def _publish_telemetry(self) -> None:
        """One ``PoolTelemetry`` per pool per period on ``faas.<node>.telemetry.<pool>``; a dedicated
        pool's period is its control period (``PoolSpec.period_s``)."""
        await asyncio.gather(*(self._pool_telemetry(name, pool) for name, pool in self.pools.items()))

    async def _pool_telemetry(self, name: str, pool: WorkerPool) -> None:
        spec = self.settings.pools.get(name)
        period = (spec.period_s if spec else None) or self.settings.telemetry_period_s
        assert self.scheduler is not None and self.nc is not None
        account = self.scheduler.accounts.get(name)
        subject = self.subjects.telemetry(self.settings.node_id, name)
        last = time.monotonic()
        next_at = last + period
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += period
            try:
                backlog = await pool.backlog()
            except Exception as exc:  # broker blip: this period's counts carry over to the next sample
                log.debug("telemetry of %s skipped: %s", name, exc)
                continue
            now = time.monotonic()
            elapsed, last = now - last, now
            running = account.load.n_running
            sample = account.stats.sample(time.time(), elapsed, queue_length=backlog - running,
                                          in_service=running, ready=pool.ready, starting=pool.starting,
                                          stopping=pool.stopping)
            await self.nc.publish(subject, encode(sample))

    async def _on_scale(self, msg: Msg) -> None:
        """A scale command: the main pool's K (persisted, like /configuration), or a dedicated pool's size."""
        try:
            command = decode(ScaleCommand, msg.data)
        except ContractError as exc:
            log.warning("bad scale command on %s: %s", msg.subject, exc)
            self.metrics.error("bad_scale_command")
            return
        pool = self.pools.get(command.pool)
        if pool is None or command.node != self.settings.node_id:
            log.warning("scale command for %s/%s ignored on %s", command.node, command.pool, msg.subject)
            self.metrics.error("bad_scale_command")
            return
        if command.pool == DEFAULT_POOL:
            target = max(1, command.target_workers)
            await self.apply_configuration(self.store.node.model_copy(update={"parallel_running_functions_max": target}))
            return
        spec = self.settings.pools[command.pool]
        target = min(spec.max, max(spec.min, command.target_workers))
        if target != pool.target:
            log.info("pool %s: %d -> %d workers (%s, %s)", command.pool, pool.target, target,
                     command.policy, command.reason)
        await pool.set_size(target)

    # -- control plane ------------------------------------------------------
    def current_load(self) -> NodeLoad:
        assert self.scheduler is not None
        c = self.store.node
        return NodeLoad(node=self.settings.node_id, running=self.scheduler.load.n_running,
                        queued=self.scheduler.load.n_queued,
                        parallel_running_functions_max=c.parallel_running_functions_max,
                        queue_length_max=c.queue_length_max, queue_enabled=c.queue_enabled)

    async def apply_configuration(self, config: NodeConfiguration) -> None:
        """Persist and apply at run time: K resizes the worker pool, no restart."""
        self.store.set_node(config)
        assert self.pool is not None
        await self.pool.set_size(config.parallel_running_functions_max)
        if self.pool:
            self.metrics.workers.labels(node=self.settings.node_id, state="target").set(self.pool.target)

    async def _reply(self, msg: Msg, body: bytes, status: int = 200) -> None:
        if msg.reply:
            await self.nc.publish(msg.reply, body, headers={STATUS_HEADER: str(status)})

    async def _error(self, msg: Msg, status: int, message: str) -> None:
        log.warning("control request on %s refused: %s", msg.subject, message)
        self.metrics.error("bad_configuration")
        await self._reply(msg, encode(ErrorBody(code=status, message=message)), status)

    async def _on_load(self, msg: Msg) -> None:
        await self._reply(msg, encode(self.current_load()))

    async def _on_config_get(self, msg: Msg) -> None:
        await self._reply(msg, encode(self.store.node))

    async def _on_config_set(self, msg: Msg) -> None:
        try:
            config = decode(NodeConfiguration, msg.data)
        except ContractError as exc:
            return await self._error(msg, 400, str(exc))
        await self.apply_configuration(config)
        await self._reply(msg, encode(config))

    async def _on_scheduler_get(self, msg: Msg) -> None:
        await self._reply(msg, encode(self.store.scheduler))

    async def _on_scheduler_set(self, msg: Msg) -> None:
        assert self.scheduler is not None
        try:
            config = decode(SchedulerConfiguration, msg.data)
            algorithm = self.scheduler.set_algorithm(config.name, config.parameters)
        except (ContractError, ValueError) as exc:
            return await self._error(msg, 400, str(exc))
        config = SchedulerConfiguration(name=algorithm.name, parameters=algorithm.parameters())
        self.store.set_scheduler(config)
        log.info("node %s scheduler is now %s", self.settings.node_id, algorithm.describe())
        await self._reply(msg, encode(config))

    async def _on_metrics(self, msg: Msg) -> None:
        if self.pool:
            for state in ("ready", "starting", "stopping"):
                self.metrics.workers.labels(node=self.settings.node_id, state=state).set(getattr(self.pool, state))
        await self._reply(msg, generate_latest(self.metrics.registry))

    async def _on_info(self, msg: Msg) -> None:
        assert self.scheduler is not None
        await self._reply(msg, orjson.dumps({
            "name": "p2pfaas", "version": VERSION, "node": self.settings.node_id,
            "scheduler": self.scheduler.algorithm.describe(), "functions": self.registry.names(),
            "workers": {"ready": self.pool.ready, "starting": self.pool.starting, "stopping": self.pool.stopping} if self.pool else {},
            "uptime_s": time.time() - self.started_at,
        }))


async def _when_jetstream_ready(action, timeout_s: float = JETSTREAM_READY_TIMEOUT_S) -> None:
    """Run ``action`` (stream provisioning), retrying while JetStream is not available yet.

    A clustered nats-server answers "JetStream system temporarily unavailable"
    (HTTP-like 503) until its meta leader is elected; a single server never does.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await action()
        except (APIError, asyncio.TimeoutError) as exc:
            retryable = (isinstance(exc, (asyncio.TimeoutError, ServiceUnavailableError))
                         or getattr(exc, "code", None) == 503)
            if not retryable or loop.time() > deadline:
                raise
            log.info("JetStream not ready yet (%s); retrying", exc)
            await asyncio.sleep(0.25)


async def run_node(settings: NodeSettings, stop: asyncio.Event) -> None:
    async with Node(settings):
        await stop.wait()
