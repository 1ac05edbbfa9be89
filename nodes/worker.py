"""A worker: runs the calls its node dispatches to it over core NATS and answers each one.

Runs as its own OS process (``python -m nodes.worker``, the default runtime) or as a task
inside the node ("inprocess"). It subscribes to ``<prefix>.<node>.worker.<name>``; each
message is a :class:`~broker.messages.WorkerCall` framed with the payload, and the reply is a
:class:`~broker.messages.WorkerOutcome` framed with the output. The node decides who runs
what (K, per-function concurrency); the worker only runs: CPU-bound functions one at a time
in its own thread, I/O-bound ones in a thread pool, ``async def`` ones on its loop, trivial
(inline) ones right in the message callback.

A stop is bounded: asked to stop, the worker finishes its calls within ``stop_grace_s`` and
then exits whatever state its broker connection is in. When its node died (the parent-death
signal), it says so on ``<prefix>.<node>.gone`` so that callers fail at once, and exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.codec import encode, frame, unframe
from broker.connection import close_quietly, connect
from broker.errors import ContractError
from broker.messages import NodeGone, WorkerCall, WorkerOutcome
from broker.subjects import Subjects
from functions.registry import FunctionInputError, FunctionRegistry, FunctionSpec, default_registry
from nodes.settings import NodeSettings

log = logging.getLogger(__name__)

DEFAULT_POOL = "default"
EXIT_RECYCLE = 3        # a function overran its timeout: the process exits so its thread dies with it
STOP_GRACE_S = 10.0     # a stopping worker finishes its calls this long, then exits regardless


class Worker:
    def __init__(self, settings: NodeSettings, registry: FunctionRegistry, name: str,
                 pool: str = DEFAULT_POOL, *, process: bool = False) -> None:
        self.settings = settings
        self.registry = registry
        self.name = name
        self.pool = pool
        self.process = process          # its own OS process: a runaway thread is ended by recycling
        self.subjects = Subjects(settings.prefix)
        self.stopping = asyncio.Event()
        self.recycle = False
        self.nc: Client | None = None
        self._running: set[asyncio.Task] = set()
        # CPU-bound calls get one thread (one at a time); I/O-bound ones share a pool
        self._cpu = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-cpu")
        self._io: ThreadPoolExecutor | None = None

    async def run(self, ready: "asyncio.Future[None] | None" = None) -> int:
        try:
            return await self._run(ready)
        finally:
            self._cpu.shutdown(wait=False)
            if self._io is not None:
                self._io.shutdown(wait=False)

    async def _run(self, ready: "asyncio.Future[None] | None") -> int:
        self.nc = await connect(self.settings.nats_servers, f"{self.settings.node_id}-{self.name}")
        sub = await self.nc.subscribe(self.subjects.worker(self.settings.node_id, self.name), cb=self._on_call)
        await self.nc.flush()
        if ready is not None and not ready.done():
            ready.set_result(None)
        try:
            await self.stopping.wait()
            await sub.unsubscribe()
            if self._running:  # finish what was dispatched (bounded by the caller's stop deadline)
                await asyncio.wait(list(self._running), timeout=STOP_GRACE_S)
        finally:
            await close_quietly(self.nc)
        return EXIT_RECYCLE if self.recycle else 0

    async def _on_call(self, msg: Msg) -> None:
        try:
            call, payload = unframe(WorkerCall, msg.data)
        except ContractError as exc:
            return await self._reply(msg.reply, WorkerOutcome(status=400, error=f"malformed worker call: {exc}"))
        spec = self.registry.get(call.fn)
        if spec is None:
            return await self._reply(msg.reply, WorkerOutcome(status=404, error=f"unknown function {call.fn!r} on worker"))
        if spec.inline and self.settings.speed >= 1.0:
            started = time.perf_counter()
            try:
                output = spec.body(payload)
                outcome = WorkerOutcome(status=200, execution_s=time.perf_counter() - started)
            except Exception as exc:
                output, outcome = b"", _failure(spec.name, exc, time.perf_counter() - started)
            return await self._reply(msg.reply, outcome, _as_bytes(output))
        task = asyncio.create_task(self._execute(msg.reply, spec, call, payload))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _execute(self, reply: str, spec: FunctionSpec, call: WorkerCall, payload: bytes) -> None:
        started = time.perf_counter()
        output: object = b""
        try:
            output = await asyncio.wait_for(self._call(spec, payload), call.timeout_s)
            outcome = WorkerOutcome(status=200, execution_s=time.perf_counter() - started)
        except asyncio.TimeoutError:
            self._abandon(spec)
            outcome = WorkerOutcome(status=504, execution_s=time.perf_counter() - started, retiring=self.recycle,
                                    error=f"{spec.name} exceeded its timeout of {call.timeout_s:g} s")
        except Exception as exc:
            outcome = _failure(spec.name, exc, time.perf_counter() - started)
        await self._reply(reply, outcome, _as_bytes(output))
        if self.recycle:
            self.stopping.set()

    async def _call(self, spec: FunctionSpec, payload: bytes):
        """Run the function; a node with ``speed`` < 1 pads the time (the slot stays busy, as on
        a slower machine)."""
        started = time.perf_counter()
        if spec.is_async:
            output = await spec.body(payload)  # type: ignore[misc]
        else:
            output = await asyncio.get_running_loop().run_in_executor(self._executor_for(spec), spec.body, payload)
        if self.settings.speed < 1.0:
            await asyncio.sleep((time.perf_counter() - started) * (1.0 / self.settings.speed - 1.0))
        return output

    def _executor_for(self, spec: FunctionSpec) -> ThreadPoolExecutor:
        if spec.concurrency == 1:
            return self._cpu
        if self._io is None:
            most = max((s.concurrency for s in map(self.registry.get, self.registry.names()) if s), default=1)
            self._io = ThreadPoolExecutor(max_workers=most, thread_name_prefix=f"{self.name}-io")
        return self._io

    def _abandon(self, spec: FunctionSpec) -> None:
        """A call overran its timeout; its thread cannot be killed. A worker process recycles
        itself after answering; an in-process worker leaves the thread behind."""
        if self.process:
            self.recycle = True
        elif spec.concurrency == 1:
            self._cpu.shutdown(wait=False)
            self._cpu = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.name}-cpu")

    async def _reply(self, reply: str, outcome: WorkerOutcome, output: bytes = b"") -> None:
        if outcome.status != 200:
            log.warning("%s: call -> %d: %s", self.name, outcome.status, outcome.error)
        if reply and self.nc is not None:
            try:
                await self.nc.publish(reply, frame(outcome, output))
            except Exception as exc:  # connection closed: the node sees the worker go and answers for it
                log.warning("%s: could not answer: %s", self.name, exc)

    async def announce_node_gone(self) -> None:
        """Our node died (we were orphaned): tell its callers, so they fail now, not at their timeout."""
        if self.nc is None or not self.nc.is_connected:
            return
        gone = NodeGone(node=self.settings.node_id, by=self.name, reason="node process ended")
        try:
            await self.nc.publish(self.subjects.gone(self.settings.node_id), encode(gone))
            await asyncio.wait_for(self.nc.flush(), 1.0)
        except Exception as exc:
            log.debug("%s: could not announce node gone: %s", self.name, exc)


def _failure(fn: str, exc: Exception, execution_s: float) -> WorkerOutcome:
    if isinstance(exc, FunctionInputError):
        return WorkerOutcome(status=400, error=f"{fn}: {exc}", execution_s=execution_s)
    return WorkerOutcome(status=500, error=f"{fn} raised {type(exc).__name__}: {exc}", execution_s=execution_s)


def _as_bytes(output: object) -> bytes:
    if isinstance(output, (bytes, bytearray, memoryview)):
        return bytes(output)
    return str(output).encode()


def run_loop(main):
    """``asyncio.run`` on uvloop when it is installed (the faster loop), else the stdlib one."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def hard_exit_after(seconds: float, code: int = 0) -> threading.Timer:
    """End the process after ``seconds`` whatever the event loop is doing (a stop with a deadline)."""
    def end() -> None:
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()
    return timer


def parent_gone() -> bool:
    """Our node holds the other end of our stdin (a pipe it never writes): end of file means
    the node process ended, whatever the order in which the kernel tells us."""
    try:
        return os.read(0, 1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return False


async def _main() -> int:
    settings = NodeSettings.model_validate_json(os.environ["P2PFAAS_NODE_SETTINGS"])
    name = os.environ.get("P2PFAAS_WORKER_NAME", f"w{os.getpid()}")
    pool = os.environ.get("P2PFAAS_WORKER_POOL", DEFAULT_POOL)
    worker = Worker(settings, default_registry(settings.functions), name, pool, process=True)
    loop = asyncio.get_running_loop()
    watch_parent = os.environ.get("P2PFAAS_WORKER_PARENT_PIPE") == "1"
    if watch_parent:
        os.set_blocking(0, False)

    stop_requested = orphaned = False

    def on_parent_gone() -> None:
        """Nobody is left to answer to: say so (callers fail now) and go."""
        nonlocal orphaned
        if orphaned:
            return
        orphaned = True
        hard_exit_after(1.0)
        loop.create_task(worker.announce_node_gone()).add_done_callback(lambda _: os._exit(0))
        worker.stopping.set()

    def on_stop() -> None:
        """SIGTERM: from our node (scale down, stop) or the parent-death signal, which comes when
        the thread that started us ends -- possibly before the rest of the node has."""
        nonlocal stop_requested
        if watch_parent and parent_gone():
            return on_parent_gone()
        if not stop_requested:
            stop_requested = True
            hard_exit_after(STOP_GRACE_S + 2.0)
            worker.stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop)
    if watch_parent:  # end of file on stdin: the node process is gone, whatever signal we got or not
        loop.add_reader(0, lambda: parent_gone() and on_parent_gone())
    ready: asyncio.Future[None] = loop.create_future()
    ready.add_done_callback(lambda _: print("READY", flush=True))
    return await worker.run(ready)


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("P2PFAAS_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s worker %(name)s: %(message)s")
    code = run_loop(_main())
    # an abandoned (overrunning) thread would hold a normal interpreter exit
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)
