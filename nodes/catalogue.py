"""The deployment's function catalogue: a JetStream key-value bucket (``<PREFIX>_FUNCTIONS``, one
key per function) that every node watches and applies in the bucket's order, its own changes
included, so all converge (docs/compat.md, "Deploying functions")."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError

from broker.codec import decode, encode
from broker.errors import ContractError
from broker.lifecycle import cancel_and_wait
from broker.messages import FunctionDeployment
from broker.streams import stream_replicas
from broker.subjects import Subjects

log = logging.getLogger(__name__)

KV_OPERATION, KV_DELETE = "KV-Operation", "DEL"   # the KV convention's delete marker
APPLY_TIMEOUT_S = 120.0   # a deploy replaces workers: seconds

Apply = Callable[[str, FunctionDeployment | None], Awaitable[None]]


def bucket_name(subjects: Subjects) -> str:
    return f"{subjects.prefix.upper()}_FUNCTIONS"


class Catalogue:
    def __init__(self, js: JetStreamContext, subjects: Subjects, node: str) -> None:
        self.js, self.subjects, self.node = js, subjects, node
        self.bucket = bucket_name(subjects)
        self.kv = None
        self.created = False                  # this node made the bucket (the first to come)
        self.revision = 0                     # the last change applied here
        self._outcomes: dict[int, Exception | None] = {}
        self._changed = asyncio.Condition()
        self._watcher = None
        self._task: asyncio.Task | None = None

    async def open(self) -> dict[str, FunctionDeployment]:
        """Bind (or make) the bucket and read what it holds, without applying it."""
        try:
            self.kv = await self.js.key_value(self.bucket)
        except BucketNotFoundError:
            self.kv = await self.js.create_key_value(KeyValueConfig(
                bucket=self.bucket, history=1, storage=StorageType.FILE, replicas=stream_replicas(),
                description="functions deployed at run time (nodes/catalogue.py)"))
            self.created = True
        self._watcher = await self.kv.watchall()
        current: dict[str, FunctionDeployment] = {}
        while (entry := await self._watcher.updates(timeout=30.0)) is not None:
            self.revision = max(self.revision, entry.revision)
            deployment = self._deployment(entry)
            if deployment is None:
                current.pop(entry.key, None)
            else:
                current[entry.key] = deployment
        return current

    def start(self, apply: Apply) -> None:
        """Apply every later change, in the bucket's order, with ``apply(name, deployment|None)``."""
        self._task = asyncio.create_task(self._follow(apply), name=f"{self.node}-catalogue")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if self._watcher is not None:
            try:
                await self._watcher.stop()
            except Exception as exc:   # the connection is going
                log.debug("%s: catalogue watcher: %s", self.node, exc)

    async def put(self, deployment: FunctionDeployment) -> int:
        return await self.kv.put(deployment.service, encode(deployment))

    async def delete(self, name: str) -> int:
        """A delete marker (the KV convention), its revision: what :meth:`applied` waits for."""
        ack = await self.js.publish(f"$KV.{self.bucket}.{name}", b"", headers={KV_OPERATION: KV_DELETE})
        return ack.seq

    async def has(self, name: str) -> bool:
        try:
            entry = await self.kv.get(name)
        except NotFoundError:   # never, or deleted (nats-py raises KeyDeletedError, a NotFoundError)
            return False
        return self._deployment(entry) is not None

    async def applied(self, revision: int) -> None:
        """Once this node has applied ``revision``: re-raises what applying it raised here."""
        async with asyncio.timeout(APPLY_TIMEOUT_S), self._changed:
            await self._changed.wait_for(lambda: self.revision >= revision)
        error = self._outcomes.pop(revision, None)
        if error is not None:
            raise error

    async def _follow(self, apply: Apply) -> None:
        async for entry in self._watcher:
            if entry is None or entry.revision <= self.revision:
                continue
            error = None
            try:
                await apply(entry.key, self._deployment(entry))
            except Exception as exc:   # said where it is applied; the request that made it is told
                error = exc
                log.error("%s: catalogue change %d (%s) not applied here: %s", self.node, entry.revision,
                          entry.key, exc)
            async with self._changed:
                self.revision = entry.revision
                self._outcomes[entry.revision] = error
                for old in [r for r in self._outcomes if r < entry.revision - 1000]:
                    del self._outcomes[old]
                self._changed.notify_all()

    def _deployment(self, entry) -> FunctionDeployment | None:
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            return None
        try:
            return decode(FunctionDeployment, entry.value)
        except ContractError as exc:   # written by something else: not a function this node can run
            log.error("%s: catalogue entry %s is not a deployment: %s", self.node, entry.key, exc)
            return None
