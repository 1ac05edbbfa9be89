"""Identities and what each may do: one model for NATS, MQTT and HTTP (docs/security.md).

Every client has an identity. Services — each node, its workers, the bridges, the controllers —
and operators get NATS users with per-subject permissions in account FAAS; devices get users
in account DEVICES that may only connect over MQTT, publish their own requests and read their
own answers; HTTP state changes need the operator's bearer token. The secrets live in
``<data-dir>/auth`` (a 0700 directory of 0600 files), made on first use.

Rules (each tested by trying the forbidden thing, tests/broker/test_security.py):

* a device publishes only requests whose ``<client>`` token is its own name, reads only its own
  results and rejects;
* only nodes publish results, rejects, forwards, membership, telemetry and rewards (each node
  only its own membership, telemetry and rewards; the bridges forward P2PFaaS peers' jobs);
  workers (user code) only answer on reply inboxes (their node, and a direct call's caller);
* only controllers publish scale commands (and the bridges, for an operator's request);
* only operators change configuration, schedulers, learner parameters and streams (over HTTP
  with the operator token: the bridge checks it, then acts).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import secrets
import subprocess
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
FULL_JS = "$JS.API.>"
JS_DENIED = ["$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.PURGE.>"]   # streams are the operators'
JS_RUNTIME = ["$JS.ACK.>", "$JS.FC.>", "_INBOX.>"]
FUNCTION_CATALOGUE = "$KV.>"   # nodes write the deployment's functions (nodes/catalogue.py), the only bucket
# names no device may take: the services' users (Mosquitto would give a device named "bridge" the
# bridge's ACL; nats-server wants user names unique across accounts, so it would not start) and the
# HTTP bridge's client token "http-<node>", whose results are every HTTP caller's
SERVICE_NAMES = frozenset({OPERATOR, BRIDGE, CONTROLLER, SYSTEM})
SERVICE_NAME_PREFIXES = ("node-", "worker-", "http-", "leaf-")
# bcrypt's cost in the generated nats-server configuration. Every password here is drawn by
# secrets.token_urlsafe(24) (192 random bits), so a leaked hash is out of reach of any guessing
# whatever the cost; the cost is only paid by nats-server, once per connection, in the client's
# read loop. At bcrypt's default of 10 (55 ms a check here) `up --k 64` spent seconds of both
# cores on its workers' CONNECTs (read loops of 2-7 s logged) and again after every broker
# restart; 4, bcrypt's least, is ~1 ms (bench/connect_storm.py).
BCRYPT_ROUNDS = 4
APPLIED = "applied.json"   # what the running brokers have loaded (AuthStore.mark_applied)
log = logging.getLogger(__name__)


def mqtt_bridge_client_id(store: "AuthStore | None", prefix: str) -> str:
    """The MQTT bridge's client id at Mosquitto: stable across restarts (Mosquitto keeps its
    session's queue for it) and, in a secure stack, not guessable by a device. MQTT client ids are
    not tied to users: a device connecting with the bridge's id throws the bridge off and takes its
    session -- every device's requests stop. The id carries a digest of the bridge's password."""
    base = f"p2pfaas-bridge-{prefix}"
    if store is None:
        return base
    digest = hashlib.sha256(f"mqtt-client-id:{store.service(BRIDGE).password}".encode()).hexdigest()[:20]
    return f"{base}-{digest}"[:64]


class AuthStoreError(ValueError):
    """A secrets file that is not a JSON object of names to secrets (broken by hand): never
    overwritten, it is fixed or removed by whoever broke it."""


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
    """The deployment's secrets under ``directory`` (made with safe permissions on first use).

    Several processes may add identities at once (``p2pfaas auth device`` while ``up`` runs):
    a change is made under an exclusive lock of the directory and written whole (a temporary
    file renamed over the old one), so readers never see half a file and no writer loses
    another's identity."""

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
        """For readers: once a file was read, a copy broken later leaves its last good identities
        in force (logged), so a running ``up`` keeps serving the identities it knows."""
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
        """The devices let in: one whose name a service goes by (a file edited by hand, or made by
        an older version) is left out and logged, never given the service's rights."""
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
        """The hub's identity of a device machine (its leaf connection): created, or shown when
        it exists (its group is what the last invitation said)."""
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
        """A running ``up``'s brokers let in the identities as of ``changed_at`` (they were reloaded
        and a new device's connection was accepted): ``p2pfaas auth device`` waits for this."""
        write_whole(self.directory / APPLIED, json.dumps({"changed_at": changed_at}).encode())

    def applied_at(self) -> float:
        """The ``changed_at`` the running brokers have applied (0: none said so yet)."""
        try:
            return float(json.loads((self.directory / APPLIED).read_bytes())["changed_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0.0


# -- NATS ------------------------------------------------------------------------------------
def _permissions(publish: list[str], subscribe: list[str] | None = None, deny: list[str] | None = None) -> dict:
    perms: dict = {"publish": {"allow": publish}, "subscribe": {"allow": subscribe or [">"]}}
    if deny:
        perms["publish"]["deny"] = deny
    return perms


def node_permissions(node: str) -> dict:
    """A node: its own subjects (but not the commands meant for it), answers, forwards and probes
    to peers, its own membership and dead letters, JetStream without deleting streams."""
    return _permissions(
        publish=[f"*.{node}.>", f"*.membership.*.{node}", f"*.storecheck.{node}", "*.result.>", "*.reject.>",
                 "*.async.>", "*.*.forward.>", "*.*.load", f"*.deadletter.{node}.>", FUNCTION_CATALOGUE, FULL_JS,
                 *JS_RUNTIME],
        deny=[f"*.{node}.scale.*", f"*.{node}.config.set", f"*.{node}.config.scheduler.set", *JS_DENIED])


def worker_permissions(node: str) -> dict:
    """A worker runs user code: it only answers on reply inboxes -- its node's call, and a direct
    call's caller (nodes/worker.py) -- and says when its node died. It asks nothing, so it reads no
    inbox: ``_INBOX.>`` would show user code every reply in the account (other calls' outputs,
    control answers) and the inbox names to forge answers to."""
    return _permissions(publish=["_INBOX.>", f"*.{node}.gone"],
                        subscribe=[f"*.{node}.worker.>", f"*.membership.*.{node}", f"*.{node}.gone"])


def bridge_permissions() -> dict:
    """The HTTP and MQTT bridges: calls, and the control requests of the routes they serve (the
    state-changing ones only for the operator token's holder, checked by the HTTP bridge)."""
    return _permissions(
        publish=["*.*.request.>", "*.async.>", "*.*.config.>", "*.*.load", "*.*.info", "*.*.metrics", "*.*.peers",
                 "*.*.discovery.>", "*.*.functions.*", "*.*.forward.>",
                 "*.*.learner.>", "*.*.reward", "*.*.scale.*", "*.*.policy.*", "*.reject.>", FULL_JS, *JS_RUNTIME],
        deny=JS_DENIED)


def controller_permissions() -> dict:
    """A controller scales pools, feeds the learner experiences and seeds a scaling model with its
    shipped weights (``weights.set``, which also rolls it back); it never changes a model's
    hyper-parameters nor resets one."""
    readers = [f"*.*.learner.*.{verb}" for verb in ("act", "weights.get", "weights.set", "stats", "parameters.get")]
    return _permissions(publish=["*.*.scale.*", "*.*.experience.*", *readers, "*.*.info", FULL_JS, *JS_RUNTIME],
                        deny=JS_DENIED)


def device_permissions(name: str) -> dict:
    """Checked on the subject after the account's mapping: a request is already the async subject."""
    malformed = ["*.async.*" + ".*" * levels for levels in MALFORMED_REQUEST_LEVELS]   # refused by the node
    return _permissions(publish=[f"*.async.*.*.{name}.*", *malformed],
                        subscribe=[f"*.result.{name}", f"*.result.{name}.>", f"*.reject.{name}", f"*.reject.{name}.>"])


def _user(creds: Credentials, permissions: dict | None, **extra) -> dict:
    import bcrypt

    user = {"user": creds.user, "password": bcrypt.hashpw(creds.password.encode(), bcrypt.gensalt(rounds=BCRYPT_ROUNDS)).decode()}
    if permissions is not None:
        user["permissions"] = permissions
    user.update(extra)
    return user


# request topics of another shape than <p>/<node>/request/<fn>/<client>/<req>: 1 to 4 levels after
# "request" but 3 (a level short, levels too many) are mapped onto the node's async subjects as well,
# so the node's intake refuses them (logged, counted, a rejection on <p>/reject/invalid): a device's
# mistake is never lost in silence (a shape with no level after "request" is not a request topic)
MALFORMED_REQUEST_LEVELS = (1, 2, 4, 5, 6)


def device_request_mappings() -> dict[str, str]:
    """The DEVICES account's mappings: request topics (every shape above) onto async subjects."""
    mappings = {}
    for levels in (3, *MALFORMED_REQUEST_LEVELS):
        wild = ".".join(f"{{{{wildcard({i})}}}}" for i in range(3, 3 + levels))
        mappings["*.*.request" + ".*" * levels] = f"{{{{wildcard(1)}}}}.async.{{{{wildcard(2)}}}}.{wild}"
    return mappings


def nats_accounts(store: AuthStore | None, nodes: list[str]) -> str:
    """The ``accounts`` block of the embedded nats-server. Without a store: one open deployment
    (no_auth_user), as the tests' own servers run; with one: every identity with its permissions."""
    devices_account = {
        "jetstream": "enabled",
        # a device's request topic <p>/<node>/request/<fn>/<client>/<req> becomes the durable subject
        "mappings": device_request_mappings(),
        "exports": [{"stream": "*.async.>"}],
        "imports": [{"stream": {"account": "FAAS", "subject": "*.result.>"}},
                    {"stream": {"account": "FAAS", "subject": "*.reject.>"}}],
    }
    faas_account = {
        "jetstream": "enabled",
        "exports": [{"stream": "*.result.>"}, {"stream": "*.reject.>"}],
        "imports": [{"stream": {"account": "DEVICES", "subject": "*.async.>"}}],
    }
    if store is None:
        faas_account["users"] = [{"user": "faas", "password": "faas-local"}]
        devices_account["users"] = [{"user": "device", "password": "device-local", "allowed_connection_types": ["MQTT"]}]
        return f"accounts {json.dumps({'FAAS': faas_account, 'DEVICES': devices_account}, indent=1)}\nno_auth_user: \"faas\"\n"
    users = [_user(store.service(OPERATOR), None),
             _user(store.service(BRIDGE), bridge_permissions()),
             _user(store.service(CONTROLLER), controller_permissions())]
    known = sorted(set(nodes) | {u[len("node-"):] for u in store.services() if u.startswith("node-")})
    for node in known:
        users.append(_user(store.node(node), node_permissions(node)))
        users.append(_user(store.worker(node), worker_permissions(node)))
    faas_account["users"] = users
    devices_account["users"] = [_user(Credentials(name, password), device_permissions(name),
                                      allowed_connection_types=["MQTT"])
                                for name, password in sorted(store.devices().items())]
    return f"accounts {json.dumps({'FAAS': faas_account, 'DEVICES': devices_account}, indent=1)}\n"


def hub_accounts(store: AuthStore) -> str:
    """The ``accounts`` block of a hub: FAAS with the operator and one user per invited device
    (``broker.edge.leaf_permissions``: what its machine may say to the others), and the system
    account. No device connects here over MQTT and nothing is stored: those stay on the devices."""
    from broker.edge import leaf_permissions, leaf_user

    users = [_user(store.service(OPERATOR), None)]
    for device, (password, group) in sorted(store.leaves().items()):
        users.append(_user(Credentials(leaf_user(device), password), leaf_permissions(device, group)))
    accounts = {"FAAS": {"users": users}, "SYS": {"users": [_user(store.service(SYSTEM), None)]}}
    return f"accounts {json.dumps(accounts, indent=1)}\nsystem_account: \"SYS\"\n"


# -- Mosquitto -----------------------------------------------------------------------------------
def mosquitto_files(store: AuthStore, prefix: str, directory: Path) -> tuple[Path, Path]:
    """Password file and ACL for Mosquitto: the bridge may do anything; a device only publishes
    its own requests and reads its own answers (``%u`` is its user name)."""
    # private, as auth/ is: the password file holds every password in clear until it is hashed
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    passwords, acl = directory / "passwords", directory / "acl"
    bridge = store.service(BRIDGE)
    lines = [f"{bridge.user}:{bridge.password}", *(f"{n}:{p}" for n, p in sorted(store.devices().items()))]
    write_whole(passwords, ("\n".join(lines) + "\n").encode())   # 0600 from its first byte
    subprocess.run(["mosquitto_passwd", "-U", str(passwords)], check=True, capture_output=True)   # hash in place
    write_whole(acl, (f"user {bridge.user}\ntopic readwrite #\n\n"
                      f"pattern write {prefix}/+/request/+/%u/+\n"
                      f"pattern read {prefix}/result/%u/#\npattern read {prefix}/reject/%u/#\n").encode())
    return passwords, acl
