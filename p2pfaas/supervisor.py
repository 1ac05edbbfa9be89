"""Supervised child processes: restarted when they die, stopped in order with a deadline, and kept in
pid files for a later run to end. Each child's stdin is a pipe we never write (our Python children
end at its end of file, even after a kill -9 of ours). A child that exits asking for a fix is
reported once and started again when its files change, another part restarts, or after a long backoff."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from broker.embedded import die_with_parent_preexec
from broker.errors import BrokerUnavailable
from broker.handoff import HANDOFF_FD_ENV, handoff_fd
from broker.lifecycle import child_env, end_strays, remove_pid_file, still_wanted, write_pid_file

log = logging.getLogger(__name__)

READY_LINE = b"READY"
COPY_CHUNK_BYTES = 65536                          # a child's stdout is copied to its log in reads of this size
KILL_WAIT_S = 5.0                                 # after SIGKILL, this long for the process to be reaped
EXIT_NEEDS_FIX = 2                                # the CLI's exit code for what the user must fix (one error line)


class RestartPolicy(BaseModel):
    """When a child that ended is started again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backoff_s: tuple[PositiveFloat, ...] = (0.5, 1.0, 2.0, 5.0, 10.0)   # after the n-th quick death in a row
    stable_after_s: float = Field(default=30.0, gt=0)   # a child that lived this long starts the backoff afresh
    # a child that exited EXIT_NEEDS_FIX: tried again without any change seen after these
    fix_backoff_s: tuple[PositiveFloat, ...] = (30.0, 60.0, 120.0, 300.0)
    fix_poll_s: float = Field(default=1.0, gt=0)        # how often its files are looked at meanwhile

    def backoff(self, quick_deaths: int) -> float:
        return self.backoff_s[min(quick_deaths, len(self.backoff_s) - 1)]


@dataclass
class ChildSpec:
    """How to run one child. ``ready``: "line" (it prints READY on stdout) or "port" (it listens
    on every one of ``ports``)."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)   # handed over at its start, never in its environment
    ready: str = "line"
    ports: list[int] = field(default_factory=list)
    ready_timeout_s: float = 120.0
    stop_timeout_s: float = 20.0
    restart: bool = True
    fix_exit_code: int | None = None   # the code it exits with when the user must fix something (our CLI: 2);
    # None: every exit is a crash (a Go program such as nats-server also exits 2 when it panics)
    watch: list[Path] = field(default_factory=list)   # files (or directories of them) a fix would change


@dataclass(eq=False)
class Child:
    spec: ChildSpec
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = 0.0
    watcher: asyncio.Task | None = None
    drain: asyncio.Task | None = None
    needs_fix: str | None = None     # its last line, while it waits for the user (it exited with code 2)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None


class Supervisor:
    def __init__(self, run_dir: Path, log_dir: Path, policy: RestartPolicy = RestartPolicy()) -> None:
        self.run_dir, self.log_dir, self.policy = run_dir, log_dir, policy
        self.children: dict[str, Child] = {}
        self.notes: list[str] = []             # what happened (restarts), for the operator
        self._stopping = False
        self._restarted = 0                    # restarts of any child so far (wakes those waiting for a fix)

    def end_strays(self) -> list[int]:
        """End processes of a previous run on this data dir (pid files), before starting ours."""
        return end_strays(self.run_dir)

    async def start(self, spec: ChildSpec) -> Child:
        child = Child(spec)
        self.children[spec.name] = child
        await self._spawn(child)
        child.watcher = asyncio.create_task(self._watch(child), name=f"watch-{spec.name}")
        return child

    async def _spawn(self, child: Child) -> None:
        """Start the child and wait until it is ready; when this raises, the process it started has
        been ended (a half-started child must not run on unsupervised)."""
        spec = child.spec
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{spec.name}.log"
        handed = handoff_fd(spec.secrets) if spec.secrets else None
        env = child_env(**spec.env, **({HANDOFF_FD_ENV: str(handed)} if handed is not None else {}))
        try:
            with _open_log(log_path) as out:
                proc = child.proc = await asyncio.create_subprocess_exec(
                    *spec.argv, env=env, stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE if spec.ready == "line" else out, stderr=out,
                    preexec_fn=die_with_parent_preexec, start_new_session=True,
                    pass_fds=() if handed is None else (handed,))
        finally:
            if handed is not None:
                os.close(handed)
        child.started_at = time.monotonic()
        child.drain = None
        try:
            write_pid_file(self.run_dir / f"{spec.name}.pid", proc.pid)
            async with asyncio.timeout(spec.ready_timeout_s):
                await self._ready(child, log_path)
        except Exception as exc:
            if proc.stdout is not None and child.drain is None:   # its pipe emptied, or it cannot end
                child.drain = asyncio.create_task(_copy_to(proc.stdout, log_path))
            await self._terminate(child)
            if not isinstance(exc, (asyncio.TimeoutError, BrokerUnavailable)):
                raise
            raise BrokerUnavailable(f"{spec.name} did not start ({exc or 'timeout'}); its log {log_path}:\n"
                                    f"{_tail(log_path)}") from None

    async def _ready(self, child: Child, log_path: Path) -> None:
        proc, spec = child.proc, child.spec
        assert proc is not None
        if spec.ready == "port":
            waiting = list(spec.ports)
            while waiting and proc.returncode is None:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", waiting[0])
                    writer.close()
                    waiting.pop(0)
                except OSError:
                    await asyncio.sleep(0.05)
            if proc.returncode is not None:
                raise BrokerUnavailable(f"exited with code {proc.returncode}")
            return
        assert proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except ValueError:   # a line over the reader's limit (64 KiB): not READY, and skipped
                continue
            if not line:
                await proc.wait()
                raise BrokerUnavailable(f"exited with code {proc.returncode}")
            if line.strip() == READY_LINE:
                child.drain = asyncio.create_task(_copy_to(proc.stdout, log_path))
                return

    async def _watch(self, child: Child) -> None:
        """Restart a child that dies (unless we are stopping), with a growing backoff when it keeps
        dying at once. A restart that fails, whatever the error (EAGAIN, a full disk), is tried again
        after the next backoff: if this task ended, the part would stay down unnoticed."""
        quick_deaths = 0
        while True:
            still_wanted()
            assert child.proc is not None
            code = await child.proc.wait()
            remove_pid_file(self.run_dir / f"{child.spec.name}.pid")
            if self._stopping or not child.spec.restart:
                return
            lived = time.monotonic() - child.started_at
            quick_deaths = 0 if lived > self.policy.stable_after_s else quick_deaths + 1
            delay = self.policy.backoff(quick_deaths)
            fixes = 0   # tries since it asked for a fix
            if code == child.spec.fix_exit_code:
                self._needs_fix(child, lived)
            else:
                note = f"{child.spec.name} exited (code {code}) after {lived:.0f} s; restarting in {delay:g} s"
                log.warning(note)
                self.notes.append(note)
            while True:
                still_wanted()
                if child.needs_fix is not None:
                    waits = self.policy.fix_backoff_s
                    await self._until_fixed(child, waits[min(fixes, len(waits) - 1)])
                else:
                    await asyncio.sleep(delay)
                if self._stopping:
                    return
                try:
                    await self._spawn(child)
                except BrokerUnavailable as exc:   # it never got ready; the message has its log's tail
                    if child.proc is not None and child.proc.returncode == child.spec.fix_exit_code:
                        fixes += 1
                        self._needs_fix(child, time.monotonic() - child.started_at)
                        continue
                    log.error("%s", exc)
                except Exception as exc:
                    log.error("%s could not be restarted: %s: %s", child.spec.name, type(exc).__name__, exc)
                else:
                    break
                if self._stopping:
                    return
                child.needs_fix = None   # it failed otherwise: a crash, restarted as crashes are
                quick_deaths += 1
                delay = self.policy.backoff(quick_deaths)
                log.warning("%s: trying again in %g s", child.spec.name, delay)
            if child.needs_fix is not None:
                log.warning("%s runs again: what it asked to fix is fixed", child.spec.name)
                child.needs_fix = None
            child.restarts += 1
            self._restarted += 1
            log.warning("%s restarted (restart %d)", child.spec.name, child.restarts)

    def _needs_fix(self, child: Child, lived: float) -> None:
        """Report a child that exited asking for a fix: once per distinct line it gave (an error, a
        note for the operator), later tries that end the same way only at info level."""
        line = _last_line(self.log_dir / f"{child.spec.name}.log") or f"exited with code {child.spec.fix_exit_code}"
        if line == child.needs_fix:
            log.info("%s still needs a fix: %s", child.spec.name, line)
            return
        child.needs_fix = line
        watched = ", ".join(str(p) for p in child.spec.watch)
        note = (f"{child.spec.name} exited after {lived:.0f} s asking for a fix: {line} -- not restarted until "
                f"{'its files change (' + watched + '), ' if watched else ''}another part restarts, or "
                f"{self.policy.fix_backoff_s[0]:g}-{self.policy.fix_backoff_s[-1]:g} s have passed; its log: {self.log_dir / child.spec.name}.log")
        log.error(note)
        self.notes.append(note)

    async def _until_fixed(self, child: Child, timeout_s: float) -> None:
        """Wait until the child's watched files change, another child was restarted, we stop, or
        ``timeout_s`` has passed (a cause outside its files, e.g. a foreign broker that was away)."""
        loop = asyncio.get_running_loop()
        before, restarted = _signature(child.spec.watch), self._restarted
        deadline = loop.time() + timeout_s
        while not self._stopping and loop.time() < deadline:
            await asyncio.sleep(min(self.policy.fix_poll_s, max(0.0, deadline - loop.time())))
            if _signature(child.spec.watch) != before:
                log.warning("%s: its files changed; starting it again", child.spec.name)
                return
            if self._restarted != restarted:
                log.info("%s: another part was restarted; starting it again", child.spec.name)
                return

    def needing_fix(self) -> dict[str, str]:
        """Children waiting for the user, with the line each gave (for a status display)."""
        return {name: c.needs_fix for name, c in self.children.items() if c.needs_fix is not None}

    async def stop_all(self, order: list[str]) -> None:
        """Stop ``order`` first, then any other child (each within its stop timeout), then their watchers."""
        self._stopping = True
        rest = [n for n in self.children if n not in order]
        for name in [n for n in order if n in self.children] + rest:
            await self._terminate(self.children[name])
        for child in self.children.values():
            for task in (child.watcher, child.drain):
                if task is not None:
                    task.cancel()
        await asyncio.gather(*(t for c in self.children.values() for t in (c.watcher, c.drain) if t),
                             return_exceptions=True)

    async def _terminate(self, child: Child) -> None:
        proc = child.proc
        if proc is None or proc.returncode is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(child.spec.stop_timeout_s):
                await proc.wait()
        except asyncio.TimeoutError:
            log.warning("%s did not stop within %g s; killing it", child.spec.name, child.spec.stop_timeout_s)
            proc.kill()
            try:   # a grandchild holding its stdout open must not hold the stop for ever
                async with asyncio.timeout(KILL_WAIT_S):
                    await proc.wait()
            except asyncio.TimeoutError:
                log.error("%s (pid %d) not reaped %g s after SIGKILL; going on", child.spec.name, proc.pid, KILL_WAIT_S)
        except ProcessLookupError:
            pass
        remove_pid_file(self.run_dir / f"{child.spec.name}.pid")

    def kill_all(self) -> None:
        """SIGKILL every child still running (the last resort of a stop past its deadline)."""
        self._stopping = True
        for child in self.children.values():
            if child.proc is not None and child.proc.returncode is None:
                try:
                    child.proc.kill()
                except ProcessLookupError:
                    pass

    def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` to a child (e.g. SIGHUP: reload its configuration)."""
        child = self.children.get(name)
        if child is not None and child.proc is not None and child.proc.returncode is None:
            child.proc.send_signal(sig)

    def kill(self, name: str) -> None:
        """SIGKILL a child (fault injection): it is restarted like any child that died."""
        child = self.children[name]
        if child.proc is not None and child.proc.returncode is None:
            child.proc.kill()

    def pids(self) -> dict[str, int]:
        return {name: c.pid for name, c in self.children.items() if c.pid is not None}


def _last_line(path: Path) -> str:
    """The last non-empty line of a child's log: the one line a CLI part ends with on an error."""
    lines = [line.strip() for line in _tail(path).splitlines() if line.strip()]
    return lines[-1][:500] if lines else ""


def _signature(paths: list[Path]) -> list[tuple]:
    """What a change to these files (or to the files directly in these directories) changes."""
    out: list[tuple] = []
    for path in paths:
        try:
            entries = sorted(path.iterdir()) if path.is_dir() else [path]
        except OSError as exc:
            out.append((str(path), exc.errno))
            continue
        for entry in entries:
            try:
                st = entry.stat()
                out.append((str(entry), st.st_mtime_ns, st.st_size))
            except OSError as exc:   # e.g. deleted meanwhile
                out.append((str(entry), exc.errno))
    return out


def _open_log(path: Path, buffering: int = -1):
    """A child's log for appending, readable by its owner only: a worker inherits its node's as its
    stderr, and a descriptor can be opened again for reading through /proc/self/fd."""
    out = open(path, "ab", buffering=buffering, opener=lambda p, flags: os.open(p, flags, 0o600))
    try:
        os.fchmod(out.fileno(), 0o600)   # one made before, by an older run
    except OSError:
        pass
    return out


def _tail(path: Path, size: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


async def _copy_to(stream: asyncio.StreamReader, path: Path) -> None:
    """Read a child's stdout into its log to its end, in chunks (``readline`` fails on a line over
    64 KiB). A pipe nobody reads blocks the child (and on 3.11 its ``wait()``): a log that cannot be
    written (a full disk) loses that output, never the reading."""
    try:
        out = _open_log(path, buffering=0)   # unbuffered: a failed write leaves nothing pending
    except OSError as exc:
        out = None
        log.error("%s cannot be opened (%s); this child's output is dropped", path, exc)
    writing = True
    try:
        while chunk := await stream.read(COPY_CHUNK_BYTES):
            if out is None:
                continue
            try:
                out.write(chunk)
                writing = True
            except OSError as exc:
                if writing:   # said once per failing spell
                    log.error("%s cannot be written (%s); this child's output is dropped meanwhile", path, exc)
                writing = False
    finally:
        if out is not None:
            out.close()
