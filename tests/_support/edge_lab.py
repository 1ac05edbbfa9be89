"""A deployment of several machines on one machine, started with the documented commands alone
(docs/edge.md): ``p2pfaas hub`` on machine "hub", ``p2pfaas auth invite`` there, the invitation
file copied to each device's own directory, ``p2pfaas join`` on the device (importable as
``edge_lab``; tests/edge and bench/edge*.py use it). Each machine has a directory of its own
and shares nothing with the others but the invitation file it was handed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from netlab import NetLab

P2PFAAS = [sys.executable, "-m", "p2pfaas.cli"]
SUPPORT = str(Path(__file__).resolve().parent)   # test functions (standin_functions) for the devices


class EdgeLab:
    def __init__(self, root: Path, devices: list[str], *, clients: int = 1, k: int = 2, queue: int = 2,
                 groups: dict[str, str] | None = None, join_args: list[str] | None = None) -> None:
        self.root, self.devices, self.k, self.queue = root, list(devices), k, queue
        self.groups = groups or {}
        self.join_args = list(join_args or [])
        self.clients = [f"c{i}" for i in range(1, clients + 1)]
        self.lab = NetLab(["hub", *self.devices, *self.clients])
        self.procs: dict[str, object] = {}
        self.timings: dict[str, float] = {}
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SUPPORT, os.environ.get("PYTHONPATH")]))}

    # -- where things are ----------------------------------------------------------------------
    def dir(self, machine: str) -> Path:
        return self.root / machine

    def address(self, machine: str) -> str:
        return self.lab.address(machine)

    def http(self, device: str) -> str:
        return f"http://{self.address(device)}:18080"

    def endpoints(self, device: str) -> dict:
        return json.loads((self.dir(device) / "data" / "endpoints.json").read_text())

    def operator_token(self, device: str) -> str:
        return json.loads((self.dir(device) / "data" / "auth" / "tokens.json").read_text())["operator"]

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> "EdgeLab":
        self.lab.__enter__()
        try:
            self.start_hub()
            for device in self.devices:
                self.invite(device)
            started = time.monotonic()
            for device in self.devices:
                self.join(device)
            for device in self.devices:
                self.wait_joined(device)
            self.timings["join_all_s"] = time.monotonic() - started
        except BaseException:
            self.lab.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.lab.close()

    def start_hub(self, timeout_s: float = 60) -> None:
        hub = self.dir("hub")
        hub.mkdir(parents=True, exist_ok=True)
        log = open(hub / "hub.out", "ab")
        self.procs["hub"] = self.lab.popen("hub", [*P2PFAAS, "hub", "--data-dir", str(hub / "data"),
                                                   "--name", self.address("hub")], stdout=log, stderr=log,
                                           stdin=subprocess.DEVNULL, env=self.env, cwd=hub)
        self._wait_file(hub / "data" / "hub.json", "hub", timeout_s)

    def invite(self, device: str) -> Path:
        """``p2pfaas auth invite`` on the hub, its file handed to the device's own directory."""
        hub = self.dir("hub")
        out = hub / f"{device}.invite"
        args = ["--group", self.groups[device]] if device in self.groups else []
        done = self.lab.run("hub", [*P2PFAAS, "auth", "invite", device, "--data-dir", str(hub / "data"),
                                    "--out", str(out), *args], env=self.env, cwd=hub)
        assert done.returncode == 0, done.stdout + done.stderr
        mine = self.dir(device)
        mine.mkdir(parents=True, exist_ok=True)
        shutil.copy(out, mine / out.name)
        os.chmod(mine / out.name, 0o600)
        return mine / out.name

    def join(self, device: str, *extra: str) -> None:
        mine = self.dir(device)
        invitation = mine / f"{device}.invite"
        log = open(mine / "join.out", "ab")
        argv = [*P2PFAAS, "join", *([str(invitation)] if invitation.exists() else []), "--data-dir", str(mine / "data"),
                "--k", str(self.k), "--queue", str(self.queue), *self.join_args, *extra]
        self.timings[f"join_started_{device}"] = time.monotonic()
        self.procs[device] = self.lab.popen(device, argv, stdout=log, stderr=log,
                                            stdin=subprocess.DEVNULL, env=self.env, cwd=mine)

    def wait_joined(self, device: str, timeout_s: float = 120) -> None:
        self._wait_file(self.dir(device) / "data" / "endpoints.json", device, timeout_s)
        self.timings[f"join_{device}_s"] = time.monotonic() - self.timings[f"join_started_{device}"]

    def stop(self, machine: str, timeout_s: float = 90) -> None:
        """Ctrl-C, as its user would."""
        proc = self.procs.pop(machine)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=timeout_s)

    def kill(self, machine: str) -> None:
        """kill -9 of the whole machine's processes (its power cut)."""
        proc = self.procs.pop(machine)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def _wait_file(self, path: Path, machine: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            proc = self.procs.get(machine)
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"{machine} exited with {proc.returncode}: {self.output(machine)[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{machine} did not come up within {timeout_s:g} s: {self.output(machine)[-3000:]}")
            time.sleep(0.1)

    def output(self, machine: str) -> str:
        for name in ("hub.out", "join.out"):
            path = self.dir(machine) / name
            if path.exists():
                return path.read_text(errors="replace")
        return ""
