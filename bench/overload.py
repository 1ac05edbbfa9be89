"""Overload: goodput of direct calls when more arrive than the node can run, callers with a timeout.

Run: .venv/bin/python bench/overload.py                       # both admission settings, 3 repetitions; ~3 min
     .venv/bin/python bench/overload.py --reps 1 --seconds 10 # quicker
     PYTHONPATH=/tmp/base .venv/bin/python bench/overload.py  # the same against another checkout

One node (in this process, K worker processes), its own nats-server on free ports, an open-loop
load of direct calls (``FaasClient.invoke``, as the HTTP bridge and ``p2pfaas invoke`` make them):
``--fn sleep --payload S`` holds a slot S seconds, so the node runs at most K / S calls per
second, and the load offers ``--load`` times that, every caller giving up after ``--wait``
seconds. Two admission settings: NoScheduler without loss (every call queues: what P2PFaaS's
``NoScheduler(false)`` does) and NoScheduler with loss and a queue of ``--queue`` (calls beyond
K + queue refused at once).

Per setting and repetition: *goodput* (answers 200 their callers got, per second, over the
last half of the run, after the queue filled), calls that timed out at their caller, calls
answered 504 unrun (the node saw they would end too late), calls refused at once (500/503),
and *wasted runs*: executions whose callers had given up (the node's
count of executions less the answers delivered in time). The table shows medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))   # after PYTHONPATH: another checkout given there is the one measured

from broker.client import FaasClient  # noqa: E402
from broker.connection import close_quietly, connect  # noqa: E402
from broker.embedded import NatsServer  # noqa: E402
from broker.messages import NodeConfiguration, SchedulerConfiguration  # noqa: E402
from nodes.node import Node  # noqa: E402
from nodes.settings import NodeSettings  # noqa: E402


def executions(node: Node, fn: str) -> float:
    return sum(s.value for m in node.metrics.results.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels["fn"] == fn)


async def phase(server: NatsServer, workdir: Path, args, name: str, loss: bool, queue: int, rep: int) -> dict:
    prefix = f"ov{rep}{'l' if loss else 'u'}"
    settings = NodeSettings(node_id="n1", nats_url=server.url, prefix=prefix, data_dir=workdir / prefix,
                            initial=NodeConfiguration(parallel_running_functions_max=args.k, queue_length_max=queue),
                            initial_scheduler=SchedulerConfiguration(name="NoScheduler",
                                                                     parameters=["true" if loss else "false"]),
                            learner=False)
    node = Node(settings)
    await node.start()
    nc = await connect([server.url], "overload-load")
    faas = await FaasClient(nc, "load", prefix).start()
    stats: Counter = Counter()
    good_at: list[float] = []
    try:
        await node.pool.wait_ready(60)
        capacity = args.k / float(args.payload)
        rate = args.load * capacity
        payload = args.payload.encode()
        tasks: set[asyncio.Task] = set()

        async def one() -> None:
            try:
                answer = await faas.invoke("n1", args.fn, payload, timeout_s=args.wait)
            except asyncio.TimeoutError:
                stats["timed_out"] += 1
                return
            except Exception as exc:  # the node could not answer at all: counted, not hidden
                stats[f"error {type(exc).__name__}"] += 1
                return
            if answer.status == 200:
                stats["ok"] += 1
                good_at.append(time.monotonic())
            else:
                stats[f"refused {answer.status}"] += 1

        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = 0
        while (now := loop.time()) < start + args.seconds:
            due = int((now - start) * rate) + 1
            for _ in range(due - sent):
                task = asyncio.create_task(one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            sent = due
            await asyncio.sleep(0.005)
        end = time.monotonic()
        half = end - args.seconds / 2
        if tasks:
            await asyncio.wait(tasks, timeout=args.wait + 5)
        goodput = sum(1 for t in good_at if half <= t <= end) / (args.seconds / 2)
        await asyncio.sleep(args.payload_s + 0.5)   # what the node still runs ends
        ran = executions(node, args.fn)
    finally:
        await faas.stop()
        await close_quietly(nc)
        await node.stop()
    refused = sum(v for k, v in stats.items() if k.startswith("refused") and k != "refused 504")
    return {"setting": name, "offered": sent, "capacity_per_s": capacity, "goodput_per_s": goodput,
            "ok": stats["ok"], "timed_out": stats["timed_out"], "refused": refused, "told_504": stats["refused 504"],
            "wasted_runs": max(0.0, ran - stats["ok"]), "ran": ran, "other": {k: v for k, v in stats.items()
                                                                             if k.startswith("error")}}


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=4, help="slots (default 4)")
    ap.add_argument("--fn", default="sleep", help="function (default sleep)")
    ap.add_argument("--payload", default="0.1", help="its input: seconds a call holds a slot (default 0.1)")
    ap.add_argument("--load", type=float, default=1.5, help="offered load / capacity (default 1.5)")
    ap.add_argument("--wait", type=float, default=1.0, help="seconds each caller waits (default 1)")
    ap.add_argument("--queue", type=int, default=100, help="queue length of the setting with loss (default 100)")
    ap.add_argument("--seconds", type=float, default=20.0, help="load per phase (default 20)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    ap.add_argument("--json", type=Path, help="write every phase here")
    args = ap.parse_args()
    args.payload_s = float(args.payload)
    import nodes
    print(f"code measured: {Path(nodes.__file__).resolve().parent.parent}", flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="p2pfaas-overload-") as tmp:
        server = NatsServer(data_dir=Path(tmp) / "nats", port=None, mqtt_port=None)
        await server.start()
        try:
            for rep in range(args.reps):
                for name, loss, queue in (("NoScheduler(false): every call queues", False, args.queue),
                                          (f"NoScheduler(true), queue {args.queue}", True, args.queue)):
                    row = await phase(server, Path(tmp), args, name, loss, queue, rep)
                    rows.append(row)
                    print(f"  rep {rep + 1} {name}: goodput {row['goodput_per_s']:.1f}/s of {row['capacity_per_s']:.0f}, "
                          f"timed out {row['timed_out']}, 504 not run {row['told_504']}, refused {row['refused']}, "
                          f"wasted runs {row['wasted_runs']:.0f}",
                          flush=True)
        finally:
            await server.stop()
    print(f"\nK={args.k}, {args.fn} {args.payload} s (capacity {args.k / args.payload_s:.0f}/s), offered "
          f"{args.load:g}x, callers wait {args.wait:g} s, {args.seconds:g} s per phase; medians of {args.reps}\n")
    print("| setting | goodput /s (last half) | answered 200 | timed out | 504 not run | refused (500/503) | wasted runs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == name]

        def med(key: str) -> float:
            return statistics.median(r[key] for r in mine)
        print(f"| {name} | {med('goodput_per_s'):.1f} | {med('ok'):.0f} | {med('timed_out'):.0f} | "
              f"{med('told_504'):.0f} | {med('refused'):.0f} | {med('wasted_runs'):.0f} |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "json"}, "rows": rows},
                                        indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
