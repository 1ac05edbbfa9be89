"""``p2pfaas compose init``: the identities of compose.yaml's services, as ``up`` has them, in
``compose/secrets/`` (git-ignored, 0700) as one env file per service (compose.yaml's ``env_file``)
and ``compose/nats/accounts.conf`` (bcrypt hashes only), which every NATS server includes. Made
once and kept: running it again adds only what is missing."""

from __future__ import annotations

import os
from pathlib import Path

from broker.auth import BRIDGE, CONTROLLER, OPERATOR, AuthStore
from broker.permissions import nats_accounts
from broker.lifecycle import write_whole

NODES = ("n1", "n2", "n3")
MQTT_BRIDGE_USER = "bridge"


def init(root: Path, devices: tuple[str, ...] = ("device",), nodes: tuple[str, ...] = NODES) -> Path:
    """Make (or complete) the secrets of the compose deployment in checkout ``root``; returns their directory."""
    secrets = root / "compose" / "secrets"
    secrets.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(secrets, 0o700)
    store = AuthStore(secrets / "auth")
    operator, bridge, controller = store.service(OPERATOR), store.service(BRIDGE), store.service(CONTROLLER)
    mqtt_bridge = store.service("mqtt-bridge")   # its Mosquitto password (a NATS user of its own is not needed)
    for node in nodes:
        creds, workers = store.node(node), store.worker(node)
        _env(secrets / f"node-{node}.env", P2PFAAS_NATS_USER=creds.user, P2PFAAS_NATS_PASSWORD=creds.password,
             P2PFAAS_WORKER_NATS_USER=workers.user, P2PFAAS_WORKER_NATS_PASSWORD=workers.password,
             P2PFAAS_SECRETS_KEY=store.secrets_key())
    _env(secrets / "http.env", P2PFAAS_NATS_USER=bridge.user, P2PFAAS_NATS_PASSWORD=bridge.password,
         P2PFAAS_OPERATOR_TOKEN=store.operator_token())
    _env(secrets / "mqtt-bridge.env", P2PFAAS_NATS_USER=bridge.user, P2PFAAS_NATS_PASSWORD=bridge.password,
         P2PFAAS_MQTT_USER=MQTT_BRIDGE_USER, P2PFAAS_MQTT_PASSWORD=mqtt_bridge.password)
    _env(secrets / "controller.env", P2PFAAS_NATS_USER=controller.user, P2PFAAS_NATS_PASSWORD=controller.password)
    _env(secrets / "operator.env", P2PFAAS_NATS_USER=operator.user, P2PFAAS_NATS_PASSWORD=operator.password,
         P2PFAAS_OPERATOR_TOKEN=store.operator_token())
    device_lines = {f"P2PFAAS_MQTT_DEVICE_{i}": f"{name}:{store.device(name).password}" for i, name in enumerate(devices)}
    _env(secrets / "mosquitto.env", P2PFAAS_MQTT_BRIDGE_USER=MQTT_BRIDGE_USER,
         P2PFAAS_MQTT_BRIDGE_PASSWORD=mqtt_bridge.password, **device_lines)
    # hashes only, read by the servers' own user inside their containers
    accounts = root / "compose" / "nats" / "accounts.conf"
    accounts.write_text(nats_accounts(store, list(nodes)))
    os.chmod(accounts, 0o644)
    return secrets


def _env(path: Path, **values: str) -> None:
    write_whole(path, "".join(f"{k}={v}\n" for k, v in values.items()).encode())
