"""Live from idle: `p2pfaas up`, the farm pool left idle (its controller scales it down to its
minimum), then `p2pfaas farm run --scenario bursty` at speed 1. One stack per controller, run one
after the other on the same machine, the same seed for every run.

    .venv/bin/python bench/live_from_idle.py [--idle 120] [--controllers auto,reactive-max,kpa]
                                             [--speed 1] [--json out.json]

Per controller: deadlines met, worker-seconds and mean workers of the farm pool, scaling
actions, and the panics (targets raised between decisions) the controller's log names. About 7
minutes per controller at speed 1 (start, idle, the 248 s episode and its grace).
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="live-idle-") as tmp:
        for controller in args.controllers.split(","):
            row = run(controller, args.idle, args.speed, args.seed, Path(tmp))
            rows.append(row)
            print(f"{controller}: QoS {100 * row['qos']:.2f} %, {row['worker_seconds']:.0f} worker-s, "
                  f"{row['mean_workers']:.1f} mean workers, {row['scaling_actions']} actions, "
                  f"{row['panics']} panics, lost {row['lost']}", flush=True)
    print("\n| controller | deadlines met | worker-seconds | mean workers | scaling actions | panics |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['controller']} | {100 * r['qos']:.2f} % of {r['tasks']} | {r['worker_seconds']:,.0f} | "
              f"{r['mean_workers']:.1f} | {r['scaling_actions']} | {r['panics']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
