"""A Docker engine for tests and benchmarks: the one ``DOCKER_HOST`` names when it answers,
else a private dockerd (own socket, exec root and config; data root cached across runs).

The private dockerd keeps its images under the cache dir, so a base image, the worker image
and the compose images are built once per machine, not once per run. One run at a time owns
that data root (a lock file); a concurrent run gets a temporary one.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator

import docker
from docker.errors import DockerException

from p2pfaas.images import unmount_below

PR_SET_PDEATHSIG = 1


def cache_dir() -> Path:
    """``$P2PFAAS_CACHE_DIR``, else ``$XDG_CACHE_HOME/p2pfaas``, else ``~/.cache/p2pfaas``."""
    if os.environ.get("P2PFAAS_CACHE_DIR"):
        return Path(os.environ["P2PFAAS_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "p2pfaas"


def _terminate_with_parent() -> None:
    # SIGTERM, not SIGKILL: dockerd then stops its containers and containerd on the way out
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class EngineUnavailable(RuntimeError):
    """No engine answers and none can be started here (the reason says why)."""


@dataclass
class PrivateDockerd:
    """``with PrivateDockerd() as engine:`` a dockerd of its own; ``engine.host`` is its DOCKER_HOST."""

    data_root: Path | None = None      # None: <cache>/docker if free, else a temporary one
    start_timeout_s: float = 60.0
    host: str = ""
    _proc: subprocess.Popen | None = None
    _dirs: list[Path] = field(default_factory=list)
    _lock: IO | None = None
    _log: IO | None = None

    def start(self) -> "PrivateDockerd":
        if shutil.which("dockerd") is None:
            raise EngineUnavailable("no Docker engine answers and dockerd is not installed "
                                    "(apt-get install -y docker.io; .ci/run does this)")
        if os.geteuid() != 0:
            raise EngineUnavailable("no Docker engine answers and a private dockerd needs root")
        exec_root = Path(tempfile.mkdtemp(prefix="p2pfaas-dockerd-", dir="/tmp"))  # short: socket paths <= 108
        self._dirs.append(exec_root)
        data_root = self.data_root or self._cached_data_root()
        config = exec_root / "daemon.json"
        config.write_text("{}")
        socket = exec_root / "docker.sock"
        self.host = f"unix://{socket}"
        self._log = (exec_root / "dockerd.log").open("w+b")
        storage = os.environ.get("P2PFAAS_DOCKERD_STORAGE_DRIVER")  # unset: dockerd picks (overlay2, else vfs)
        self._proc = subprocess.Popen(
            ["dockerd", "-H", self.host, "--data-root", str(data_root), "--exec-root", str(exec_root / "exec"),
             "--pidfile", str(exec_root / "dockerd.pid"), "--config-file", str(config),
             "--iptables=false", "--bridge=none", "--log-level=warn",
             *([f"--storage-driver={storage}"] if storage else [])],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_terminate_with_parent,
        )
        self._wait_until_up()
        return self

    def _cached_data_root(self) -> Path:
        root = cache_dir()
        root.mkdir(parents=True, exist_ok=True)
        lock = (root / "docker.lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another run owns the cached engine: a throw-away one for us
            lock.close()
            tmp = Path(tempfile.mkdtemp(prefix="p2pfaas-docker-data-"))
            self._dirs.append(tmp)
            return tmp
        self._lock = lock
        return root / "docker"

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise EngineUnavailable(f"dockerd exited with {self._proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(DockerException, OSError):
                client = docker.DockerClient(base_url=self.host, timeout=5)
                try:
                    if client.ping():
                        return
                finally:
                    client.close()
            if time.monotonic() > deadline:
                self.stop()
                raise EngineUnavailable(f"dockerd did not answer within {self.start_timeout_s:g} s: {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 15) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return "\n".join(self._log.read().decode(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        for path in reversed(self._dirs):
            unmount_below(path)  # dockerd leaves its netns bind mount behind
            shutil.rmtree(path, ignore_errors=True)
        self._dirs.clear()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> "PrivateDockerd":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def docker_engine() -> Iterator[tuple[docker.DockerClient, str]]:
    """(client, DOCKER_HOST) of a reachable engine, starting a private dockerd when none answers.
    Sets ``DOCKER_HOST`` meanwhile, so workers and the SDK's ``from_env`` use the same engine."""
    client = _reachable_engine()
    if client is not None:
        try:
            yield client, os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        finally:
            client.close()
        return
    with PrivateDockerd() as engine:
        previous = os.environ.get("DOCKER_HOST")
        os.environ["DOCKER_HOST"] = engine.host
        client = docker.DockerClient(base_url=engine.host, timeout=600)
        try:
            yield client, engine.host
        finally:
            client.close()
            if previous is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = previous


def _reachable_engine() -> docker.DockerClient | None:
    try:
        client = docker.from_env(timeout=10)
        if client.ping():
            return client
    except DockerException:
        pass
    return None


