"""Live from idle: `p2pfaas up`, the farm pool left idle (its controller scales it down to its
minimum), then `p2pfaas farm run --scenario bursty` at speed 1. One stack per controller, run one
after the other on the same machine, the same seed for every run.

    .venv/bin/python bench/live_from_idle.py [--idle 120] [--controllers auto,reactive-max,kpa]
                                             [--rounds 1] [--speed 1] [--json out.json]

Per controller: deadlines met, worker-seconds and mean workers of the farm pool, scaling
actions, and the panics (targets raised between decisions) the controller's log names. About 7
minutes per controller at speed 1 (start, idle, the 248 s episode and its grace). With
``--rounds N`` every controller runs N times, the order rotated each round so that none always
runs first or last on a shared machine, and the medians come last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from stacks import CLI, ROOT, start_up, stop_up


def run(controller: str, idle_s: float, speed: float, seed: int, work: Path) -> dict:
    data = work / controller
    data.mkdir(parents=True)
    log = (work / f"{controller}.up.log").open("w")
    up, _ = start_up(["--nodes", "1", "--controller", controller, "--mqtt", "off", "--http-port", "0",
                      "--nats-port", "0"], data, log)
    try:
        print(f"{controller}: up; idle {idle_s:.0f} s", flush=True)
        time.sleep(idle_s)
        out = work / f"{controller}.json"
        farm = subprocess.run([*CLI, "farm", "run", "--scenario", "bursty", "--speed", str(speed), "--seed", str(seed),
                               "--data-dir", str(data), "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                              timeout=900)
        if not out.exists():
            raise RuntimeError(f"farm run failed ({farm.returncode}): {farm.stderr[-2000:]}")
        result = json.loads(out.read_text())
    finally:
        stop_up(up)
        log.close()
    controller_log = data / "logs" / "controller.log"
    text = controller_log.read_text() if controller_log.exists() else ""
    pool = result.get("pool") or {}
    return {"controller": controller, "qos": result["qos"], "tasks": result["tasks"], "lost": result["lost"],
            "errors": result["errors"], "worker_seconds": pool.get("worker_seconds"),
            "mean_workers": pool.get("mean_workers"), "scaling_actions": pool.get("scaling_actions"),
            "panics": text.count(" panic: "), "decided_by": result.get("decided_by")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=120.0, help="seconds the stack idles before the run")
    parser.add_argument("--controllers", default="auto,reactive-max,kpa")
    parser.add_argument("--rounds", type=int, default=1, help="runs per controller, the order rotated each round")
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    controllers = args.controllers.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="live-idle-") as tmp:
        for r in range(args.rounds):
            for controller in controllers[r % len(controllers):] + controllers[:r % len(controllers)]:
                row = run(controller, args.idle, args.speed, args.seed, Path(tmp) / f"round-{r + 1}")
                rows.append({**row, "round": r + 1})
                print(f"round {r + 1}, {controller}: QoS {100 * row['qos']:.2f} %, {row['worker_seconds']:.0f} "
                      f"worker-s, {row['mean_workers']:.1f} mean workers, {row['scaling_actions']} actions, "
                      f"{row['panics']} panics, lost {row['lost']}", flush=True)
    print("\n| round | controller | deadlines met | worker-seconds | mean workers | scaling actions | panics |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['round']} | {r['controller']} | {100 * r['qos']:.2f} % of {r['tasks']} | "
              f"{r['worker_seconds']:,.0f} | {r['mean_workers']:.1f} | {r['scaling_actions']} | {r['panics']} |")
    if args.rounds > 1:
        print(f"\nmedians over {args.rounds} rounds")
        print("| controller | deadlines met | worker-seconds | fewer worker-seconds than, in how many rounds |")
        print("|---|---|---|---|")
        spent = {(r["controller"], r["round"]): r["worker_seconds"] for r in rows}
        for c in controllers:
            mine = [r for r in rows if r["controller"] == c]
            fewer = ", ".join(f"{o} {sum(spent[c, k] < spent[o, k] for k in range(1, args.rounds + 1))}/{args.rounds}"
                              for o in controllers if o != c)
            print(f"| {c} | {100 * statistics.median(r['qos'] for r in mine):.2f} % | "
                  f"{statistics.median(r['worker_seconds'] for r in mine):,.0f} | {fewer} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
