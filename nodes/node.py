"""One p2pfaas node: scheduler + discovery services, worker pool and control plane (load,
configuration, metrics over NATS request/reply). ``async with Node(settings)`` runs it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker import codes
from broker.codec import decode, encode
from broker.connection import close_quietly, connect, on_event
from broker.lifecycle import end_strays, hold_data_dir
from broker.errors import ContractError
from broker.messages import NodeConfiguration, NodeGone, NodeLoad, ScaleCommand
from broker.streams import ensure_node_streams, when_jetstream_ready
from broker.subjects import Subjects
from functions.registry import FunctionRegistry, default_registry
from nodes.config_store import ConfigStore
from nodes.control_plane import NodeControl
from nodes.discovery.service import DiscoveryService
from nodes.answering import Answerer
from nodes.deployments import Deployments
from nodes.dispatch import Dispatcher
from nodes.inbox import Inbox
from nodes.ingress import Ingress
from nodes.learner.service import LearnerService
from nodes.learner.settings import LearnerSettings
from nodes.metrics import NodeMetrics
from nodes.pool import WorkerPool, worker_processes
from nodes.scheduler.learning import LearningContext
from nodes.peer_source import PeerSource
from nodes.scheduler.service import SchedulerService
from nodes.scheduler.view import NodeView
from nodes.settings import NodeSettings
from nodes.store_check import StoreCheck
from nodes.pool_reports import send_pulses, send_telemetry
from nodes.telemetry import PULSE_PERIOD_S, PoolStats
from nodes.worker import DEFAULT_POOL

log = logging.getLogger(__name__)

MAX_K = 1024
NODE_LOCK = Path("run") / "node.lock"   # under the node's directory: one node process per node


class Node:
    def __init__(self, settings: NodeSettings, registry: FunctionRegistry | None = None,
                 peers: PeerSource | None = None) -> None:
        """``peers`` replaces discovery (tests, fixed topologies); by default the node runs its own."""
        self.settings = settings
        self.subjects = Subjects(settings.prefix)
        self.metrics = NodeMetrics(settings.node_id)
        self.store = ConfigStore(settings.node_dir, settings.initial, settings.initial_scheduler)
        self.deployments = Deployments(self)
        if registry is None:   # functions deployed at run time before a restart come back
            self.deployments.restore()
        self.registry = registry or default_registry(settings.functions, options=settings.function_options)
        self.nc: Client | None = None
        self.inbox: Inbox | None = None
        self.pool: WorkerPool | None = None          # the main pool: K slots, all other functions
        self.pools: dict[str, WorkerPool] = {}       # every pool by name, the main one as "default"
        self.stats: dict[str, PoolStats] = {}        # per-pool telemetry bookkeeping
        self._dispatchers: dict[str, Dispatcher] = {}
        self._watching: dict[str, list] = {}         # per pool: its telemetry tasks and scale subscription
        self._answerer: Answerer | None = None
        self.store_check: StoreCheck | None = None
        self.scheduler: SchedulerService | None = None
        self.ingress: Ingress | None = None
        self.discovery: DiscoveryService | None = None
        self.learner: LearnerService | None = None
        self._peers = peers
        self._unlisten = lambda: None
        self._reconciling: set[asyncio.Task] = set()
        self.control: NodeControl | None = None
        self.started_at = time.time()
        self._lock: int | None = None

    async def start(self) -> "Node":
        # one node process per node directory: a second would end our workers as strays and share our state
        self._lock = hold_data_dir(self.settings.node_dir, NODE_LOCK, f"node {self.settings.node_id}",
                                   "--data-dir or --node-id")
        strays = end_strays(self.settings.run_dir)
        if strays:
            log.warning("node %s: ended %d worker process(es) left by a previous run", self.settings.node_id, len(strays))
        self.nc = await connect(self.settings.nats_servers, f"node-{self.settings.node_id}")
        js = self.nc.jetstream()
        await when_jetstream_ready(lambda: ensure_node_streams(js, self.subjects, self.settings.node_id))
        # the deployment's functions before the workers start: they load them at once
        await when_jetstream_ready(lambda: self.deployments.join_catalogue(js))
        if self.settings.learner:  # before the scheduler, so a LearningScheduler can use it
            self.learner = await LearnerService(self.nc, LearnerSettings.for_node(self.settings)).start()
        self.inbox = await Inbox(self.nc).start()
        answerer = Answerer(self.settings.node_id, self.nc, self.subjects, self.metrics, self.stats.get, self.inbox,
                            registry=self.registry, retry_backoff_s=self.settings.retry_backoff_s,
                            ip=self.settings.machine_ip, timings=self.settings.timings)
        self._answerer, dispatchers = answerer, self._dispatchers
        for name in (DEFAULT_POOL, *self.settings.pools):
            dispatchers[name] = self._new_dispatcher(name)
        peers = self._peers
        if peers is None:
            self.discovery = peers = DiscoveryService(self.settings, self.nc, self.current_load,
                                                      activity=self._activity)
        main = dispatchers[DEFAULT_POOL]
        learning = LearningContext.for_node(self.nc, self.settings, main.keys)
        answerer.on_answer = learning.rewards.observe
        view = NodeView(self.settings.node_id, self.store, main, self.metrics, peers, learning)
        self.scheduler = scheduler = SchedulerService(self.settings, self.nc, self.store, self.metrics, answerer,
                                                      self.inbox, dispatchers, view, peers)
        self.ingress = ingress = Ingress(self.settings, self.nc, self.registry, self.metrics, answerer, dispatchers,
                                         scheduler.schedule, alive=view.peers)
        if self.discovery:   # a peer that falls silent: what was forwarded to it fails then, not at its timeout
            self.discovery.on_removed.append(scheduler.forwarder.peer_removed)
        for name in list(self._dispatchers):
            await self._start_pool(name)
        await scheduler.start()
        await ingress.start()
        self.store_check = StoreCheck(self.settings.node_id, self.nc, self.subjects,
                                      self.settings.timings.store_check_every_s).start()
        if self.discovery:
            await self.discovery.start()
        self.control = await NodeControl(self.nc, self).start()
        for name in self.pools:
            await self._watch_pool(name)
        self._unlisten = on_event(self.nc, "reconnected", self._on_reconnected)
        log.info("node %s up: K=%d queue=%d scheduler=%s", self.settings.node_id,
                 self.store.node.parallel_running_functions_max, self.store.node.queue_length_max,
                 scheduler.algorithm.describe())
        return self

    async def stop(self) -> None:
        self._unlisten()
        if self._answerer is not None:
            self._answerer.dropped.flush()
        for task in self._reconciling:
            task.cancel()
        for name in list(self._watching):
            await self._unwatch_pool(name)
        if self.store_check is not None:
            await self.store_check.stop()
        if self.discovery:  # silence first: peers stop choosing us within suspect_after periods
            await self.discovery.stop()
        if self.control:
            await self.control.stop()
        if self.deployments.catalogue is not None:
            await self.deployments.catalogue.stop()
        if self.ingress:
            await self.ingress.stop()
        if self.scheduler:
            await self.scheduler.stop_deciding()
        await asyncio.gather(*(pool.stop() for pool in self.pools.values()))
        if self.scheduler:
            await self.scheduler.stop()
            if self.scheduler.learning:
                await self.scheduler.learning.stop()
        if self.nc is not None and self.nc.is_connected:  # anyone still waiting on us fails now
            with contextlib.suppress(Exception):
                await self.nc.publish(self.subjects.gone(self.settings.node_id),
                                      encode(NodeGone(node=self.settings.node_id, by=self.settings.node_id,
                                                      reason="node stopped")))
        if self.inbox:
            await self.inbox.stop()
        if self.learner:
            await self.learner.stop()
        if self.nc and not self.nc.is_closed:
            await close_quietly(self.nc)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    async def __aenter__(self) -> "Node":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- worker pools ---------------------------------------------------------
    def _new_dispatcher(self, name: str) -> Dispatcher:
        """The main pool's has K slots; a dedicated pool's a slot per worker."""
        assert self.nc is not None and self.inbox is not None and self._answerer is not None
        main = name == DEFAULT_POOL
        self.stats[name] = PoolStats(self.settings.node_id, name)
        return Dispatcher(name, self.nc, self.subjects, self.settings.node_id, self.registry, self.inbox,
                          self._answerer, slots=self.store.node.parallel_running_functions_max if main else None,
                          kill_worker=lambda worker: self.pools[name].kill(worker),
                          unreachable=lambda worker: self.pools[name].unreachable(worker),
                          wake=None if main else lambda: self.pools[name].wake(), timings=self.settings.timings)

    async def _start_pool(self, name: str) -> WorkerPool:
        pool = WorkerPool(self.settings, self._dispatchers[name], name, self.metrics)
        self.pools[name] = pool
        if name == DEFAULT_POOL:
            self.pool = pool
            await pool.start(self._main_processes(self.store.node.parallel_running_functions_max))
        else:
            pool.secrets = self.deployments.secrets_of(name)
            await pool.start(self.settings.pools[name].initial)
        return pool

    # -- pools made and removed at run time (a function's own: nodes/deployments.py) ------
    async def add_pool(self, name: str) -> WorkerPool:
        """Start a pool of ``settings.pools`` (dispatcher, workers, telemetry, scale commands); its
        functions' calls go to it from now on."""
        assert self.scheduler is not None
        self._dispatchers[name] = self._new_dispatcher(name)
        pool = await self._start_pool(name)
        for fn in self.settings.pools[name].functions:
            self.scheduler.pool_of[fn] = name
        if self.learner is not None and name not in self.learner.settings.pools:
            self.learner.settings.pools.append(name)
        await self._watch_pool(name)
        log.info("node %s: pool %s added for %s", self.settings.node_id, name, ", ".join(self.settings.pools[name].functions))
        return pool

    async def remove_pool(self, name: str, functions: list[str], drain_s: float = 30.0) -> None:
        """Its functions are gone (or back in the main pool): what waits in it runs, within
        ``drain_s``; what is left is refused; then its workers stop."""
        assert self.scheduler is not None and self._answerer is not None
        for fn in functions:
            if self.scheduler.pool_of.get(fn) == name:
                del self.scheduler.pool_of[fn]
        await self._unwatch_pool(name)
        dispatcher = self._dispatchers[name]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_s):
                while dispatcher.n_waiting:
                    await asyncio.sleep(0.1)
        for call in dispatcher.drop_queued(lambda call: True):
            await self._answerer.refused(call, codes.GENERIC, 503, f"{call.fn} was removed from this node before "
                                                                   "it ran", "function_removed")
        await self.pools.pop(name).stop()
        del self._dispatchers[name]
        self.stats.pop(name, None)
        log.info("node %s: pool %s removed", self.settings.node_id, name)

    async def _watch_pool(self, name: str) -> None:
        """Its telemetry (and pulses between long control periods) out, its scale commands in."""
        assert self.nc is not None
        pool = self.pools[name]
        stats, me, period = self.stats[name], self.settings.node_id, self._pool_period(name)
        tasks = [asyncio.create_task(send_telemetry(self.nc, self.subjects.telemetry(me, name), stats, pool, period),
                                     name=f"{name}-telemetry")]
        if period > PULSE_PERIOD_S:
            tasks.append(asyncio.create_task(send_pulses(self.nc, self.subjects.pulse(me, name), stats, pool),
                                             name=f"{name}-pulses"))
        sub = await self.nc.subscribe(self.subjects.scale(self.settings.node_id, name), cb=self._on_scale)
        self._watching[name] = [*tasks, sub]

    async def _unwatch_pool(self, name: str) -> None:
        *tasks, sub = self._watching.pop(name, [None])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def _on_reconnected(self) -> None:
        """Back on the broker: calls (or outcomes) on the wire when it went are found and run again or
        answered (Dispatcher.reconcile); async calls received again are checked for stored answers."""
        at = time.time()
        if self.ingress is not None:
            self.ingress.reconnected()
        for dispatcher in self._dispatchers.values():
            task = asyncio.get_running_loop().create_task(dispatcher.reconcile(at))
            self._reconciling.add(task)
            task.add_done_callback(self._reconciled)

    def _reconciled(self, task: asyncio.Task) -> None:
        self._reconciling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("node %s: reconciling after the broker outage failed: %r", self.settings.node_id, task.exception())

    def _activity(self) -> tuple[str, dict[str, int]]:
        """For heartbeats: the algorithm and the forwards per peer since the previous heartbeat."""
        if self.scheduler is None:
            return "", {}
        forwards, self.scheduler.forwards = self.scheduler.forwards, {}
        return self.scheduler.algorithm.describe(), forwards

    def _pool_period(self, name: str) -> float:
        spec = self.settings.pools.get(name)
        return (spec.period_s if spec else None) or self.settings.telemetry_period_s

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
            target = min(MAX_K, max(1, command.target_workers))
            await self.apply_configuration(self.store.node.model_copy(update={"parallel_running_functions_max": target}))
            return
        spec = self.settings.pools[command.pool]
        if pool.target == 0 and spec.min == 0:
            return   # asleep: its next call wakes it, not a policy that saw no call
        target = min(spec.max, max(spec.min, command.target_workers))
        if target != pool.target:
            log.info("pool %s: %d -> %d workers (%r, %r)", command.pool, pool.target, target,   # repr: no log injection
                     command.policy[:64], command.reason[:200])
        await pool.set_size(target)

    # -- control plane ------------------------------------------------------
    def current_load(self) -> NodeLoad:
        assert self.scheduler is not None
        c = self.store.node
        main = self.scheduler.main
        return NodeLoad(node=self.settings.node_id, running=main.n_running, queued=main.n_waiting,
                        parallel_running_functions_max=c.parallel_running_functions_max,
                        queue_length_max=c.queue_length_max, queue_enabled=c.queue_enabled,
                        scheduler=self.scheduler.algorithm.describe())

    def _main_processes(self, k: int) -> int:
        return worker_processes(k, self.settings.worker_processes_max)

    async def apply_configuration(self, config: NodeConfiguration) -> None:
        """Persist and apply at run time: K resizes the worker pool, no restart."""
        self.store.set_node(config)
        assert self.pool is not None
        await self.pool.dispatcher.set_slots(config.parallel_running_functions_max)
        await self.pool.set_size(self._main_processes(config.parallel_running_functions_max))
        if self.ingress is not None:
            self.ingress.intake.wake()
        if self.pool:
            self.metrics.workers.labels(node=self.settings.node_id, state="target").set(self.pool.target)
