"""No process outlives the stack that started it: ``p2pfaas up`` stopped by SIGKILL, by SIGTERM
with a shutdown that hangs past its bound, or after its nats-server died — each while the farm
pool is busy — leaves nothing alive shortly after; a new ``up`` ends strays of an old one, and
refuses to start while the ``up`` of that data dir is alive."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from broker.auth import OPERATOR, AuthStore
from broker.client import FaasClient
from broker.connection import close_quietly, connect
from broker.embedded import free_port
from stack_processes import alive, descendants, wait_endpoints

STOP_BOUND_S = 8.0   # up's whole-shutdown bound in these tests (P2PFAAS_STOP_TIMEOUT_S)


def pid_of(data_dir: Path, part: str) -> int:
    return int((data_dir / "run" / f"{part}.pid").read_text().split()[0])


def start_busy_stack(start_up, tmp_path: Path) -> tuple[subprocess.Popen, Path, set[int]]:
    """``up`` with a farm pool (scenario spike: 4 workers) busy with long tasks; its process tree."""
    data_dir = tmp_path / "data"
    proc = start_up(data_dir, "--nats-port", str(free_port()), "--http-port", str(free_port()), "--mqtt", "off",
                    "--controller", "fixed-4", "--scenario", "spike",
                    env={"P2PFAAS_STOP_TIMEOUT_S": str(STOP_BOUND_S)})
    endpoints = wait_endpoints(proc, data_dir, timeout_s=120)

    operator = AuthStore(data_dir / "auth").service(OPERATOR)   # the stack is secure: act as its operator

    async def keep_farm_busy() -> None:
        nc = await connect(endpoints["nats_url"], "orphans-test", credentials=(operator.user, operator.password))
        try:
            async with FaasClient(nc, client="orphans", prefix=endpoints["prefix"]) as faas:
                for i in range(6):
                    await faas.submit("n1", "sleep", b"30", f"busy{i}")
        finally:
            await close_quietly(nc)

    asyncio.run(keep_farm_busy())
    deadline = time.monotonic() + 30
    workers: set[int] = set()
    while time.monotonic() < deadline:   # the farm's worker processes are up and running tasks
        workers = {p for p in descendants(proc.pid) if b"nodes.worker" in _cmdline(p)}
        if len(workers) >= 4:
            break
        time.sleep(0.2)
    assert len(workers) >= 4, "the farm pool did not start"
    tree = descendants(proc.pid)
    assert len(tree) >= 8, tree   # nats-server, node, its workers, bridge, controller
    return proc, data_dir, tree


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def assert_all_gone(pids: set[int], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    left = {p: _cmdline(p).replace(b"\0", b" ")[:120] for p in pids if alive(p)}
    assert not left, f"processes of the stack still alive: {left}"


def test_up_killed_with_sigkill_leaves_nothing_behind(start_up, tmp_path):
    proc, _, tree = start_busy_stack(start_up, tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert_all_gone(tree, within_s=10)


def test_a_shutdown_that_hangs_is_cut_at_its_bound(start_up, tmp_path):
    proc, data_dir, tree = start_busy_stack(start_up, tmp_path)
    node = pid_of(data_dir, "node-n1")
    os.kill(node, signal.SIGSTOP)   # a node that will never answer its SIGTERM
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=STOP_BOUND_S + 30)
    assert time.monotonic() - started < STOP_BOUND_S + 10
    assert proc.returncode == 1 and "killing what is left" in out
    assert_all_gone(tree, within_s=10)


def test_stopping_after_nats_server_died_leaves_nothing_behind(start_up, tmp_path):
    proc, data_dir, tree = start_busy_stack(start_up, tmp_path)
    os.kill(pid_of(data_dir, "nats-server"), signal.SIGKILL)
    proc.send_signal(signal.SIGTERM)      # before the supervisor could restart it
    proc.communicate(timeout=STOP_BOUND_S + 30)
    assert_all_gone(tree, within_s=10)


def test_a_new_up_ends_strays_of_a_previous_run(start_up, tmp_path):
    data_dir = tmp_path / "data"
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        run = data_dir / "run" / "workers"
        run.mkdir(parents=True)
        started = Path(f"/proc/{stray.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19].decode()
        (run / "n1-w7.pid").write_text(f"{stray.pid} {started}\n")              # ours: ended
        (data_dir / "run" / "reused.pid").write_text(f"{os.getpid()} 1\n")      # a reused pid: left alone
        proc = start_up(data_dir, "--nats-port", str(free_port()), "--http-port", str(free_port()),
                        "--mqtt", "off", "--controller", "off")
        wait_endpoints(proc, data_dir, timeout_s=120)
        assert stray.wait(10) == -signal.SIGTERM     # ended by the new up (TERM first; a sleep obeys it)
        assert not (run / "n1-w7.pid").exists()
        # reused.pid names this test's own process with another start time: that it is still
        # running to read this line is the check that a reused pid is left alone
    finally:
        if stray.poll() is None:
            stray.kill()


def test_a_second_up_on_a_live_stack_refuses_and_leaves_it_alone(start_up, tmp_path):
    data_dir = tmp_path / "data"

    def up() -> subprocess.Popen:
        return start_up(data_dir, "--nats-port", str(free_port()), "--http-port", str(free_port()),
                        "--mqtt", "off", "--controller", "off")

    first = up()
    endpoints = wait_endpoints(first, data_dir, timeout_s=120)
    parts = ("nats-server", "node-n1")   # each node serves its HTTP bridge from its own process
    pids = {part: pid_of(data_dir, part) for part in parts}
    files = {name: (data_dir / name).read_bytes()
             for name in ("endpoints.json", "run/node-n1.json", "nats/nats-server.conf")}

    started = time.monotonic()
    second = up()
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 2, out
    assert f"in use by another `p2pfaas up` (pid {first.pid})" in out and "Traceback" not in out, out
    assert time.monotonic() - started < 30, "the refusal should come before anything starts"

    assert first.poll() is None
    assert {part: pid_of(data_dir, part) for part in parts} == pids and all(alive(p) for p in pids.values())
    assert {name: (data_dir / name).read_bytes() for name in files} == files
    health = httpx.get(f"{endpoints['http']['n1']}/healthz", timeout=10)
    assert health.status_code == 200, health.text
    r = httpx.post(f"{endpoints['http']['n1']}/function/fib", content=b"20", timeout=30)
    assert r.status_code == 200 and r.text == "6765"

    # once that up is gone (kill -9: its lock file stays, the kernel's lock does not), a new one starts
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    (data_dir / "endpoints.json").unlink()
    wait_endpoints(up(), data_dir, timeout_s=120)
