"""Several machines: a hub and the devices that join it as mutual-TLS leaf nodes (docs/edge.md). Only what
nodes say to each other crosses a link: ``leaf_permissions`` at the hub, ``LOCAL_ONLY`` at the device."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import Field

from broker.lifecycle import write_whole
from broker.messages import Contract
from broker.subjects import DEFAULT_GROUP, check_node, group_token

INVITATION_VERSION = 1
LEAF_PORT = 7422                 # nats-server's leaf node port
PING_INTERVAL = "2s"             # a cut link is noticed in 4-8 s, not nats-server's default minutes
LEAF_RECONNECT = "1s"            # a device redials its hub every second while the link is down
LEAF_PREFIX = "leaf-"            # the hub's user of device <d> is leaf-<d>

# Never across a leaf connection: a device's calls, answers, workers, control plane and streams.
LOCAL_ONLY = ("*.async.>", "*.result.>", "*.reject.>", "*.deadletter.>", "*.storecheck.>", "*.*.worker.>",
              "*.*.config.>", "*.*.functions.>", "*.*.scale.*", "*.*.policy.*", "*.*.learner.>", "*.*.reward",
              "*.*.experience.>", "*.*.discovery.>", "*.*.peers", "*.*.metrics", "$JS.>", "$KV.>", "$MQTT.>")


class Invitation(Contract):
    """What a device needs to join a hub (``p2pfaas auth invite`` writes it, ``p2pfaas join`` reads it)."""

    version: int = INVITATION_VERSION
    device: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")   # its node id
    group: str = DEFAULT_GROUP                              # its P2PFaaS group (fog network)
    hubs: list[str] = Field(min_length=1)                   # tls://host:7422 of every hub server
    prefix: str = "faas"
    leaf_user: str
    leaf_password: str
    ca: str                                                 # PEM of the deployment's CA
    cert: str                                               # the device's client certificate (PEM)
    key: str                                                # ... and its key
    issued_at: float = Field(default_factory=time.time)

    def save(self, path: Path) -> None:
        write_whole(path, self.model_dump_json(indent=1).encode())   # 0600: it holds a password and a key

    @classmethod
    def load(cls, path: Path) -> "Invitation":
        invitation = cls.model_validate_json(path.read_bytes())
        check_node(invitation.device)
        if invitation.version != INVITATION_VERSION:
            raise ValueError(f"{path}: an invitation of version {invitation.version}; this p2pfaas reads "
                             f"version {INVITATION_VERSION}")
        return invitation


def leaf_user(device: str) -> str:
    return LEAF_PREFIX + check_node(device)


def inbox_prefix(device: str) -> str:
    """The inboxes of a device's clients: the hub sends a device only the replies meant for it."""
    return f"_INBOX.{check_node(device)}"


def leaf_permissions(device: str, group: str) -> dict:
    """The hub's user of ``device``: what its machine may say to the others and hear from them."""
    g = group_token(group)
    return {"publish": {"allow": ["*.*.forward.>", "*.*.request.>", "*.*.load", f"*.membership.{g}.{device}",
                                  f"*.{device}.gone", f"*.{device}.telemetry.*", "_INBOX.>"]},
            "subscribe": {"allow": [f"*.{device}.forward.>", f"*.{device}.request.>", f"*.{device}.load",
                                    f"*.{device}.info", f"*.membership.{g}.*", "*.*.gone",
                                    f"{inbox_prefix(device)}.>"]}}


def leaf_remote(invitation: Invitation, files: Path) -> str:
    """The device's ``leafnodes`` block, its TLS files written under ``files`` (0600)."""
    files.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths = {}
    for name, pem in (("hub-ca.pem", invitation.ca), ("device.pem", invitation.cert), ("device-key.pem", invitation.key)):
        write_whole(files / name, pem.encode())
        paths[name] = str((files / name).resolve())
    credentials = files / "leaf-password"
    write_whole(credentials, invitation.leaf_password.encode())
    local_only = [pattern.replace("*", invitation.prefix, 1) if pattern.startswith("*.") else pattern
                  for pattern in LOCAL_ONLY]
    remote = {
        "urls": [_with_user(url, invitation.leaf_user, invitation.leaf_password) for url in invitation.hubs],
        "account": "FAAS",
        "deny_imports": local_only, "deny_exports": local_only,
        "tls": {"ca_file": paths["hub-ca.pem"], "cert_file": paths["device.pem"], "key_file": paths["device-key.pem"],
                "timeout": 2},
    }
    return f"leafnodes {json.dumps({'reconnect': LEAF_RECONNECT, 'remotes': [remote]}, indent=1)}\n"


def _with_user(url: str, user: str, password: str) -> str:
    """nats-server takes a remote's credentials in its URL (a leaf remote has no user field)."""
    from urllib.parse import quote, urlsplit

    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{quote(user, safe='')}:{quote(password, safe='')}@{host}"
