"""The deployment's secrets as a node serves them (``faas.<node>.functions.secrets_*``): names listed,
values sealed into the bucket and opened only for the workers of a function that lists them. A
value is never answered, logged or written anywhere else."""

from __future__ import annotations

import logging
from typing import Callable

import orjson
from nats.js import JetStreamContext

from broker import handoff
from broker.codec import decode
from broker.control import ControlError
from broker.messages import SecretChange
from broker.secrets import KEY_NAME, SecretError, SecretStore
from broker.subjects import Subjects

log = logging.getLogger(__name__)


class NodeSecrets:
    def __init__(self, js: JetStreamContext, subjects: Subjects, node: str,
                 users: Callable[[str], list[str]] = lambda name: []) -> None:
        """``users(name)``: the functions whose deployments list secret ``name``."""
        self.node = node
        self.store = SecretStore(js, subjects, handoff.get(KEY_NAME))
        self._users = users

    async def values(self, names: list[str]) -> dict[str, str]:
        """The values of ``names``, or ControlError naming the first that cannot be opened."""
        out = {}
        for name in names:
            try:
                out[name] = await self.store.get(name)
            except SecretError as exc:
                raise ControlError(exc.status, exc.message) from None
        return out

    async def on_list(self, body: bytes) -> bytes:
        """OpenFaaS's list: names only."""
        return orjson.dumps([{"name": name} for name in await self._do(self.store.names())])

    async def on_set(self, body: bytes) -> bytes:
        change = decode(SecretChange, body)
        if change.value is None:
            raise ControlError(400, f"secret {change.name!r}: value is missing")
        if change.mode != "set":
            exists = await self._do(self.store.has(change.name))
            if change.mode == "create" and exists:
                raise ControlError(409, f"secret {change.name!r} exists: update it (p2pfaas secret update)")
            if change.mode == "update" and not exists:
                raise ControlError(404, f"no secret {change.name!r}: create it (p2pfaas secret create)")
        await self._do(self.store.put(change.name, change.value))
        log.info("node %s: secret %s stored (sealed)", self.node, change.name)
        return orjson.dumps({"name": change.name})

    async def on_delete(self, body: bytes) -> bytes:
        change = decode(SecretChange, body)
        users = self._users(change.name)
        if users:
            raise ControlError(409, f"secret {change.name!r} is used by {', '.join(users)}: deploy them without it "
                                    "(or remove them) first")
        await self._do(self.store.delete(change.name))
        log.info("node %s: secret %s removed", self.node, change.name)
        return b"{}"

    @staticmethod
    async def _do(action):
        try:
            return await action
        except SecretError as exc:
            raise ControlError(exc.status, exc.message) from None
