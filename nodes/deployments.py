"""The node's functions as OpenFaaS's management API sees them (``/system/*``, docs/compat.md):
list, deploy and delete functions at run time, scale a function's pool, measure a scale-up.

A deployed function is a ``module:callable`` or an ``image:<ref>`` reference, as ``--function``
takes it. It is registered in the node (so calls to it are admitted at once), persisted in
``<node_dir>/functions.json`` (a restart keeps it), and the workers are **replaced**: new worker
processes load the new function list, then the old ones stop after finishing their calls.
Scaling sets the pool's size: K for the main pool (as ``/configuration`` does), the worker count
of a dedicated pool (within its bounds).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

import orjson
from pydantic import ValidationError

from broker.codec import decode, encode
from broker.control import ControlError
from broker.messages import FunctionDeployment, FunctionInfo, FunctionList, FunctionScale, ScaleDelay
from functions.image import check_engine, parse_image_reference
from functions.registry import FunctionRegistry, default_registry, env_conflicts
from nodes.catalogue import APPLY_TIMEOUT_S, Catalogue
from nodes.config_store import read_node_file, write_node_file
from nodes.worker import DEFAULT_POOL

if TYPE_CHECKING:
    from nodes.node import Node

log = logging.getLogger(__name__)

SCALE_DELAY_TIMEOUT_S = 120.0
POLL_S = 0.1   # P2PFaaS polls the replicas every 100 ms while measuring the scale-up


class Deployments:
    def __init__(self, node: "Node") -> None:
        self.node = node
        self.path = node.settings.node_dir / "functions.json"
        self._lock = asyncio.Lock()
        self._deployed: dict[str, FunctionDeployment] = {}   # deployed at run time (functions.json)
        self.catalogue: Catalogue | None = None

    # -- persistence -----------------------------------------------------------------
    def restore(self) -> None:
        """Functions deployed before a restart join the settings' (the workers load them). A
        ``functions.json`` that cannot be read is refused (NodeFileError): the node does not guess
        what its functions were (the catalogue then says what they are now)."""
        saved = read_node_file(self.path, _deployed_functions, "fix it, or delete it to start without the "
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
        """This node's record of its deployed functions. The catalogue holds them (a restart reads
        it), so a record that cannot be written (a full disk) is said, counted, and not fatal."""
        try:
            write_node_file(self.path, orjson.dumps([d.model_dump() for d in self._deployed.values()]))
        except OSError as exc:
            log.error("node %s: %s applied, but its record %s cannot be written (%s): the catalogue has it",
                      self.node.settings.node_id, change, self.path, exc.strerror or exc)
            self.node.metrics.error("node_file_unwritten")

    def _take(self, deployment: FunctionDeployment) -> None:
        """``deployment`` in the settings the workers start from: its reference and variables."""
        name, settings = deployment.service, self.node.settings
        settings.functions = [*((n, r) for n, r in settings.functions if n != name), (name, deployment.reference)]
        settings.function_env = {**{n: e for n, e in settings.function_env.items() if n != name},
                                 **({name: dict(deployment.env_vars)} if deployment.env_vars else {})}
        if settings.runtime == "inprocess":   # its functions run in this process
            os.environ.update(deployment.env_vars)

    def _drop(self, name: str) -> None:
        settings = self.node.settings
        settings.functions = [(n, r) for n, r in settings.functions if n != name]
        settings.function_env = {n: e for n, e in settings.function_env.items() if n != name}

    # -- the catalogue (nodes/catalogue.py) ---------------------------------------------
    async def join_catalogue(self, js) -> None:
        """Before the workers start: what the deployment's catalogue holds becomes this node's
        (a function deployed or removed while it was away included); then every later change. The
        first node to make the catalogue brings the functions it had deployed before there was one."""
        self.catalogue = catalogue = Catalogue(js, self.node.subjects, self.node.settings.node_id)
        current = await catalogue.open()
        if catalogue.created:
            for deployment in self.deployed():
                await catalogue.put(deployment)
                current[deployment.service] = deployment
        for name in [n for n in self._deployed if n not in current]:
            await self._apply(name, None, replace=False)
        for name, deployment in current.items():
            try:
                await self._apply(name, deployment, replace=False)
            except ControlError as exc:   # e.g. its module is not on this machine: the others run it
                log.error("node %s: catalogue function %s = %s cannot run here: %s",
                          self.node.settings.node_id, name, deployment.reference, exc.message)
        catalogue.start(self._apply)

    def deployed(self) -> list[FunctionDeployment]:
        """The functions deployed at run time here (those of functions.json), not --function's."""
        return list(self._deployed.values())

    async def check(self, deployment: FunctionDeployment) -> "FunctionRegistry":
        """A registry with ``deployment`` (its module imported; an image: its engine answers and
        has it), or ControlError: what could not run, or variables another function sets otherwise."""
        try:
            trial = default_registry([(deployment.service, deployment.reference)],
                                     env={deployment.service: dict(deployment.env_vars)})
            image = parse_image_reference(deployment.reference)
            if image is not None:
                await asyncio.to_thread(check_engine, image)
        except ValueError as exc:
            raise ControlError(400, str(exc)) from None
        clash = env_conflicts(self.node.settings.function_env, deployment.service, dict(deployment.env_vars))
        if clash:
            raise ControlError(409, f"{deployment.service}: {', '.join(clash)}: the functions of a pool share "
                                    "its workers' environment")
        return trial

    async def _apply(self, name: str, deployment: FunctionDeployment | None, replace: bool = True) -> None:
        """One catalogue change, here: deploy (import or check the image first: a bad one changes
        nothing) or remove ``name``; ControlError says why not."""
        async with self._lock:
            if deployment is None:
                if self._deployed.pop(name, None) is None:
                    return
                self._save(f"removal of {name}")
                self._drop(name)
                self.node.registry.remove(name)
                log.info("node %s: removed %s", self.node.settings.node_id, name)
            else:
                if self._deployed.get(name) == deployment and self.node.registry.get(name):
                    return
                trial = await self.check(deployment)
                self._deployed[name] = deployment
                self._save(f"deploy of {name}")
                self.node.registry.add(trial.get(name))   # admitted from now on
                self._take(deployment)
                log.info("node %s: deployed %s = %s", self.node.settings.node_id, name, deployment.reference)
            if replace:
                await self._replace_workers()

    # -- control handlers (faas.<node>.functions.*) ----------------------------------
    async def on_list(self, body: bytes) -> bytes:
        return encode(FunctionList([self.info(name) for name in self.node.registry.names()]))

    async def on_deploy(self, body: bytes) -> bytes:
        """Checked here (a bad one changes nothing anywhere), then into the catalogue: every node
        deploys it; the answer comes once this one has."""
        deployment = decode(FunctionDeployment, body)
        await self.check(deployment)
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
        scale = decode(FunctionScale, body)
        if scale.replicas is None:
            raise ControlError(400, "replicas is missing")
        pool = self._pool_of(scale.service)
        await self._set_size(pool, scale.replicas)
        return encode(self.info(scale.service))

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
        reference = dict(self.node.settings.functions).get(name, "")
        image = parse_image_reference(reference) if reference else None
        pool = self.node.pools.get(self._pool_of(name))
        deployed = self._deployed.get(name)
        return FunctionInfo(
            name=name, image=image or "p2pfaas", envProcess="" if image else reference,
            envVars=dict(deployed.env_vars) if deployed else {},
            invocationCount=int(self.node.metrics.invocations(name)),
            replicas=pool.target if pool else 0, availableReplicas=pool.ready if pool else 0,
            labels={**(deployed.labels if deployed else {}), "p2pfaas.pool": self._pool_of(name),
                    "p2pfaas.node": self.node.settings.node_id,
                    "p2pfaas.deployed": "catalogue" if deployed else "node"},
            annotations={**({"description": spec.description} if spec.description else {}),
                         **(deployed.annotations if deployed else {})},
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

    async def _replace_workers(self) -> None:
        replaced = await asyncio.gather(*(pool.replace_workers() for pool in self.node.pools.values()))
        log.info("node %s: %d worker(s) replaced to load the new function list", self.node.settings.node_id,
                 sum(replaced))


def _deployed_functions(data: bytes) -> list[FunctionDeployment]:
    """``functions.json``: a JSON list of deployments (or, as written before the catalogue, of
    ``[name, reference]`` pairs); ValueError otherwise."""
    saved = orjson.loads(data)
    wrong = 'it must be a JSON list of ["name", "reference"] pairs or of deployments'
    if not isinstance(saved, list):
        raise ValueError(wrong)
    out = []
    for item in saved:
        if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
            item = {"service": item[0], "reference": item[1]}
        if not isinstance(item, dict):
            raise ValueError(wrong)
        try:
            out.append(FunctionDeployment.model_validate(item))
        except ValidationError as exc:
            raise ValueError(f"{wrong} ({exc.errors()[0]['msg']})") from None
    return out
