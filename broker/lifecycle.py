"""How every p2pfaas process starts and ends: the fastest event loop, a stop with a deadline, and a stdin
pipe its parent never writes (``P2PFAAS_PARENT_PIPE=1``): end of file means the parent is gone."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from broker.errors import DataDirInUse

PARENT_PIPE_ENV = "P2PFAAS_PARENT_PIPE"


def run_loop(main):
    """``asyncio.run`` on uvloop when it is installed (the faster loop), else the stdlib one."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


class OnItsLoop:
    """A mixin: ``self.loop``, looked up once (CPython 3.11's lookup makes a system call)."""

    _loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop


class StartStop:
    """A mixin: ``async with`` starts the object (it is what ``start()`` returns) and stops it."""

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has ended, whatever its outcome."""
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class Tasks:
    """Tasks a service holds (asyncio keeps only weak references), each failure logged as ``what``."""

    def __init__(self, what: str, logger: logging.Logger) -> None:
        self.what, self.logger = what, logger
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.logger.error("%s: %r", self.what, task.exception())

    def __bool__(self) -> bool:
        return bool(self._tasks)

    def __iter__(self):
        return iter(list(self._tasks))

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def still_wanted() -> None:
    """Raise CancelledError if the running task was asked to stop; called at the top of every turn of a
    long-lived loop, since Python 3.11's ``asyncio.wait_for`` (in nats-py) can swallow a cancellation
    that comes as its future completes, while ``Task.cancelling()`` still counts it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def hard_exit_after(seconds: float, code: int = 0) -> threading.Timer:
    """End the process after ``seconds`` whatever the event loop is doing (a stop with a deadline)."""
    def end() -> None:
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()
    return timer


def parent_pipe_watched() -> bool:
    return os.environ.get(PARENT_PIPE_ENV) == "1"


def parent_gone() -> bool:
    """True once the parent's end of our stdin pipe is closed (it never writes to it)."""
    try:
        return os.read(0, 1) == b""
    except (BlockingIOError, OSError):
        return False


def on_parent_gone(callback: Callable[[], None]) -> bool:
    """Call ``callback`` once when our parent ends; False without a parent pipe to watch."""
    if not parent_pipe_watched():
        return False
    loop = asyncio.get_running_loop()
    os.set_blocking(0, False)
    called = False

    def check() -> None:
        nonlocal called
        if not called and parent_gone():
            called = True
            loop.remove_reader(0)
            callback()

    loop.add_reader(0, check)
    return True


def child_env(**extra: str) -> dict[str, str]:
    """A child's environment: ours less any secret (see :mod:`broker.handoff`), a parent pipe, ``extra``."""
    from broker.handoff import HANDOFF_FD_ENV, SECRET_NAMES

    if SECRET_NAMES & extra.keys():
        raise ValueError(f"{sorted(SECRET_NAMES & extra.keys())} must be handed over (broker.handoff), not put in an environment")
    inherited = {k: v for k, v in os.environ.items() if k not in SECRET_NAMES and k != HANDOFF_FD_ENV}
    return {**inherited, PARENT_PIPE_ENV: "1", **extra}


# -- one owner per data directory ----------------------------------------------------------
UP_LOCK = Path("run") / "up.lock"


def hold_data_dir(data_dir: "os.PathLike[str] | str", lock: Path = UP_LOCK, owner: str = "`p2pfaas up`",
                  flag: str = "--data-dir") -> int:
    """Take ``data_dir``'s exclusive ``lock`` (our pid in it) while the returned descriptor is open (dropped
    when we end, even by kill -9; not inherited); :class:`DataDirInUse` names a live holder's pid."""
    path = Path(data_dir) / lock
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"   # "?": not written yet
        os.close(fd)
        raise DataDirInUse(data_dir, holder, owner, flag) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def data_dir_held(data_dir: "os.PathLike[str] | str", lock: Path = UP_LOCK) -> bool:
    """Whether a live process (a running ``up``) holds the lock of ``data_dir``."""
    path = Path(data_dir) / lock
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# -- state files ------------------------------------------------------------------------------
def write_whole(path: Path, data: bytes) -> None:
    """``data`` as the whole of ``path`` (temporary file, fsync, rename): a crash leaves the old."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)   # the rename itself survives a crash
    finally:
        os.close(directory)


# -- pid files: strays of a previous run are found and ended --------------------------------
def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/<pid>/stat), None if it is gone."""
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
    except OSError:
        return None
    return stat.rsplit(b")", 1)[1].split()[19].decode()


def write_pid_file(path: "os.PathLike[str] | str", pid: int) -> None:
    """Remember a child: its pid and start time (a later process with the same pid is never taken for it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{pid} {_start_time(pid) or 0}\n")


def remove_pid_file(path: "os.PathLike[str] | str") -> None:
    Path(path).unlink(missing_ok=True)


def end_strays(directory: "os.PathLike[str] | str", grace_s: float = 3.0) -> list[int]:
    """SIGTERM (then SIGKILL) every still-running process a pid file under ``directory`` names."""
    alive: list[int] = []
    for path in sorted(Path(directory).rglob("*.pid")):
        try:
            pid_text, started = path.read_text().split()[:2]
            pid = int(pid_text)
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if pid != os.getpid() and _start_time(pid) == started:
            alive.append(pid)
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        path.unlink(missing_ok=True)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline and any(_start_time(p) for p in alive):
        time.sleep(0.05)
    for pid in alive:
        if _start_time(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return alive
