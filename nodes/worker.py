"""A worker: pulls one task at a time from the node's durable task stream, runs it, publishes the result.

Runs as its own OS process (``python -m nodes.worker``, the default runtime, so
K workers are K-way parallelism) or as a task inside the node ("inprocess").
Delivery is at-least-once; the result is published once per request id: a
redelivered task whose result already exists is only acknowledged.
The result carries the request's path: ``peers`` (origin first, this node
last, when it was forwarded) and ``hop_timings`` (one entry per node).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NotFoundError

from broker import headers as H
from broker.codec import decode, encode
from broker.connection import close_quietly, connect
from broker.errors import ContractError
from broker.messages import HopTiming, HopTrail, LearningDecision, Result, Timings
from broker.streams import deadletter_stream, results_stream, tasks_stream
from broker.subjects import Subjects
from functions.registry import FunctionInputError, FunctionRegistry, default_registry
from nodes.settings import NodeSettings

log = logging.getLogger(__name__)

WORKERS_DURABLE = "workers"          # the node's main pool (all functions not in a dedicated pool)
DEFAULT_POOL = "default"


def pool_durable(pool: str) -> str:
    """Durable consumer of a worker pool on the node's task stream."""
    return WORKERS_DURABLE if pool == DEFAULT_POOL else f"pool-{pool}"
EXIT_RECYCLE = 3  # a function overran its timeout: the process exits so its thread dies with it


def hop_timings(h: dict, node: str, arrival: float, scheduling_s: float, finished: float) -> list[HopTiming]:
    """Every node's timings, origin first, with ``total_s`` = its arrival to ``finished``.

    Earlier nodes' arrivals are their own clocks: across machines this assumes
    synchronised clocks (NTP), as the origin's ``X-P2pfaas-Arrival`` already does.
    """
    hops: list[HopTiming] = []
    if h.get(H.HOP_TIMINGS):
        try:
            hops = list(decode(HopTrail, h[H.HOP_TIMINGS].encode()).hops)
        except ContractError as exc:
            log.warning("malformed %s header: %s", H.HOP_TIMINGS, exc)
    if not hops:  # a task enqueued by an older scheduler: this node alone
        hops = [HopTiming(node=node, arrival=arrival, scheduling_s=scheduling_s)]
    return [hop.model_copy(update={"total_s": max(0.0, finished - hop.arrival)}) for hop in hops]


def output_fields(output: bytes) -> dict[str, str]:
    try:
        return {"output": output.decode()}
    except UnicodeDecodeError:
        return {"output_b64": base64.b64encode(output).decode()}


class Worker:
    def __init__(self, settings: NodeSettings, registry: FunctionRegistry, name: str,
                 pool: str = DEFAULT_POOL) -> None:
        self.settings = settings
        self.registry = registry
        self.name = name
        self.pool = pool
        self.subjects = Subjects(settings.prefix)
        self.stopping = asyncio.Event()
        self.recycle = False
        self.nc: Client | None = None
        self.js = None  # one JetStream context per worker, made when it connects
        # one thread per worker (a worker runs one task at a time): in-process
        # workers do not queue behind the loop's small default executor
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, ready: "asyncio.Future[None] | None" = None) -> int:
        try:
            return await self._run(ready)
        finally:
            self._executor.shutdown(wait=False)

    async def _run(self, ready: "asyncio.Future[None] | None") -> int:
        self.nc = await connect(self.settings.nats_servers, f"{self.settings.node_id}-{self.name}")
        self.js = js = self.nc.jetstream()
        sub = await js.pull_subscribe_bind(
            durable=pool_durable(self.pool), stream=tasks_stream(self.subjects, self.settings.node_id)
        )
        if ready is not None and not ready.done():
            ready.set_result(None)
        try:
            while not self.stopping.is_set() and not self.recycle:
                try:
                    msgs = await sub.fetch(1, timeout=0.5)
                except (NatsTimeout, asyncio.TimeoutError):
                    continue
                for msg in msgs:
                    await self.handle(msg)
        finally:
            await close_quietly(self.nc, sub)
        return EXIT_RECYCLE if self.recycle else 0

    async def handle(self, msg: Msg) -> None:
        assert self.nc is not None
        js = self.js
        h = msg.headers or {}
        fn = msg.subject.rsplit(".", 1)[-1]
        client, req = h.get(H.CLIENT, ""), h.get(H.REQUEST_ID, "")
        key = f"{client}.{req}"
        delivered = msg.metadata.num_delivered
        node = self.settings.node_id
        result_subject = self.subjects.result(client, req)

        if delivered > 1 and await self._result_exists(js, result_subject):
            log.info("task %s redelivered but already answered; acknowledging", key)
            await self._done(key, fn, 0, 0.0, 0.0, h)
            await msg.ack()
            return

        arrival = float(h.get(H.ARRIVAL, time.time()))
        sent_at = float(h.get(H.SENT_AT, arrival))
        scheduling_s = float(h.get(H.SCHEDULING_S, 0.0))
        forwarders = [p for p in h.get(H.PEERS_LIST_ID, "").split(",") if p]
        common = dict(
            request_id=req, client=client, fn=fn, executed_by=node, origin=h.get(H.ORIGIN, node),
            hops=int(h.get(H.HOPS, 0)), peers=[*forwarders, node] if forwarders else [],
            scheduler=h.get(H.SCHEDULER_NAME, ""),
            learning=LearningDecision.from_headers(h),  # a LearningScheduler's decision, answered to the caller
        )
        if delivered >= self.settings.max_deliver:
            reason = f"task failed {delivered - 1} times (its worker died); dead-lettered"
            log.error("%s: %s", key, reason)
            await js.publish(self.subjects.deadletter(node, fn), msg.data, headers=dict(h),
                             stream=deadletter_stream(self.subjects))
            hops = hop_timings(h, node, arrival, scheduling_s, time.time())
            await self._publish(js, Result(status=500, error=reason, hop_timings=hops, **common), key)
            await self._done(key, fn, 500, 0.0, time.time() - arrival, h)
            await msg.ack()
            return

        await self.nc.publish(self.subjects.task_event(node, "started"), orjson.dumps({"k": key, "p": self.pool}))
        started = time.time()
        spec = self.registry.get(fn)
        timeout = float(h.get(H.TIMEOUT, 0) or 0) or (spec.timeout_s if spec else 30.0)
        status, fields = 200, {}
        if spec is None:
            status, fields = 404, {"error": f"unknown function {fn!r} on worker"}
        else:
            keepalive = KeepAlive(msg, self.settings.ack_wait_s / 3)
            try:
                output = await asyncio.wait_for(self._call(spec.body, msg.data), timeout)
                if not isinstance(output, (bytes, bytearray)):
                    output = str(output).encode()
                fields = output_fields(bytes(output))
            except asyncio.TimeoutError:
                status, fields = 504, {"error": f"{fn} exceeded its timeout of {timeout:g} s"}
                self.recycle = os.environ.get("P2PFAAS_WORKER_PROCESS") == "1"
                if not self.recycle:  # the overrunning thread cannot be killed: leave it behind
                    self._executor.shutdown(wait=False)
                    self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
            except FunctionInputError as exc:
                status, fields = 400, {"error": f"{fn}: {exc}"}
            except Exception as exc:  # the function's own failure: report it, keep serving
                status, fields = 500, {"error": f"{fn} raised {type(exc).__name__}: {exc}"}
            finally:
                keepalive.stop()
        finished = time.time()
        timings = Timings(
            scheduling_s=scheduling_s,
            queueing_s=max(0.0, started - sent_at),
            execution_s=finished - started,
            total_s=finished - arrival,
        )
        if status != 200:
            log.warning("%s %s -> %d: %s", fn, key, status, fields.get("error"))
        hops = hop_timings(h, node, arrival, scheduling_s, finished)
        await self._publish(js, Result(status=status, timings=timings, hop_timings=hops, **common, **fields), key)
        await self._done(key, fn, status, timings.execution_s, timings.total_s, h)
        await msg.ack()

    async def _call(self, body, payload: bytes):
        """Run the function in this worker's thread; a node with ``speed`` < 1 pads the time
        (the slot stays busy, as on a slower machine)."""
        started = time.perf_counter()
        output = await asyncio.get_running_loop().run_in_executor(self._executor, body, payload)
        if self.settings.speed < 1.0:
            await asyncio.sleep((time.perf_counter() - started) * (1.0 / self.settings.speed - 1.0))
        return output

    async def _publish(self, js, result: Result, key: str) -> None:
        await js.publish(
            self.subjects.result(result.client, result.request_id), encode(result),
            headers={H.MSG_ID: f"result.{key}"}, stream=results_stream(self.subjects),
        )

    async def _done(self, key: str, fn: str, status: int, execution_s: float, total_s: float, h: dict) -> None:
        """Tell the node (load accounting, metrics, pool telemetry); ``d`` is the task's QoS deadline."""
        assert self.nc is not None
        event = {"k": key, "fn": fn, "p": self.pool, "s": status, "e": execution_s, "t": total_s,
                 "d": _float_or_none(h.get(H.DEADLINE))}
        await self.nc.publish(self.subjects.task_event(self.settings.node_id, "done"), orjson.dumps(event))

    async def _result_exists(self, js, subject: str) -> bool:
        try:
            await js.get_last_msg(results_stream(self.subjects), subject)
            return True
        except NotFoundError:
            return False



class KeepAlive:
    """Tells JetStream a long task is still running, so it is not redelivered meanwhile.
    A timer, not a task per task: most functions finish before the first beat."""

    def __init__(self, msg: Msg, period_s: float) -> None:
        self.msg, self.period_s = msg, period_s
        self._loop = asyncio.get_running_loop()
        self._beat: asyncio.Task | None = None
        self._timer = self._loop.call_later(period_s, self._fire)

    def _fire(self) -> None:
        self._beat = self._loop.create_task(self._send())
        self._timer = self._loop.call_later(self.period_s, self._fire)

    async def _send(self) -> None:
        try:
            await self.msg.in_progress()
        except Exception as exc:  # connection blip: the next beat retries
            log.debug("in_progress failed: %s", exc)

    def stop(self) -> None:
        self._timer.cancel()
        if self._beat is not None:
            self._beat.cancel()


def _float_or_none(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


async def _main() -> int:
    settings = NodeSettings.model_validate_json(os.environ["P2PFAAS_NODE_SETTINGS"])
    name = os.environ.get("P2PFAAS_WORKER_NAME", f"w{os.getpid()}")
    pool = os.environ.get("P2PFAAS_WORKER_POOL", DEFAULT_POOL)
    worker = Worker(settings, default_registry(settings.functions), name, pool)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stopping.set)
    ready: asyncio.Future[None] = loop.create_future()
    ready.add_done_callback(lambda _: print("READY", flush=True))
    return await worker.run(ready)


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("P2PFAAS_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s worker %(name)s: %(message)s")
    os.environ["P2PFAAS_WORKER_PROCESS"] = "1"
    code = asyncio.run(_main())
    if code == EXIT_RECYCLE:  # an overrunning function's thread would hold a normal exit
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)
