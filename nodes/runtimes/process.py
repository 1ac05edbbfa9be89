"""Workers as OS processes (``python -m nodes.worker``): their handles, their start in turns, what
they print, and what they are handed (their identity, the stack's CA, their secrets)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import orjson

from broker.connection import TLS_CA_PEM, credentials_from_env
from broker.handoff import FUNCTION_SECRETS, HANDOFF_FD_ENV, handoff_fd
from broker.lifecycle import child_env, remove_pid_file, write_pid_file
from broker.settings import broker_settings
from nodes.sandbox import WorkerSandbox
from nodes.settings import NodeSettings
from nodes.worker import WORKER_CREDENTIALS, Worker

# what functions print: always in the node's log, whatever its level (as a FaaS shows a function's logs)
output_log = logging.getLogger("functions.output")
output_log.setLevel(logging.INFO)
READY_LINE = b"READY"
OUTPUT_CHUNK = 65536     # read as it comes: a worker never blocks on a full pipe, whatever it prints
OUTPUT_LINE_MAX = 4096   # longer lines are cut in the log (the function's output is not)


def worker_identity() -> dict[str, str]:
    """The environment that makes a worker connect as its node's worker identity and trust the
    stack's CA (its file is in the data dir, out of a worker's reach)."""
    # no worker identity (a broker of one's own, a node run by hand): the node's, as before any existed
    creds = credentials_from_env(WORKER_CREDENTIALS) or credentials_from_env()
    out = {"P2PFAAS_NATS_USER": creds[0], "P2PFAAS_NATS_PASSWORD": creds[1]} if creds else {}
    ca = broker_settings().tls_ca
    if ca:
        out[TLS_CA_PEM] = Path(ca).read_text()
    return out


@dataclass(eq=False)
class WorkerHandle:
    name: str
    state: str = "starting"            # starting -> ready -> stopping
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Task | None = None   # watcher (process) or the worker itself (inprocess)
    worker: Worker | None = None       # inprocess runtime only
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    boot_slot: asyncio.Semaphore | None = None   # held from spawn to READY (or exit): see boot_slots

    def booted(self) -> None:
        if self.boot_slot is not None:
            self.boot_slot.release()
            self.boot_slot = None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        if self.worker is not None:
            self.worker.stopping.set()


BOOTS_AT_ONCE = 2 * (os.cpu_count() or 1)   # worker processes starting at the same time, per process
_boots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def boot_slots() -> asyncio.Semaphore:
    """Every pool of this process shares it: 32 Python workers booting at once on 2 cores starve the
    node and its broker (a control request went unanswered for 10 s); in turns, they stay responsive."""
    loop = asyncio.get_running_loop()
    for other in [old for old in _boots if old.is_closed()]:
        del _boots[other]
    if loop not in _boots:
        _boots[loop] = asyncio.Semaphore(BOOTS_AT_ONCE)
    return _boots[loop]


async def run_process(settings: NodeSettings, pool: str, handle: WorkerHandle, secrets: dict[str, str],
                      sandbox: Callable[[], WorkerSandbox],
                      became_ready: Callable[[WorkerHandle], Awaitable[None]]) -> int | None:
    """A worker as an OS process, from its start to its exit code (None: it never started);
    ``became_ready`` is awaited when it prints READY."""
    env = child_env(P2PFAAS_NODE_SETTINGS=settings.model_dump_json(),
                    P2PFAAS_WORKER_NAME=handle.name, P2PFAAS_WORKER_POOL=pool,
                    PYTHONUNBUFFERED="1")   # what a function prints reaches the log when it prints it
    env.pop("P2PFAAS_TLS_CA", None)   # its file is out of the worker's reach: the CA itself is handed over
    # under the node's run directory: a later start of the node ends a worker it left behind
    pid_file = settings.run_dir / "workers" / f"{handle.name}.pid"
    slots = boot_slots()
    await slots.acquire()
    handle.boot_slot = slots
    try:
        if handle.state == "stopping":   # retired while it waited for its turn: never started
            return None
        handed = handoff_fd({**worker_identity(),
                             **({FUNCTION_SECRETS: orjson.dumps(secrets).decode()} if secrets else {})})
        try:
            handle.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "nodes.worker", env={**env, HANDOFF_FD_ENV: str(handed)},
                # its stdin is a pipe we never write: when this process ends, the worker reads EOF
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                preexec_fn=sandbox().preexec(), start_new_session=True, pass_fds=(handed,),
            )
        finally:
            os.close(handed)
        write_pid_file(pid_file, handle.proc.pid)
        if handle.state == "stopping":
            handle.signal(signal.SIGTERM)
        assert handle.proc.stdout is not None
        await read_output(handle, handle.proc.stdout, became_ready)
        return await handle.proc.wait()
    finally:
        handle.booted()
        remove_pid_file(pid_file)


async def read_output(handle: WorkerHandle, stdout: asyncio.StreamReader,
                      became_ready: Callable[[WorkerHandle], Awaitable[None]]) -> None:
    """Until the worker closes its stdout: READY makes it ready, the rest goes to the node's log (lines
    cut at OUTPUT_LINE_MAX). Read in chunks, not lines: a long line would block the worker's ``print``."""
    async def line_out(line: bytes, extra: int) -> None:
        if handle.state == "starting" and not extra and line.strip() == READY_LINE:
            return await became_ready(handle)
        if line or extra:
            cut = f" [{extra} more bytes]" if extra else ""
            output_log.info("%s: %s%s", handle.name, line.decode(errors="replace").rstrip("\r"), cut)

    head, extra = b"", 0   # the current line's first OUTPUT_LINE_MAX bytes, and how many more it has
    while chunk := await stdout.read(OUTPUT_CHUNK):
        *ended, rest = chunk.split(b"\n")
        for piece in ended:
            await line_out(*_grown(head, extra, piece))
            head, extra = b"", 0
        head, extra = _grown(head, extra, rest)
    if head or extra:
        await line_out(head, extra)


def _grown(head: bytes, extra: int, piece: bytes) -> tuple[bytes, int]:
    """A line's kept head and its count of bytes beyond it, after ``piece`` of it came."""
    room = OUTPUT_LINE_MAX - len(head)
    return head + piece[:room], extra + max(0, len(piece) - room)
