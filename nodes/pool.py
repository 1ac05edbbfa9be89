"""A worker pool's processes: started, watched, replaced and resized at run time.

A worker that is ready is handed to the pool's :class:`~nodes.dispatch.Dispatcher`; one asked
to stop gets no new calls and finishes its own; one that ends unexpectedly is replaced, and
the dispatcher answers (or delivers again) what it was running. Runtimes: OS processes
(``python -m nodes.worker``, the default) or tasks inside the node ("inprocess").
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import sys
from dataclasses import dataclass, field

from broker.embedded import die_with_parent_preexec
from functions.registry import default_registry
from nodes.dispatch import Dispatcher
from nodes.settings import NodeSettings
from nodes.worker import DEFAULT_POOL, EXIT_RECYCLE, STOP_GRACE_S, Worker

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WorkerHandle:
    name: str
    state: str = "starting"            # starting -> ready -> stopping
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Task | None = None   # watcher (process) or the worker itself (inprocess)
    worker: Worker | None = None       # inprocess runtime only
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        if self.worker is not None:
            self.worker.stopping.set()


class WorkerPool:
    def __init__(self, settings: NodeSettings, dispatcher: Dispatcher, name: str = DEFAULT_POOL) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.name = name
        self.target = 0
        self.workers: list[WorkerHandle] = []
        self._names = itertools.count(1)
        self._closing = False
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task] = set()

    # -- counts for load and telemetry ------------------------------------------------
    @property
    def ready(self) -> int:
        return sum(1 for w in self.workers if w.state == "ready")

    @property
    def starting(self) -> int:
        return sum(1 for w in self.workers if w.state == "starting")

    @property
    def stopping(self) -> int:
        return sum(1 for w in self.workers if w.state == "stopping")

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers if w.proc is not None and w.proc.returncode is None]

    async def start(self, size: int) -> None:
        await self.set_size(size)

    async def set_size(self, size: int) -> None:
        """Make ``size`` workers active (starting or ready)."""
        async with self._lock:
            self.target = max(0, size)
            active = [w for w in self.workers if w.state != "stopping"]
            for _ in range(self.target - len(active)):
                self._spawn()
            # retire the newest first: a starting worker costs nothing to drop
            for handle in reversed(active[self.target:]):
                self._retire(handle)

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        async def all_ready() -> None:
            while self.ready < self.target:
                await asyncio.sleep(0.02)
        await asyncio.wait_for(all_ready(), timeout_s)

    def kill(self, name: str) -> None:
        """End a worker now (it is stuck): the pool replaces it."""
        for handle in self.workers:
            if handle.name == name:
                handle.signal(signal.SIGKILL)
                if handle.task is not None and handle.worker is not None:  # in-process: cannot be killed
                    handle.worker.stopping.set()

    def _retire(self, handle: WorkerHandle) -> None:
        handle.state = "stopping"
        self.dispatcher.retire_worker(handle.name)
        handle.signal(signal.SIGTERM)

    def _spawn(self) -> None:
        prefix = "w" if self.name == DEFAULT_POOL else f"{self.name}-w"
        handle = WorkerHandle(name=f"{self.settings.node_id}-{prefix}{next(self._names)}")
        self.workers.append(handle)
        runner = self._run_process if self.settings.runtime == "process" else self._run_inprocess
        handle.task = asyncio.create_task(runner(handle), name=handle.name)

    async def _became_ready(self, handle: WorkerHandle) -> None:
        if handle.state != "starting":
            return
        handle.state = "ready"
        handle.ready.set()
        await self.dispatcher.add_worker(handle.name)

    async def _run_process(self, handle: WorkerHandle) -> None:
        env = dict(os.environ,
                   P2PFAAS_NODE_SETTINGS=self.settings.model_dump_json(),
                   P2PFAAS_WORKER_NAME=handle.name, P2PFAAS_WORKER_POOL=self.name, P2PFAAS_WORKER_PARENT_PIPE="1")
        code: int | None = None
        try:
            handle.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "nodes.worker", env=env,
                # its stdin is a pipe we never write: when this process ends, the worker reads EOF
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                preexec_fn=die_with_parent_preexec, start_new_session=True,
            )
            if handle.state == "stopping":
                handle.signal(signal.SIGTERM)
            assert handle.proc.stdout is not None
            line = await handle.proc.stdout.readline()
            if line.strip() == b"READY":
                await self._became_ready(handle)
            code = await handle.proc.wait()
        finally:
            await self._exited(handle, code)

    async def _run_inprocess(self, handle: WorkerHandle) -> None:
        handle.worker = Worker(self.settings, default_registry(self.settings.functions), handle.name, self.name)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ready.add_done_callback(lambda _: self._in_background(self._became_ready(handle)))
        code: int | None = None
        try:
            code = await handle.worker.run(ready)
        except Exception:
            log.exception("worker %s crashed", handle.name)
            code = 1
        finally:
            await self._exited(handle, code)

    def _in_background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _exited(self, handle: WorkerHandle, code: int | None) -> None:
        if handle in self.workers:
            self.workers.remove(handle)
        expected = self._closing or handle.state == "stopping"
        reason = (f"worker {handle.name} stopped" if expected else
                  "it overran its timeout and was recycled" if code == EXIT_RECYCLE else
                  f"worker {handle.name} died (exit code {code})")
        await self.dispatcher.lose_worker(handle.name, reason)
        if expected:
            return
        if code == EXIT_RECYCLE:
            log.info("worker %s recycled after a timeout", handle.name)
        else:
            log.warning("worker %s exited unexpectedly (code %s); replacing it", handle.name, code)
        active = sum(1 for w in self.workers if w.state != "stopping")
        if active < self.target:
            self._spawn()

    async def stop(self, timeout_s: float = STOP_GRACE_S + 5.0) -> None:
        """Stop every worker (each finishes its calls, within its own grace), then wait, bounded:
        a worker still alive after ``timeout_s`` is killed."""
        self._closing = True
        handles = list(self.workers)
        for handle in handles:
            self._retire(handle)
        tasks = [h.task for h in handles if h.task is not None]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for handle in handles:
            handle.signal(signal.SIGKILL)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
