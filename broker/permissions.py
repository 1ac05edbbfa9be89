"""What each identity may do on the brokers: nats-server's accounts and permissions, and
Mosquitto's password and ACL files, written from the identities of :mod:`broker.auth`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from broker.auth import BCRYPT_ROUNDS, BRIDGE, CONTROLLER, OPERATOR, SYSTEM, AuthStore, Credentials
from broker.lifecycle import write_whole

FULL_JS = "$JS.API.>"
JS_DENIED = ["$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.PURGE.>"]   # streams are the operators'
JS_RUNTIME = ["$JS.ACK.>", "$JS.FC.>", "_INBOX.>"]
FUNCTION_CATALOGUE = "$KV.>"   # nodes write the deployment's functions (nodes/catalogue.py), the only bucket


# -- NATS ------------------------------------------------------------------------------------
def _permissions(publish: list[str], subscribe: list[str] | None = None, deny: list[str] | None = None) -> dict:
    perms: dict = {"publish": {"allow": publish}, "subscribe": {"allow": subscribe or [">"]}}
    if deny:
        perms["publish"]["deny"] = deny
    return perms


def node_permissions(node: str) -> dict:
    """A node: its own subjects (not its commands), answers, forwards, probes, JetStream."""
    return _permissions(
        publish=[f"*.{node}.>", f"*.membership.*.{node}", f"*.storecheck.{node}", "*.result.>", "*.reject.>",
                 "*.async.>", "*.*.forward.>", "*.*.load", f"*.deadletter.{node}.>", FUNCTION_CATALOGUE, FULL_JS,
                 *JS_RUNTIME],
        deny=[f"*.{node}.scale.*", f"*.{node}.config.set", f"*.{node}.config.scheduler.set", *JS_DENIED])


def worker_permissions(node: str) -> dict:
    """A worker runs user code: it only answers on reply inboxes and says when its node died. It reads
    no inbox: ``_INBOX.>`` would show user code every reply in the account, and names to forge answers to."""
    return _permissions(publish=["_INBOX.>", f"*.{node}.gone"],
                        subscribe=[f"*.{node}.worker.>", f"*.membership.*.{node}", f"*.{node}.gone"])


def bridge_permissions() -> dict:
    """The bridges: calls, and the control requests of the routes they serve."""
    return _permissions(
        publish=["*.*.request.>", "*.async.>", "*.*.config.>", "*.*.load", "*.*.info", "*.*.metrics", "*.*.peers",
                 "*.*.discovery.>", "*.*.functions.*", "*.*.forward.>",
                 "*.*.learner.>", "*.*.reward", "*.*.scale.*", "*.*.policy.*", "*.reject.>", FULL_JS, *JS_RUNTIME],
        deny=JS_DENIED)


def controller_permissions() -> dict:
    """A controller scales pools, feeds the learner, sets a model's weights; no more."""
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


# request topics of another shape than <p>/<node>/request/<fn>/<client>/<req> are mapped onto the
# node's async subjects as well, so its intake refuses them on <p>/reject/invalid, never in silence
MALFORMED_REQUEST_LEVELS = (1, 2, 4, 5, 6)


def device_request_mappings() -> dict[str, str]:
    """The DEVICES account's mappings: request topics (every shape above) onto async subjects."""
    mappings = {}
    for levels in (3, *MALFORMED_REQUEST_LEVELS):
        wild = ".".join(f"{{{{wildcard({i})}}}}" for i in range(3, 3 + levels))
        mappings["*.*.request" + ".*" * levels] = f"{{{{wildcard(1)}}}}.async.{{{{wildcard(2)}}}}.{wild}"
    return mappings


def nats_accounts(store: AuthStore | None, nodes: list[str]) -> str:
    """The embedded nats-server's ``accounts``; without a store one open deployment (tests)."""
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
    """A hub's ``accounts``: FAAS with the operator and each invited device's user, and SYS."""
    from broker.edge import leaf_permissions, leaf_user

    users = [_user(store.service(OPERATOR), None)]
    for device, (password, group) in sorted(store.leaves().items()):
        users.append(_user(Credentials(leaf_user(device), password), leaf_permissions(device, group)))
    accounts = {"FAAS": {"users": users}, "SYS": {"users": [_user(store.service(SYSTEM), None)]}}
    return f"accounts {json.dumps(accounts, indent=1)}\nsystem_account: \"SYS\"\n"


# -- Mosquitto -----------------------------------------------------------------------------------
def mosquitto_files(store: AuthStore, prefix: str, directory: Path) -> tuple[Path, Path]:
    """Mosquitto's password file and ACL: the bridge may do anything, a device only its own."""
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
