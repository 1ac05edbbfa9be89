"""The parties of bench/invoke_path.py, each in its own OS process, and how the orchestrator drives them.

A party is started with :class:`Party` (multiprocessing spawn, a pipe); it answers ``("ready", info)``
once, then each command with ``("ok", result)``, and dies with the orchestrator (parent-death signal).
Measurement windows are absolute wall-clock times (``start_at``/``end_at``) chosen by the
orchestrator, so that every process counts the same seconds and the CPU meter can sample them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import os
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable

NODE_ID = "n1"
FN = "echo"
RAW_SUBJECT = "bench.echo"
JS_STREAM = "BENCH_JS"
JS_SUBJECT = "bench.js.task"
JS_PROGRESS = "bench.js.progress"   # the raw consumer's running count of acknowledged messages
JS_BATCH = 256                      # what the node's intake pulls at once (nodes/intake.py)
# raw durable calls: the contract's two stores (a call, then its result) done with nats-py alone
JS2_CALLS, JS2_RESULTS = "BENCH_JS2", "BENCH_JS2_RESULTS"
JS2_CALL, JS2_RESULT = "bench.js2.call", "bench.js2.result"
TIMING_SAMPLE = 32                  # one answer in this many has its timing headers read (the reading costs CPU)


# ---------------------------------------------------------------------------------------------
# the orchestrator's side
# ---------------------------------------------------------------------------------------------
def die_with_parent() -> None:
    """This process gets SIGTERM when the orchestrator dies, even by kill -9 (no orphans)."""
    from broker.embedded import die_with_parent_preexec
    die_with_parent_preexec()


async def arecv(conn, timeout: float | None = None):
    """``conn.recv()`` without blocking the event loop; EOFError when the other end went away."""
    if not conn.poll():
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_reader(conn.fileno(), lambda: fut.done() or fut.set_result(None))
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            asyncio.get_running_loop().remove_reader(conn.fileno())
    return conn.recv()


class Party:
    """A spawned party and its pipe."""

    def __init__(self, name: str, target: Callable, *args: Any) -> None:
        ctx = mp.get_context("spawn")
        self.name = name
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(*args, child_conn), name=name, daemon=True)
        self.proc.start()
        child_conn.close()
        self.info: dict = {}

    @property
    def pid(self) -> int:
        return self.info.get("pid") or self.proc.pid

    async def ready(self, timeout: float = 90.0) -> dict:
        kind, info = await arecv(self.conn, timeout)
        if kind != "ready":
            raise RuntimeError(f"{self.name} did not start: {info}")
        self.info = info
        return info

    async def ask(self, cmd: str, params: dict, timeout: float) -> dict:
        self.conn.send((cmd, params))
        kind, result = await arecv(self.conn, timeout)
        if kind != "ok":
            raise RuntimeError(f"{self.name}: {result}")
        return result

    async def stop(self, timeout: float = 20.0) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(("stop", {}))
        deadline = time.monotonic() + timeout
        while self.proc.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.proc.is_alive():
            self.proc.terminate()
            await asyncio.sleep(1.0)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


async def serve_commands(conn, handlers: dict[str, Callable[[dict], Awaitable[dict]]]) -> None:
    """Answer the orchestrator's commands until "stop" (or until it went away)."""
    while True:
        try:
            cmd, params = await arecv(conn)
        except EOFError:
            return
        if cmd == "stop":
            return
        handler = handlers.get(cmd)
        if handler is None:
            conn.send(("error", f"unknown command {cmd!r}"))
            continue
        try:
            conn.send(("ok", await handler(params)))
        except Exception as exc:  # reported to the orchestrator, which stops the run
            conn.send(("error", f"{cmd}: {type(exc).__name__}: {exc}"))


def run_on_uvloop(main) -> None:
    import uvloop
    uvloop.run(main)


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


async def sleep_until(wall_time: float) -> None:
    await asyncio.sleep(max(0.0, wall_time - time.time()))


# ---------------------------------------------------------------------------------------------
# load generator: raw request/reply, FaasClient.invoke, FaasClient async calls, raw JetStream producer
# ---------------------------------------------------------------------------------------------
STAGES = ("transit", "scheduling", "queueing", "execution", "node_total", "return", "e2e")


async def drive(call: Callable[[], Awaitable[Any]], n: int, start_at: float, end_at: float) -> dict:
    """``n`` coroutines call back to back until ``end_at``. Completions inside [start_at, end_at]
    are counted (ok or refused); latencies of the calls that started and ended inside it are kept."""
    lat: list[float] = []
    stages: list[tuple] = []
    stats = {"ok": 0, "refused": 0, "errors": 0, "total": 0}
    last_error: list[str] = []

    async def one_after_another() -> None:
        while True:
            started, t0 = time.time(), time.perf_counter()
            try:
                ok, info = await call()
                failed = False
            except Exception as exc:  # counted and reported
                ok, info, failed = False, None, True
                last_error[:] = [f"{type(exc).__name__}: {exc}"]
            elapsed, ended = time.perf_counter() - t0, time.time()
            stats["total"] += 1
            if start_at <= ended <= end_at:
                stats["errors" if failed else "ok" if ok else "refused"] += 1
                if ok and started >= start_at:
                    lat.append(elapsed)
                    if info is not None:
                        stages.append((*info, elapsed))
            if ended >= end_at:
                return
            if failed:
                await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(one_after_another()) for _ in range(n)]
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, end_at - time.time()) + 30)
    for task in pending:
        task.cancel()
    lat.sort()
    window = end_at - start_at
    out = {"n": n, "window_s": window, "ok": stats["ok"], "refused": stats["refused"], "errors": stats["errors"],
           "calls_total": stats["total"], "rps": stats["ok"] / window, "samples": len(lat),
           "p50_us": percentile(lat, 0.5) * 1e6, "p99_us": percentile(lat, 0.99) * 1e6,
           "last_error": last_error[0] if last_error else None}
    if stages:  # where a p2pfaas call's time went (the answer's timing headers), medians in µs
        columns = list(zip(*stages))
        transit, scheduling, queueing, execution, node_total, e2e = (statistics.median(c) * 1e6 for c in columns)
        out["stages_us"] = {"transit": transit, "scheduling": scheduling, "queueing": queueing,
                            "execution": execution, "node_total": node_total, "e2e": e2e,
                            "return": statistics.median(e - t - nt for t, _, _, _, nt, e in stages) * 1e6}
    return out


def timing_of(answer) -> tuple[float, ...]:
    t = answer.timings
    return t.transit_s, t.scheduling_s, t.queueing_s, t.execution_s, t.total_s


def loadgen_main(url: str, conn) -> None:
    die_with_parent()
    run_on_uvloop(_loadgen(url, conn))


async def _loadgen(url: str, conn) -> None:
    from broker.client import FaasClient, new_request_id
    from broker.connection import close_quietly, connect

    nc = await connect(url, "bench-loadgen")
    js = nc.jetstream()
    clients: dict[str, FaasClient] = {}
    js_state = {"published": 0, "consumed": 0}
    progress = asyncio.Event()

    async def on_progress(msg) -> None:
        js_state["consumed"] = int(msg.data)
        progress.set()

    await nc.subscribe(JS_PROGRESS, cb=on_progress)

    async def client(prefix: str) -> FaasClient:
        if prefix not in clients:
            clients[prefix] = await FaasClient(nc, client="bench", prefix=prefix).start()
        return clients[prefix]

    async def raw(p: dict) -> dict:
        payload = p["payload"].encode()

        async def call():
            msg = await nc.request(RAW_SUBJECT, payload, timeout=10.0)
            if msg.data != payload:
                raise RuntimeError(f"bad echo {msg.data[:40]!r}")
            return True, None
        return await drive(call, p["n"], p["start_at"], p["end_at"])

    async def faas_calls(p: dict, invoke: Callable[[FaasClient, bytes], Awaitable[Any]]) -> dict:
        faas, payload = await client(p["prefix"]), p["payload"].encode()
        sampled = itertools.count()

        async def call():
            answer = await invoke(faas, payload)
            if answer.status == 200 and answer.body != payload:
                raise RuntimeError(f"bad echo {answer.body[:40]!r}")
            # the timing headers of one call in TIMING_SAMPLE: reading them costs the load generator CPU
            return answer.status == 200, timing_of(answer) if next(sampled) % TIMING_SAMPLE == 0 else None
        return await drive(call, p["n"], p["start_at"], p["end_at"])

    async def direct(p: dict) -> dict:
        return await faas_calls(p, lambda faas, payload: faas.invoke(NODE_ID, FN, payload, timeout_s=30.0))

    async def durable(p: dict) -> dict:
        return await faas_calls(p, lambda faas, payload: faas.call_async(NODE_ID, FN, payload, req=new_request_id(),
                                                                         timeout_s=30.0))

    async def raw_durable(p: dict) -> dict:
        """Row 4's contract with nats-py alone: store a call (unique subject, message id, waiting for
        JetStream's ack), then wait for its result on a subscription, as ``FaasClient.call_async`` does."""
        payload, waiting = p["payload"].encode(), {}

        async def on_result(msg) -> None:
            fut = waiting.pop(msg.subject.rsplit(".", 1)[1], None)
            if fut is not None and not fut.done():
                fut.set_result(msg.data)

        sub = await nc.subscribe(f"{JS2_RESULT}.>", cb=on_result)

        async def call():
            req = uuid.uuid4().hex
            fut = waiting[req] = asyncio.get_running_loop().create_future()
            try:
                await js.publish(f"{JS2_CALL}.{req}", payload, headers={"Nats-Msg-Id": req}, timeout=10.0)
                if await asyncio.wait_for(fut, 30.0) != payload:
                    raise RuntimeError("bad result")
            finally:
                waiting.pop(req, None)
            return True, None
        try:
            return await drive(call, p["n"], p["start_at"], p["end_at"])
        finally:
            await sub.unsubscribe()

    async def js_publish(p: dict) -> dict:
        """Pipelined ``publish_async`` while at most ``window`` messages wait for the consumer."""
        payload, window, start_at, end_at = p["payload"].encode(), p["window"], p["start_at"], p["end_at"]
        acked = {"in_window": 0, "errors": 0}

        def on_ack(fut: asyncio.Future) -> None:
            if fut.cancelled() or fut.exception() is not None:
                acked["errors"] += 1
            elif start_at <= time.time() <= end_at:
                acked["in_window"] += 1

        while time.time() < end_at:
            if js_state["published"] - js_state["consumed"] >= window:
                progress.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(progress.wait(), 1.0)
                continue
            fut = await js.publish_async(JS_SUBJECT, payload)
            fut.add_done_callback(on_ack)
            js_state["published"] += 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(js.publish_async_completed(), 10.0)
        window_s = end_at - start_at
        return {"published_rps": acked["in_window"] / window_s, "errors": acked["errors"]}

    conn.send(("ready", {"pid": os.getpid()}))
    await serve_commands(conn, {"raw": raw, "direct": direct, "async": durable, "js_publish": js_publish,
                                "raw_durable": raw_durable})
    for faas in clients.values():
        await faas.stop()
    await close_quietly(nc)


# ---------------------------------------------------------------------------------------------
# raw baselines' other ends: an echo responder, a JetStream consumer
# ---------------------------------------------------------------------------------------------
def responder_main(url: str, conn) -> None:
    die_with_parent()
    run_on_uvloop(_responder(url, conn))


async def _responder(url: str, conn) -> None:
    from broker.connection import close_quietly, connect

    nc = await connect(url, "bench-responder")

    async def echo(msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(RAW_SUBJECT, cb=echo)
    await nc.flush()
    conn.send(("ready", {"pid": os.getpid()}))
    await serve_commands(conn, {})
    await close_quietly(nc)


def js_consumer_main(url: str, conn) -> None:
    die_with_parent()
    run_on_uvloop(_js_consumer(url, conn))


async def _js_consumer(url: str, conn) -> None:
    """A work-queue stream like the node's async intake (file storage), a durable pull consumer
    with explicit acks; fetches batches of ``JS_BATCH``, acks each message, says how many. Also the
    other end of the raw durable calls (row 4's ceiling): their results stored, their calls acked."""
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    from broker.connection import close_quietly, connect

    nc = await connect(url, "bench-js-consumer")
    js = nc.jetstream()

    async def new_stream(name: str, subject: str, retention: RetentionPolicy) -> None:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
        await js.add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE, retention=retention))

    async def work_queue(name: str, subject: str):
        """A new file-stored work-queue stream and a durable pull consumer on it, explicit acks."""
        await new_stream(name, subject, RetentionPolicy.WORK_QUEUE)
        await js.add_consumer(name, ConsumerConfig(durable_name="bench", ack_policy=AckPolicy.EXPLICIT,
                                                   max_ack_pending=20_000))
        return await js.pull_subscribe_bind(durable="bench", stream=name)

    async def batches(pulled):
        while True:
            try:
                yield await pulled.fetch(JS_BATCH, timeout=1.0)
            except (NatsTimeout, asyncio.TimeoutError):
                continue

    sub = await work_queue(JS_STREAM, JS_SUBJECT)
    consumed = 0

    async def pull() -> None:
        nonlocal consumed
        async for msgs in batches(sub):
            for msg in msgs:
                await msg.ack()
            consumed += len(msgs)
            await nc.publish(JS_PROGRESS, str(consumed).encode())

    # the raw durable calls' other end: pull calls, store each one's result (unique subject, message
    # id), acknowledge the call once JetStream acknowledged its result (what the node does)
    await new_stream(JS2_RESULTS, f"{JS2_RESULT}.>", RetentionPolicy.LIMITS)
    calls = await work_queue(JS2_CALLS, f"{JS2_CALL}.>")

    stored_calls: list = []          # calls whose result JetStream acknowledged, to acknowledge in turn
    some_stored = asyncio.Event()

    def ack_when_stored(msg):
        def done(fut: asyncio.Future) -> None:
            if not fut.cancelled() and fut.exception() is None:
                stored_calls.append(msg)
                some_stored.set()
        return done

    async def answer() -> None:
        async for msgs in batches(calls):
            for msg in msgs:
                req = msg.subject.rsplit(".", 1)[1]
                stored = await js.publish_async(f"{JS2_RESULT}.{req}", msg.data, headers={"Nats-Msg-Id": req})
                stored.add_done_callback(ack_when_stored(msg))

    async def acknowledge() -> None:   # one task for every acknowledgement, not one per call
        while True:
            await some_stored.wait()
            some_stored.clear()
            done = stored_calls[:]
            stored_calls.clear()
            for msg in done:
                await msg.ack()

    async def count(p: dict) -> dict:
        await sleep_until(p["start_at"])
        first = consumed
        await sleep_until(p["end_at"])
        return {"consumed_rps": (consumed - first) / (p["end_at"] - p["start_at"])}

    tasks = [asyncio.create_task(pull()), asyncio.create_task(answer()), asyncio.create_task(acknowledge())]
    conn.send(("ready", {"pid": os.getpid()}))
    await serve_commands(conn, {"count": count})
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # unsubscribed first: a drain waits for the fetch queue's messages to be taken, which nobody does now
    await close_quietly(nc, sub, calls)


# ---------------------------------------------------------------------------------------------
# p2pfaas: the node, and HTTP bridge processes in front of it
# ---------------------------------------------------------------------------------------------
def node_main(url: str, prefix: str, data_dir: str, k: int, queue: int, loss: bool, loop: str, runtime: str,
              http_ports: list[int], conn) -> None:
    die_with_parent()
    import logging
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s node %(name)s: %(message)s")
    main = _node(url, prefix, Path(data_dir), k, queue, loss, runtime, http_ports, conn)
    run_on_uvloop(main) if loop == "uvloop" else asyncio.run(main)


async def _node(url: str, prefix: str, data_dir: Path, k: int, queue: int, loss: bool, runtime: str,
                http_ports: list[int], conn) -> None:
    """The node; on each of ``http_ports`` its HTTP bridge in this process, with the node's
    in-process door, as ``p2pfaas node --http-port`` (what ``up`` runs) serves it."""
    from broker.messages import NodeConfiguration, SchedulerConfiguration
    from nodes.node import Node
    from nodes.settings import NodeSettings
    from p2pfaas.parts import HttpBridgeSettings, start_http_bridge, stop_http_bridge

    settings = NodeSettings(
        node_id=NODE_ID, nats_url=url, prefix=prefix, data_dir=data_dir, runtime=runtime, learner=False,
        initial=NodeConfiguration(parallel_running_functions_max=k, queue_length_max=queue),
        initial_scheduler=SchedulerConfiguration(name="NoScheduler", parameters=[str(loss).lower()]),
    )
    async with Node(settings) as node:
        assert node.pool is not None and node.scheduler is not None
        await node.pool.wait_ready(90)
        bridges = [await start_http_bridge(HttpBridgeSettings(node=NODE_ID, nats_url=url, port=port, prefix=prefix),
                                           door=node.ingress.door) for port in http_ports]
        conn.send(("ready", {"pid": os.getpid(), "worker_pids": node.pool.pids()}))
        await serve_commands(conn, {})
        for bridge in bridges:
            await stop_http_bridge(bridge)


def bridge_main(url: str, prefix: str, port: int, conn) -> None:
    die_with_parent()
    run_on_uvloop(_bridge(url, prefix, port, conn))


async def _bridge(url: str, prefix: str, port: int, conn) -> None:
    from broker.connection import close_quietly, connect
    from broker.http_bridge import HttpBridge

    nc = await connect(url, f"bench-bridge-{os.getpid()}")
    bridge = HttpBridge(nc, NODE_ID, prefix=prefix)
    started = asyncio.Event()
    serving = asyncio.create_task(bridge.serve("127.0.0.1", port, started, reuse_port=True))
    await asyncio.wait_for(started.wait(), 30)
    conn.send(("ready", {"pid": os.getpid()}))
    await serve_commands(conn, {})
    bridge.shutdown()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(serving, 10)
    await close_quietly(nc)


# ---------------------------------------------------------------------------------------------
# MQTT devices (paho, QoS 1) on nats-server's own MQTT listener
# ---------------------------------------------------------------------------------------------
class Device:
    """One paho connection: keeps ``window`` QoS 1 requests outstanding, each answer (QoS 1 on its
    result topic) sends the next one while the run lasts."""

    def __init__(self, port: int, prefix: str, name: str, window: int, payload: bytes) -> None:
        import paho.mqtt.client as mqtt

        self.prefix, self.name, self.window, self.payload = prefix, name, window, payload
        self.lock = threading.Lock()
        self.sent: dict[str, float] = {}
        self.ids = itertools.count()
        self.run_id = uuid.uuid4().hex[:8]
        self.start_at = self.end_at = 0.0
        self.ok = self.refused = 0
        self.latencies: list[float] = []
        self.paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{name}-{self.run_id}")
        self.paho.max_inflight_messages_set(window + 10)
        subscribed = threading.Event()
        self.paho.on_subscribe = lambda *a: subscribed.set()
        self.paho.on_message = self._on_answer
        self.paho.connect("127.0.0.1", port)
        self.paho.loop_start()
        self.paho.subscribe([(f"{prefix}/result/{name}/#", 1), (f"{prefix}/reject/{name}/#", 1)])
        if not subscribed.wait(10):
            raise RuntimeError(f"device {name}: no SUBACK")

    def _next(self) -> str:
        """A new request id, its send time noted (the caller holds the lock)."""
        req = f"{self.run_id}x{next(self.ids)}"
        self.sent[req] = time.perf_counter()
        return req

    def _publish(self, req: str) -> None:  # outside the lock: paho takes its own
        self.paho.publish(f"{self.prefix}/{NODE_ID}/request/{FN}/{self.name}/{req}", self.payload, qos=1)

    def start(self, start_at: float, end_at: float) -> None:
        with self.lock:
            self.start_at, self.end_at, self.ok, self.refused, self.latencies = start_at, end_at, 0, 0, []
            self.sent.clear()   # answers of an earlier run that never came are not waited for again
            first = [self._next() for _ in range(self.window)]
        for req in first:
            self._publish(req)

    def _on_answer(self, client, userdata, msg) -> None:
        req = msg.topic.rpartition("/")[2]
        now, ended = time.time(), time.perf_counter()
        with self.lock:
            sent = self.sent.pop(req, None)
            if sent is None:
                return
            if self.start_at <= now <= self.end_at:
                if "/result/" in msg.topic and b'"status":200' in msg.payload:
                    self.ok += 1
                    self.latencies.append(ended - sent)
                else:
                    self.refused += 1
            follow_up = self._next() if now < self.end_at else None
        if follow_up is not None:
            self._publish(follow_up)

    def outstanding(self) -> int:
        with self.lock:
            return len(self.sent)

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


def devices_main(port: int, prefix: str, count: int, window: int, payload: str, conn) -> None:
    die_with_parent()
    run_on_uvloop(_devices(port, prefix, count, window, payload.encode(), conn))


async def _devices(port: int, prefix: str, count: int, window: int, payload: bytes, conn) -> None:
    devices = [Device(port, prefix, f"d{i + 1}", window, payload) for i in range(count)]

    async def run(p: dict) -> dict:
        for device in devices:
            device.start(p["start_at"], p["end_at"])
        await sleep_until(p["end_at"])
        deadline = time.monotonic() + 15
        while any(d.outstanding() for d in devices) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        window_s = p["end_at"] - p["start_at"]
        lat = sorted(x for d in devices for x in d.latencies)
        return {"rps": sum(d.ok for d in devices) / window_s, "refused": sum(d.refused for d in devices),
                "lost": sum(d.outstanding() for d in devices), "p50_us": percentile(lat, 0.5) * 1e6,
                "p99_us": percentile(lat, 0.99) * 1e6}

    conn.send(("ready", {"pid": os.getpid()}))
    await serve_commands(conn, {"run": run})
    for device in devices:
        device.close()
