"""The supervisor with real child processes: a restart that fails is tried again (the watcher
outlives any error), and a child's stdout is drained whatever the length of its lines."""

from __future__ import annotations

import asyncio
import errno
import json
import sys
from pathlib import Path

import pytest

import p2pfaas.supervisor as supervisor
from p2pfaas.supervisor import ChildSpec, RestartPolicy, Supervisor

from stack_processes import alive
from support import wait_until

LONG = 200_000   # one line of this many bytes: over the 64 KiB a StreamReader's readline takes


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


# READY, then sleeps; the first run (no marker file yet) exits 3 after one long line instead
ONCE_LONG_THEN_SLEEPS = f"""
import os, sys, time
marker = sys.argv[1]
print("READY", flush=True)
if not os.path.exists(marker):
    open(marker, "w").close()
    sys.stdout.write("x" * {LONG} + "\\n")
    sys.stdout.flush()
    sys.exit(3)
time.sleep(600)
"""


@pytest.fixture
def sup(tmp_path):
    return Supervisor(tmp_path / "run", tmp_path / "logs", RestartPolicy(backoff_s=(0.05, 0.1, 0.2), fix_poll_s=0.1))


async def _stopped(sup: Supervisor) -> None:
    await asyncio.wait_for(sup.stop_all([]), 30)


@pytest.mark.parametrize("failing", ["pid file", "exec"])
async def test_a_restart_that_fails_once_is_tried_again(sup, monkeypatch, failing):
    child = await sup.start(ChildSpec("sleeper", python("import time; print('READY', flush=True); time.sleep(600)")))
    first = child.pid
    half_started: list[int] = []
    real_write, real_exec = supervisor.write_pid_file, asyncio.create_subprocess_exec

    def disk_full_once(path, pid: int) -> None:
        if not half_started:
            half_started.append(pid)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, pid)

    async def eagain_once(*args, **kwargs):
        if not half_started:
            half_started.append(0)
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return await real_exec(*args, **kwargs)

    if failing == "pid file":
        monkeypatch.setattr(supervisor, "write_pid_file", disk_full_once)
    else:
        monkeypatch.setattr(asyncio, "create_subprocess_exec", eagain_once)
    try:
        sup.kill("sleeper")
        await wait_until(lambda: child.restarts == 1 and child.pid is not None, timeout_s=20)
        assert half_started, "the failing restart was not attempted"
        assert child.pid != first and not child.watcher.done()
        assert (sup.run_dir / "sleeper.pid").read_text().split()[0] == str(child.pid)
        if failing == "pid file":   # the process whose pid file failed was ended, not left unsupervised
            await wait_until(lambda: not alive(half_started[0]), timeout_s=10)
        sup.kill("sleeper")         # and the watcher still restarts it after that
        await wait_until(lambda: child.restarts == 2 and child.pid is not None, timeout_s=20)
    finally:
        await _stopped(sup)


async def test_a_long_line_and_what_follows_reach_the_log(sup):
    code = (f"import sys\nprint('READY', flush=True)\nsys.stdout.write('y' * {LONG} + '\\n')\n"
            "for i in range(20000): print('line', i)\n")
    child = await sup.start(ChildSpec("talker", python(code), restart=False))
    try:
        await asyncio.wait_for(child.watcher, 20)   # its exit noticed: it was never blocked on its stdout
        assert child.proc.returncode == 0
        log = (sup.log_dir / "talker.log").read_bytes()
        assert b"y" * LONG + b"\n" in log and log.endswith(b"line 19999\n")
    finally:
        await _stopped(sup)


async def test_a_child_that_exits_after_a_long_line_is_restarted(sup, tmp_path):
    child = await sup.start(ChildSpec("once", python(ONCE_LONG_THEN_SLEEPS) + [str(tmp_path / "ran")]))
    try:
        await wait_until(lambda: child.restarts == 1 and child.pid is not None, timeout_s=20)
        assert "exited (code 3)" in sup.notes[0]
        assert b"x" * LONG in (sup.log_dir / "once.log").read_bytes()
    finally:
        await _stopped(sup)


async def test_a_long_line_before_ready_is_skipped(sup):
    code = f"import sys, time\nsys.stdout.write('z' * {LONG} + '\\n')\nprint('READY', flush=True)\ntime.sleep(600)\n"
    child = await sup.start(ChildSpec("early", python(code), ready_timeout_s=20))
    try:
        assert child.pid is not None and alive(child.pid)
    finally:
        await _stopped(sup)


@pytest.mark.parametrize("log_file", ["/dev/full", "a directory"])
async def test_the_output_is_drained_when_the_log_cannot_be_written(sup, monkeypatch, tmp_path, log_file):
    """A full disk (/dev/full) or a log that cannot be opened loses the output; the child still
    runs to its end and its exit is noticed."""
    target = Path(log_file) if log_file.startswith("/") else tmp_path / log_file
    if not target.exists():
        target.mkdir()
    real_copy = supervisor._copy_to
    monkeypatch.setattr(supervisor, "_copy_to", lambda stream, path: real_copy(stream, target))
    code = f"import sys\nprint('READY', flush=True)\nfor i in range(50): sys.stdout.write('w' * {LONG} + '\\n')\n"
    child = await sup.start(ChildSpec("nolog", python(code), restart=False))
    try:
        assert await asyncio.wait_for(child.proc.wait(), 20) == 0
    finally:
        await _stopped(sup)


async def test_a_node_refusing_its_broken_file_waits_for_the_fix(sup, monkeypatch, tmp_path, nats_server, prefix,
                                                                 caplog):
    """A real `p2pfaas node` whose configuration.json is broken while it is down (a crash
    mid-write) refuses it, one line and exit code 2. It was restarted every 10 s for ever, the same
    line each time; now it is reported once, left down, and started again once its file changes."""
    node_dir = tmp_path / "data" / "nodes" / "n1"
    settings = tmp_path / "node.json"
    settings.write_text(json.dumps({"node_id": "n1", "nats_url": nats_server.url, "prefix": prefix,
                                    "data_dir": str(tmp_path / "data"), "learner": False, "runtime": "inprocess"}))
    spec = ChildSpec("node-n1", [sys.executable, "-m", "p2pfaas.cli", "node", "--settings", str(settings)],
                     fix_exit_code=supervisor.EXIT_NEEDS_FIX, watch=[node_dir], stop_timeout_s=30)
    child = await sup.start(spec)
    log_path = sup.log_dir / "node-n1.log"
    try:
        (node_dir / "configuration.json").write_bytes(b'{"parallel_running_functions_max": 4, "queue')
        sup.kill("node-n1")
        await wait_until(lambda: child.needs_fix is not None, timeout_s=30)
        assert "configuration.json is not valid" in child.needs_fix and child.needs_fix.startswith("error: ")
        assert sup.needing_fix() == {"node-n1": child.needs_fix}
        await asyncio.sleep(2.0)   # blindly, it would have been started again many times meanwhile
        assert log_path.read_text().count("configuration.json is not valid") == 1
        reported = [r for r in caplog.records if r.levelname == "ERROR" and "asking for a fix" in r.getMessage()]
        assert len(reported) == 1 and str(node_dir) in reported[0].getMessage()
        assert child.pid is None and child.restarts == 0

        (node_dir / "configuration.json").unlink()   # the user's fix: back to the defaults
        await wait_until(lambda: child.restarts == 1 and child.pid is not None, timeout_s=30)
        assert child.needs_fix is None and sup.needing_fix() == {}
    finally:
        await _stopped(sup)


async def test_a_crash_is_still_restarted_at_once(sup, tmp_path):
    """Only the fix code waits for a fix: a child that crashes (another code, a signal) comes back
    on the usual backoff, whatever it printed; and so does one that has no fix code (nats-server:
    a Go panic exits 2)."""
    code = ("import os, sys\nprint('READY', flush=True)\nif not os.path.exists(sys.argv[1]):\n"
            "    open(sys.argv[1], 'w').close(); print('error: not this kind', file=sys.stderr); sys.exit(int(sys.argv[2]))\n"
            "import time; time.sleep(600)\n")
    child = await sup.start(ChildSpec("crasher", python(code) + [str(tmp_path / "ran"), "1"], fix_exit_code=2,
                                      watch=[tmp_path / "x"]))
    go = await sup.start(ChildSpec("go", python(code) + [str(tmp_path / "go-ran"), "2"]))
    try:
        await wait_until(lambda: child.restarts == 1 and child.pid is not None, timeout_s=20)
        sup.kill("crasher")
        await wait_until(lambda: child.restarts == 2 and child.pid is not None, timeout_s=20)
        await wait_until(lambda: go.restarts == 1 and go.pid is not None, timeout_s=20)
        assert child.needs_fix is None and go.needs_fix is None and sup.needing_fix() == {}
        assert {"crasher exited (code 1)", "crasher exited (code -9)", "go exited (code 2)"} == {
            n.split(" after")[0] for n in sup.notes}
    finally:
        await _stopped(sup)
