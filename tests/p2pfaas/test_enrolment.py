"""Enrolling a device works at any moment of a running ``up``, its start included, and
``p2pfaas auth device`` returns only once the brokers let the device in: a script that enrols a
device and connects at once is never refused."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import paho.mqtt.client as mqtt
import pytest

from broker.embedded import free_port
from stack_processes import P2PFAAS

pytestmark = [pytest.mark.nats]


def connack(port: int, user: str, password: str, timeout_s: float = 10.0) -> str:
    """The reason code of the first CONNACK (a refused device gets 'Not authorized' or similar)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"enrol-{user}", protocol=mqtt.MQTTv311)
    client.username_pw_set(user, password)
    codes: list[str] = []
    client.on_connect = lambda c, u, flags, reason, props=None: codes.append(str(reason))
    client.connect("127.0.0.1", port, keepalive=10)
    deadline = time.monotonic() + timeout_s
    while not codes and time.monotonic() < deadline:
        client.loop(timeout=0.05)
    client.disconnect()
    return codes[0] if codes else "no CONNACK"


def enrol(data_dir, name: str) -> dict:
    done = subprocess.run([*P2PFAAS, "auth", "device", name, "--data-dir", str(data_dir)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("mqtt_mode", ["nats", "mosquitto"])
def test_a_device_enrolled_while_up_starts_is_let_in_when_auth_device_returns(tmp_path, start_up, mqtt_mode):
    http_port, mqtt_port = free_port(), free_port()
    proc = start_up(tmp_path, "--http-port", str(http_port), "--nats-port", str(free_port()),
                    "--mqtt-port", str(mqtt_port), "--mqtt", mqtt_mode, "--controller", "off")
    deadline = time.monotonic() + 60
    while True:   # the first moment /healthz answers: up may still be starting its other parts
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "the node never answered /healthz"
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    first = enrol(tmp_path, "early1")
    assert connack(mqtt_port, first["user"], first["password"]) == "Success"
    later = enrol(tmp_path, "later1")   # and once up has started
    assert connack(mqtt_port, later["user"], later["password"]) == "Success"
    assert connack(mqtt_port, "later1", "not-its-password") != "Success"   # the check can fail
