"""A worker pool's processes: started, watched, replaced and resized at run time. A ready worker is
handed to the pool's :class:`~nodes.dispatch.Dispatcher`; one that ends unexpectedly is replaced."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal

import orjson

from broker.handoff import FUNCTION_SECRETS
from broker.lifecycle import still_wanted
from functions.registry import default_registry
from functions.secrets import give as give_secrets
from nodes.dispatch import Dispatcher
from nodes.metrics import NodeMetrics
from nodes.runtimes.process import WorkerHandle, run_process, worker_identity
from nodes.sandbox import WorkerSandbox
from nodes.sandbox import decide as decide_sandbox
from nodes.settings import NodeSettings, machine_memory, pool_functions
from nodes.worker import DEFAULT_POOL, EXIT_RECYCLE, Worker

log = logging.getLogger(__name__)
RESPAWN_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)   # after the n-th worker in a row died before READY
WORKERS_PER_CORE = 16    # CPU-bound calls beyond the cores only queue in the kernel; I/O-bound ones share workers
WORKER_MEMORY = 128 * 1024 * 1024   # what a worker process may grow to, conservatively (idle: ~30 MB)


def machine_worker_limit() -> int:
    """Worker processes one node starts at most, from what this machine can hold: K above it still
    limits calls running at once (CPU-bound ones wait for a worker, as for a free core)."""
    cores = os.cpu_count() or 1
    return max(2, min(cores * WORKERS_PER_CORE, machine_memory() // (2 * WORKER_MEMORY)))


def worker_processes(k: int, limit: int | None) -> int:
    """The main pool's processes for K slots: K, at most ``limit`` (None: the machine's)."""
    return min(k, limit or machine_worker_limit())


FLUSH_BEFORE_STOP_S = 2.0   # a retired worker's SIGTERM waits at most this for its calls to leave
IDLE_CHECK_S = 1.0   # how often a pool that scales to zero looks at how long it has been idle


class WorkerPool:
    def __init__(self, settings: NodeSettings, dispatcher: Dispatcher, name: str = DEFAULT_POOL,
                 metrics: NodeMetrics | None = None) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.name = name
        self.metrics = metrics
        self.secrets: dict[str, str] = {}   # a function pool's: what its workers are handed at their start
        self.target = 0
        self.cold_start_s: float | None = None     # the last wake from zero, to the first worker ready
        self._woken_at: float | None = None        # loop time a call woke the pool from zero
        self._idle: asyncio.Task | None = None
        self.workers: list[WorkerHandle] = []
        self._names = itertools.count(1)
        self._closing = False
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task] = set()
        self._docker: asyncio.Future | None = None   # runtime "docker": the pool's DockerWorkerRuntime
        self._replaced: set[WorkerHandle] = set()     # old workers a replace_workers will stop
        self._early_deaths = 0                         # workers in a row that died before READY
        self._respawn: asyncio.TimerHandle | None = None
        self._worker_sandbox: WorkerSandbox | None = None

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
        if self.name in self.settings.pools:
            self._idle = asyncio.create_task(self._sleep_when_idle(), name=f"{self.name}-idle")

    @property
    def spec(self):
        return self.settings.pools.get(self.name)

    def wake(self) -> None:
        """A call came and no worker can take it: the pool grows to its wake size at once (from
        zero: a cold start, measured until its first worker is ready). Knative's activator."""
        spec = self.spec
        size = spec.wake_size if spec is not None else 1
        if self._closing or self.target >= size:
            return
        if self.target == 0 and self._woken_at is None:
            self._woken_at = asyncio.get_running_loop().time()
            log.info("%s: a call woke it from zero: %d worker(s) start", self.name, size)
        self.target = size
        self._resize()

    async def _sleep_when_idle(self) -> None:
        """A pool that may scale to zero does after ``zero_after_s`` without a call."""
        while not self._closing:
            still_wanted()
            await asyncio.sleep(IDLE_CHECK_S)
            spec = self.spec
            if spec is None or spec.zero_after_s is None or self.target == 0:
                continue
            idle = self.dispatcher.idle_for()
            if idle >= spec.zero_after_s:
                log.info("%s: no call for %.0f s: scaled to zero (its next call wakes it)", self.name, idle)
                await self.set_size(0)

    async def set_size(self, size: int) -> None:
        """Make ``size`` workers active (starting or ready)."""
        async with self._lock:
            self.target = max(0, size)
            self._resize()

    def _resize(self) -> None:
        """Spawn or retire towards the target. Workers a replacement will stop do not count: else a
        resize in its middle would retire the new ones, and the replacement then stop the old."""
        staying = [w for w in self.workers if w.state != "stopping" and w not in self._replaced]
        for _ in range(self.target - len(staying)):
            self._spawn()
        # retire the newest first: a starting worker costs nothing to drop
        for handle in reversed(staying[self.target:]):
            self._retire(handle)

    async def replace_workers(self, ready_timeout_s: float = 60.0) -> int:
        """New workers for the current ones (loading the functions anew): the old ones stop once the
        new are ready (or after ``ready_timeout_s``). Returns the workers replaced."""
        async with self._lock:
            old = [w for w in self.workers if w.state != "stopping" and w not in self._replaced]
            self._replaced.update(old)
            for _ in old:
                self._spawn()
            new = [w for w in self.workers if w not in old and w not in self._replaced]
        if new:
            waits = [asyncio.create_task(w.ready.wait()) for w in new]
            _, late = await asyncio.wait(waits, timeout=ready_timeout_s)
            for wait in late:
                wait.cancel()
        async with self._lock:
            for handle in old:
                self._replaced.discard(handle)
                if handle.state != "stopping":
                    self._retire(handle)
            self._resize()   # the target may have changed meanwhile
        return len(old)

    async def wait_ready(self, timeout_s: float = 30.0, at_least: int | None = None) -> None:
        """Until every worker (or ``at_least`` of them) is ready; asyncio.TimeoutError after ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            while self.ready < (self.target if at_least is None else min(at_least, self.target)):
                await asyncio.sleep(0.02)

    def kill(self, name: str) -> None:
        """End a worker now (it is stuck): the pool replaces it."""
        for handle in self.workers:
            if handle.name == name:
                handle.signal(signal.SIGKILL)
                if handle.task is not None and handle.worker is not None:  # in-process: cannot be killed
                    handle.worker.stopping.set()

    def unreachable(self, name: str) -> None:
        """Nobody listened on worker ``name``'s subject. Unless it is stopping, it lost its
        subscription: it gets no more calls and is replaced (else it would count as ready, take none)."""
        self.dispatcher.retire_worker(name)
        handle = next((w for w in self.workers if w.name == name), None)
        if handle is None or handle.state == "stopping" or self._closing:
            return
        log.warning("%s: nobody listens on the subject of worker %s though it runs (lost its broker "
                    "connection?); replacing it", self.name, name)
        self._retire(handle)
        if sum(1 for w in self.workers if w.state != "stopping") < self.target:
            self._spawn()

    def _retire(self, handle: WorkerHandle, at_once: bool = False) -> None:
        """It gets no new call, finishes its own, and stops. The calls already sent to it leave this
        node before its SIGTERM (one flush), so it takes them before it stops listening."""
        handle.state = "stopping"
        self.dispatcher.retire_worker(handle.name)
        if at_once:
            return handle.signal(signal.SIGTERM)
        self._in_background(self._stop_when_sent(handle))

    async def _stop_when_sent(self, handle: WorkerHandle) -> None:
        try:
            async with asyncio.timeout(FLUSH_BEFORE_STOP_S):
                await self.dispatcher.nc.flush()
        except Exception as exc:   # the connection is going: nothing more leaves anyway
            log.debug("%s: flush before stopping it: %s", handle.name, exc)
        handle.signal(signal.SIGTERM)

    def _spawn(self) -> None:
        prefix = "w" if self.name == DEFAULT_POOL else f"{self.name}-w"
        handle = WorkerHandle(name=f"{self.settings.node_id}-{prefix}{next(self._names)}")
        self.workers.append(handle)
        runner = {"process": self._run_process, "docker": self._run_docker}.get(self.settings.runtime,
                                                                              self._run_inprocess)
        handle.task = asyncio.create_task(runner(handle), name=handle.name)

    async def _became_ready(self, handle: WorkerHandle) -> None:
        if handle.state != "starting":
            return
        handle.state = "ready"
        handle.booted()
        handle.ready.set()
        self._early_deaths = 0
        if self._woken_at is not None:
            self.cold_start_s = asyncio.get_running_loop().time() - self._woken_at
            self._woken_at = None
            log.info("%s: awake after a cold start of %.3f s", self.name, self.cold_start_s)
            if self.metrics is not None:
                self.metrics.cold_start(self.name, self.cold_start_s)
        await self.dispatcher.add_worker(handle.name)

    def _sandbox(self) -> WorkerSandbox:
        """How this node's worker processes are kept from its secrets (nodes/sandbox.py)."""
        if self._worker_sandbox is None:
            self._worker_sandbox = sandbox = decide_sandbox(self.settings)
            if not sandbox.announced:
                sandbox.announced = True
                log.info("node %s: %s", self.settings.node_id, sandbox.describe())
                for note in sandbox.notes:
                    log.warning("node %s: %s", self.settings.node_id, note)
        return self._worker_sandbox

    async def _run_process(self, handle: WorkerHandle) -> None:
        code: int | None = None
        try:
            code = await run_process(self.settings, self.name, handle, self.secrets, self._sandbox, self._became_ready)
        finally:
            await self._exited(handle, code)

    async def _run_docker(self, handle: WorkerHandle) -> None:
        """A worker as a container (nodes/runtimes/docker.py); it stands in for the process."""
        from nodes.runtimes.docker import pool_runtime

        code: int | None = None
        try:
            self._docker = self._docker or asyncio.ensure_future(pool_runtime(self.settings, self.name))
            # a container cannot hold our pipe: it watches our heartbeats instead
            env = {"P2PFAAS_NODE_SETTINGS": self.settings.model_dump_json(),
                   "P2PFAAS_WORKER_NAME": handle.name, "P2PFAAS_WORKER_POOL": self.name,
                   "P2PFAAS_WORKER_WATCH_NODE": "1", **worker_identity(),
                   **({FUNCTION_SECRETS: orjson.dumps(self.secrets).decode()} if self.secrets else {})}
            handle.proc = await (await self._docker).start(handle.name, env)  # type: ignore[assignment]
            if handle.state == "stopping":
                handle.proc.send_signal(signal.SIGTERM)
            if await handle.proc.ready_or_exit():  # type: ignore[attr-defined]
                await self._became_ready(handle)
            code = await handle.proc.wait()
        except Exception:
            log.exception("docker worker %s failed to start", handle.name)
            code = 1
            await asyncio.sleep(1.0)  # back off: a missing image or engine must not spin the replacing loop
        finally:
            await self._exited(handle, code)

    async def _run_inprocess(self, handle: WorkerHandle) -> None:
        functions, env = pool_functions(self.settings, self.name)
        if self.secrets:   # in-process workers share the node's process: not kept from other functions
            give_secrets(self.secrets, replace=False)
        handle.worker = Worker(self.settings, default_registry(functions, env=env, options=self.settings.function_options),
                               handle.name, self.name)
        if handle.state == "stopping":   # retired before it started: it stops at once
            handle.worker.stopping.set()
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
        if handle.state == "starting":   # it never became ready: a broken module, no resources
            self._early_deaths += 1
            delay = RESPAWN_BACKOFF_S[min(self._early_deaths, len(RESPAWN_BACKOFF_S)) - 1]
            log.warning("%s: %d worker(s) in a row died before they were ready; the next starts in %g s",
                        self.name, self._early_deaths, delay)
            if self._respawn is None:
                self._respawn = asyncio.get_running_loop().call_later(delay, self._respawn_now)
            return
        if not self._closing:
            self._resize()

    def _respawn_now(self) -> None:
        self._respawn = None
        if not self._closing:
            self._resize()

    async def stop(self) -> None:
        """Stop every worker (each finishes its calls), then wait; one alive 5 s after its grace is killed."""
        timeout_s = self.settings.timings.stop_grace_s + 5.0
        self._closing = True
        if self._respawn is not None:
            self._respawn.cancel()
        if self._idle is not None:
            self._idle.cancel()
            await asyncio.gather(self._idle, return_exceptions=True)
        handles = list(self.workers)
        for handle in handles:
            self._retire(handle, at_once=True)
        tasks = [h.task for h in handles if h.task is not None]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for handle in handles:
            handle.signal(signal.SIGKILL)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

