"""Connection storms: what ``p2pfaas up --k K`` costs nats-server when every worker connects at
once -- at start, and again when nats-server is killed and every client reconnects.

Run: .venv/bin/python bench/connect_storm.py --tree new=. --tree old=/tmp/base [--k 64] [--reps 3]

Each ``--tree NAME=DIR`` is a checkout of p2pfaas; its ``up`` runs from DIR with PYTHONPATH=DIR
(the node starts its workers with ``python -m nodes.worker``, which finds the package of the
current directory first), the trees alternating in every repetition on the same machine. One
repetition of a tree:

1. ``up --nodes 1 --k K --controller off --mqtt off`` on free ports, a fresh data dir;
2. **start**: seconds from spawning ``up`` until the pool's telemetry says K workers ready and
   none starting, and the CPU seconds nats-server used until then;
3. **storm**: nats-server is killed (SIGKILL; ``up``'s supervisor starts it again on the same
   port), and over the next ``--storm-window`` seconds the new nats-server's CPU seconds and
   the longest "Readloop processing time" it logs (the time one client's commands held it);
   then seconds from the kill until a round of K concurrent calls (``sleep 0.5``, one per
   worker) all answer 200 within 2 s of each other's start -- every worker connected again.

Printed: the median of every figure per tree, and each tree's ratio to the first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import nats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from probes import cpu_seconds  # noqa: E402
from soak import tree  # noqa: E402
from broker.embedded import free_port  # noqa: E402

READLOOP = re.compile(r"Readloop processing time: ([0-9.]+)(ms|s|µs)")


def nats_server_pid(up_pid: int) -> int | None:
    return next((pid for pid, name in tree(up_pid).items() if name == "nats-server"), None)


def longest_readloop_s(log: Path, after: int) -> float:
    """The longest read-loop time nats-server logged past byte ``after`` of its log."""
    with log.open("rb") as f:
        f.seek(after)
        text = f.read().decode(errors="replace")
    scale = {"s": 1.0, "ms": 1e-3, "µs": 1e-6}
    return max((float(v) * scale[u] for v, u in READLOOP.findall(text)), default=0.0)


async def until_all_ready(nats_url: str, operator: tuple[str, str], k: int, prefix: str, timeout_s: float) -> None:
    nc = await nats.connect(nats_url, user=operator[0], password=operator[1], connect_timeout=5)
    done = asyncio.get_running_loop().create_future()

    async def on_sample(msg) -> None:
        sample = json.loads(msg.data)
        if sample["workers_ready"] >= k and sample["workers_starting"] == 0 and not done.done():
            done.set_result(None)

    await nc.subscribe(f"{prefix}.n1.telemetry.default", cb=on_sample)
    try:
        async with asyncio.timeout(timeout_s):
            await done
    finally:
        await nc.close()


async def until_every_worker_answers(url: str, k: int, timeout_s: float) -> None:
    """Rounds of K concurrent ``sleep 0.5`` calls until one round is all 200 within 2 s: K calls
    of half a second end together only when K workers run them."""
    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=k + 8)) as http:
        async with asyncio.timeout(timeout_s):
            while True:
                started = time.monotonic()
                try:
                    answers = await asyncio.gather(*(http.post(f"{url}/function/sleep", content=b"0.5")
                                                     for _ in range(k)))
                    if all(a.status_code == 200 for a in answers) and time.monotonic() - started < 2.0:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)


def one(tree: Path, k: int, storm_window_s: float) -> dict[str, float]:
    data_dir = Path(tempfile.mkdtemp(prefix="p2pfaas-storm-"))
    nats_port = free_port()
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.monotonic()
    up = subprocess.Popen([sys.executable, "-m", "p2pfaas.cli", "up", "--nodes", "1", "--k", str(k),
                           "--controller", "off", "--mqtt", "off", "--nats-port", str(nats_port),
                           "--http-port", str(free_port()), "--data-dir", str(data_dir)],
                          cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (data_dir / "endpoints.json").exists():
            if up.poll() is not None or time.monotonic() - t0 > 300:
                sys.exit(f"{tree}: p2pfaas up did not come up (logs in {data_dir / 'logs'})")
            time.sleep(0.1)
        endpoints = json.loads((data_dir / "endpoints.json").read_text())
        services = json.loads((data_dir / "auth" / "services.json").read_text())
        operator = ("operator", services["operator"])
        asyncio.run(until_all_ready(endpoints["nats_url"], operator, k, endpoints["prefix"], 300))
        start_s = time.monotonic() - t0
        server = nats_server_pid(up.pid)
        start_cpu = cpu_seconds(server)

        log = data_dir / "logs" / "nats-server.log"
        offset = log.stat().st_size
        killed = time.monotonic()
        os.kill(server, signal.SIGKILL)
        while (restarted := nats_server_pid(up.pid)) in (None, server):
            if time.monotonic() - killed > 60:
                sys.exit(f"{tree}: nats-server was not started again")
            time.sleep(0.05)

        async def storm() -> tuple[float, float]:
            answering = asyncio.create_task(until_every_worker_answers(endpoints["http"]["n1"], k, 120))
            answering.add_done_callback(lambda _: answered.append(time.monotonic() - killed))
            await asyncio.sleep(max(0.0, storm_window_s - (time.monotonic() - killed)))
            cpu = cpu_seconds(restarted)
            await answering
            return cpu, answered[0]

        answered: list[float] = []
        storm_cpu, all_workers_s = asyncio.run(storm())
        return {"start_s": start_s, "start_server_cpu_s": start_cpu, "storm_server_cpu_s": storm_cpu,
                "storm_longest_readloop_s": longest_readloop_s(log, offset), "storm_all_workers_s": all_workers_s}
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            up.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR",
                        help="a p2pfaas checkout to measure (repeat; the first is the baseline)")
    parser.add_argument("--k", type=int, default=64, help="worker processes of the node")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--storm-window", type=float, default=15.0,
                        help="seconds after the kill over which nats-server's CPU is counted")
    parser.add_argument("--json", type=Path, help="write every repetition here")
    args = parser.parse_args()
    trees = [(name, Path(path).resolve()) for name, path in (t.split("=", 1) for t in args.tree)]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for rep in range(args.reps):
        for name, checkout in trees:
            r = one(checkout, args.k, args.storm_window)
            results[name].append(r)
            print(f"rep {rep + 1} {name}: " + ", ".join(f"{key} {value:.2f}" for key, value in r.items()), flush=True)
    keys = list(next(iter(results.values()))[0])
    base = trees[0][0]
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in keys} for name, rs in results.items()}
    print(f"\nK={args.k}, medians of {args.reps} (ratio to {base})")
    print(f"{'':28}" + "".join(f"{name:>20}" for name, _ in trees))
    for key in keys:
        cells = "".join(f"{medians[name][key]:>11.2f} ({medians[name][key] / medians[base][key]:4.2f}x)"
                        if medians[base][key] else f"{medians[name][key]:>20.2f}" for name, _ in trees)
        print(f"{key:28}{cells}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
