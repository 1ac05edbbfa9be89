"""The supervisor with real child processes: a restart that fails is tried again (the watcher
outlives any error)."""

from __future__ import annotations

import asyncio
import errno
import sys

import pytest

import p2pfaas.supervisor as supervisor
from p2pfaas.supervisor import ChildSpec, Supervisor

from stack_processes import alive
from support import wait_until


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.fixture
def sup(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor, "RESTART_BACKOFF_S", (0.05, 0.1, 0.2))
    return Supervisor(tmp_path / "run", tmp_path / "logs")


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
