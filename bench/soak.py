"""Soak: ``p2pfaas up`` under a steady load for minutes, with the memory of every process sampled.

Run: .venv/bin/python bench/soak.py [--k 64] [--minutes 10] [--rate 200] [--json OUT]
     .venv/bin/python bench/soak.py --k 16 --fn sleep --payload 0.1 --rate 80 --minutes 30   # half capacity

With ``--fn sleep --payload S`` every call holds a slot S seconds, so the node's capacity is
K / S calls per second and ``--rate`` says how full it runs (K 16, 0.1 s, 80/s: half).

It starts its own ``p2pfaas up`` (one node, the controller and MQTT off, free ports, a temporary
data dir), drives an open-loop load of direct HTTP calls (echo) at ``--rate`` per second, and
every ``--sample`` seconds records the RSS of every process of the stack (from /proc) and the
calls answered/failed. At the end it prints one table: calls by status, latency percentiles,
the restarts the supervisor made (a lost broker shows there), and each process's RSS at the
first and last sample with the change. Pass: no restart, no call lost, every RSS within
``--rss-tolerance`` (10 %) of its first sample after the warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.embedded import free_port  # noqa: E402


def tree(pid: int) -> dict[int, str]:
    """Every descendant of ``pid``: {pid: short command line}."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    children: dict[int, list[tuple[int, str]]] = {}
    for line in out.splitlines():
        p, pp, args = line.strip().split(None, 2)
        children.setdefault(int(pp), []).append((int(p), args))
    found, todo = {}, [pid]
    while todo:
        for child, args in children.get(todo.pop(), []):
            found[child] = name_of(args)
            todo.append(child)
    return found


def name_of(args: str) -> str:
    for marker, name in (("nats-server", "nats-server"), ("nodes.worker", "worker"), ("cli node", "node"),
                         ("bridge http", "http-bridge"), ("bridge mqtt", "mqtt-bridge"), ("controller", "controller")):
        if marker in args:
            return name
    return args[:40]


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


async def drive(url: str, rate: float, seconds: float, stats: Counter, latencies: list[float],
                fn: str = "echo", payload: bytes = b"soak") -> None:
    """Open loop: a call every 1/rate s, whatever the previous ones do (bounded in flight)."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        in_flight: set[asyncio.Task] = set()

        async def one() -> None:
            started = time.perf_counter()
            try:
                r = await http.post(f"{url}/function/{fn}", content=payload)
                stats[r.status_code] += 1
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - started)
            except httpx.HTTPError as exc:
                stats[type(exc).__name__] += 1

        start = time.monotonic()
        n = 0
        while (elapsed := time.monotonic() - start) < seconds:
            n += 1
            if len(in_flight) < 2048:
                task = asyncio.create_task(one())
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            else:
                stats["not sent (2048 in flight)"] += 1
            await asyncio.sleep(max(0.0, n / rate - elapsed))
        await asyncio.gather(*in_flight)


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=32, help="K of the node (worker processes)")
    parser.add_argument("--queue", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0, help="calls per second (open loop)")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between RSS samples")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the reference RSS sample")
    parser.add_argument("--rss-tolerance", type=float, default=0.10)
    parser.add_argument("--fn", default="echo", help="function called (echo; sleep holds a slot --payload seconds)")
    parser.add_argument("--payload", default="soak", help="the call's body (for sleep: seconds)")
    parser.add_argument("--json", type=Path, help="write every sample here")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="p2pfaas-soak-"))
    http_port = free_port()
    up = subprocess.Popen([sys.executable, "-m", "p2pfaas.cli", "up", "--nodes", "1", "--k", str(args.k),
                           "--queue", str(args.queue), "--controller", "off", "--mqtt", "off",
                           "--nats-port", str(free_port()), "--http-port", str(http_port),
                           "--data-dir", str(data_dir)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    try:
        deadline = time.monotonic() + 300
        while not (data_dir / "endpoints.json").exists():
            if up.poll() is not None or time.monotonic() > deadline:
                print(up.stdout.read() if up.stdout else "", file=sys.stderr)
                sys.exit("p2pfaas up did not come up")
            time.sleep(0.2)
        url = json.loads((data_dir / "endpoints.json").read_text())["http"]["n1"]
        load_note = ""
        if args.fn == "sleep":
            capacity = args.k / float(args.payload)
            load_note = f" ({args.rate / capacity:.0%} of the node's capacity of {capacity:g} calls/s)"
        print(f"up with K={args.k}: {url}; {args.rate:g} calls/s of {args.fn}{load_note} for {args.minutes:g} min", flush=True)

        stats: Counter = Counter()
        latencies: list[float] = []
        samples: list[dict] = []
        seconds = args.minutes * 60

        async def run() -> None:
            load = asyncio.create_task(drive(url, args.rate, seconds, stats, latencies, args.fn, args.payload.encode()))
            start = time.monotonic()
            while not load.done():
                procs = tree(up.pid)
                samples.append({"t": round(time.monotonic() - start, 1), "calls": dict(stats),
                                "rss_kib": {f"{name}:{pid}": rss_kib(pid) for pid, name in procs.items()}})
                total = sum(v for v in samples[-1]["rss_kib"].values() if v)
                print(f"  t={samples[-1]['t']:6.0f} s  answered {stats[200]:8d}  other {sum(stats.values()) - stats[200]:5d}  "
                      f"RSS {total / 1024:8.1f} MiB over {len(procs)} processes", flush=True)
                await asyncio.wait({load}, timeout=args.sample)
            await load

        asyncio.run(run())
    finally:
        up.send_signal(signal.SIGINT)
        try:
            out, _ = up.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            up.kill()
            out = ""
    restarts = [line for line in (out or "").splitlines() if "restart" in line]
    log_dir = data_dir / "logs"
    supervisor_notes = [line for f in log_dir.glob("*.log") for line in f.read_text(errors="replace").splitlines()
                        if "restarting" in line] if log_dir.exists() else []
    reference = next((s for s in samples if s["t"] >= args.warmup), samples[0])
    last = samples[-1]
    print(f"\ncalls: {dict(stats)}")
    print(f"latency of answered calls: p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
          f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms, mean {statistics.fmean(latencies) * 1000 if latencies else float('nan'):.1f} ms")
    print(f"supervisor restarts: {len(restarts) + len(supervisor_notes)}")
    print(f"\n{'process':<28} {'RSS at ' + str(reference['t']) + ' s':>16} {'RSS at end':>12} {'change':>8}")
    worst = 0.0
    groups: dict[str, list[tuple[int, int]]] = {}
    for key, first in sorted(reference["rss_kib"].items()):
        end = last["rss_kib"].get(key)
        if not first or not end:
            continue
        worst = max(worst, abs(end - first) / first)
        groups.setdefault(key.split(":")[0], []).append((first, end))
    for name, pairs in groups.items():   # workers summed: one row per kind of process
        first, end = sum(a for a, _ in pairs), sum(b for _, b in pairs)
        label = f"{name} x{len(pairs)}" if len(pairs) > 1 else name
        print(f"{label:<28} {first / 1024:13.1f} MiB {end / 1024:9.1f} MiB {(end - first) / first:+8.1%}")
    lost = sum(v for k, v in stats.items() if k != 200)
    verdict = "PASS" if not restarts and not supervisor_notes and lost == 0 and worst <= args.rss_tolerance else "MISS"
    print(f"\n{verdict}: restarts {len(restarts) + len(supervisor_notes)}, calls failed {lost}, "
          f"largest RSS change of one process {worst:.1%} (tolerance {args.rss_tolerance:.0%})")
    if args.json:
        args.json.write_text(json.dumps({"samples": samples, "calls": dict(stats), "verdict": verdict}, indent=1))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
