"""``p2pfaas up`` and ``p2pfaas invoke`` as a user runs them: real processes, real brokers."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from broker.embedded import free_port

from stack_processes import P2PFAAS, alive, descendants, wait_endpoints


def invoke(data_dir: Path, via: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*P2PFAAS, "invoke", "fib", "--data", "25", "--via", via, "--data-dir", str(data_dir), *extra],
                          capture_output=True, text=True, timeout=60)


def stop_and_check_no_orphans(proc: subprocess.Popen) -> str:
    children = descendants(proc.pid)
    assert children, "up should have started nats-server and workers"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    deadline = time.monotonic() + 10
    while any(alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c for c in children if alive(c)], "orphan processes left behind"
    return out


@pytest.mark.parametrize("mqtt", ["nats", "mosquitto"])
def test_up_serves_http_nats_mqtt_and_stops_cleanly(tmp_path, mqtt, start_up):
    if mqtt == "mosquitto" and not (Path("/usr/sbin/mosquitto").exists()):
        pytest.fail("mosquitto not installed (.ci/run installs it)")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    try:
        proc = start_up(tmp_path, "--http-port", str(busy_port), "--nats-port", str(free_port()),
                        "--mqtt-port", str(free_port()), "--mqtt", mqtt)
        endpoints = wait_endpoints(proc, tmp_path)
        http = endpoints["http"]["n1"]
        assert not http.endswith(f":{busy_port}")
        r = httpx.post(f"{http}/function/fib", content=b"25", timeout=30)
        assert r.status_code == 200 and r.text == "75025" and r.headers["X-P2pfaas-Scheduler"]
        for via in ("http", "nats", "mqtt"):
            done = invoke(tmp_path, via)
            assert done.returncode == 0 and done.stdout.strip() == "75025", (via, done.stdout, done.stderr)
        bad = subprocess.run([*P2PFAAS, "invoke", "nope", "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 1 and "unknown function" in bad.stdout
        out = stop_and_check_no_orphans(proc)
    finally:
        busy.close()
    assert f"port {busy_port} is busy" in out
    assert "p2pfaas is up" in out and "stopped" in out
    assert not (tmp_path / "endpoints.json").exists()


def test_invoke_reports_unreachable_broker_clearly(tmp_path):
    port = free_port()
    done = subprocess.run([*P2PFAAS, "invoke", "fib", "--data", "1", "--via", "nats", "--nats-url",
                           f"nats://127.0.0.1:{port}", "--data-dir", str(tmp_path), "--timeout", "3"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot connect to NATS" in done.stderr


def test_help_lists_commands():
    out = subprocess.run([*P2PFAAS, "--help"], capture_output=True, text=True, timeout=60).stdout
    for command in ("up", "node", "bridge", "invoke"):
        assert command in out
