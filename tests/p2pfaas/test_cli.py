"""``p2pfaas up`` and ``p2pfaas invoke`` as a user runs them: real processes, real brokers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from broker.embedded import free_port

P2PFAAS = [sys.executable, "-m", "p2pfaas.cli"]


def descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = map(int, line.split())
        children.setdefault(pp, []).append(p)
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.fixture
def start_up():
    """Start ``p2pfaas up`` as a user does; whatever the test's outcome, it is ended afterwards."""
    started: list[subprocess.Popen] = []

    def start(data_dir: Path, *extra: str) -> subprocess.Popen:
        proc = subprocess.Popen([*P2PFAAS, "up", "--data-dir", str(data_dir), "--nodes", "1", "--k", "2", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_endpoints(proc: subprocess.Popen, data_dir: Path, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"p2pfaas up exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            return json.loads((data_dir / "endpoints.json").read_text())
        except (OSError, ValueError):
            time.sleep(0.1)
    proc.kill()
    pytest.fail("p2pfaas up did not come up")


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
