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
import time
from typing import TYPE_CHECKING

import orjson

from broker.codec import decode, encode
from broker.control import ControlError
from broker.messages import FunctionDeployment, FunctionInfo, FunctionList, FunctionScale, ScaleDelay
from functions.image import check_engine, parse_image_reference
from functions.registry import default_registry
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
        self._deployed: list[tuple[str, str]] = []   # deployed at run time (functions.json)
        self.catalogue: Catalogue | None = None

    # -- persistence -----------------------------------------------------------------
    def restore(self) -> None:
        """Functions deployed before a restart join the settings' (the workers load them). A
        ``functions.json`` that cannot be read is refused (NodeFileError): started without it, the
        node would overwrite it at the next deploy and the user's functions would be lost."""
        saved = read_node_file(self.path, _deployed_functions, "fix it, or delete it to start without the "
                                                               "functions deployed at run time")
        known = {name for name, _ in self.node.settings.functions}
        extra = []
        for name, ref in saved or []:
            if name in known:
                continue
            try:
                default_registry([(name, ref)])
            except ValueError as exc:   # e.g. its module is gone: the node starts without it
                log.warning("node %s: deployed function %s = %s not restored: %s",
                            self.node.settings.node_id, name, ref, exc)
                continue
            extra.append((name, ref))
        self._deployed = extra
        self.node.settings.functions = [*self.node.settings.functions, *extra]

    def _save(self, functions: list[tuple[str, str]], change: str) -> None:
        """This node's record of its deployed functions. The catalogue holds them (a restart reads
        it), so a record that cannot be written (a full disk) is said, counted, and not fatal."""
        try:
            write_node_file(self.path, orjson.dumps(functions))
        except OSError as exc:
            log.error("node %s: %s applied, but its record %s cannot be written (%s): the catalogue has it",
                      self.node.settings.node_id, change, self.path, exc.strerror or exc)
            self.node.metrics.error("node_file_unwritten")

    # -- the catalogue (nodes/catalogue.py) ---------------------------------------------
    async def join_catalogue(self, js) -> None:
        """Before the workers start: what the deployment's catalogue holds becomes this node's
        (a function deployed or removed while it was away included); then every later change. The
        first node to make the catalogue brings the functions it had deployed before there was one."""
        self.catalogue = catalogue = Catalogue(js, self.node.subjects, self.node.settings.node_id)
        current = await catalogue.open()
        if catalogue.created:
            for name, ref in self.deployed():
                await catalogue.put(FunctionDeployment(service=name, reference=ref))
                current[name] = FunctionDeployment(service=name, reference=ref)
        ours = dict(self.deployed())
        for name in [n for n in ours if n not in current]:
            await self._apply(name, None, replace=False)
        for name, deployment in current.items():
            if ours.get(name) != deployment.reference:
                try:
                    await self._apply(name, deployment, replace=False)
                except ControlError as exc:   # e.g. its module is not on this machine: the others run it
                    log.error("node %s: catalogue function %s = %s cannot run here: %s",
                              self.node.settings.node_id, name, deployment.reference, exc.message)
        catalogue.start(self._apply)

    def deployed(self) -> list[tuple[str, str]]:
        """The functions deployed at run time here (those of functions.json), not --function's."""
        return list(self._deployed)

    async def _apply(self, name: str, deployment: FunctionDeployment | None, replace: bool = True) -> None:
        """One catalogue change, here: deploy (import or check the image first: a bad one changes
        nothing) or remove ``name``; ControlError says why not."""
        async with self._lock:
            if deployment is None:
                if name not in dict(self._deployed):
                    return
                functions = [(n, r) for n, r in self.node.settings.functions if n != name]
                self._save([(n, r) for n, r in self._deployed if n != name], f"removal of {name}")
                self.node.settings.functions = functions
                self._deployed = [(n, r) for n, r in self._deployed if n != name]
                self.node.registry.remove(name)
                log.info("node %s: removed %s", self.node.settings.node_id, name)
            else:
                if dict(self._deployed).get(name) == deployment.reference and self.node.registry.get(name):
                    return
                try:
                    trial = default_registry([(name, deployment.reference)])
                    image = parse_image_reference(deployment.reference)
                    if image is not None:
                        await asyncio.to_thread(check_engine, image)
                except ValueError as exc:
                    raise ControlError(400, str(exc)) from None
                deployed = [*((n, r) for n, r in self._deployed if n != name), (name, deployment.reference)]
                self._save(deployed, f"deploy of {name}")
                self._deployed = deployed
                self.node.registry.add(trial.get(name))   # admitted from now on
                self.node.settings.functions = [*((n, r) for n, r in self.node.settings.functions if n != name),
                                                (name, deployment.reference)]
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
        try:
            default_registry([(deployment.service, deployment.reference)])
            image = parse_image_reference(deployment.reference)
            if image is not None:
                await asyncio.to_thread(check_engine, image)
        except ValueError as exc:
            raise ControlError(400, str(exc)) from None
        await self._changed(self._catalogue().put(deployment), f"deploy of {deployment.service}")
        return encode(self.info(deployment.service))

    async def on_delete(self, body: bytes) -> bytes:
        name = decode(FunctionScale, body).service
        catalogue = self._catalogue()
        if not await catalogue.has(name) and name not in dict(self._deployed):
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
        return FunctionInfo(
            name=name, image=image or "p2pfaas", envProcess="" if image else reference,
            invocationCount=int(self.node.metrics.invocations(name)),
            replicas=pool.target if pool else 0, availableReplicas=pool.ready if pool else 0,
            labels={"p2pfaas.pool": self._pool_of(name), "p2pfaas.node": self.node.settings.node_id},
            annotations={"description": spec.description} if spec.description else {},
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


def _deployed_functions(data: bytes) -> list[tuple[str, str]]:
    """``functions.json``: a JSON list of ``[name, reference]`` pairs (ValueError otherwise)."""
    saved = orjson.loads(data)
    if not isinstance(saved, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair) for pair in saved):
        raise ValueError('it must be a JSON list of ["name", "reference"] pairs')
    return [(name, reference) for name, reference in saved]
