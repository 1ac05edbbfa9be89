"""``p2pfaas up`` as the fault suite drives it: started on fixed free ports (so clients reconnect
to the same addresses after a restart), its parts found through their pid files, killed one by
one, restarted, and always cleaned up (pid files, then its process group)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from broker.auth import OPERATOR, AuthStore
from broker.embedded import free_port
from broker.lifecycle import end_strays

NODE = "n1"
UP_START_TIMEOUT_S = 120.0
UP_STOP_TIMEOUT_S = 60.0


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (None when the process is gone or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if stat[0] == b"Z" else stat[19].decode()


def read_pid_file(path: Path) -> int | None:
    """The pid a pid file names, when that very process still runs."""
    try:
        pid_text, started = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return int(pid_text) if start_time(int(pid_text)) == started else None


class UpStack:
    """One ``p2pfaas up`` with one node on ``data_dir``; ``mqtt`` is ``nats`` or ``mosquitto``."""

    def __init__(self, root: Path, mqtt: str, *, k: int, queue: int, data_dir: Path | None = None) -> None:
        self.root, self.mqtt, self.k, self.queue = root, mqtt, k, queue
        self.data_dir = data_dir or root / "data"
        self.ports = {"nats": free_port(), "http": free_port(), "mqtt": free_port()}
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.endpoints: dict = {}

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.ports['nats']}"

    @property
    def mqtt_port(self) -> int:
        return self.ports["mqtt"]

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "p2pfaas.cli", "up", "--data-dir", str(self.data_dir), "--nodes", "1",
                "--k", str(self.k), "--queue", str(self.queue), "--controller", "off", "--mqtt", self.mqtt,
                "--nats-port", str(self.ports["nats"]), "--http-port", str(self.ports["http"]),
                "--mqtt-port", str(self.ports["mqtt"]), "--verbose"]

    async def start(self, timeout_s: float = UP_START_TIMEOUT_S) -> None:
        """Start ``up`` and wait until it wrote its endpoints and the node is healthy; the
        endpoints must be the ports we chose (clients keep their addresses across restarts)."""
        (self.data_dir / "endpoints.json").unlink(missing_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.root / f"up-{self.starts}.log", "wb") as out:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        import orjson

        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"p2pfaas up exited with {self.proc.returncode}: {self.up_log_tail()}")
            try:
                self.endpoints = orjson.loads((self.data_dir / "endpoints.json").read_bytes())
                break
            except (OSError, orjson.JSONDecodeError):
                await asyncio.sleep(0.2)
        else:
            raise RuntimeError(f"p2pfaas up did not come up within {timeout_s:g} s: {self.up_log_tail()}")
        if self.endpoints.get("nats_url") != self.nats_url or self.endpoints["http"].get(NODE) != self.http_url:
            raise RuntimeError(f"p2pfaas up moved to other ports than asked: {self.endpoints}")
        if not await self.healthy(deadline - time.monotonic()):
            raise RuntimeError(f"node {NODE} not healthy {timeout_s:g} s after start")

    # -- identities: the stack is secure (docs/security.md); the suite is its operator on NATS,
    # and each MQTT transport a device of its own (up reloads the brokers when one is added)
    @property
    def auth(self) -> AuthStore:
        return AuthStore(self.data_dir / "auth")

    def operator(self) -> tuple[str, str]:
        """The operator's NATS user and password."""
        creds = self.auth.service(OPERATOR)
        return creds.user, creds.password

    def device(self, name: str) -> tuple[str, str]:
        """A device's MQTT user and password (made on first use)."""
        creds = self.auth.device(name)
        return creds.user, creds.password

    def up_log_tail(self, lines: int = 4) -> str:
        """The last lines of up's output that say something (rich's traceback frames left out)."""
        path = self.root / f"up-{self.starts}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        said = [line.strip() for line in text.splitlines() if line.strip() and line.strip()[0] not in "│╭╰"]
        return " / ".join(said[-lines:]) + f" (all of it: {path})"

    async def health(self) -> tuple[int, dict]:
        """/healthz of the node's bridge: (status, body); (0, {}) when nothing answers."""
        try:
            async with httpx.AsyncClient(timeout=3.0) as client:
                response = await client.get(f"{self.http_url}/healthz")
                return response.status_code, response.json()
        except (httpx.HTTPError, ValueError):
            return 0, {}

    async def healthy(self, timeout_s: float) -> bool:
        """/healthz says 200 and every worker of the node is ready, within ``timeout_s``."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            status, body = await self.health()
            workers = body.get("node", {}).get("workers", {}) if status == 200 else {}
            if status == 200 and workers.get("ready", 0) >= self.k:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.25)

    # -- parts ------------------------------------------------------------------------
    def pid_of(self, part: str) -> int | None:
        """The running process of a part (``nats-server``, ``mosquitto``, ``mqtt-bridge``,
        ``node-n1``, ``http-n1``) from its pid file."""
        return read_pid_file(self.data_dir / "run" / f"{part}.pid")

    def worker_pids(self) -> list[int]:
        folder = self.data_dir / "nodes" / NODE / "run" / "workers"
        return sorted(pid for path in folder.glob("*.pid") if (pid := read_pid_file(path)) is not None)

    def children(self) -> dict[int, str]:
        """Every running process ``up`` started, by pid, named after its pid file."""
        return {pid: path.stem for path in self.data_dir.rglob("*.pid") if (pid := read_pid_file(path)) is not None}

    def kill_up(self) -> int:
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait(10)
        return pid

    async def wait_gone(self, pids: list[int], timeout_s: float) -> list[int]:
        """The pids still running after ``timeout_s`` (each compared with its start time)."""
        started = {pid: start_time(pid) for pid in pids}
        deadline = time.monotonic() + timeout_s
        while True:
            left = [pid for pid, t in started.items() if t is not None and start_time(pid) == t]
            if not left or time.monotonic() >= deadline:
                return left
            await asyncio.sleep(0.1)

    async def stop(self) -> list[str]:
        """SIGINT ``up`` (bounded), then end whatever its pid files or its process group still
        name; returns notes on what had to be forced."""
        notes = []
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                await asyncio.to_thread(proc.wait, UP_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                notes.append(f"p2pfaas up did not stop within {UP_STOP_TIMEOUT_S:g} s: killed")
                proc.kill()
                proc.wait(10)
        strays = await asyncio.to_thread(end_strays, self.data_dir)
        if strays:
            notes.append(f"ended {len(strays)} process(es) left by up: {strays}")
        return notes
