"""Cold starts of a function scaled to zero, as a user meets them: `p2pfaas up` (one node, worker
processes), a function deployed with `--scale-to-zero-after`, then N rounds of: wait until its pool
is at zero, call it over HTTP (the cold call), call it again at once (warm).

    .venv/bin/python bench/cold_start.py [--rounds 10] [--fn echo-cold] [--json out.json]

Prints the median and the spread of the cold start the answers report (X-P2pfaas-Cold-Start-Seconds:
the call's wait for the first worker), the cold call's and the warm call's whole time at the
client, and the node's own histogram (p2pfaas_cold_start_seconds) as it ends.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from stacks import CLI, ROOT, start_up, stop_up


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": statistics.median(ordered), "p90": ordered[max(0, round(0.9 * len(ordered)) - 1)],
            "min": ordered[0], "max": ordered[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--fn", default="echo-cold")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="p2pfaas-cold-"))
    log = (work / "up.log").open("w")
    up, endpoints = start_up(["--nodes", "1", "--controller", "off", "--mqtt", "off", "--http-port", "0",
                              "--nats-port", "0"], work, log)
    try:
        url = endpoints["http"]["n1"]
        deployed = subprocess.run([*CLI, "deploy", args.fn, "--ref", "functions.builtins:echo", "--scale-to-zero-after",
                                   "1s", "--policy", "off", "--data-dir", str(work)], capture_output=True, text=True,
                                  cwd=ROOT, timeout=120)
        if deployed.returncode != 0:
            raise RuntimeError(deployed.stderr)
        cold, cold_total, warm_total = [], [], []
        with httpx.Client(timeout=60) as http:
            def replicas() -> int:
                return http.get(f"{url}/system/function/{args.fn}").json()["availableReplicas"]

            for round_ in range(args.rounds):
                wait_for(lambda: replicas() == 0, 60, "the pool at zero")
                started = time.perf_counter()
                answer = http.post(f"{url}/function/{args.fn}", content=b"x")
                cold_total.append(time.perf_counter() - started)
                started = time.perf_counter()
                again = http.post(f"{url}/function/{args.fn}", content=b"x")
                warm_total.append(time.perf_counter() - started)
                if answer.status_code != 200 or again.status_code != 200:
                    raise RuntimeError(f"round {round_}: {answer.status_code} {answer.text} / {again.status_code}")
                cold.append(float(answer.headers["X-P2pfaas-Cold-Start-Seconds"]))
                print(f"round {round_ + 1}: cold start {cold[-1]:.3f} s, cold call {cold_total[-1]:.3f} s, "
                      f"warm call {warm_total[-1] * 1000:.1f} ms", flush=True)
            metric = [line for line in http.get(f"{url}/metrics").text.splitlines()
                      if line.startswith("p2pfaas_cold_start_seconds_") and args.fn in line and "_bucket" not in line]
    finally:
        stop_up(up)
        log.close()
    report = {"cold_start_s": quantiles(cold), "cold_call_s": quantiles(cold_total), "warm_call_s": quantiles(warm_total),
              "metric": metric, "rounds": args.rounds}
    print(f"cold start (header): p50 {report['cold_start_s']['p50']:.3f} s, p90 {report['cold_start_s']['p90']:.3f} s, "
          f"max {report['cold_start_s']['max']:.3f} s")
    print(f"cold call at the client: p50 {report['cold_call_s']['p50']:.3f} s; warm: "
          f"p50 {report['warm_call_s']['p50'] * 1000:.1f} ms")
    print("\n".join(metric))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
