"""Slow and oversized clients against a node's HTTP bridge (issue 25): what one hostile client
costs the others.

Run: .venv/bin/python bench/slow_clients.py [--quick] [--json OUT] [--tree old=/tmp/base --tree new=.]

Per tree (a checkout of p2pfaas, default this one; its server runs with PYTHONPATH and cwd = the
tree), on one nats-server (its own, or ``--nats-url``):

1. **the server**, its own process: a node (K=4 process workers) with its HTTP bridge in the same
   process (``p2pfaas.parts.start_http_bridge`` with the node's door: what ``up`` runs);
2. ``--rounds`` rounds of
   * **idle**: sequential ``POST /function/echo`` from 127.0.0.1, on one keep-alive connection and
     then on a new connection per request;
   * **the attack**: a process bound to 127.0.0.2, at nice ``--nice`` (as if on a machine of its
     own), holds ``--slow`` slow-header connections (a request line, then a header line every
     ``--trickle-s``; one the server closes is opened again ``--retry-s`` later) and ``--oversized``
     connections that each send an endless header (64 KiB writes, up to 100 MB, until the server
     closes it; then a new one at once);
   * **under attack**, once every slow connection was tried and ``--settle-s`` passed: the same
     sequential requests, the server's RSS sampled every 0.1 s, ``/healthz`` and the edge's counts
     in ``/metrics``; then the attacker stops;
3. the server's RSS a second after the last round.

Latencies are pooled over the rounds (idle and attack alternate, so that a busy moment of a shared
machine falls on both). Verdict (issue 25's target): under attack, p99 within 2x its idle value in
both modes, every request answered 200, ``/healthz`` 200, and the server's RSS peak within
``--rss-mb`` of its idle value. bench/README.md has a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ATTACKER = "127.0.0.2"
REQUEST = b"POST /function/echo HTTP/1.1\r\nHost: bench\r\nContent-Length: 5\r\n\r\nhello"
CLOSING_REQUEST = b"POST /function/echo HTTP/1.1\r\nHost: bench\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
REQUEST_TIMEOUT_S = 5.0     # a request not answered within this counts as an error of this latency
OVERSIZED_BYTES = 100 * 1024 * 1024


def raise_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def open_files_limit(pid: int) -> int | None:
    """A process's soft limit of open files (the bridge raises its own when it is low)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    return None


# ---------------------------------------------------------------------------------------------
# the server: a node and its HTTP bridge in one process (run with the tree's PYTHONPATH)
# ---------------------------------------------------------------------------------------------
async def serve(args) -> None:
    from broker.messages import NodeConfiguration, SchedulerConfiguration
    from nodes.node import Node
    from nodes.settings import NodeSettings
    from p2pfaas.parts import HttpBridgeSettings, start_http_bridge, stop_http_bridge

    settings = NodeSettings(
        node_id="n1", nats_url=args.nats_url, prefix=args.prefix, data_dir=Path(args.data_dir), runtime="process",
        learner=False, initial=NodeConfiguration(parallel_running_functions_max=args.k, queue_length_max=100),
        initial_scheduler=SchedulerConfiguration(name="NoScheduler", parameters=["false"]))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Node(settings) as node:
        assert node.pool is not None and node.scheduler is not None
        await node.pool.wait_ready(90)
        bridge = await start_http_bridge(HttpBridgeSettings(node="n1", nats_url=args.nats_url, port=args.port,
                                                           prefix=args.prefix), door=node.ingress.door)
        print(f"READY {os.getpid()}", flush=True)
        await stop.wait()
        await stop_http_bridge(bridge)


# ---------------------------------------------------------------------------------------------
# the attacker (its own process): slow-header and oversized-header connections from one address
# ---------------------------------------------------------------------------------------------
class Slow(asyncio.Protocol):
    def __init__(self, stats: dict) -> None:
        self.stats, self.transport, self.answered, self.closed = stats, None, b"", False

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(b"GET /healthz HTTP/1.1\r\nHost: bench\r\n")

    def data_received(self, data: bytes) -> None:
        self.answered += data[:64]

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.stats["refused_503" if self.answered.startswith(b"HTTP/1.1 503") else
                   "answered_other" if self.answered else "cut"] += 1


async def attack(args) -> None:
    raise_file_limit()
    os.nice(args.nice)
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    stats = {"slow_attempts": 0, "connect_errors": 0, "refused_503": 0, "answered_other": 0, "cut": 0,
             "oversized_connections": 0, "oversized_bytes": 0, "oversized_max_bytes": 0}
    gate = asyncio.Semaphore(256)   # connects in flight at once
    stopping = asyncio.Event()

    async def open_slow() -> Slow | None:
        async with gate:
            stats["slow_attempts"] += 1
            try:
                _, proto = await loop.create_connection(lambda: Slow(stats), "127.0.0.1", args.port,
                                                        local_addr=(args.address, 0))
                return proto
            except OSError:
                stats["connect_errors"] += 1
                return None

    async def slow_slot() -> None:
        """One of the ``--slow`` connections: trickles a header line; opened again when closed."""
        while not stopping.is_set():
            proto = await open_slow()
            while proto is not None and not proto.closed and not stopping.is_set():
                await asyncio.sleep(args.trickle_s)
                if not proto.closed:
                    proto.transport.write(b"X-Slow: 1\r\n")
            if proto is not None and not proto.closed:
                proto.transport.abort()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), args.retry_s)

    async def oversized() -> None:
        chunk = b"a" * 65536
        while not stopping.is_set():
            stats["oversized_connections"] += 1
            sent = 0
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", args.port, local_addr=(args.address, 0))
                writer.write(b"POST /function/echo HTTP/1.1\r\nHost: bench\r\nX-Oversized: ")
                while sent < OVERSIZED_BYTES and not stopping.is_set():
                    writer.write(chunk)
                    await writer.drain()
                    sent += len(chunk)
                writer.close()
            except OSError:
                pass
            stats["oversized_bytes"] += sent
            stats["oversized_max_bytes"] = max(stats["oversized_max_bytes"], sent)

    slots = [asyncio.create_task(slow_slot()) for _ in range(args.slow)]
    big = [asyncio.create_task(oversized()) for _ in range(args.oversized)]
    while stats["slow_attempts"] < args.slow:
        await asyncio.sleep(0.05)
    print("READY " + json.dumps(stats), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)   # the orchestrator says stop
    stopping.set()
    await asyncio.wait(slots + big, timeout=10)
    stats["elapsed_s"] = time.monotonic() - started
    print("STATS " + json.dumps(stats), flush=True)


# ---------------------------------------------------------------------------------------------
# the orchestrator: measures from 127.0.0.1
# ---------------------------------------------------------------------------------------------
async def read_response(reader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(head[9:12])


async def sequential(port: int, n: int, keep_alive: bool, phase_s: float) -> dict:
    """``n`` requests one after another (for at most ``phase_s``): on one connection, or each on a
    new one. Their latencies (a failed one counts with the time it took) and statuses."""
    latencies, statuses, conn = [], {}, None
    end = time.monotonic() + phase_s
    for _ in range(n):
        if time.monotonic() > end:
            statuses["not sent (phase over)"] = statuses.get("not sent (phase over)", 0) + 1
            continue
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", port)
                reader, writer = conn
                writer.write(REQUEST if keep_alive else CLOSING_REQUEST)
                status = await read_response(reader)
            if not keep_alive:
                writer.close()
                conn = None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
            status = type(exc).__name__
            if conn is not None:
                conn[1].close()
            conn = None
        latencies.append(time.perf_counter() - t0)
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    if conn is not None:
        conn[1].close()
    return {"latencies": latencies, "statuses": statuses}


def pooled(phases: list[dict]) -> dict:
    latencies = [x for phase in phases for x in phase["latencies"]]
    statuses: dict[str, int] = {}
    for phase in phases:
        for status, count in phase["statuses"].items():
            statuses[status] = statuses.get(status, 0) + count
    return {"n": len(latencies), "p50_ms": percentile(latencies, 0.5) * 1e3, "p99_ms": percentile(latencies, 0.99) * 1e3,
            "max_ms": max(latencies, default=float("nan")) * 1e3, "statuses": statuses,
            "p99_ms_per_round": [percentile(phase["latencies"], 0.99) * 1e3 for phase in phases]}


async def http_get(port: int, path: str) -> tuple[int | str, bytes]:
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
            data = await reader.read()
            writer.close()
        return int(data[9:12]), data.partition(b"\r\n\r\n")[2]
    except (OSError, TimeoutError, ValueError) as exc:
        return type(exc).__name__, b""


def edge_metrics(text: bytes) -> dict:
    out = {}
    for line in text.decode(errors="replace").splitlines():
        if line.startswith(("p2pfaas_http_refused_total{", "p2pfaas_http_connections ")):
            name, value = line.rsplit(" ", 1)
            out[name.replace("p2pfaas_http_refused_total", "refused")] = float(value)
    return out


async def line_from(proc, prefix: str, timeout: float) -> str:
    while True:
        raw = await asyncio.wait_for(proc.stdout.readline(), timeout)
        if not raw:
            raise RuntimeError(f"process {proc.pid} ended before {prefix}")
        line = raw.decode().strip()
        if line.startswith(prefix):
            return line[len(prefix):].strip()


async def measure(args, tree: Path, nats_url: str, prefix: str, tmp: Path) -> dict:
    """One tree: its server, then ``--rounds`` rounds of (idle phase, attack, phase under attack)."""
    from broker.embedded import die_with_parent_preexec, free_port
    from probes import cpu_seconds

    port = free_port()
    script = str(Path(__file__).resolve())
    server = await asyncio.create_subprocess_exec(
        sys.executable, script, "serve", "--nats-url", nats_url, "--prefix", prefix, "--port", str(port),
        "--k", str(args.k), "--data-dir", str(tmp / f"node-{port}"), cwd=str(tree),
        env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
        preexec_fn=die_with_parent_preexec)
    attacker = None
    modes = {"keep_alive": (args.requests, True), "new_connection": (args.new_connections, False)}
    phases: dict = {phase: {mode: [] for mode in modes} for phase in ("idle", "attack")}
    out: dict = {"healthz_under_attack": [], "ramp_s": [], "attacker": {}, "cpu_under_attack": []}
    try:
        pid = int(await line_from(server, "READY", 120))
        out["server_open_files"] = open_files_limit(pid)
        await sequential(port, args.warmup, True, args.phase_s)
        out["rss_idle_mb"] = rss_mb(pid)
        peak = [out["rss_idle_mb"]]
        for _ in range(args.rounds):
            for mode, (n, keep_alive) in modes.items():
                phases["idle"][mode].append(await sequential(port, n // args.rounds, keep_alive, args.phase_s))
            attacker = await asyncio.create_subprocess_exec(
                sys.executable, script, "attack", "--port", str(port), "--address", args.address, "--slow", str(args.slow),
                "--oversized", str(args.oversized), "--trickle-s", str(args.trickle_s), "--retry-s", str(args.retry_s),
                "--nice", str(args.nice), stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=die_with_parent_preexec)
            ramp_t0 = time.monotonic()
            await line_from(attacker, "READY", 120)
            out["ramp_s"].append(time.monotonic() - ramp_t0)

            async def sample() -> None:
                while True:
                    peak[0] = max(peak[0], rss_mb(pid))
                    await asyncio.sleep(0.1)

            sampler = asyncio.create_task(sample())
            await asyncio.sleep(args.settle_s)
            profiler = None
            if args.profile:
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                profiler = await asyncio.create_subprocess_exec(
                    str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--format", "raw", "-o",
                    str(Path(args.profile) / f"server-{tree.name}-{port}-{len(out['ramp_s'])}.txt"),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cpu0, t0 = (cpu_seconds(pid), cpu_seconds(attacker.pid)), time.monotonic()
            for mode, (n, keep_alive) in modes.items():
                phases["attack"][mode].append(await sequential(port, n // args.rounds, keep_alive, args.phase_s))
            elapsed = time.monotonic() - t0
            out["cpu_under_attack"].append({"server": (cpu_seconds(pid) - cpu0[0]) / elapsed,
                                            "attacker": (cpu_seconds(attacker.pid) - cpu0[1]) / elapsed})
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                await profiler.wait()
            out["healthz_under_attack"].append((await http_get(port, "/healthz"))[0])
            out["edge_under_attack"] = edge_metrics((await http_get(port, "/metrics"))[1])
            sampler.cancel()
            attacker.stdin.write(b"stop\n")
            await attacker.stdin.drain()
            for key, value in json.loads(await line_from(attacker, "STATS", 30)).items():
                out["attacker"][key] = max(value, out["attacker"].get(key, 0)) if key.endswith("max_bytes") else \
                    out["attacker"].get(key, 0) + value
            await attacker.wait()
            attacker = None
        out["rss_peak_mb"] = peak[0]
        await asyncio.sleep(1.0)
        out["rss_after_mb"] = rss_mb(pid)
        out["edge_after"] = edge_metrics((await http_get(port, "/metrics"))[1])
        for phase, by_mode in phases.items():
            out[phase] = {mode: pooled(runs) for mode, runs in by_mode.items()}
        return out
    finally:
        for proc in (attacker, server):
            if proc is not None and proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 20)
                except asyncio.TimeoutError:
                    proc.kill()
                    await proc.wait()


def verdict(run: dict, rss_mb_limit: float) -> dict:
    checks = {}
    for mode in ("keep_alive", "new_connection"):
        idle, attack = run["idle"][mode], run["attack"][mode]
        checks[f"{mode}_p99_within_2x"] = attack["p99_ms"] <= 2 * idle["p99_ms"]
        checks[f"{mode}_all_200"] = set(attack["statuses"]) == {"200"}
    checks["rss_bounded"] = run["rss_peak_mb"] - run["rss_idle_mb"] <= rss_mb_limit
    checks["healthz_200"] = set(run["healthz_under_attack"]) == {200}
    return checks


def report(runs: dict, args) -> None:
    print(f"\nslow clients (issue 25): {args.slow} slow-header + {args.oversized} oversized-header connections "
          f"from {args.address}; sequential POST /function/echo from 127.0.0.1 ({args.requests} on one keep-alive "
          f"connection, {args.new_connections} on new connections per phase), {args.rounds} rounds of idle then "
          f"under attack; latencies pooled over the rounds\n")
    header = f"{'tree':<8} {'phase':<7} {'mode':<15} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>8}  {'p99 per round':<22} statuses"
    print(header)
    print("-" * len(header))
    for name, run in runs.items():
        for phase in ("idle", "attack"):
            for mode in ("keep_alive", "new_connection"):
                r = run[phase][mode]
                rounds = " ".join(f"{x:.1f}" for x in r["p99_ms_per_round"])
                print(f"{name:<8} {phase:<7} {mode:<15} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['max_ms']:>8.1f}  "
                      f"{rounds:<22} {r['statuses']}")
    print()
    for name, run in runs.items():
        server_cpu = " ".join(f"{c['server']:.0%}" for c in run["cpu_under_attack"])
        attacker_cpu = " ".join(f"{c['attacker']:.0%}" for c in run["cpu_under_attack"])
        print(f"{name}: server RSS idle {run['rss_idle_mb']:.1f} MB, peak under attack {run['rss_peak_mb']:.1f} MB, "
              f"after {run['rss_after_mb']:.1f} MB (open files allowed: {run['server_open_files']}); /healthz under attack {run['healthz_under_attack']}; ramp "
              f"{max(run['ramp_s']):.1f} s at most; CPU while measured under attack (share of a core, per round): server "
              f"{server_cpu}, attacker {attacker_cpu}")
        a = run["attacker"]
        print(f"  attacker, {a['elapsed_s']:.0f} s in all: {a['slow_attempts']:,} slow connections tried "
              f"({a['slow_attempts'] / a['elapsed_s']:,.0f}/s; {a['refused_503']:,} answered 503, {a['cut']:,} cut, "
              f"{a['answered_other']:,} answered otherwise, {a['connect_errors']:,} connect errors), "
              f"{a['oversized_connections']:,} oversized ({a['oversized_connections'] / a['elapsed_s']:,.0f}/s, "
              f"{a['oversized_bytes'] / 2**20:,.0f} MiB written, at most {a['oversized_max_bytes'] / 2**20:.1f} MiB on one)")
        print(f"  edge (/metrics) at the end of the last attack: {run.get('edge_under_attack') or 'n/a'}")
        print(f"  checks: {run['verdict']}")
    print(f"\nload average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


async def orchestrate(args) -> dict:
    raise_file_limit()
    sys.path.insert(0, str(ROOT))
    from broker.embedded import NatsServer

    tmp = Path(tempfile.mkdtemp(prefix="p2pfaas-slow-clients-"))
    server = None
    if args.nats_url:
        url = args.nats_url
    else:
        server = NatsServer(data_dir=tmp / "nats", port=None, mqtt_port=0)
        await server.start()
        url = server.url
    try:
        runs = {}
        for spec in args.tree or ["this=."]:
            name, _, directory = spec.partition("=")
            run = await measure(args, Path(directory).resolve(), url, f"{args.prefix}{name}", tmp)
            run["verdict"] = verdict(run, args.rss_mb)
            runs[name] = run
        return runs
    finally:
        if server is not None:
            await server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = p.add_subparsers(dest="mode")
    s = sub.add_parser("serve")
    s.add_argument("--nats-url", required=True)
    s.add_argument("--prefix", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--k", type=int, default=4)
    s.add_argument("--data-dir", required=True)
    a = sub.add_parser("attack")
    a.add_argument("--port", type=int, required=True)
    for target in (p, a):
        target.add_argument("--address", default=ATTACKER, help="the attacker's source address (default 127.0.0.2)")
        target.add_argument("--slow", type=int, default=5000, help="slow-header connections (default 5000)")
        target.add_argument("--oversized", type=int, default=8, help="oversized-header connections (default 8)")
        target.add_argument("--trickle-s", type=float, default=1.0, help="a slow connection's header line every (1 s)")
        target.add_argument("--retry-s", type=float, default=1.0, help="a closed slow connection is opened again after (1 s)")
        target.add_argument("--nice", type=int, default=10, help="the attacker's niceness (10): as if on a machine of its own")
    p.add_argument("--tree", action="append", help="NAME=DIR, a checkout of p2pfaas (repeatable; default this one)")
    p.add_argument("--nats-url", help="an existing nats-server (default: one of its own)")
    p.add_argument("--prefix", default="slowbench", help="subject prefix (+ the tree's name)")
    p.add_argument("--k", type=int, default=4, help="the node's K (process workers)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of idle then under attack (3)")
    p.add_argument("--requests", type=int, default=1500, help="sequential keep-alive requests in all idle (and attack) phases")
    p.add_argument("--new-connections", type=int, default=600, help="the same, each on a new connection")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--phase-s", type=float, default=30.0, help="a phase's requests stop after this (the old code stalls)")
    p.add_argument("--settle-s", type=float, default=2.0, help="attack running this long before measuring")
    p.add_argument("--rss-mb", type=float, default=32.0, help="RSS growth allowed under attack (MB)")
    p.add_argument("--quick", action="store_true", help="fewer requests, shorter settling (the test's run)")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--profile", help="py-spy the server while it is measured under attack (flame graphs in this directory)")
    args = p.parse_args()
    if args.mode == "serve":
        import uvloop
        uvloop.run(serve(args))
        return
    if args.mode == "attack":
        import uvloop
        uvloop.run(attack(args))
        return
    if args.quick:
        args.requests, args.new_connections, args.warmup, args.settle_s, args.phase_s = 600, 240, 100, 1.0, 15.0
    runs = asyncio.run(orchestrate(args))
    report(runs, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    sys.exit(0 if all(all(run["verdict"].values()) for run in runs.values()) else 1)


if __name__ == "__main__":
    main()
