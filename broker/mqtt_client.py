"""Connecting to an MQTT broker as p2pfaas does: its URL, TLS, the bridge's client id, and whether
a user is let in (what a device will meet)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from urllib.parse import urlparse

import paho.mqtt.client as mqtt

log = logging.getLogger(__name__)


def default_client_id(prefix: str) -> str:
    """Stable across restarts (Mosquitto keeps the session's queue for it), unique per host."""
    return f"p2pfaas-bridge-{prefix}-{socket.gethostname()}"[:64]


def parse_mqtt_url(url: str) -> tuple[str, int]:
    parsed = urlparse(url if "://" in url else f"mqtt://{url}")
    if parsed.scheme not in ("mqtt", "tcp", "mqtts", "ssl"):
        raise ValueError(f"MQTT URL {url!r} must look like mqtt://HOST:PORT (or mqtts:// for TLS)")
    return parsed.hostname or "127.0.0.1", parsed.port or (8883 if parsed.scheme in ("mqtts", "ssl") else 1883)


def mqtt_tls(client: mqtt.Client, url: str, ca: str | None) -> None:
    """Speak TLS to an mqtts:// broker, verifying it against ``ca`` (the deployment's CA)."""
    if urlparse(url).scheme in ("mqtts", "ssl"):
        client.tls_set(ca_certs=ca)


def mqtt_accepts(url: str, user: str, password: str, ca: str | None = None, timeout_s: float = 2.0) -> bool:
    """Whether the broker lets ``user`` in now (one CONNECT); blocking, False on failure."""
    host, port = parse_mqtt_url(url)
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"p2pfaas-check-{os.urandom(6).hex()}",
                         protocol=mqtt.MQTTv311, clean_session=True)
    client.username_pw_set(user, password)
    answered: list[bool] = []

    def on_connect(c, userdata, flags, reason, properties=None) -> None:
        answered.append(not reason.is_failure)

    client.on_connect = on_connect
    try:
        mqtt_tls(client, url, ca)
        client.connect(host, port, keepalive=10)
        deadline = time.monotonic() + timeout_s
        while not answered and time.monotonic() < deadline:
            client.loop(timeout=0.05)
    except (OSError, ValueError) as exc:
        log.debug("MQTT check of %s at %s: %s", user, url, exc)
        return False
    finally:
        with contextlib.suppress(Exception):
            client.disconnect()
    return bool(answered and answered[0])
