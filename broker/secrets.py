"""The deployment's secrets (OpenFaaS's ``/system/secrets``): a JetStream key-value bucket, each value sealed
with AES-GCM under the secrets key only nodes hold (docs/security.md, "Secrets")."""

from __future__ import annotations

import hashlib
import os
import re

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, NoKeysError, NotFoundError

from broker.streams import stream_replicas
from broker.subjects import Subjects

KEY_NAME = "P2PFAAS_SECRETS_KEY"
NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")   # OpenFaaS's: a DNS label
MAX_VALUE = 64 * 1024
NONCE = 12


class SecretError(Exception):
    """What a caller can fix: no such secret, a bad name or value, no key here."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def bucket_name(subjects: Subjects) -> str:
    return f"{subjects.prefix.upper()}_SECRETS"


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise SecretError(400, f"secret name {name!r} must be lower case letters, digits, '-' and '.' "
                               "(at most 63, starting and ending with a letter or digit)")
    return name


def derive_key(token: str) -> bytes:
    """The AES-256 key of a secrets token (what ``data/auth/tokens.json`` keeps)."""
    return hashlib.sha256(b"p2pfaas secrets key\0" + token.encode()).digest()


def seal(key: bytes, name: str, value: str) -> bytes:
    """``value`` encrypted and bound to ``name`` (a value moved under another name does not open)."""
    nonce = os.urandom(NONCE)
    return nonce + AESGCM(key).encrypt(nonce, value.encode(), name.encode())


def unseal(key: bytes, name: str, sealed: bytes) -> str:
    try:
        return AESGCM(key).decrypt(sealed[:NONCE], sealed[NONCE:], name.encode()).decode()
    except (InvalidTag, ValueError):
        raise SecretError(500, f"secret {name!r} does not open with this node's secrets key (made under "
                               "another one?): create it again") from None


class SecretStore:
    def __init__(self, js: JetStreamContext, subjects: Subjects, token: str | None) -> None:
        self.js, self.subjects = js, subjects
        self.key = derive_key(token) if token else None
        self.bucket = bucket_name(subjects)
        self._kv = None

    async def _bucket(self):
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(self.bucket)
            except BucketNotFoundError:
                self._kv = await self.js.create_key_value(KeyValueConfig(
                    bucket=self.bucket, history=1, storage=StorageType.FILE, replicas=stream_replicas(),
                    max_value_size=MAX_VALUE + 64, description="the deployment's secrets, sealed (broker/secrets.py)"))
        return self._kv

    def _key(self) -> bytes:
        if self.key is None:
            raise SecretError(503, f"this node has no secrets key ({KEY_NAME}): secrets need a stack that `p2pfaas "
                                   "up` set up (not --insecure), or the key handed to the node")
        return self.key

    async def put(self, name: str, value: str) -> None:
        check_name(name)
        if not value:
            raise SecretError(400, f"secret {name!r} has an empty value")
        if len(value.encode()) > MAX_VALUE:
            raise SecretError(413, f"secret {name!r} is over {MAX_VALUE // 1024} KiB")
        await (await self._bucket()).put(name, seal(self._key(), name, value))

    async def get(self, name: str) -> str:
        check_name(name)
        try:
            entry = await (await self._bucket()).get(name)
        except NotFoundError:   # never made, or removed
            raise SecretError(404, f"no secret {name!r}: create it first (p2pfaas secret create {name})") from None
        return unseal(self._key(), name, entry.value)

    async def names(self) -> list[str]:
        try:
            return sorted(await (await self._bucket()).keys())
        except NoKeysError:
            return []

    async def has(self, name: str) -> bool:
        try:
            await (await self._bucket()).get(name)
        except NotFoundError:
            return False
        return True

    async def delete(self, name: str) -> None:
        check_name(name)
        if not await self.has(name):
            raise SecretError(404, f"no secret {name!r}")
        await (await self._bucket()).delete(name)
