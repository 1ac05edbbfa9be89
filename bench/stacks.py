"""`p2pfaas up` as the benches run it: in a data dir of its own, on free ports, its output in a log
file; stopped as a user stops it (Ctrl-C, SIGINT to its process group), killed when it has not
stopped within a minute."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "p2pfaas.cli"]


def start_up(flags: list[str], data_dir: Path, log: IO, timeout_s: float = 120.0) -> tuple[subprocess.Popen, dict]:
    """``p2pfaas up FLAGS --data-dir DATA_DIR`` and its endpoints once it has written them."""
    up = subprocess.Popen([*CLI, "up", *flags, "--data-dir", str(data_dir)], stdout=log, stderr=subprocess.STDOUT,
                          cwd=ROOT, start_new_session=True)
    endpoints = data_dir / "endpoints.json"
    deadline = time.monotonic() + timeout_s
    while not endpoints.exists():
        if up.poll() is not None or time.monotonic() > deadline:
            stop_up(up)
            raise RuntimeError(f"p2pfaas up {' '.join(flags)} did not start: see {log.name}")
        time.sleep(0.5)
    return up, json.loads(endpoints.read_text())


def stop_up(up: subprocess.Popen) -> None:
    if up.poll() is not None:
        return
    os.killpg(up.pid, signal.SIGINT)
    try:
        up.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
        up.wait(10)
