"""P2P scheduling across emulated machines: 12 devices (K=2, no queue), each in its own network
namespace and joined to a hub with the documented commands, under a Poisson load whose per-device
Erlangs are drawn from a seed of their own (none of docs/p2p.md's); every algorithm sees the
same arrivals, sent over HTTP from machine c1 to each device's :18080 (``sleep`` with exponential
service times). Its rejection rate is set next to Erlang-B(nK, sum A) (the pooled bound: one
24-slot machine) and the local-only value (each device alone).

  .venv/bin/python bench/edge_p2p.py                          # 12 devices, 60 s per algorithm (~15 min)
  .venv/bin/python bench/edge_p2p.py --devices 6 --seconds 30 --algorithms PowerOfNScheduler:2,1,true,1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "_support"))
sys.path.insert(0, str(ROOT / "bench"))

from edge import peers, set_scheduler, until  # noqa: E402
from edge_lab import EdgeLab  # noqa: E402
from netlab import why_not  # noqa: E402
from nodes.scheduler.queueing import erlang_b  # noqa: E402

# P2PFaaS's default PowerOfN, more probes, and every peer probed with more hops allowed (a call the
# peer cannot take after all, another node's forward having taken its slot, tries again)
DEFAULT = ["NoScheduler:true", "PowerOfNScheduler:1,2,true,1", "PowerOfNScheduler:3,2,true,1",
           "PowerOfNScheduler:11,2,true,2", "PowerOfNScheduler:11,2,true,4"]


def loads_for(devices: int, seed: int, mean: float) -> list[float]:
    rng = random.Random(seed)
    return [round(mean * rng.uniform(0.5, 1.5), 3) for _ in range(devices)]


def arrivals(loads: list[float], mean_s: float, seconds: float, seed: int) -> list[tuple[float, int, float]]:
    rng = random.Random(seed + 1)
    out = []
    for node, load in enumerate(loads):
        t = rng.expovariate(load / mean_s)
        while t < seconds:
            out.append((t, node, rng.expovariate(1 / mean_s)))
            t += rng.expovariate(load / mean_s)
    return sorted(out)


class Http1:
    """The least HTTP/1.1 client an open-loop load needs: idle keep-alive connections per host and
    nothing per call but the call (httpx's pool bookkeeping grew with the calls in flight and made
    the load generator, not the devices, the bottleneck at ~100 calls/s)."""

    def __init__(self) -> None:
        self.idle: dict[tuple[str, int], list] = {}

    async def post(self, host: str, port: int, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        idle = self.idle.setdefault((host, port), [])
        if idle:
            try:
                return await self._post(host, port, path, body, idle, idle.pop())
            except (ConnectionError, IndexError):   # the server had closed that idle connection: a new one
                pass
        return await self._post(host, port, path, body, idle, await asyncio.open_connection(host, port))

    async def _post(self, host: str, port: int, path: str, body: bytes, idle: list,
                    connection) -> tuple[int, dict[str, str], bytes]:
        reader, writer = connection
        try:
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            status = int((await reader.readline()).split()[1])
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            data = await reader.readexactly(int(headers.get("content-length", "0")))
        except BaseException:
            writer.close()
            raise
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            idle.append((reader, writer))
        return status, headers, data


def drive(urls: list[str], plan: list[tuple[float, int, float]]) -> list[dict]:
    """Open loop: each call at its time, whatever the others do; its answer recorded."""
    from urllib.parse import urlsplit

    targets = [(urlsplit(u).hostname, urlsplit(u).port) for u in urls]

    async def run() -> list[dict]:
        results: list[dict] = []
        http = Http1()
        start = time.monotonic()

        async def one(at: float, node: int, service: float) -> None:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            sent = time.monotonic()
            host, port = targets[node]
            try:
                status, headers, body = await asyncio.wait_for(
                    http.post(host, port, "/function/sleep", f"{service:.6f}".encode()), 60)
                code = json.loads(body).get("code") if status != 200 else None
                results.append({"status": status, "code": code, "hops": int(headers.get("x-p2pfaas-hops", 0)),
                                "latency": time.monotonic() - sent, "late_s": sent - start - at})
            except (OSError, asyncio.TimeoutError, ValueError, IndexError) as exc:
                results.append({"status": None, "error": repr(exc), "latency": time.monotonic() - sent})

        await asyncio.gather(*(one(*a) for a in plan))
        return results

    return asyncio.run(run())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--devices", type=int, default=12)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--mean-load", type=float, default=1.6, help="mean Erlangs per device (x 0.5-1.5 each)")
    parser.add_argument("--mean-service", type=float, default=0.2)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--algorithms", default=";".join(DEFAULT), help="Name:p1,p2;...")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--work-dir", type=Path)
    args = parser.parse_args()
    reason = why_not()
    if reason:
        print(f"cannot run: {reason}")
        return 2
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="p2pfaas-edge-p2p-"))
    devices = [f"d{i}" for i in range(1, args.devices + 1)]
    loads = loads_for(args.devices, args.seed, args.mean_load)
    plan = arrivals(loads, args.mean_service, args.seconds, args.seed)
    realised = [0.0] * args.devices
    for _, node, service in plan:
        realised[node] += service / args.seconds
    pooled = erlang_b(args.slots * args.devices, sum(realised))
    local = sum(a * erlang_b(args.slots, a) for a in realised) / sum(realised)
    print(f"{args.devices} devices, K={args.slots}, loads {loads} (realised sum {sum(realised):.2f} Erlangs); "
          f"pooled Erlang-B {pooled:.2%}, local-only {local:.2%}; {len(plan)} calls per algorithm", flush=True)
    rows = []
    with EdgeLab(work, devices, k=args.slots, queue=0) as edge:
        for device in devices:
            until(lambda: len(peers(edge, device)) == args.devices - 1, 120)
        print(f"joined in {edge.timings['join_all_s']:.1f} s", flush=True)
        urls = [edge.http(d) for d in devices]
        for spec in args.algorithms.split(";"):
            name, _, params = spec.partition(":")
            parameters = [p for p in params.split(",") if p]
            for device in devices:
                set_scheduler(edge, device, name, parameters)
            time.sleep(2)   # a heartbeat period: every view has the new loads
            results = edge.lab.call("c1", drive, urls, plan)
            rejected = sum(1 for r in results if r["status"] in (500, 503) and r.get("code") in (400, 401))
            errors = sum(1 for r in results if r["status"] != 200 and not (r["status"] in (500, 503)
                                                                             and r.get("code") in (400, 401)))
            served = [r for r in results if r["status"] == 200]
            other = {}
            for r in results:
                if r["status"] != 200 and not (r["status"] in (500, 503) and r.get("code") in (400, 401)):
                    why = f"{r['status']} {r.get('code')}" if r["status"] else r.get("error", "?")[:80]
                    other[why] = other.get(why, 0) + 1
            row = {"algorithm": f"{name}({', '.join(parameters)})", "requests": len(results), "other": other,
                   "rejected": rejected / len(results), "errors": errors,
                   "forwarded": sum(1 for r in served if r["hops"]) / max(1, len(served)),
                   "latency_p50_ms": statistics.median(r["latency"] for r in served) * 1e3 if served else None,
                   "sent_late_p99_ms": sorted(r.get("late_s", 0) for r in results)[int(0.99 * len(results))] * 1e3,
                   "vs_pooled": (rejected / len(results)) / pooled if pooled else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print("| algorithm | rejected % | x pooled | forwarded % | errors | p50 ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['algorithm']} | {r['rejected']:.2%} | {r['vs_pooled']:.2f} | {r['forwarded']:.1%} | {r['errors']} | "
              f"{r['latency_p50_ms']:.0f} |")
    print(f"| Erlang-B(K={args.slots}, A_i) local-only | {local:.2%} | {local / pooled:.2f} | | | analytic |")
    print(f"| Erlang-B(nK={args.slots * args.devices}, sum A) pooled | {pooled:.2%} | 1.00 | | | analytic |")
    if args.json:
        args.json.write_text(json.dumps({"loads": loads, "realised": realised, "pooled": pooled, "local_only": local,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
