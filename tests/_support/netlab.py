"""Machines on one machine: a Linux network namespace per emulated machine, each with an address
on one bridge (the LAN, in a namespace of its own), for tests and benchmarks of what crosses a
network (importable as ``netlab``; needs root and iproute2).

    with NetLab(["hub", "d1", "d2"]) as lab:
        proc = lab.popen("d1", ["p2pfaas", "join", ...])   # runs inside d1's namespace
        lab.cut("d2")                                       # its link down: a partition
        lab.heal("d2")

Everything it made (namespaces, links, the processes it started, in their own process groups) is
removed when the block ends, however it ends; names carry the creating process's id, so runs
side by side never meet, and :func:`sweep` removes what a killed run left behind.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

CLONE_NEWNET = 0x40000000
SUBNET = "10.77.0"           # machine i gets SUBNET.(i + 1); only between our own namespaces
PREFIX = "p2pl"              # every namespace this module makes starts with it
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def why_not() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "emulated machines need root (network namespaces); .ci/run runs these tests as root"
    if shutil.which("ip") is None:
        return "emulated machines need iproute2's `ip` (apt-get install -y iproute2)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def sweep() -> list[str]:
    """Delete the namespaces of runs whose process is gone (a killed test); returns their names."""
    gone = []
    for name in _ip("netns", "list", check=False).stdout.split():
        if not name.startswith(PREFIX):
            continue
        owner = name[len(PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            _ip("netns", "del", name, check=False)
            gone.append(name)
    return gone


class NetLab:
    def __init__(self, machines: list[str]) -> None:
        self.machines = list(machines)
        self.tag = f"{PREFIX}{os.getpid()}"
        self.lan = f"{self.tag}-lan"
        self.procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    # -- names and addresses --------------------------------------------------------------------
    def ns(self, machine: str) -> str:
        return f"{self.tag}-{machine}"

    def address(self, machine: str) -> str:
        return f"{SUBNET}.{self.machines.index(machine) + 1}"

    def _port(self, machine: str) -> str:
        return f"v{os.getpid() % 100000}x{self.machines.index(machine)}"   # the LAN's end of its link (<= 15 chars)

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "NetLab":
        sweep()
        try:
            self._make(self.lan)
            _ip("-n", self.lan, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.lan, "link", "set", "br0", "up")
            for i, machine in enumerate(self.machines):
                ns = self.ns(machine)
                self._make(ns)
                port = self._port(machine)
                _ip("link", "add", port, "type", "veth", "peer", "name", f"e{os.getpid() % 100000}x{i}")
                _ip("link", "set", port, "netns", self.lan)
                _ip("link", "set", f"e{os.getpid() % 100000}x{i}", "netns", ns)
                _ip("-n", ns, "link", "set", f"e{os.getpid() % 100000}x{i}", "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.address(machine)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", self.lan, "link", "set", port, "master", "br0")
                _ip("-n", self.lan, "link", "set", port, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)

    def close(self) -> None:
        """End every process started here (its whole group), then delete every namespace (its links go with it)."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 60
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)   # what did not stop, and what it left in its group
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()

    # -- the network -------------------------------------------------------------------------
    def cut(self, machine: str) -> None:
        """Its link down: it reaches nobody and nobody reaches it (its own processes still meet)."""
        _ip("-n", self.lan, "link", "set", self._port(machine), "down")

    def heal(self, machine: str) -> None:
        _ip("-n", self.lan, "link", "set", self._port(machine), "up")

    # -- processes -------------------------------------------------------------------------------
    def popen(self, machine: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """``argv`` inside ``machine``'s namespace, in a process group of its own (ended at close)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(machine), *argv], start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, machine: str, argv: list[str], timeout_s: float = 120, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns(machine), *argv], capture_output=True, text=True,
                              timeout=timeout_s, **kwargs)

    def call(self, machine: str, fn, *args, **kwargs):
        """``fn(*args)`` in a thread switched into ``machine``'s namespace (sockets it opens live
        there; setns is per thread): its result, or its exception raised here."""
        box: dict = {}

        def run() -> None:
            try:
                fd = os.open(f"/var/run/netns/{self.ns(machine)}", os.O_RDONLY)
                try:
                    if _libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns into {self.ns(machine)}")
                finally:
                    os.close(fd)
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:   # handed to the caller
                box["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]
        return box.get("value")
