"""Invocation path, side by side: raw NATS request/reply vs the durable p2pfaas path, and the
HTTP bridge vs a bare ASGI echo endpoint — one run, same machine, DESIGN.md §7 targets.

Run: .venv/bin/python bench/invoke_path.py [--quick] [--json OUT] [--profile DIR]

Everything runs on its own nats-server (free port, temporary JetStream dir) and is
stopped at the end. Every party is its own OS process (no shared event loop/GIL):

* responder  – nats-py echo subscription (baseline A's server side)
* loadgen    – nats-py client: raw ``nc.request`` or ``FaasClient.invoke`` (same code
               drives both: sequential for latency, N coroutines in flight for throughput)
* node host  – ``Node`` (echo function, NoScheduler(false), K workers, runtime
               process|inprocess) + ``HttpBridge`` on the same loop, as ``p2pfaas up`` runs them
* echo app   – a bare Starlette POST echo under uvicorn with the bridge's uvicorn settings
* wrk        – HTTP load generator for both echo app and bridge (POST, lua script)

Baseline and p2pfaas phases alternate (ABBA) within each repetition; tables show
medians over repetitions and the median of the per-repetition ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

RAW_SUBJECT = "bench.echo"
NODE_ID = "n1"
FN = "echo"
FAAS_CLIENT = "bench"
HTTP_PATH = f"/function/{FN}"

# DESIGN.md §7
TARGET_THROUGHPUT = 0.25   # durable NATS path req/s >= 25 % of raw request/reply
TARGET_P50 = 4.0           # durable p50 <= 4x raw p50
TARGET_HTTP = 0.50         # bridge req/s >= 50 % of bare ASGI echo
# REFERENCE.md: the original Go P2PFaaS with hey on POST /function (echo, K=64), same kind of machine
GO_P2PFAAS = {"seq_rps": 1137.0, "c32_rps": 2981.0}


# ---------------------------------------------------------------------------
# helpers shared by every process
# ---------------------------------------------------------------------------
def die_with_parent() -> None:
    """Children get SIGTERM if the orchestrator dies (no orphans even on kill -9)."""
    from broker.embedded import die_with_parent_preexec
    die_with_parent_preexec()


async def arecv(conn, timeout: float | None = None):
    """``conn.recv()`` without blocking the event loop; EOFError when the other end went away."""
    loop = asyncio.get_running_loop()
    if not conn.poll():
        fut = loop.create_future()
        loop.add_reader(conn.fileno(), lambda: fut.done() or fut.set_result(None))
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            loop.remove_reader(conn.fileno())
    return conn.recv()


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def med(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------------------
# child: raw echo responder
# ---------------------------------------------------------------------------
def responder_main(url: str, conn) -> None:
    die_with_parent()
    asyncio.run(_responder(url, conn))


async def _responder(url: str, conn) -> None:
    from broker.connection import close_quietly, connect

    nc = await connect(url, "bench-responder")

    async def echo(msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(RAW_SUBJECT, cb=echo)
    await nc.flush()
    conn.send(("ready", {"pid": os.getpid()}))
    with contextlib.suppress(EOFError):
        await arecv(conn)
    await close_quietly(nc)


# ---------------------------------------------------------------------------
# child: load generator (raw request/reply and FaasClient.invoke)
# ---------------------------------------------------------------------------
def loadgen_main(url: str, conn) -> None:
    die_with_parent()
    asyncio.run(_loadgen(url, conn))


async def _drive(call: Callable[[], Any], n: int, warmup_s: float, duration_s: float) -> dict:
    """``n`` coroutines call back to back; completions in the window after warm-up are counted,
    latencies of calls started and finished inside it are kept (steady state, no drain)."""
    t0 = time.perf_counter()
    w_end, m_end = t0 + warmup_s, t0 + warmup_s + duration_s
    lat: list[float] = []
    extra: list[Any] = []
    stats = {"done": 0, "errors": 0, "total": 0}
    last_error: list[str] = []

    async def worker() -> None:
        while True:
            start = time.perf_counter()
            try:
                info = await call()
                ok = True
            except Exception as exc:  # counted, reported
                ok, info = False, None
                last_error[:] = [f"{type(exc).__name__}: {exc}"]
            end = time.perf_counter()
            stats["total"] += 1
            if w_end <= end <= m_end:
                if ok:
                    stats["done"] += 1
                else:
                    stats["errors"] += 1
            if ok and start >= w_end and end <= m_end:
                lat.append(end - start)
                if info is not None:
                    extra.append(info)
            if end >= m_end:
                return
            if not ok:
                await asyncio.sleep(0.001)

    tasks = [asyncio.create_task(worker()) for _ in range(n)]
    done, pending = await asyncio.wait(tasks, timeout=warmup_s + duration_s + 30)
    for t in pending:
        t.cancel()
    lat.sort()
    out = {
        "n": n, "duration_s": duration_s, "completed": stats["done"], "errors": stats["errors"],
        "calls_total": stats["total"], "rps": stats["done"] / duration_s,
        "p50_us": percentile(lat, 0.5) * 1e6, "p99_us": percentile(lat, 0.99) * 1e6,
        "mean_us": (sum(lat) / len(lat) * 1e6) if lat else float("nan"), "samples": len(lat),
        "last_error": last_error[0] if last_error else None,
    }
    if extra:  # p2pfaas: where the time went (medians, microseconds)
        keys = ("scheduling", "queueing", "execution", "total_server", "e2e")
        cols = list(zip(*extra))
        out["stages_us"] = {k: statistics.median(c) * 1e6 for k, c in zip(keys, cols)}
        out["stages_us"]["result_delivery"] = out["stages_us"]["e2e"] - out["stages_us"]["total_server"]
    return out


async def _loadgen(url: str, conn) -> None:
    from broker.client import FaasClient
    from broker.connection import close_quietly, connect

    nc = await connect(url, "bench-loadgen")
    clients: dict[str, FaasClient] = {}
    conn.send(("ready", {"pid": os.getpid()}))
    while True:
        try:
            cmd, params = await arecv(conn)
        except EOFError:
            break
        if cmd == "stop":
            break
        payload = b"x" * params["payload_bytes"]
        if cmd == "raw":
            async def call() -> None:
                msg = await nc.request(RAW_SUBJECT, payload, timeout=5.0)
                if msg.data != payload:
                    raise RuntimeError("bad echo")
        elif cmd == "faas":
            prefix = params["prefix"]
            if prefix not in clients:
                clients[prefix] = await FaasClient(nc, client=FAAS_CLIENT, prefix=prefix).start()
            faas = clients[prefix]

            async def call():
                start = time.time()
                answer = await faas.invoke(NODE_ID, FN, payload, timeout_s=30.0)
                e2e = time.time() - start
                if answer.status != 200 or answer.output != payload:
                    raise RuntimeError(f"status {answer.status}: {answer.rejection or answer.result}")
                t = answer.result.timings  # type: ignore[union-attr]
                return t.scheduling_s, t.queueing_s, t.execution_s, t.total_s, e2e
        else:
            conn.send(("error", f"unknown command {cmd}"))
            continue
        result = await _drive(call, params["n"], params["warmup_s"], params["duration_s"])
        conn.send(("ok", result))
    for faas in clients.values():
        await faas.stop()
    await close_quietly(nc)


# ---------------------------------------------------------------------------
# child: node host (Node + HttpBridge on one loop, as `p2pfaas up`)
# ---------------------------------------------------------------------------
def nodehost_main(url: str, prefix: str, data_dir: str, runtime: str, k: int, queue: int,
                  http_port: int, conn) -> None:
    die_with_parent()
    import logging
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s nodehost %(name)s: %(message)s")
    asyncio.run(_nodehost(url, prefix, Path(data_dir), runtime, k, queue, http_port, conn))


async def _nodehost(url: str, prefix: str, data_dir: Path, runtime: str, k: int, queue: int,
                    http_port: int, conn) -> None:
    from broker.connection import close_quietly, connect
    from broker.http_bridge import HttpBridge
    from broker.messages import NodeConfiguration, SchedulerConfiguration
    from nodes.node import Node
    from nodes.settings import NodeSettings

    settings = NodeSettings(
        node_id=NODE_ID, nats_url=url, prefix=prefix, data_dir=data_dir, runtime=runtime,
        initial=NodeConfiguration(parallel_running_functions_max=k, queue_length_max=queue, queue_enabled=True),
        initial_scheduler=SchedulerConfiguration(name="NoScheduler", parameters=["false"]),
    )
    node = Node(settings)
    await node.start()
    bnc = await connect(url, "bench-bridge")
    bridge = await HttpBridge(bnc, NODE_ID, prefix=prefix).start()
    started = asyncio.Event()
    serving = asyncio.create_task(bridge.serve("127.0.0.1", http_port, started))
    try:
        await asyncio.wait_for(started.wait(), 15)
        assert node.pool is not None
        await node.pool.wait_ready(60)
        workers = [w.proc.pid for w in node.pool.workers if w.proc is not None]
        conn.send(("ready", {"pid": os.getpid(), "worker_pids": workers}))
        with contextlib.suppress(EOFError):
            while (await arecv(conn))[0] != "stop":
                pass
    finally:
        bridge.shutdown()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 10)
        await bridge.stop()
        await close_quietly(bnc)
        await node.stop()
    with contextlib.suppress(Exception):
        conn.send(("stopped", None))


# ---------------------------------------------------------------------------
# child: bare ASGI echo (Starlette under uvicorn, the bridge's uvicorn settings)
# ---------------------------------------------------------------------------
def echo_app_main(port: int, conn) -> None:
    die_with_parent()
    asyncio.run(_echo_app(port, conn))


async def _echo_app(port: int, conn) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/octet-stream")

    app = Starlette(routes=[Route("/function/{fn}", echo, methods=["GET", "POST"])])
    # same Config as HttpBridge.serve
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                            access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    conn.send(("ready", {"pid": os.getpid()}))
    with contextlib.suppress(EOFError):
        await arecv(conn)
    server.should_exit = True
    await task


# ---------------------------------------------------------------------------
# orchestrator
# ---------------------------------------------------------------------------
class Child:
    """A spawned child process and its pipe."""

    def __init__(self, name: str, target: Callable, *args: Any) -> None:
        ctx = mp.get_context("spawn")
        self.name = name
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(*args, child_conn), name=name, daemon=True)
        self.proc.start()
        child_conn.close()
        self.info: dict = {}

    async def ready(self, timeout: float = 90.0) -> dict:
        kind, info = await arecv(self.conn, timeout)
        if kind != "ready":
            raise RuntimeError(f"{self.name}: {kind} {info}")
        self.info = info
        return info

    async def ask(self, cmd: str, params: dict, timeout: float) -> dict:
        self.conn.send((cmd, params))
        kind, result = await arecv(self.conn, timeout)
        if kind != "ok":
            raise RuntimeError(f"{self.name}: {kind} {result}")
        return result

    async def stop(self, timeout: float = 20.0) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(("stop", None))
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


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def machine_busy() -> tuple[float, float]:
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


class CpuMeter:
    """CPU seconds per named process (and machine utilisation) across a phase."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids

    def __enter__(self) -> "CpuMeter":
        self.t0 = time.monotonic()
        self.m0 = machine_busy()
        self.before = {name: [cpu_seconds(p) for p in ps] for name, ps in self.pids.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.monotonic() - self.t0
        m1 = machine_busy()
        self.machine_util = (m1[0] - self.m0[0]) / max(1, m1[1] - self.m0[1])
        self.used: dict[str, float] = {}
        for name, ps in self.pids.items():
            total = 0.0
            for p, b in zip(ps, self.before[name]):
                a = cpu_seconds(p)
                if a is not None and b is not None:
                    total += a - b
            self.used[name] = total

    def per_request_us(self, calls: int) -> dict[str, float]:
        return {name: used / max(1, calls) * 1e6 for name, used in self.used.items()}


WRK_LUA = r"""
wrk.method = "POST"
wrk.body = string.rep("x", tonumber(os.getenv("BENCH_PAYLOAD") or "16"))
wrk.headers["Content-Type"] = "application/octet-stream"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\"requests\": %d, \"duration_us\": %d, \"p50_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, " ..
    "\"connect\": %d, \"read\": %d, \"write\": %d, \"status\": %d, \"timeout\": %d}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.mean,
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


async def run_wrk(wrk: str, lua: Path, port: int, conns: int, duration_s: int, payload: int) -> dict:
    proc = await asyncio.create_subprocess_exec(
        wrk, "-t1", f"-c{conns}", f"-d{duration_s}s", "--timeout", "10s", "-s", str(lua),
        f"http://127.0.0.1:{port}{HTTP_PATH}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
        env=dict(os.environ, BENCH_PAYLOAD=str(payload)), preexec_fn=die_with_parent,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), duration_s + 30)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("WRKJSON "):
            r = json.loads(line[8:])
            errors = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
            ok = r["requests"] - r["status"]
            return {"conns": conns, "rps": ok / (r["duration_us"] / 1e6), "p50_us": r["p50_us"],
                    "p99_us": r["p99_us"], "mean_us": r["mean_us"], "requests": r["requests"], "errors": errors}
    raise RuntimeError(f"wrk printed no result:\n{out.decode(errors='replace')[-2000:]}")


def log(console, text: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}")


async def profile_node(args, console, server_url: str, loadgen: Child, node: Child, prefix: str, runtime: str) -> dict:
    """While the loadgen keeps N requests in flight: py-spy (--gil: CPU attribution) on the node host and
    on every worker process, and a count of the messages nats-server carries per request."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out_dir = Path(args.profile)
    out_dir.mkdir(parents=True, exist_ok=True)
    dur = max(3, int(args.thr_s * 2))
    targets = {"node host": [node.info["pid"]], "workers": node.info.get("worker_pids", [])}
    spies, files = [], {}
    if Path(pyspy).exists():
        for kind, pids in targets.items():
            for pid in pids:
                out = out_dir / f"{runtime}-{kind.replace(' ', '')}-{pid}.collapsed"
                files.setdefault(kind, []).append(out)
                spies.append(await asyncio.create_subprocess_exec(
                    pyspy, "record", "--pid", str(pid), "--gil", "--nonblocking", "--rate", "200",
                    "--format", "raw", "-o", str(out), "-d", str(dur),
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, preexec_fn=die_with_parent))
    else:
        log(console, "[yellow]py-spy not found (pip install py-spy): stack profile skipped[/yellow]")
    counter = asyncio.create_task(count_messages(server_url, prefix, dur))
    await asyncio.sleep(0.3)
    load = await loadgen.ask("faas", {"prefix": prefix, "n": args.inflight, "warmup_s": 0.0,
                                      "duration_s": dur, "payload_bytes": args.payload_bytes}, timeout=dur + 60)
    counts = await counter
    for spy in spies:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(spy.wait(), 30)
        if spy.returncode is None:
            spy.kill()
            await spy.wait()
    summary: dict[str, Any] = {kind: summarize_collapsed([f for f in fs if f.exists()]) for kind, fs in files.items()}
    summary["rps_while_profiling"] = load["rps"]
    summary["messages_per_request"] = {k: round(v / max(1, load["calls_total"]), 2) for k, v in counts.items()}
    summary["messages_per_request_total"] = round(sum(counts.values()) / max(1, load["calls_total"]), 1)
    (out_dir / f"{runtime}-summary.json").write_text(json.dumps(summary, indent=2))
    log(console, f"profile ({runtime}): collapsed stacks and {runtime}-summary.json in {out_dir}")
    return summary


async def count_messages(url: str, prefix: str, duration_s: float) -> dict[str, int]:
    """Messages nats-server carries, by kind, seen by a `>` subscriber (a raw request/reply is 2)."""
    import re

    import nats

    kinds = [
        ("JetStream pub acks", re.compile(r"^_INBOX\.")),
        ("acks to JetStream", re.compile(r"^\$JS\.ACK\.")),
        ("pull requests", re.compile(r"^\$JS\.API\.CONSUMER\.MSG\.NEXT\.")),
        ("other JetStream API", re.compile(r"^\$JS\.")),
        ("request (publish + delivery)", re.compile(rf"^{prefix}\.[^.]+\.(request|forward)\.")),
        ("task (publish + delivery)", re.compile(rf"^{prefix}\.[^.]+\.task\.")),
        ("task events", re.compile(rf"^{prefix}\.[^.]+\.events\.")),
        ("result/reject", re.compile(rf"^{prefix}\.(result|reject)\.")),
    ]
    counts: dict[str, int] = {}
    nc = await nats.connect(url, name="bench-counter", pending_size=256 * 1024 * 1024)

    async def cb(msg) -> None:
        for name, rx in kinds:
            if rx.match(msg.subject):
                counts[name] = counts.get(name, 0) + 1
                return
        counts["other"] = counts.get("other", 0) + 1

    await nc.subscribe(">", cb=cb)
    await asyncio.sleep(duration_s)
    await nc.close()
    return counts


def summarize_collapsed(paths: list[Path], top: int = 25) -> dict:
    """Self and inclusive shares of GIL-holding samples (py-spy --gil), aggregated over ``paths``;
    frames present in nearly every sample (event loop, runpy) are left out of the inclusive list."""
    import re

    total = 0
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")
                      if not f.startswith(("process ", "thread "))]
            if not frames:
                continue
            total += n
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for f in set(frames):
                incl[f] = incl.get(f, 0) + n
    t = max(1, total)
    return {
        "samples": total,
        "self_top": [(f, round(100 * c / t, 1)) for f, c in sorted(own.items(), key=lambda x: -x[1])[:top]],
        "incl_top": [(f, round(100 * c / t, 1)) for f, c in sorted(incl.items(), key=lambda x: -x[1])
                     if c / t < 0.9][:top],
    }


async def orchestrate(args, console) -> dict:
    from broker.embedded import NatsServer, free_port

    wrk = shutil.which("wrk")
    tmp = Path(tempfile.mkdtemp(prefix="p2pfaas-invoke-bench-"))
    children: list[Child] = []
    server = NatsServer(data_dir=tmp / "nats", port=None)
    results: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "raw": {}, "p2pfaas": {}, "http": {}, "cpu": {}, "profile": {},
    }
    phase_kw = {"warmup_s": args.warmup_s, "payload_bytes": args.payload_bytes}

    async def measure(loadgen: Child, cmd: str, extra: dict, n: int, duration: float) -> dict:
        return await loadgen.ask(cmd, {**extra, **phase_kw, "n": n, "duration_s": duration},
                                 timeout=duration + args.warmup_s + 90)

    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    loop.add_signal_handler(signal.SIGTERM, me.cancel)  # SIGTERM: clean up like Ctrl-C
    try:
        await server.start()
        log(console, f"nats-server {server.url} (JetStream in {tmp})")
        responder = Child("responder", responder_main, server.url)
        children.append(responder)
        loadgen = Child("loadgen", loadgen_main, server.url)
        children.append(loadgen)
        await responder.ready()
        await loadgen.ready()

        for runtime in ([args.http_runtime] if args.no_nats else args.runtimes):
            prefix = f"b{runtime[:4]}"
            http_port = free_port()
            log(console, f"node runtime={runtime} K={args.k} queue={args.queue} NoScheduler(false), "
                         f"HTTP bridge :{http_port}")
            node = Child(f"node-{runtime}", nodehost_main, server.url, prefix, str(tmp / f"data-{runtime}"),
                         runtime, args.k, args.queue, http_port)
            children.append(node)
            info = await node.ready()
            pids = {"nats-server": [server.proc.pid], "loadgen": [loadgen.info["pid"]],
                    "responder": [responder.info["pid"]], "node host": [info["pid"]],
                    "workers": info.get("worker_pids", [])}
            raw_r = results["raw"].setdefault(runtime, {"seq": [], "thr": []})
            sys_r = results["p2pfaas"].setdefault(runtime, {"seq": [], "thr": []})
            cpu_r = results["cpu"].setdefault(runtime, {"raw": [], "p2pfaas": []})
            # untimed warm-up of the whole path (stream files, caches, connections)
            await measure(loadgen, "faas", {"prefix": prefix}, args.inflight, 1.0)
            for rep in range(0 if args.no_nats else args.reps):
                order = ["raw", "p2pfaas"] if rep % 2 == 0 else ["p2pfaas", "raw"]
                for which in order:
                    cmd, extra = ("raw", {}) if which == "raw" else ("faas", {"prefix": prefix})
                    r = await measure(loadgen, cmd, extra, 1, args.seq_s)
                    (raw_r if which == "raw" else sys_r)["seq"].append(r)
                for which in order:
                    cmd, extra = ("raw", {}) if which == "raw" else ("faas", {"prefix": prefix})
                    with CpuMeter(pids) as meter:
                        r = await measure(loadgen, cmd, extra, args.inflight, args.thr_s)
                    r["machine_util"] = meter.machine_util
                    (raw_r if which == "raw" else sys_r)["thr"].append(r)
                    cpu_r[which].append({"per_request_us": meter.per_request_us(r["calls_total"]),
                                         "machine_util": meter.machine_util})
                s, t = sys_r["seq"][-1], sys_r["thr"][-1]
                rs, rt = raw_r["seq"][-1], raw_r["thr"][-1]
                log(console, f"  rep {rep + 1}/{args.reps} {runtime}: raw p50 {rs['p50_us']:.0f} µs, "
                             f"{rt['rps']:.0f} req/s | p2pfaas p50 {s['p50_us']:.0f} µs, {t['rps']:.0f} req/s"
                             + (f" [errors {s['errors'] + t['errors']}: {t['last_error'] or s['last_error']}]"
                                if s["errors"] + t["errors"] else ""))

            if runtime == args.http_runtime and not args.no_http:
                if wrk is None:
                    log(console, "[yellow]wrk not found (apt-get install -y wrk): HTTP comparison skipped[/yellow]")
                else:
                    results["http"] = await http_block(args, console, wrk, tmp, http_port, children, pids)
            if args.profile:
                results["profile"][runtime] = await profile_node(args, console, server.url, loadgen, node, prefix, runtime)
            await node.stop()
            children.remove(node)
    finally:
        for child in reversed(children):
            await child.stop()
        await server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        loop.remove_signal_handler(signal.SIGTERM)
    return results


async def http_block(args, console, wrk: str, tmp: Path, bridge_port: int, children: list[Child],
                     pids: dict[str, list[int]]) -> dict:
    from broker.embedded import free_port

    lua = tmp / "post.lua"
    lua.write_text(WRK_LUA)
    echo_port = free_port()
    echo = Child("echo-app", echo_app_main, echo_port)
    children.append(echo)
    await echo.ready()
    log(console, f"HTTP: bare Starlette echo :{echo_port} vs bridge :{bridge_port} (wrk -t1)")
    ports = {"echo": echo_port, "bridge": bridge_port}
    out: dict[str, Any] = {"echo": {"conc": [], "seq": []}, "bridge": {"conc": [], "seq": []},
                           "cpu": {"echo": [], "bridge": []}}
    http_pids = {"echo app": [echo.info["pid"]], "node host (bridge + scheduler)": pids["node host"],
                 "workers": pids["workers"], "nats-server": pids["nats-server"]}
    dur = max(1, round(args.thr_s))
    for port in ports.values():  # warm-up
        await run_wrk(wrk, lua, port, args.http_conns, 1, args.payload_bytes)
    for rep in range(args.reps):
        order = ["echo", "bridge"] if rep % 2 == 0 else ["bridge", "echo"]
        for which in order:
            with CpuMeter(http_pids) as meter:
                r = await run_wrk(wrk, lua, ports[which], args.http_conns, dur, args.payload_bytes)
            out[which]["conc"].append(r)
            out["cpu"][which].append({"per_request_us": meter.per_request_us(r["requests"]),
                                      "machine_util": meter.machine_util})
        for which in order:
            out[which]["seq"].append(await run_wrk(wrk, lua, ports[which], 1, max(1, round(args.seq_s)), args.payload_bytes))
        e, b = out["echo"]["conc"][-1], out["bridge"]["conc"][-1]
        log(console, f"  rep {rep + 1}/{args.reps} HTTP c={args.http_conns}: echo {e['rps']:.0f} req/s, "
                     f"bridge {b['rps']:.0f} req/s" + (f" [bridge errors {b['errors']}]" if b["errors"] else ""))
    await echo.stop()
    children.remove(echo)
    return out


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------
def paired(base: list[dict], sys_: list[dict], key: str) -> float:
    return med([s[key] / b[key] for b, s in zip(base, sys_) if b[key]])


def build_rows(results: dict, args) -> list[dict]:
    rows: list[dict] = []

    def row(metric, base, sysv, ratio, target, verdict, unit=""):
        rows.append({"metric": metric, "baseline": base, "p2pfaas": sysv, "ratio": ratio,
                     "target": target, "verdict": verdict, "unit": unit})

    n = args.inflight
    for runtime, sys_r in results["p2pfaas"].items():
        raw_r = results["raw"][runtime]
        if not sys_r["seq"]:
            continue
        r50 = paired(raw_r["seq"], sys_r["seq"], "p50_us")
        row(f"NATS sequential p50 µs ({runtime})", med([r["p50_us"] for r in raw_r["seq"]]),
            med([r["p50_us"] for r in sys_r["seq"]]), r50, f"≤ {TARGET_P50:g}x",
            "PASS" if r50 <= TARGET_P50 else "MISS", "x")
        row(f"NATS sequential p99 µs ({runtime})", med([r["p99_us"] for r in raw_r["seq"]]),
            med([r["p99_us"] for r in sys_r["seq"]]), paired(raw_r["seq"], sys_r["seq"], "p99_us"), "", "", "x")
        rt = paired(raw_r["thr"], sys_r["thr"], "rps")
        row(f"NATS req/s, {n} in flight ({runtime})", med([r["rps"] for r in raw_r["thr"]]),
            med([r["rps"] for r in sys_r["thr"]]), rt, f"≥ {TARGET_THROUGHPUT:.0%}",
            "PASS" if rt >= TARGET_THROUGHPUT else "MISS", "%")
        row(f"NATS p50 µs, {n} in flight ({runtime})", med([r["p50_us"] for r in raw_r["thr"]]),
            med([r["p50_us"] for r in sys_r["thr"]]), paired(raw_r["thr"], sys_r["thr"], "p50_us"), "", "", "x")
    http = results.get("http") or {}
    if http.get("echo", {}).get("conc"):
        e, b = http["echo"], http["bridge"]
        c = args.http_conns
        rh = paired(e["conc"], b["conc"], "rps")
        row(f"HTTP req/s, {c} conns ({args.http_runtime})", med([r["rps"] for r in e["conc"]]),
            med([r["rps"] for r in b["conc"]]), rh, f"≥ {TARGET_HTTP:.0%}", "PASS" if rh >= TARGET_HTTP else "MISS", "%")
        row(f"HTTP p50 µs, {c} conns", med([r["p50_us"] for r in e["conc"]]), med([r["p50_us"] for r in b["conc"]]),
            paired(e["conc"], b["conc"], "p50_us"), "", "", "x")
        row(f"HTTP p99 µs, {c} conns", med([r["p99_us"] for r in e["conc"]]), med([r["p99_us"] for r in b["conc"]]),
            paired(e["conc"], b["conc"], "p99_us"), "", "", "x")
        row("HTTP req/s, 1 conn", med([r["rps"] for r in e["seq"]]), med([r["rps"] for r in b["seq"]]),
            paired(e["seq"], b["seq"], "rps"), "", "", "%")
        row("HTTP p50 µs, 1 conn", med([r["p50_us"] for r in e["seq"]]), med([r["p50_us"] for r in b["seq"]]),
            paired(e["seq"], b["seq"], "p50_us"), "", "", "x")
    return rows


def fmt_ratio(r: dict) -> str:
    v = r["ratio"]
    if v != v:
        return "-"
    return f"{v:.0%}" if r["unit"] == "%" else f"{v:.2f}x"


def render(results: dict, args, console) -> None:
    from rich.table import Table

    rows = results["rows"]
    t = Table(title=f"Invocation path (medians of {args.reps} rep(s); ratio = median of paired per-rep ratios)")
    for col, just in (("metric", "left"), ("baseline", "right"), ("p2pfaas", "right"), ("ratio", "right"),
                      ("target", "center"), ("", "center")):
        t.add_column(col, justify=just)
    for r in rows:
        verdict = {"PASS": "[green]PASS[/green]", "MISS": "[red]MISS[/red]"}.get(r["verdict"], "")
        t.add_row(r["metric"], f"{r['baseline']:,.0f}", f"{r['p2pfaas']:,.0f}", fmt_ratio(r), r["target"], verdict)
    console.print(t)
    console.print("[dim]baseline: raw nats-py request/reply to an echo subscription (NATS rows), bare Starlette "
                  "echo under uvicorn (HTTP rows); same load generator for both sides[/dim]")

    stages = Table(title="Durable path: where a request's time goes (medians, µs; from Result.timings)")
    for col in ("runtime / load", "scheduling", "queueing", "execution", "result delivery", "end to end"):
        stages.add_column(col, justify="right")
    for runtime, sys_r in results["p2pfaas"].items():
        for label, phase in (("sequential", "seq"), (f"{args.inflight} in flight", "thr")):
            st = [r["stages_us"] for r in sys_r[phase] if "stages_us" in r]
            if st:
                stages.add_row(f"{runtime}, {label}", *(f"{med([s[k] for s in st]):,.0f}" for k in
                               ("scheduling", "queueing", "execution", "result_delivery", "e2e")))
    console.print(stages)
    console.print("[dim]scheduling = client submit → scheduler decision (JetStream store + pull); queueing = task "
                  "published → worker started; result delivery = worker done → client has the answer[/dim]")

    cpu = Table(title=f"CPU per request during the {args.inflight}-in-flight phase (µs of CPU, medians)")
    names = ["loadgen", "responder", "nats-server", "node host", "workers"]
    cpu.add_column("path")
    for nme in names + ["sum", "machine busy"]:
        cpu.add_column(nme, justify="right")
    for runtime, c in results["cpu"].items():
        for which in ("raw", "p2pfaas"):
            if not c[which]:
                continue
            per = {nme: med([x["per_request_us"].get(nme, 0.0) for x in c[which]]) for nme in names}
            util = med([x["machine_util"] for x in c[which]])
            cpu.add_row(f"{which} ({runtime})", *(f"{per[nme]:,.0f}" for nme in names),
                        f"{sum(per.values()):,.0f}", f"{util:.0%}")
    console.print(cpu)

    http = results.get("http") or {}
    if http.get("cpu", {}).get("bridge"):
        names = ["echo app", "node host (bridge + scheduler)", "workers", "nats-server"]
        hc = Table(title=f"HTTP, {args.http_conns} connections: CPU per request (µs, medians; wrk itself not counted)")
        hc.add_column("endpoint")
        for nme in names + ["sum", "machine busy"]:
            hc.add_column(nme, justify="right")
        for which in ("echo", "bridge"):
            rows_ = http["cpu"][which]
            per = {nme: med([x["per_request_us"].get(nme, 0.0) for x in rows_]) for nme in names}
            hc.add_row(which, *(f"{per[nme]:,.0f}" for nme in names), f"{sum(per.values()):,.0f}",
                       f"{med([x['machine_util'] for x in rows_]):.0%}")
        console.print(hc)
    if http.get("bridge", {}).get("conc"):
        b = http["bridge"]
        console.print(f"[dim]Go P2PFaaS (REFERENCE.md, earlier run, hey, in-memory queue): sequential "
                      f"{GO_P2PFAAS['seq_rps']:,.0f} req/s, 32 concurrent {GO_P2PFAAS['c32_rps']:,.0f} req/s; "
                      f"our bridge here: 1 conn {med([r['rps'] for r in b['seq']]):,.0f} req/s, "
                      f"{args.http_conns} conns {med([r['rps'] for r in b['conc']]):,.0f} req/s (wrk)[/dim]")
    errors = sum(r["errors"] for side in results["p2pfaas"].values() for ph in side.values() for r in ph)
    if errors:
        console.print(f"[yellow]p2pfaas path errors during timed windows: {errors}[/yellow]")
    for runtime, prof in (results.get("profile") or {}).items():
        if not prof:
            continue
        console.print(f"[bold]profile ({runtime}), {args.inflight} in flight[/bold]: "
                      f"{prof.get('rps_while_profiling', 0):,.0f} req/s while profiling; nats-server carried "
                      f"{prof.get('messages_per_request_total', 0)} messages per request (raw request/reply: 2): "
                      + ", ".join(f"{k} {v}" for k, v in sorted(prof.get("messages_per_request", {}).items(),
                                                               key=lambda x: -x[1])))
        for kind in ("node host", "workers"):
            p = prof.get(kind)
            if not p or not p.get("samples"):
                continue
            console.print(f"  {kind} ({p['samples']} GIL samples) — inclusive: "
                          + "; ".join(f"{f.split(' (')[0]} {pct}%" for f, pct in p["incl_top"][:14]))
            console.print(f"  {kind} — self: "
                          + "; ".join(f"{f.split(' (')[0]} {pct}%" for f, pct in p["self_top"][:10]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Raw NATS request/reply vs the durable p2pfaas invocation path, and the HTTP bridge vs a "
                    "bare ASGI echo, measured side by side in one run (DESIGN.md §7 targets).")
    p.add_argument("--quick", action="store_true", help="short run (1 rep, short phases; ~40 s)")
    p.add_argument("--json", metavar="OUT", help="write all measurements (per rep) and the table rows as JSON")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every phase (default 3)")
    p.add_argument("--seq-s", type=float, default=2.0, help="seconds per sequential-latency phase (default 2)")
    p.add_argument("--thr-s", type=float, default=3.0, help="seconds per throughput phase (default 3)")
    p.add_argument("--warmup-s", type=float, default=0.5, help="untimed seconds before each phase (default 0.5)")
    p.add_argument("--inflight", type=int, default=200, help="requests in flight in throughput phases (default 200)")
    p.add_argument("--payload-bytes", type=int, default=16, help="request payload size (default 16)")
    p.add_argument("--k", type=int, default=8, help="node's K (worker count, default 8)")
    p.add_argument("--queue", type=int, default=10_000, help="node's queue length (default 10000)")
    p.add_argument("--runtimes", default="process,inprocess", help="worker runtimes to measure (default both)")
    p.add_argument("--http-runtime", default="process", help="runtime of the node behind the HTTP bridge")
    p.add_argument("--http-conns", type=int, default=32, help="wrk connections for HTTP throughput (default 32)")
    p.add_argument("--no-http", action="store_true", help="skip the HTTP comparison")
    p.add_argument("--no-nats", action="store_true", help="skip the NATS comparison (HTTP only)")
    p.add_argument("--profile", metavar="DIR",
                   help="also py-spy the node host (+ workers) under load; collapsed stacks + summary in DIR")
    args = p.parse_args(argv)
    args.runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    for r in args.runtimes:
        if r not in ("process", "inprocess"):
            p.error(f"unknown runtime {r!r}")
    if args.quick:
        args.reps, args.seq_s, args.thr_s, args.warmup_s = 1, 1.0, 1.5, 0.3
    if args.profile and Path(args.profile).exists() and not Path(args.profile).is_dir():
        p.error(f"--profile {args.profile}: exists and is not a directory")
    if args.no_nats and (args.no_http or args.http_runtime not in args.runtimes):
        p.error("--no-nats needs the HTTP comparison (and --http-runtime among --runtimes)")
    if args.reps < 1 or args.inflight < 1 or args.k < 1:
        p.error("--reps, --inflight and --k must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 140)
    started = time.monotonic()
    try:
        results = asyncio.run(orchestrate(args, console))
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("[yellow]interrupted; everything it started was stopped[/yellow]")
        return 130
    results["rows"] = build_rows(results, args)
    results["elapsed_s"] = time.monotonic() - started
    render(results, args, console)
    console.print(f"[dim]total {results['elapsed_s']:.0f} s; command: {' '.join([Path(sys.executable).name, *sys.argv])}[/dim]")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
        console.print(f"[dim]JSON written to {args.json}[/dim]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
