"""A node's control plane: the request/reply subjects that read and change it (load, configuration,
scheduler, metrics, info, functions, secrets, P2PFaaS's discovery API), each a handler
``async (body) -> body`` served by :class:`broker.control.ControlServer`."""

from __future__ import annotations

import logging
import time
from typing import Protocol

import orjson
from nats.aio.client import Client
from prometheus_client import generate_latest

from broker.answers import VERSION
from broker.codec import decode, decode_update, encode
from broker.control import ControlError, ControlServer
from broker.messages import NodeConfiguration, NodeLoad, SchedulerChange, SchedulerConfiguration
from broker.subjects import Subjects
from functions.registry import FunctionRegistry
from nodes.config_store import ConfigStore
from nodes.deployments import Deployments
from nodes.discovery.service import DiscoveryService
from nodes.ingress import Ingress
from nodes.metrics import NodeMetrics
from nodes.pool import WorkerPool
from nodes.scheduler.service import SchedulerService
from nodes.settings import NodeSettings
from nodes.store_check import StoreCheck

log = logging.getLogger(__name__)


class ControlledNode(Protocol):
    """What the control plane reads and changes of a started node (nodes/node.py's ``Node``)."""

    settings: NodeSettings
    subjects: Subjects
    metrics: NodeMetrics
    store: ConfigStore
    registry: FunctionRegistry
    deployments: Deployments
    pool: WorkerPool | None
    pools: dict[str, WorkerPool]
    scheduler: SchedulerService | None
    ingress: Ingress | None
    discovery: DiscoveryService | None
    store_check: StoreCheck | None
    started_at: float

    def current_load(self) -> NodeLoad: ...

    async def apply_configuration(self, config: NodeConfiguration) -> None: ...


class NodeControl:
    def __init__(self, nc: Client, node: ControlledNode) -> None:
        self.node = node
        self.server = ControlServer(nc, self._refused, name="p2pfaas-node",
                                    metadata={"node": node.settings.node_id, "prefix": node.settings.prefix},
                                    description=f"p2pfaas node {node.settings.node_id}: its control plane")

    async def start(self) -> "NodeControl":
        node = self.node
        name, s, deployments = node.settings.node_id, node.subjects, node.deployments
        handlers = [
            (s.load(name), self._on_load),
            (s.config(name, "get"), self._on_config_get),
            (s.config(name, "set"), self._on_config_set),
            (s.scheduler_config(name, "get"), self._on_scheduler_get),
            (s.scheduler_config(name, "set"), self._on_scheduler_set),
            (s.metrics(name), self._on_metrics),
            (s.info(name), self._on_info),
            (s.functions(name, "list"), deployments.on_list),
            (s.functions(name, "deploy"), deployments.on_deploy),
            (s.functions(name, "delete"), deployments.on_delete),
            (s.functions(name, "scale"), deployments.on_scale),
            (s.functions(name, "scale_delay"), deployments.on_scale_delay),
            (s.functions(name, "secrets_list"), deployments.secrets.on_list),
            (s.functions(name, "secrets_set"), deployments.secrets.on_set),
            (s.functions(name, "secrets_delete"), deployments.secrets.on_delete),
        ]
        if node.discovery:   # P2PFaaS's discovery API
            d = node.discovery
            handlers += [(s.discovery(name, verb), handler) for verb, handler in (
                ("register", d.on_register), ("reset", d.on_reset),
                ("config.get", d.on_config_get), ("config.set", d.on_config_set))]
        for subject, handler in handlers:
            await self.server.serve(subject, handler)
        return self

    async def stop(self) -> None:
        await self.server.stop()

    async def _on_load(self, body: bytes) -> bytes:
        return encode(self.node.current_load())

    async def _on_config_get(self, body: bytes) -> bytes:
        return encode(self.node.store.node)

    async def _on_config_set(self, body: bytes) -> bytes:
        """As P2PFaaS: the keys sent replace the current values, the others keep theirs."""
        config = decode_update(self.node.store.node, body)
        await self.node.apply_configuration(config)
        return encode(config)

    async def _on_scheduler_get(self, body: bytes) -> bytes:
        return encode(self.node.store.scheduler)

    async def _on_scheduler_set(self, body: bytes) -> bytes:
        node = self.node
        assert node.scheduler is not None
        config = decode(SchedulerChange, body)
        try:
            algorithm = node.scheduler.set_algorithm(config.name, config.parameters)
        except ValueError as exc:
            raise ControlError(400, str(exc)) from None
        config = SchedulerConfiguration(name=algorithm.name, parameters=algorithm.parameters())
        node.store.set_scheduler(config)
        log.info("node %s scheduler is now %s", node.settings.node_id, algorithm.describe())
        return encode(config)

    async def _on_metrics(self, body: bytes) -> bytes:
        node, me = self.node, self.node.settings.node_id
        if node.pool:
            for state in ("ready", "starting", "stopping"):
                node.metrics.workers.labels(node=me, state=state).set(getattr(node.pool, state))
        for name, pool in node.pools.items():
            for state in ("ready", "starting", "stopping", "target"):
                node.metrics.pool_workers.labels(node=me, pool=name, state=state).set(getattr(pool, state))
        return generate_latest(node.metrics.registry)

    async def _on_info(self, body: bytes) -> bytes:
        node = self.node
        assert node.scheduler is not None and node.ingress is not None
        pool = node.pool
        return orjson.dumps({
            "name": "p2pfaas", "version": VERSION, "node": node.settings.node_id,
            "scheduler": node.scheduler.algorithm.describe(), "functions": node.registry.names(),
            "workers": {"ready": pool.ready, "starting": pool.starting, "stopping": pool.stopping} if pool else {},
            "intake": "ok" if node.ingress.intake.healthy else "down",
            "store": (node.store_check.problem if node.store_check else None) or "ok",
            "answers_unstored": node.scheduler.answerer.unstored,
            "uptime_s": time.time() - node.started_at,
        })

    def _refused(self, subject: str, message: str) -> None:
        log.warning("control request on %s refused: %s", subject, message)
        self.node.metrics.error("bad_configuration")
