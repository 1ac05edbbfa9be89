"""Helpers for tests that run ``p2pfaas up`` as a user does: start it, wait for its endpoints,
and find every process of its tree (importable as ``stack_processes``)."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

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


UP_STOP_BOUND_S = 60.0   # p2pfaas.cli.STOP_TIMEOUT_S: up's whole shutdown


class UpRuns:
    """``p2pfaas up`` processes a test started; :meth:`end` stops whatever is still running."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def __call__(self, data_dir: Path, *extra: str, env: dict[str, str] | None = None,
                 python: str = sys.executable, user: int | None = None) -> subprocess.Popen:
        """``python``: the interpreter up (and so every part) runs on; ``user``: the uid it runs as."""
        proc = subprocess.Popen([python, "-m", "p2pfaas.cli", "up", "--data-dir", str(data_dir), "--nodes", "1", "--k", "2",
                                 *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **(env or {})}, user=user,
                                group=None if user is None else pwd.getpwuid(user).pw_gid,
                                extra_groups=None if user is None else [])
        self.started.append(proc)
        return proc

    def end(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    # reading its output: a full pipe must not hold up its stop. Longer than up's own
                    # bound on its shutdown (60 s, then it kills what is left and exits): at exactly
                    # 60 s this raced that bound once in CI
                    proc.communicate(timeout=UP_STOP_BOUND_S + 30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, _ = proc.communicate()
                    # not this test's subject, but worth seeing in the run's warnings summary
                    warnings.warn(f"p2pfaas up did not stop within {UP_STOP_BOUND_S + 30:g} s of SIGINT (its own bound "
                                  f"is {UP_STOP_BOUND_S:g} s); its output ended: {out[-2000:]}")


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


