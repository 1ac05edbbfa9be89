"""Identities and their secrets, one model for NATS, MQTT and HTTP (rules: docs/security.md): services
are NATS users of account FAAS, devices MQTT-only users of DEVICES; secrets live in ``<data-dir>/auth``."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from broker.errors import InvalidToken
from broker.lifecycle import write_whole
from broker.subjects import check_node, check_token

OPERATOR = "operator"
BRIDGE = "bridge"
CONTROLLER = "controller"
SYSTEM = "sys"   # a hub's system-account user (it drops a revoked device's live link)
# names no device may take: the services' users (a device "bridge" would get the bridge's ACL, and
# nats-server wants unique user names) and the HTTP bridge's client "http-<node>" (every caller's results)
SERVICE_NAMES = frozenset({OPERATOR, BRIDGE, CONTROLLER, SYSTEM})
SERVICE_NAME_PREFIXES = ("node-", "worker-", "http-", "leaf-")
# bcrypt's cost in nats-server's configuration: the least, as every password has 192 random bits, and
# nats-server pays it per CONNECT in its read loop (bench/connect_storm.py)
BCRYPT_ROUNDS = 4
APPLIED = "applied.json"   # what the running brokers have loaded (AuthStore.mark_applied)
log = logging.getLogger(__name__)


def mqtt_bridge_client_id(store: "AuthStore | None", prefix: str) -> str:
    """The MQTT bridge's client id: stable (Mosquitto keeps its session) and, in a secure stack, not
    guessable (a device with the bridge's id would take its session): a digest of its password."""
    base = f"p2pfaas-bridge-{prefix}"
    if store is None:
        return base
    digest = hashlib.sha256(f"mqtt-client-id:{store.service(BRIDGE).password}".encode()).hexdigest()[:20]
    return f"{base}-{digest}"[:64]


class AuthStoreError(ValueError):
    """A secrets file that is not a JSON object of names to secrets: never overwritten."""


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str
    password: str

    def as_json(self) -> str:
        return json.dumps({"user": self.user, "password": self.password})


def check_device_name(name: str) -> str:
    """A device name: a token, and none a service goes by (InvalidToken, a ValueError, says so)."""
    check_token(name, "device name")
    if name in SERVICE_NAMES or name.startswith(SERVICE_NAME_PREFIXES):
        raise InvalidToken(f"device name {name!r} is taken by p2pfaas's services ({', '.join(sorted(SERVICE_NAMES))}, "
                           f"{'*, '.join(SERVICE_NAME_PREFIXES)}*): choose another")
    return name


def node_user(node: str) -> str:
    return f"node-{check_node(node)}"


def worker_user(node: str) -> str:
    return f"worker-{check_node(node)}"


class AuthStore:
    """The deployment's secrets under ``directory``. Several processes may add identities at once: a
    change is made under an exclusive lock and written whole, so no writer loses another's identity."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._last_good: dict[str, dict[str, str]] = {}

    def _file(self, name: str) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.directory, 0o700)
        return self.directory / name

    @contextmanager
    def _locked(self):
        fd = os.open(self._file(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)   # released when closed, also when the process dies
            yield
        finally:
            os.close(fd)

    def _read(self, name: str) -> dict[str, str]:
        path = self._file(name)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            data = {}
        except ValueError as exc:   # not JSON, not UTF-8
            raise AuthStoreError(f"{path} is not valid JSON ({exc}): fix or remove it") from None
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise AuthStoreError(f"{path} must be a JSON object of names to secrets: fix or remove it")
        self._last_good[name] = dict(data)
        return data

    def _load(self, name: str) -> dict[str, str]:
        """For readers: a file broken after it was read leaves its last good identities in force (logged)."""
        try:
            return self._read(name)
        except AuthStoreError as exc:
            if name not in self._last_good:
                raise
            log.error("%s; the identities read before stay in force", exc)
            return dict(self._last_good[name])

    def _save(self, name: str, data: dict[str, str]) -> None:
        path = self._file(name)
        write_whole(path, json.dumps(data, indent=2, sort_keys=True).encode())   # 0600, fsynced, whole or not at all
        self._last_good[name] = dict(data)

    def _get(self, name: str, key: str) -> str:
        known = self._load(name)
        if key in known:
            return known[key]
        with self._locked():   # read again under the lock: another process may have just added it
            data = self._read(name)
            if key not in data:
                data[key] = secrets.token_urlsafe(24)
                self._save(name, data)
            return data[key]

    # -- identities -------------------------------------------------------------------------
    def service(self, user: str) -> Credentials:
        """A service or operator identity on NATS (created on first use)."""
        return Credentials(user, self._get("services.json", user))

    def node(self, node: str) -> Credentials:
        return self.service(node_user(node))

    def worker(self, node: str) -> Credentials:
        return self.service(worker_user(node))

    def device(self, name: str) -> Credentials:
        """A device (MQTT) identity: created, or shown when it exists."""
        check_device_name(name)
        return Credentials(name, self._get("devices.json", name))

    def devices(self) -> dict[str, str]:
        """The devices let in: one named as a service is left out (logged), never given its rights."""
        devices = self._load("devices.json")
        for name in list(devices):
            try:
                check_device_name(name)
            except InvalidToken as exc:
                log.error("%s/devices.json: %s; device %r is not let in: rename it", self.directory, exc, name)
                del devices[name]
        return devices

    def services(self) -> dict[str, str]:
        return self._load("services.json")

    def operator_token(self) -> str:
        """The bearer token of HTTP routes that change state."""
        return self._get("tokens.json", "operator")

    def secrets_key(self) -> str:
        """The token of the deployment's secrets key (broker/secrets.py): only nodes get it."""
        return self._get("tokens.json", "secrets")

    def invoke_token(self) -> str:
        """The bearer token HTTP invocation requires when it is not open (``--invoke-token``)."""
        return self._get("tokens.json", "invoke")

    # -- a hub's invited machines (docs/edge.md) -----------------------------------------------
    def invite(self, device: str, group: str) -> Credentials:
        """The hub's identity of a device machine's leaf connection (created, or shown when it exists)."""
        from broker.edge import leaf_user

        user = leaf_user(device)
        with self._locked():
            groups = self._read("groups.json")
            if groups.get(device) != group:
                groups[device] = group
                self._save("groups.json", groups)
        return Credentials(user, self._get("leaves.json", user))

    def revoke(self, device: str) -> bool:
        """Forget a device machine's identity (False: it had none); a running hub drops its link."""
        from broker.edge import leaf_user

        with self._locked():
            leaves = self._read("leaves.json")
            if leaves.pop(leaf_user(device), None) is None:
                return False
            self._save("leaves.json", leaves)
            revoked = self._read("revoked.json")
            revoked[device] = str(time.time())
            self._save("revoked.json", revoked)
        return True

    def leaves(self) -> dict[str, tuple[str, str]]:
        """Invited devices: name -> (leaf password, group)."""
        from broker.edge import LEAF_PREFIX

        groups = self._load("groups.json")
        return {user[len(LEAF_PREFIX):]: (password, groups.get(user[len(LEAF_PREFIX):], "default"))
                for user, password in self._load("leaves.json").items() if user.startswith(LEAF_PREFIX)}

    def revoked(self) -> dict[str, float]:
        return {name: float(at) for name, at in self._load("revoked.json").items()}

    def changed_at(self) -> float:
        """Newest change of any identity (``up`` and ``hub`` reload the brokers when it grows)."""
        files = [self.directory / n for n in ("services.json", "devices.json", "leaves.json", "groups.json")]
        return max((f.stat().st_mtime for f in files if f.exists()), default=0.0)

    def mark_applied(self, changed_at: float) -> None:
        """The running brokers let in the identities as of ``changed_at`` (``p2pfaas auth device`` waits)."""
        write_whole(self.directory / APPLIED, json.dumps({"changed_at": changed_at}).encode())

    def applied_at(self) -> float:
        """The ``changed_at`` the running brokers have applied (0: none said so yet)."""
        try:
            return float(json.loads((self.directory / APPLIED).read_bytes())["changed_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0.0
