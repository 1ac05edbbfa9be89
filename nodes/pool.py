"""The worker pool (the farm): K workers consuming the node's durable task stream.

K changes at run time (configuration or scale commands): new workers are
started, surplus ones are asked to stop and finish their current task first.
A worker that dies unexpectedly is replaced; its task is redelivered by JetStream.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import sys
from dataclasses import dataclass, field

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import BadRequestError

from broker.embedded import die_with_parent_preexec
from broker.streams import tasks_stream
from broker.subjects import Subjects
from functions.registry import default_registry
from nodes.settings import NodeSettings
from nodes.worker import DEFAULT_POOL, EXIT_RECYCLE, Worker, pool_durable

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WorkerHandle:
    name: str
    state: str = "starting"            # starting -> ready -> stopping
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Task | None = None   # watcher (process) or the worker itself (inprocess)
    worker: Worker | None = None       # inprocess runtime only
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def request_stop(self) -> None:
        self.state = "stopping"
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        if self.worker is not None:
            self.worker.stopping.set()


class WorkerPool:
    """``filter_subjects``: the task subjects this pool serves (None: every task of the node).
    Pools of one node must not overlap: the task stream is a work queue."""

    def __init__(self, settings: NodeSettings, js: JetStreamContext, subjects: Subjects,
                 name: str = DEFAULT_POOL, filter_subjects: list[str] | None = None) -> None:
        self.settings = settings
        self.js = js
        self.subjects = subjects
        self.name = name
        self.durable = pool_durable(name)
        self.filter_subjects = filter_subjects or [subjects.tasks_of(settings.node_id)]
        self.target = 0
        self.workers: list[WorkerHandle] = []
        self._names = itertools.count(1)
        self._closing = False
        self._lock = asyncio.Lock()
        self._docker: asyncio.Future | None = None   # runtime "docker": the pool's DockerWorkerRuntime

    # -- counts for load and telemetry ------------------------------------
    @property
    def ready(self) -> int:
        return sum(1 for w in self.workers if w.state == "ready")

    @property
    def starting(self) -> int:
        return sum(1 for w in self.workers if w.state == "starting")

    @property
    def stopping(self) -> int:
        return sum(1 for w in self.workers if w.state == "stopping")

    async def start(self, size: int) -> None:
        await self._ensure_consumer()
        await self.set_size(size)

    async def _ensure_consumer(self) -> None:
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait_s,
            max_deliver=self.settings.max_deliver,
            max_ack_pending=-1,
            max_waiting=4096,
            filter_subjects=self.filter_subjects,
        )
        stream = tasks_stream(self.subjects, self.settings.node_id)
        try:
            await self.js.add_consumer(stream, config)
        except BadRequestError as exc:  # exists with other settings (ack_wait, the pool's functions)
            if exc.err_code != 10148:
                raise
            # a work-queue stream keeps the tasks: recreating the consumer loses none
            await self.js.delete_consumer(stream, self.durable)
            await self.js.add_consumer(stream, config)

    async def backlog(self) -> int:
        """Tasks of this pool not yet acknowledged (waiting + being run)."""
        info = await self.js.consumer_info(tasks_stream(self.subjects, self.settings.node_id), self.durable)
        return info.num_pending + info.num_ack_pending

    async def set_size(self, size: int) -> None:
        """Make ``size`` workers active (starting or ready)."""
        async with self._lock:
            self.target = max(0, size)
            active = [w for w in self.workers if w.state != "stopping"]
            for _ in range(self.target - len(active)):
                self._spawn()
            # retire the newest first: a starting worker costs nothing to drop
            for handle in reversed(active[self.target:]):
                handle.request_stop()

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        async def all_ready() -> None:
            while self.ready < self.target:
                await asyncio.sleep(0.02)
        await asyncio.wait_for(all_ready(), timeout_s)

    def _spawn(self) -> None:
        prefix = "w" if self.name == DEFAULT_POOL else f"{self.name}-w"
        handle = WorkerHandle(name=f"{self.settings.node_id}-{prefix}{next(self._names)}")
        self.workers.append(handle)
        runner = {"process": self._run_process, "docker": self._run_docker}.get(self.settings.runtime,
                                                                              self._run_inprocess)
        handle.task = asyncio.create_task(runner(handle), name=handle.name)

    async def _run_process(self, handle: WorkerHandle) -> None:
        env = dict(os.environ,
                   P2PFAAS_NODE_SETTINGS=self.settings.model_dump_json(),
                   P2PFAAS_WORKER_NAME=handle.name, P2PFAAS_WORKER_POOL=self.name)
        code: int | None = None
        try:
            handle.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "nodes.worker", env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                preexec_fn=die_with_parent_preexec, start_new_session=True,
            )
            if handle.state == "stopping":
                handle.proc.send_signal(signal.SIGTERM)
            assert handle.proc.stdout is not None
            line = await handle.proc.stdout.readline()
            if line.strip() == b"READY" and handle.state == "starting":
                handle.state = "ready"
                handle.ready.set()
            code = await handle.proc.wait()
        finally:
            self._exited(handle, code)

    async def _run_docker(self, handle: WorkerHandle) -> None:
        """A worker as a container (nodes/runtimes/docker.py); it stands in for the process."""
        from nodes.runtimes.docker import pool_runtime

        code: int | None = None
        try:
            self._docker = self._docker or asyncio.ensure_future(pool_runtime(self.settings, self.name))
            env = {"P2PFAAS_NODE_SETTINGS": self.settings.model_dump_json(),
                   "P2PFAAS_WORKER_NAME": handle.name, "P2PFAAS_WORKER_POOL": self.name}
            handle.proc = await (await self._docker).start(handle.name, env)  # type: ignore[assignment]
            if handle.state == "stopping":
                handle.proc.send_signal(signal.SIGTERM)
            if await handle.proc.ready_or_exit() and handle.state == "starting":  # type: ignore[attr-defined]
                handle.state = "ready"
                handle.ready.set()
            code = await handle.proc.wait()
        except Exception:
            log.exception("docker worker %s failed to start", handle.name)
            code = 1
            await asyncio.sleep(1.0)  # back off: a missing image or engine must not spin the replacing loop
        finally:
            self._exited(handle, code)

    async def _run_inprocess(self, handle: WorkerHandle) -> None:
        handle.worker = Worker(self.settings, default_registry(self.settings.functions), handle.name, self.name)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_ready(_: object) -> None:
            if handle.state == "starting":
                handle.state = "ready"
                handle.ready.set()

        ready.add_done_callback(on_ready)
        code: int | None = None
        try:
            code = await handle.worker.run(ready)
        except Exception:
            log.exception("worker %s crashed", handle.name)
            code = 1
        finally:
            self._exited(handle, code)

    def _exited(self, handle: WorkerHandle, code: int | None) -> None:
        if handle in self.workers:
            self.workers.remove(handle)
        if self._closing or handle.state == "stopping":
            return
        if code == EXIT_RECYCLE:
            log.info("worker %s recycled after a timeout", handle.name)
        else:
            log.warning("worker %s exited unexpectedly (code %s); replacing it", handle.name, code)
        active = sum(1 for w in self.workers if w.state != "stopping")
        if active < self.target:
            self._spawn()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every worker (each finishes its current task), then wait for them."""
        self._closing = True
        handles = list(self.workers)
        for handle in handles:
            handle.request_stop()
        tasks = [h.task for h in handles if h.task is not None]
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for handle in handles:
            if handle.proc is not None and handle.proc.returncode is None:
                handle.proc.kill()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
