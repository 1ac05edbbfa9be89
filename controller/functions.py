"""Each function's own autoscaling (``p2pfaas controller --functions``, which ``up`` runs): every
catalogue function with its own pool and a scaling policy gets a ``LiveController`` per node running
it, from its pool's first telemetry until the function or its scaling changes, as KEDA's operator
does. The ``--scenario`` gives the observation's scale; the function gives bounds and the period."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import BucketNotFoundError

from broker.codec import decode
from broker.errors import ContractError
from broker.lifecycle import cancel_and_wait, still_wanted
from broker.messages import FunctionDeployment, PoolTelemetry
from broker.subjects import Subjects
from controller.live import LiveController
from controller.scenario import Scenario, WorkerBounds
from nodes.catalogue import bucket_name as catalogue_bucket

log = logging.getLogger(__name__)

CATALOGUE_RETRY_S = 2.0   # until a node has made the catalogue
OFF = "off"


class FunctionScaler:
    def __init__(self, nc: Client, scenario: Scenario, *, prefix: str = "faas", models_dir: Path = Path("data/models"),
                 learn_online: bool = True, resolve: Callable[..., Any] | None = None,
                 on_start: Callable[[LiveController], None] | None = None) -> None:
        """``resolve(name, scenario, models_dir) -> (policy, name, note)``; ``on_start(controller)``."""
        from controller.policies import resolve_policy

        self.nc, self.scenario, self.models_dir = nc, scenario, models_dir
        self.subjects = Subjects(prefix)
        self.learn_online = learn_online
        self.resolve = resolve or resolve_policy
        self.on_start = on_start
        self.functions: dict[str, FunctionDeployment] = {}          # the catalogue's, with a pool of their own
        self.controllers: dict[tuple[str, str], LiveController] = {}   # (node, function)
        self.refused: dict[str, str] = {}                             # function -> why its policy is not run
        self._starting: set[tuple[str, str]] = set()
        self._sub = None
        self._watch: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> "FunctionScaler":
        self._watch = asyncio.create_task(self._follow_catalogue(), name="functions-catalogue")
        self._sub = await self.nc.subscribe(self.subjects.all_telemetry(), cb=self._on_telemetry)
        return self

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        await cancel_and_wait(self._watch)
        async with self._lock:
            for key in list(self.controllers):
                await self._stop(key)

    async def _follow_catalogue(self) -> None:
        js = self.nc.jetstream()
        while True:
            still_wanted()
            try:
                kv = await js.key_value(catalogue_bucket(self.subjects))
                break
            except BucketNotFoundError:   # no node has come yet
                await asyncio.sleep(CATALOGUE_RETRY_S)
        watcher = await kv.watchall()
        try:
            async for entry in watcher:
                if entry is None:   # the catalogue as it is, read whole
                    continue
                await self._changed(entry.key, self._deployment(entry))
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    @staticmethod
    def _deployment(entry) -> FunctionDeployment | None:
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            return None
        try:
            deployment = decode(FunctionDeployment, entry.value)
        except ContractError:
            return None
        return deployment if deployment.own_pool else None

    async def _changed(self, name: str, deployment: FunctionDeployment | None) -> None:
        """A function came, changed or went: its controllers stop (to start again at the next telemetry)."""
        async with self._lock:
            before = self.functions.pop(name, None)
            if deployment is not None:
                self.functions[name] = deployment
            if before is not None and (deployment is None or before.scaling != deployment.scaling):
                for key in [k for k in self.controllers if k[1] == name]:
                    await self._stop(key)
            self.refused.pop(name, None)

    async def _on_telemetry(self, msg: Msg) -> None:
        parts = msg.subject.split(".")
        node, pool = parts[-3], parts[-1]
        deployment = self.functions.get(pool)
        if deployment is None or (node, pool) in self.controllers or (node, pool) in self._starting:
            return
        scaling = deployment.scaling
        if scaling is None or scaling.policy == OFF or pool in self.refused:
            return
        try:
            period = decode(PoolTelemetry, msg.data).period_s
        except ContractError:
            return
        self._starting.add((node, pool))
        try:
            async with self._lock:
                if self.functions.get(pool) is deployment:
                    await self._start(node, deployment, period)
        finally:
            self._starting.discard((node, pool))

    async def _start(self, node: str, deployment: FunctionDeployment, period_s: float) -> None:
        scaling = deployment.scaling
        assert scaling is not None
        scenario = self.scenario.model_copy(update={
            "workers": WorkerBounds(min=scaling.min, max=scaling.max, initial=scaling.min), "step_seconds": period_s})
        try:
            policy, name, note = await asyncio.to_thread(self.resolve, scaling.policy, scenario, self.models_dir)
        except ValueError as exc:   # a name the controller does not know (the API takes any token)
            self.refused[deployment.service] = str(exc)
            log.error("function %s: its policy %r is not run: %s", deployment.service, scaling.policy, exc)
            return
        controller = LiveController(self.nc, node, deployment.service, policy, scenario, prefix=self.subjects.prefix,
                                    policy_name=name, learn_online=self.learn_online, models_dir=self.models_dir)
        await controller.start()
        self.controllers[(node, deployment.service)] = controller
        log.info("function %s on %s: scaled by %s between %d and %d workers%s", deployment.service, node, name,
                 scaling.min, scaling.max, f" ({note})" if note else "")
        if self.on_start is not None:
            self.on_start(controller)

    async def _stop(self, key: tuple[str, str]) -> None:
        controller = self.controllers.pop(key, None)
        if controller is not None:
            try:
                await controller.stop()
            except Exception as exc:   # the connection going: nothing more is decided anyway
                log.warning("function %s on %s: controller stop: %r", key[1], key[0], exc)
