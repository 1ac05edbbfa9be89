"""The node's functions as OpenFaaS's management API sees them (``/system/*``, docs/compat.md):
deploy, delete and scale at run time. A deployed function is persisted in ``<node_dir>/functions.json``
and the workers that load it are replaced; it gets a pool of its own when it asks for what shared
workers cannot give (scaling bounds, scale to zero, secrets, limits) or is scaled by hand."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Protocol

import orjson

from broker.codec import decode, encode
from broker.control import ControlError
from broker.messages import (FunctionDeployment, FunctionInfo, FunctionList, FunctionScale, NodeConfiguration,
                             ScaleDelay)
from broker.subjects import Subjects
from functions.image import check_engine, parse_image_reference
from functions.registry import FunctionRegistry, default_registry, env_conflicts
from nodes.catalogue import APPLY_TIMEOUT_S, Catalogue
from nodes.config_store import ConfigStore, read_node_file, write_node_file
from nodes.metrics import NodeMetrics
from nodes.pool import WorkerPool
from nodes.deployment_specs import deployed_functions, function_pool, memory_text, options_of
from nodes.secrets import NodeSecrets
from nodes.settings import FunctionOptions, NodeSettings, PoolSpec
from nodes.worker import DEFAULT_POOL

log = logging.getLogger(__name__)

SCALE_DELAY_TIMEOUT_S = 120.0
POLL_S = 0.1   # P2PFaaS polls the replicas every 100 ms while measuring the scale-up
PROCESS_MEMORY_MIN = 128 * 1024 * 1024   # a worker process itself holds about 90 MB of data
SCALED_BY_HAND_MAX = 32   # a shared function scaled by hand gets a pool of its own of up to this many


class PoolHost(Protocol):
    """What deployments need of the node that holds them (nodes/node.py's ``Node``)."""

    settings: NodeSettings
    subjects: Subjects
    metrics: NodeMetrics
    store: ConfigStore
    registry: FunctionRegistry
    pools: dict[str, WorkerPool]

    async def add_pool(self, name: str) -> WorkerPool: ...

    async def remove_pool(self, name: str, functions: list[str], drain_s: float = 30.0) -> None: ...

    async def apply_configuration(self, config: NodeConfiguration) -> None: ...


class Deployments:
    def __init__(self, node: PoolHost) -> None:
        self.node = node
        self.path = node.settings.node_dir / "functions.json"
        self._lock = asyncio.Lock()
        self._deployed: dict[str, FunctionDeployment] = {}   # deployed at run time (functions.json)
        self._secrets: dict[str, dict[str, str]] = {}         # a function pool's secrets, opened
        self.catalogue: Catalogue | None = None
        self.secrets: NodeSecrets | None = None

    # -- persistence -----------------------------------------------------------------
    def restore(self) -> None:
        """Functions deployed before a restart join the settings'; an unreadable ``functions.json`` is
        refused (NodeFileError): the node does not guess what its functions were."""
        saved = read_node_file(self.path, deployed_functions, "fix it, or delete it to start without the "
                                                               "functions deployed at run time")
        known = {name for name, _ in self.node.settings.functions}
        for deployment in saved or []:
            if deployment.service in known:
                continue
            try:
                default_registry([(deployment.service, deployment.reference)])
            except ValueError as exc:   # e.g. its module is gone: the node starts without it
                log.warning("node %s: deployed function %s = %s not restored: %s",
                            self.node.settings.node_id, deployment.service, deployment.reference, exc)
                continue
            self._deployed[deployment.service] = deployment
            self._take(deployment)

    def _save(self, change: str) -> None:
        """This node's record of its deployed functions; the catalogue has them, so a write failure is not fatal."""
        try:
            write_node_file(self.path, orjson.dumps([d.model_dump(exclude_defaults=True)
                                                     for d in self._deployed.values()]))
        except OSError as exc:
            log.error("node %s: %s applied, but its record %s cannot be written (%s): the catalogue has it",
                      self.node.settings.node_id, change, self.path, exc.strerror or exc)
            self.node.metrics.error("node_file_unwritten")

    def _take(self, deployment: FunctionDeployment) -> None:
        """``deployment`` in the settings the workers start from (its own pool, if it has one)."""
        self._drop(deployment.service)
        name, settings = deployment.service, self.node.settings
        settings.functions = [*settings.functions, (name, deployment.reference)]
        if deployment.env_vars:
            settings.function_env = {**settings.function_env, name: dict(deployment.env_vars)}
        options = options_of(deployment)
        if options != FunctionOptions():
            settings.function_options = {**settings.function_options, name: options}
        if deployment.own_pool:
            settings.pools = {**settings.pools, name: function_pool(deployment)}
        if settings.runtime == "inprocess":   # its functions run in this process
            os.environ.update(deployment.env_vars)

    def _drop(self, name: str) -> None:
        settings = self.node.settings
        settings.functions = [(n, r) for n, r in settings.functions if n != name]
        settings.function_env = {n: e for n, e in settings.function_env.items() if n != name}
        settings.function_options = {n: o for n, o in settings.function_options.items() if n != name}
        if name in settings.pools and settings.pools[name].function_pool:
            settings.pools = {p: spec for p, spec in settings.pools.items() if p != name}

    # -- the catalogue (nodes/catalogue.py) ---------------------------------------------
    async def join_catalogue(self, js) -> None:
        """Before the workers start: the catalogue's functions become this node's, then every later
        change. The first node to make the catalogue brings the functions it had deployed before."""
        self.secrets = NodeSecrets(js, self.node.subjects, self.node.settings.node_id, self.secret_users)
        self.catalogue = catalogue = Catalogue(js, self.node.subjects, self.node.settings.node_id)
        current = await catalogue.open()
        if catalogue.created:
            for deployment in self.deployed():
                await catalogue.put(deployment)
                current[deployment.service] = deployment
        for name in [n for n in self._deployed if n not in current]:
            await self._apply(name, None, running=False)
        for name in [n for n in self._deployed if n in current]:   # restored: their secrets still to open
            self._deployed.pop(name)
            self._drop(name)
        for name, deployment in current.items():
            try:
                await self._apply(name, deployment, running=False)
            except ControlError as exc:   # e.g. its module is not on this machine: the others run it
                log.error("node %s: catalogue function %s = %s cannot run here: %s",
                          self.node.settings.node_id, name, deployment.reference, exc.message)
        catalogue.start(self._apply)

    def deployed(self) -> list[FunctionDeployment]:
        """The functions deployed at run time here (those of functions.json), not --function's."""
        return list(self._deployed.values())

    def secret_users(self, secret: str) -> list[str]:
        return sorted(name for name, d in self._deployed.items() if secret in d.secrets)

    def secrets_of(self, pool: str) -> dict[str, str]:
        """The opened secrets a pool's workers are handed (a function pool's own)."""
        return dict(self._secrets.get(pool, {}))

    async def check(self, deployment: FunctionDeployment) -> "FunctionRegistry":
        """A registry with ``deployment``, or ControlError saying what could not run or what clashes."""
        name, settings = deployment.service, self.node.settings
        taken = settings.pools.get(name)
        if name == DEFAULT_POOL or (taken is not None and not taken.function_pool):
            raise ControlError(409, f"{name}: a pool of this node has that name; a function with a pool of its own "
                                    "cannot take it")
        try:
            trial = default_registry([(name, deployment.reference)], env={name: dict(deployment.env_vars)},
                                     options={name: options_of(deployment)})
            image = parse_image_reference(deployment.reference)
            if image is not None:
                await asyncio.to_thread(check_engine, image)
        except ValueError as exc:
            raise ControlError(400, str(exc)) from None
        limits = deployment.limits
        if limits is not None and image is None:
            if limits.cpus and settings.runtime != "docker":
                raise ControlError(400, f"{name}: a CPU limit is a container's: give it to an image function, or run "
                                        "the node's workers as containers (--runtime docker); a worker process takes a "
                                        "memory limit only")
            if limits.memory_bytes and limits.memory_bytes < PROCESS_MEMORY_MIN and settings.runtime != "docker":
                raise ControlError(400, f"{name}: a memory limit under {PROCESS_MEMORY_MIN >> 20} MiB leaves a worker "
                                        "process no room for itself (about 90 MB): give 128Mi or more")
        if not deployment.own_pool:   # its workers are the main pool's, and so is their environment
            shared = {n: e for n, e in settings.function_env.items() if n not in settings.pools}
            clash = env_conflicts(shared, name, dict(deployment.env_vars))
            if clash:
                raise ControlError(409, f"{name}: {', '.join(clash)}: the functions of a pool share its workers' "
                                        "environment (a function with a pool of its own does not)")
        return trial

    async def _apply(self, name: str, deployment: FunctionDeployment | None, running: bool = True) -> None:
        """One catalogue change here: deploy (checked first: a bad one changes nothing) or remove ``name``;
        ControlError says why not. ``running``: the node serves already, so its pools change now."""
        async with self._lock:
            settings = self.node.settings
            before = settings.pools.get(name)
            shared_before = name in dict(settings.functions) and (before is None or not before.function_pool)
            if deployment is None:
                if self._deployed.pop(name, None) is None:
                    return
                self._save(f"removal of {name}")
                self._drop(name)
                self._secrets.pop(name, None)
                self.node.registry.remove(name)
                log.info("node %s: removed %s", settings.node_id, name)
            else:
                if self._deployed.get(name) == deployment and self.node.registry.get(name):
                    return
                trial = await self.check(deployment)
                secrets = await self._open(deployment)
                self._deployed[name] = deployment
                self._save(f"deploy of {name}")
                self._secrets[name] = secrets
                self._take(deployment)
                log.info("node %s: deployed %s = %s%s", settings.node_id, name, deployment.reference,
                         " (a pool of its own)" if deployment.own_pool else "")
            if running:
                await self._change_pools(name, before, shared_before)
            if deployment is not None:   # admitted once the workers that run it are there
                self.node.registry.add(trial.get(name))

    async def _open(self, deployment: FunctionDeployment) -> dict[str, str]:
        if not deployment.secrets:
            return {}
        assert self.secrets is not None
        return await self.secrets.values(deployment.secrets)

    async def _change_pools(self, name: str, before: PoolSpec | None, shared_before: bool) -> None:
        """The pools as the settings now say, the main pool's workers replaced when its functions changed."""
        node, settings = self.node, self.node.settings
        after = settings.pools.get(name)
        shared_now = name in dict(settings.functions) and after is None
        if before is not None and before.function_pool and after is None:
            await node.remove_pool(name, [name])
        elif after is not None and name not in node.pools:
            await node.add_pool(name)
        elif after is not None:
            pool = node.pools[name]
            pool.secrets = self.secrets_of(name)
            await pool.replace_workers()
            asleep = pool.target == 0 and after.min == 0
            await pool.set_size(0 if asleep else min(after.max, max(after.min, pool.target)))
        if shared_before or shared_now:
            replaced = await node.pools[DEFAULT_POOL].replace_workers()
            log.info("node %s: %d worker(s) of the main pool replaced to load the new function list",
                     settings.node_id, replaced)

    # -- control handlers (faas.<node>.functions.*) ----------------------------------
    async def on_list(self, body: bytes) -> bytes:
        return encode(FunctionList([self.info(name) for name in self.node.registry.names()]))

    async def on_deploy(self, body: bytes) -> bytes:
        """Checked here (a bad one changes nothing), then into the catalogue; answered once applied here."""
        deployment = decode(FunctionDeployment, body)
        await self.check(deployment)
        await self._open(deployment)
        await self._changed(self._catalogue().put(deployment), f"deploy of {deployment.service}")
        return encode(self.info(deployment.service))

    async def on_delete(self, body: bytes) -> bytes:
        name = decode(FunctionScale, body).service
        catalogue = self._catalogue()
        if not await catalogue.has(name) and name not in self._deployed:
            known = self.node.registry.get(name) is not None
            raise ControlError(400 if known else 404, f"{name} is not deployed at run time and cannot be removed"
                               if known else f"no function {name!r} is deployed")
        await self._changed(catalogue.delete(name), f"removal of {name}")
        return b"{}"

    def _catalogue(self) -> Catalogue:
        if self.catalogue is None:
            raise ControlError(503, "the node is starting: its function catalogue is not read yet; try again")
        return self.catalogue

    async def _changed(self, change, what: str) -> None:
        """Make a catalogue change and wait until this node has applied it."""
        try:
            revision = await change
        except Exception as exc:   # JetStream away, or the bucket's store full
            raise ControlError(503, f"{what} refused, nothing changed: the function catalogue cannot be written "
                                    f"({type(exc).__name__}: {exc})") from None
        try:
            await self.catalogue.applied(revision)
        except TimeoutError:
            raise ControlError(504, f"{what}: in the catalogue, not applied here within "
                                    f"{APPLY_TIMEOUT_S:g} s") from None

    async def on_scale(self, body: bytes) -> bytes:
        """``replicas``: the function's own pool's size (0: its next call wakes it); a function of the
        main pool gets a pool of its own on this node."""
        scale = decode(FunctionScale, body)
        if scale.replicas is None:
            raise ControlError(400, "replicas is missing")
        name, replicas = scale.service, scale.replicas
        pool_name = self._pool_of(name)
        async with self._lock:
            settings = self.node.settings
            if pool_name == DEFAULT_POOL:
                settings.pools = {**settings.pools, name: PoolSpec(
                    functions=[name], min=0, max=max(replicas, SCALED_BY_HAND_MAX), initial=replicas,
                    function_pool=True)}
                await self.node.add_pool(name)
                log.info("node %s: %s scaled by hand to %d: a pool of its own", settings.node_id, name, replicas)
                return encode(self.info(name))
            spec = settings.pools[pool_name]
            if not spec.function_pool:   # a pool of several functions (the farm): within its bounds
                await self.node.pools[pool_name].set_size(min(spec.max, max(spec.min, replicas)))
                return encode(self.info(name))
            if not (spec.min <= replicas <= spec.max or replicas == 0 == spec.min):
                raise ControlError(400, f"{name} scales between {spec.min} and {spec.max} replicas, not {replicas} "
                                        "(deploy it with other bounds to change them)")
            await self.node.pools[pool_name].set_size(replicas)
        return encode(self.info(name))

    async def on_scale_delay(self, body: bytes) -> bytes:
        """Scale the function's pool up by one, time until the new worker is ready, scale back."""
        name = decode(FunctionScale, body).service
        pool_name = self._pool_of(name)
        pool = self.node.pools[pool_name]
        if pool.ready != pool.target:
            raise ControlError(400, f"the pool of {name} is scaling ({pool.ready} of {pool.target} ready); try again")
        size = pool.target
        started, attempts = time.perf_counter(), 0
        await self._set_size(pool_name, size + 1)
        try:
            while pool.ready < pool.target:
                attempts += 1
                if time.perf_counter() - started > SCALE_DELAY_TIMEOUT_S:
                    raise ControlError(500, f"the pool of {name} did not scale within {SCALE_DELAY_TIMEOUT_S:g} s")
                await asyncio.sleep(POLL_S)
            delay = time.perf_counter() - started
        finally:
            await self._set_size(pool_name, size)
        return encode(ScaleDelay(approximate_delay=delay, error_margin=POLL_S, attempts=max(1, attempts)))

    # -- helpers -----------------------------------------------------------------------
    def info(self, name: str) -> FunctionInfo:
        spec = self.node.registry.get(name)
        if spec is None:
            raise ControlError(404, f"no function {name!r} on {self.node.settings.node_id}")
        settings = self.node.settings
        reference = dict(settings.functions).get(name, "")
        image = parse_image_reference(reference) if reference else None
        pool_name = self._pool_of(name)
        pool = self.node.pools.get(pool_name)
        own = settings.pools.get(name) if pool_name == name else None
        deployed = self._deployed.get(name)
        labels = {**(deployed.labels if deployed else {}), "p2pfaas.pool": pool_name,
                  "p2pfaas.node": settings.node_id, "p2pfaas.deployed": "catalogue" if deployed else "node",
                  "p2pfaas.timeout": f"{spec.timeout_s:g}s", "p2pfaas.concurrency": str(spec.concurrency)}
        if own is not None:   # as faas-cli users write them
            labels.update({"com.openfaas.scale.min": str(own.min), "com.openfaas.scale.max": str(own.max),
                           "com.openfaas.scale.zero": "true" if own.zero_after_s else "false"})
            if own.zero_after_s:
                labels["com.openfaas.scale.zero-duration"] = f"{own.zero_after_s:g}s"
            if deployed is not None and deployed.scaling is not None:
                labels["p2pfaas.scale.policy"] = deployed.scaling.policy
            if pool is not None and pool.cold_start_s is not None:
                labels["p2pfaas.cold_start"] = f"{pool.cold_start_s:.3f}s"
        limits = deployed.limits if deployed else None
        return FunctionInfo(
            name=name, image=image or "p2pfaas", envProcess="" if image else reference,
            envVars=dict(deployed.env_vars) if deployed else {},
            invocationCount=int(self.node.metrics.invocations(name)),
            replicas=pool.target if pool else 0, availableReplicas=pool.ready if pool else 0,
            labels=labels,
            annotations={**({"description": spec.description} if spec.description else {}),
                         **(deployed.annotations if deployed else {})},
            secrets=list(deployed.secrets) if deployed else [],
            limits={k: v for k, v in (("memory", memory_text(limits.memory_bytes)),
                                      ("cpu", f"{limits.cpus:g}" if limits.cpus else None)) if v} if limits else None,
        )

    def _pool_of(self, name: str) -> str:
        if self.node.registry.get(name) is None:
            raise ControlError(404, f"no function {name!r} on {self.node.settings.node_id}")
        return next((p for p, spec in self.node.settings.pools.items() if name in spec.functions), DEFAULT_POOL)

    async def _set_size(self, pool_name: str, replicas: int) -> None:
        if pool_name == DEFAULT_POOL:   # the main pool's size is K
            node = self.node
            k = max(1, replicas)
            await node.apply_configuration(node.store.node.model_copy(update={"parallel_running_functions_max": k}))
            return
        spec = self.node.settings.pools[pool_name]
        await self.node.pools[pool_name].set_size(min(spec.max, max(spec.min, replicas)))
