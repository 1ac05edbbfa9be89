"""The faults, one at a time: kill -9 a worker, the node, ``up``, nats-server, Mosquitto or the
MQTT bridge, or fill the disk under JetStream. ``inject`` does it, ``end`` waits for the
supervisor's restart (or restarts ``up``, or frees the disk) and says what happened."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from fault_suite.stack import NODE, UpStack

RESTART_TIMEOUT_S = 60.0
UP_CHILDREN_GONE_S = 20.0   # a killed up's children end within 5 s (their parent pipe); bound it
FILL_CHUNK = 1024 * 1024


class FaultError(RuntimeError):
    """The fault could not be injected (nothing to kill, cannot mount): the run says so."""


@dataclass
class Fault:
    name: str
    title: str
    modes: tuple[str, ...] = ("nats", "mosquitto")   # `up --mqtt` modes it runs in
    mosquitto_only: bool = False                     # a fault of the Mosquitto side: every transport is loaded
    tmpfs: bool = False                              # the data dir lives on a small tmpfs

    def hold_s(self, load_s: float) -> float:
        """How long the fault lasts before ``end`` (kills: until the restart)."""
        return 0.0

    async def inject(self, stack: UpStack, rng: random.Random) -> str:
        raise NotImplementedError

    async def end(self, stack: UpStack) -> str:
        raise NotImplementedError


class NoFault(Fault):
    """The control run: the same load and phases, nothing killed."""

    async def inject(self, stack: UpStack, rng: random.Random) -> str:
        return "no fault (control run)"

    async def end(self, stack: UpStack) -> str:
        return "nothing to end"


class Kill(Fault):
    """kill -9 one process (``victim``); ``end`` waits until ``replaced`` says what took its place."""

    killed: int | None = None
    killed_at = 0.0

    def victim(self, stack: UpStack, rng: random.Random) -> tuple[int, str]:
        raise NotImplementedError

    def replaced(self, stack: UpStack) -> str | None:
        raise NotImplementedError

    async def inject(self, stack: UpStack, rng: random.Random) -> str:
        pid, what = self.victim(stack, rng)
        os.kill(pid, signal.SIGKILL)
        self.killed, self.killed_at = pid, time.monotonic()
        return f"kill -9 {what}"

    async def end(self, stack: UpStack) -> str:
        while time.monotonic() < self.killed_at + RESTART_TIMEOUT_S:
            if (done := self.replaced(stack)) is not None:
                return f"{done} after {time.monotonic() - self.killed_at:.1f} s"
            await asyncio.sleep(0.1)
        return f"NOT replaced within {RESTART_TIMEOUT_S:g} s"


class KillPart(Kill):
    """kill -9 one supervised part; the supervisor must start it again."""

    def __init__(self, name: str, part: str, title: str, **kw) -> None:
        super().__init__(name, title, **kw)
        self.part = part

    def victim(self, stack: UpStack, rng: random.Random) -> tuple[int, str]:
        pid = stack.pid_of(self.part)
        if pid is None:
            raise FaultError(f"{self.part} is not running (no live pid file)")
        return pid, f"{self.part} (pid {pid})"

    def replaced(self, stack: UpStack) -> str | None:
        pid = stack.pid_of(self.part)
        return f"{self.part} restarted by up as pid {pid}" if pid is not None and pid != self.killed else None


class KillWorker(Kill):
    """kill -9 one worker process of the (busy) node; its pool must replace it."""

    def victim(self, stack: UpStack, rng: random.Random) -> tuple[int, str]:
        pids = stack.worker_pids()
        if not pids:
            raise FaultError(f"node {NODE} has no running worker (no live pid file)")
        pid = rng.choice(pids)
        return pid, f"worker pid {pid} (one of {len(pids)})"

    def replaced(self, stack: UpStack) -> str | None:
        pids = stack.worker_pids()
        return f"{len(pids)} workers running again" if self.killed not in pids and len(pids) >= stack.k else None


class KillUp(Fault):
    """kill -9 ``up`` itself: its children end with it; we start ``up`` again on the same data dir."""

    DOWN_S = 2.0

    def hold_s(self, load_s: float) -> float:
        return self.DOWN_S

    async def inject(self, stack: UpStack, rng: random.Random) -> str:
        self.children = stack.children()
        pid = stack.kill_up()
        return f"kill -9 up (pid {pid}; {len(self.children)} child processes)"

    async def end(self, stack: UpStack) -> str:
        left = await stack.wait_gone(list(self.children), UP_CHILDREN_GONE_S)
        note = (f"still alive {UP_CHILDREN_GONE_S:g} s after up was killed: "
                f"{', '.join(f'{self.children[p]} (pid {p})' for p in left)}; ") if left else ""
        started = time.monotonic()
        await stack.start()
        return f"{note}up started again on the same data dir, healthy after {time.monotonic() - started:.1f} s"


class FillDisk(Fault):
    """Fill the tmpfs under the data dir with a file until the disk refuses, hold, delete it."""

    def hold_s(self, load_s: float) -> float:
        return max(2.0, load_s / 3)

    def filler(self, stack: UpStack) -> Path:
        return stack.data_dir.parent / "filler"

    async def inject(self, stack: UpStack, rng: random.Random) -> str:
        written = await asyncio.to_thread(_fill, self.filler(stack))
        free = os.statvfs(stack.data_dir).f_bavail * os.statvfs(stack.data_dir).f_frsize
        return f"filled the disk: {written / 2**20:.1f} MiB written, {free} bytes left"

    async def end(self, stack: UpStack) -> str:
        self.filler(stack).unlink(missing_ok=True)
        st = os.statvfs(stack.data_dir)
        return f"freed the disk: {st.f_bavail * st.f_frsize / 2**20:.1f} MiB free"


def _fill(path: Path) -> int:
    chunk, written = b"\0" * FILL_CHUNK, 0
    with open(path, "wb", buffering=0) as out:
        while True:
            try:
                written += out.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return written
                chunk = chunk[: len(chunk) // 2]   # the last bytes too: JetStream must find nothing


def all_faults() -> dict[str, Fault]:
    """Fresh fault objects (they remember what they killed), in the suite's order."""
    faults = [
        NoFault("baseline", "no fault: the same load and phases (control)"),
        KillWorker("worker", "kill -9 a worker process of the busy node"),
        KillPart("node", f"node-{NODE}", "kill -9 the node process (up restarts it)"),
        KillUp("up", "kill -9 `p2pfaas up` itself, then start it again on the same data dir"),
        KillPart("nats-server", "nats-server", "kill -9 nats-server (up restarts it on the same store)"),
        KillPart("mosquitto", "mosquitto", "kill -9 Mosquitto (up restarts it)", modes=("mosquitto",),
                 mosquitto_only=True),
        KillPart("mqtt-bridge", "mqtt-bridge", "kill -9 the MQTT bridge (up restarts it)", modes=("mosquitto",),
                 mosquitto_only=True),
        FillDisk("disk-full", "fill the disk under JetStream (tmpfs), then free it", tmpfs=True),
    ]
    return {f.name: f for f in faults}
