"""A worker (``python -m nodes.worker``, or a task in the node): runs the ``WorkerCalls`` batches its
node sends to ``<prefix>.<node>.worker.<name>`` and replies ``WorkerOutcomes``; a direct call's caller
is answered by the worker itself. A stop finishes calls within ``stop_grace_s``; when the node died,
the worker says so on ``<prefix>.<node>.gone`` so that callers fail at once, and exits."""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import logging
import os
import resource
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg

from broker import handoff
from broker.answers import HEADER_ROOM, output_limit, render_direct
from broker.codec import decode, encode, frame, split_by_size, unframe
from broker.connection import close_quietly, connect, credentials_from_env, listen
from broker.errors import ContractError
from broker.lifecycle import OnItsLoop, hard_exit_after, on_parent_gone, parent_gone, parent_pipe_watched, run_loop
from broker.messages import NodeGone, WorkerCall, WorkerCalls, WorkerOutcome, WorkerStatus, WorkerStatusRequest
from broker.subjects import Subjects
from functions.output import TaggedStream, current_function
from functions.registry import FunctionRegistry, default_registry, function_environment
from functions.secrets import give as give_secrets
from functions.spec import FunctionSpec
from nodes.settings import NodeSettings, pool_functions
from nodes.worker_outcomes import Ended, SentOutcomes, as_bytes, failure

log = logging.getLogger(__name__)

DEFAULT_POOL = "default"
EXIT_RECYCLE = 3        # a function overran its timeout: the process exits so its thread dies with it
WORKER_CREDENTIALS = "P2PFAAS_WORKER_NATS"   # _USER / _PASSWORD: the identity of a node's workers


class Worker(OnItsLoop):
    def __init__(self, settings: NodeSettings, registry: FunctionRegistry, name: str,
                 pool: str = DEFAULT_POOL, *, process: bool = False, watch_node: bool = False) -> None:
        """``watch_node``: end when the node's heartbeats stop or it says it is gone (a worker
        that cannot hold its node's pipe, e.g. in a container)."""
        self.settings = settings
        self.registry = registry
        self.name = name
        self.pool = pool
        self.process = process          # its own OS process: a runaway thread is ended by recycling
        self.watch_node = watch_node
        self.subjects = Subjects(settings.prefix)
        self.stopping = asyncio.Event()
        self.recycle = False
        self.nc: Client | None = None
        self._running: set[asyncio.Task] = set()
        self._outbox: dict[str, Ended] = {}   # reply -> the calls that ended this turn
        self._active: set[int] = set()                  # ids of the calls running here
        # the last outcomes sent, by call id: sent again when the node asks after a broker outage
        self._sent = SentOutcomes()
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
        # a worker runs user code: it connects as its node's worker identity, not as the node
        self.nc = await connect(self.settings.nats_servers, f"{self.settings.node_id}-{self.name}",
                                credentials=credentials_from_env(WORKER_CREDENTIALS) or credentials_from_env())
        # calls are taken in the read loop (no Msg, queue or task switch per message), as the node's doors take them
        sub = await listen(self.nc, self.subjects.worker(self.settings.node_id, self.name), self._on_calls)
        await self.nc.subscribe(self.subjects.worker_status(self.settings.node_id, self.name), cb=self._on_status)
        watch = await self._watch_node() if self.watch_node else None
        await self.nc.flush()
        if ready is not None and not ready.done():
            ready.set_result(None)
        try:
            await self.stopping.wait()
            if watch is not None:
                watch.cancel()
            try:   # the calls the broker routed to us before the stop come in before its PONG: taken
                async with asyncio.timeout(2.0):
                    await self.nc.flush()
            except Exception as exc:   # the broker is away: nothing more comes anyway
                log.debug("%s: flush before unsubscribing: %s", self.name, exc)
            await sub.unsubscribe()
            if self._running:  # finish what was dispatched (bounded by the caller's stop deadline)
                await asyncio.wait(list(self._running), timeout=self.settings.timings.stop_grace_s)
            await self._flush_all()
        finally:
            await close_quietly(self.nc)
        return EXIT_RECYCLE if self.recycle else 0

    async def _watch_node(self) -> asyncio.Task:
        """Stop when the node says it is gone, or has been silent for several heartbeat periods."""
        node = self.settings.node_id
        silent_after = max(10.0, 5 * self.settings.heartbeat_period_s)
        last = time.monotonic()

        async def on_heartbeat(msg: Msg) -> None:
            nonlocal last
            last = time.monotonic()

        async def on_gone(msg: Msg) -> None:
            log.warning("%s: node %s is gone; stopping", self.name, node)
            self.stopping.set()

        await self.nc.subscribe(self.subjects.membership_of(node), cb=on_heartbeat)
        await self.nc.subscribe(self.subjects.gone(node), cb=on_gone)

        async def watchdog() -> None:
            while True:
                await asyncio.sleep(1.0)
                if time.monotonic() - last > silent_after:
                    log.warning("%s: no heartbeat of node %s for %.0f s; stopping", self.name, node, silent_after)
                    self.stopping.set()
                    return

        return asyncio.create_task(watchdog())

    def _on_calls(self, subject: str, reply: str, data: bytes, headers: object) -> None:
        """A batch of calls (what the node dispatched to us in one turn of its loop)."""
        try:
            batch, payloads = unframe(WorkerCalls, data)
        except ContractError as exc:
            return self._send_outcomes(reply, [], [], error=f"malformed worker call: {exc}")
        offset = 0
        for call in batch.calls:
            payload, offset = payloads[offset:offset + call.size], offset + call.size
            self._start(reply, call, payload)

    def _start(self, reply: str, call: WorkerCall, payload: bytes) -> None:
        self._active.add(call.id)
        spec = self.registry.get(call.fn)
        if spec is None:
            return self._answer(reply, call, 404, 0.0, b"", f"unknown function {call.fn!r} on worker")
        if spec.inline and self.settings.speed >= 1.0:
            started = time.perf_counter()
            try:
                output = as_bytes(spec.body(payload))
            except Exception as exc:
                failed = failure(spec.name, exc, time.perf_counter() - started)
                return self._answer(reply, call, failed.status, failed.execution_s, b"", failed.error)
            return self._answer(reply, call, 200, time.perf_counter() - started, output)
        task = asyncio.create_task(self._execute(reply, spec, call, payload))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _execute(self, reply: str, spec: FunctionSpec, call: WorkerCall, payload: bytes) -> None:
        started = time.perf_counter()
        output: object = b""
        try:
            async with asyncio.timeout(call.timeout_s):
                output = await self._call(spec, payload)
            outcome = WorkerOutcome(status=200, execution_s=time.perf_counter() - started)
        except asyncio.TimeoutError:
            self._abandon(spec)
            outcome = WorkerOutcome(status=504, execution_s=time.perf_counter() - started, retiring=self.recycle,
                                    error=f"{spec.name} exceeded its timeout of {call.timeout_s:g} s")
        except Exception as exc:
            outcome = failure(spec.name, exc, time.perf_counter() - started)
        self._answer(reply, call, outcome.status, outcome.execution_s, as_bytes(output), outcome.error, outcome.retiring)
        if self.recycle:
            self.stopping.set()

    async def _call(self, spec: FunctionSpec, payload: bytes):
        """Run the function; with ``speed`` < 1 the time is padded (the slot stays busy, as on a slower machine)."""
        started = time.perf_counter()
        current_function.set(spec.name)   # its output is tagged with its name (functions/output.py)
        if spec.is_async:
            output = await spec.body(payload)  # type: ignore[misc]
        else:   # the executor's thread runs it in this task's context, where its name is
            output = await asyncio.get_running_loop().run_in_executor(
                self._executor_for(spec), contextvars.copy_context().run, spec.body, payload)
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

    def _answer(self, reply: str, call: WorkerCall, status: int, execution_s: float, output: bytes,
                error: str | None = None, retiring: bool = False) -> None:
        """A call ended: its outcome goes to the node with the turn's others at the end of the turn,
        and a direct call's caller gets its answer from here in the same write."""
        limit = output_limit(self.nc.max_payload) if self.nc is not None else len(output)
        if len(output) > limit:   # no message could carry it: the caller gets an error it can read
            status, error = 500, f"{call.fn}: output of {len(output)} bytes exceeds the limit of {limit}"
            output = b""
        if status != 200:
            log.warning("%s: call -> %d: %s", self.name, status, error)
        direct = call.answer is not None and self.nc is not None
        kept = b"" if direct else output   # the node answers an async call (it stores the answer)
        # a WorkerOutcome document (the node validates it)
        outcome = {"id": call.id, "status": status, "error": error, "execution_s": execution_s, "retiring": retiring,
                   "answered": direct, "size": len(kept)}
        self._active.discard(call.id)
        self._sent.remember(call.id, reply, outcome, kept)
        entry = self._outbox.get(reply)
        if entry is None:
            entry = self._outbox[reply] = Ended()
            self.loop.call_soon(self._flush_outcomes, reply)
        entry.outcomes.append(outcome)
        entry.outputs.append(kept)
        if direct:
            entry.answers.append((call.answer, status, execution_s, output, error))   # type: ignore[arg-type]

    def _flush_outcomes(self, reply: str) -> None:
        """End of the turn: the outcomes to the node as one message and the direct answers, in one write."""
        entry = self._outbox.pop(reply, None)
        if entry is None:
            return
        self._send_outcomes(reply, entry.outcomes, entry.outputs)
        for ctx, status, execution_s, output, error in entry.answers:
            body, block = render_direct(ctx, status, output, error, execution_s)
            try:
                self.nc.send(ctx.reply, body, headers=block)   # type: ignore[union-attr]
            except Exception as exc:  # the connection is closed: the caller's FaasClient fails the call on its own
                log.error("%s: the answer to a call could not be sent: %s", self.name, exc)

    def _send_outcomes(self, reply: str, outcomes: list[dict], outputs: list[bytes], error: str | None = None) -> None:
        """Outcome documents (with async calls' outputs) to the node in as few messages as they fit."""
        if not reply or self.nc is None:
            return
        sizes = [len(o) for o in outputs]
        for run in split_by_size(range(len(sizes)), sizes, self.nc.max_payload - HEADER_ROOM) if outcomes else [[]]:
            try:
                self.nc.send(reply, frame({"outcomes": [outcomes[i] for i in run], "error": error},
                                          b"".join(outputs[i] for i in run)))
            except Exception as exc:  # connection closed: the node sees the worker go and answers for it
                log.warning("%s: could not answer: %s", self.name, exc)

    async def _on_status(self, msg: Msg) -> None:
        """The node's connection came back: outcomes it may have missed go again, then the ids still running."""
        try:
            asked = decode(WorkerStatusRequest, msg.data)
        except ContractError as exc:
            log.warning("%s: malformed status request: %s", self.name, exc)
            return
        for reply, (outcomes, outputs) in self._sent.again(asked.ids).items():
            self._send_outcomes(reply, outcomes, outputs)
        running = [i for i in asked.ids if i in self._active]
        if msg.reply and self.nc is not None:
            await self.nc.publish(msg.reply, encode(WorkerStatus(running=running)))

    async def _flush_all(self) -> None:
        """Stopping: every outcome still waiting for the end of a turn goes out, and is written."""
        for reply in list(self._outbox):
            self._flush_outcomes(reply)
        if self.nc is not None and self.nc.is_connected:
            try:
                async with asyncio.timeout(2.0):
                    await self.nc.flush()
            except Exception as exc:  # the broker went away meanwhile: the node answers for us
                log.debug("%s: last outcomes not flushed: %s", self.name, exc)

    async def announce_node_gone(self) -> None:
        """Our node died (we were orphaned): tell its callers, so they fail now, not at their timeout."""
        if self.nc is None or not self.nc.is_connected:
            return
        gone = NodeGone(node=self.settings.node_id, by=self.name, reason="node process ended")
        try:
            await self.nc.publish(self.subjects.gone(self.settings.node_id), encode(gone))
            async with asyncio.timeout(1.0):
                await self.nc.flush()
        except Exception as exc:
            log.debug("%s: could not announce node gone: %s", self.name, exc)


def limit_memory(limit: int) -> None:
    """A function pool's memory limit on this worker's data, not its address space (which Python
    reserves far beyond use): a function past it gets MemoryError, the worker goes on."""
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


async def _main() -> int:
    settings = NodeSettings.model_validate_json(os.environ["P2PFAAS_NODE_SETTINGS"])
    name = os.environ.get("P2PFAAS_WORKER_NAME", f"w{os.getpid()}")
    pool = os.environ.get("P2PFAAS_WORKER_POOL", DEFAULT_POOL)
    functions, env = pool_functions(settings, pool)
    # before the functions are imported: their variables, their secrets, their memory
    os.environ.update(function_environment(env))
    give_secrets(orjson.loads(handoff.get(handoff.FUNCTION_SECRETS) or "{}"))
    spec = settings.pools.get(pool)
    if spec is not None and spec.memory_bytes:
        limit_memory(spec.memory_bytes)
    sys.stdout, sys.stderr = TaggedStream(sys.stdout), TaggedStream(sys.stderr)
    worker = Worker(settings, default_registry(functions, env=env, options=settings.function_options), name, pool,
                    process=True, watch_node=os.environ.get("P2PFAAS_WORKER_WATCH_NODE") == "1")
    loop = asyncio.get_running_loop()
    orphaned = stop_requested = False

    def node_gone() -> None:
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
        if parent_pipe_watched() and parent_gone():
            return node_gone()
        if not stop_requested:
            stop_requested = True
            hard_exit_after(settings.timings.stop_grace_s + 2.0)
            worker.stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop)
    on_parent_gone(node_gone)   # end of file on stdin: the node process is gone, signal or not
    ready: asyncio.Future[None] = loop.create_future()
    ready.add_done_callback(lambda _: print("READY", flush=True))
    return await worker.run(ready)


if __name__ == "__main__":
    handoff.take()   # its identity, read before any user code is imported; not dumpable
    logging.basicConfig(level=os.environ.get("P2PFAAS_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s worker %(name)s: %(message)s")
    code = run_loop(_main())
    # cleanups run, but no interpreter shutdown: it would join an abandoned (overrunning) thread
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)
