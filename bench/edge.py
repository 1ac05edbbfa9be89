"""Several machines, emulated (network namespaces, root): a hub and devices started with the
documented commands alone (tests/_support/edge_lab.py), measured under faults of the network.

  .venv/bin/python bench/edge.py latency      # a local call vs a forward across devices (p50, p99), the RTT
  .venv/bin/python bench/edge.py partition    # d3 cut off 30 s under open-loop load on every transport
  .venv/bin/python bench/edge.py hub          # the hub killed (-9) for 30 s, then started again
  .venv/bin/python bench/edge.py membership   # heartbeats per node per period at N = 3, 6, 12, flat and grouped
  .venv/bin/python bench/edge.py all --json edge.json

Local load (``bench/edge_load.py``, run on the device itself, as its own callers are): HTTP
direct, HTTP async and MQTT QoS 1, Poisson, --rate per transport. Remote load from machine c1 to
d1 (saturated: K=2, so PowerOfN forwards part of it to d2 and d3). A call is *lost* when it was
accepted (202, PUBACK; a direct call: sent) and never answered, a *duplicate* when it got two
different answers. Nothing here is shared between machines but the invitation files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "_support"))

from edge_lab import P2PFAAS, EdgeLab  # noqa: E402
from netlab import why_not  # noqa: E402

PYTHON = sys.executable
LOAD = str(ROOT / "bench" / "edge_load.py")


def until(predicate, timeout_s: float, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception:   # not yet
            pass
        time.sleep(interval_s)
    return None


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def peers(edge: EdgeLab, device: str, where: str = "c1") -> list[str]:
    def get() -> list[str]:
        with urllib.request.urlopen(f"http://{edge.address(device)}:19000/list", timeout=1) as r:
            return sorted(row["name"] for row in json.loads(r.read()))
    return edge.lab.call(where, get)


def enrol(edge: EdgeLab, device: str, name: str) -> dict:
    done = edge.lab.run(device, [*P2PFAAS, "auth", "device", name, "--data-dir", str(edge.dir(device) / "data")],
                        env=edge.env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def start_load(edge: EdgeLab, where: str, device: str, out: Path, *, rate: float, seconds: float,
               transports: str = "http-direct,http-async,mqtt", body: str = "0.05", seed: int = 1):
    args = [PYTHON, LOAD, "--url", edge.http(device), "--node", device, "--rate", str(rate), "--seconds", str(seconds),
            "--transports", transports, "--body", body, "--seed", str(seed), "--out", str(out)]
    if "mqtt" in transports:
        device_id = enrol(edge, device, f"load-{where}-{device}")
        args += ["--mqtt", f"{edge.address(device)}:1883", "--user", device_id["user"], "--password", device_id["password"]]
    return edge.lab.popen(where, args, env=edge.env, stdout=open(out.with_suffix(".log"), "w"), stderr=subprocess.STDOUT)


def tally(calls: list[dict], windows: dict[str, tuple[float, float]] | None = None) -> dict:
    """Per transport: sent, accepted, answered, ok, lost, duplicated, and who ran them."""
    out: dict[str, dict] = {}
    for call in calls:
        row = out.setdefault(call["transport"], {"sent": 0, "accepted": 0, "answered": 0, "ok": 0, "lost": 0,
                                                 "duplicated": 0, "by": {}})
        row["sent"] += 1
        accepted = call["transport"] == "http-direct" or call.get("accepted")
        row["accepted"] += bool(accepted)
        if call["answered"] is not None:
            row["answered"] += 1
            row["ok"] += call["status"] == 200
            row["by"][call["by"] or "?"] = row["by"].get(call["by"] or "?", 0) + 1
        elif accepted:
            row["lost"] += 1
        row["duplicated"] += len(call.get("distinct", [])) > 1
    return out


def set_scheduler(edge: EdgeLab, device: str, name: str, parameters: list[str]) -> None:
    token = edge.operator_token(device)

    def post() -> int:
        request = urllib.request.Request(f"{edge.http(device)}/configuration/scheduler", method="POST",
                                         data=json.dumps({"name": name, "parameters": parameters}).encode(),
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    assert edge.lab.call("c1", post) == 200


# -- scenarios -------------------------------------------------------------------------------------
def latency(work: Path, calls: int = 1000) -> dict:
    import httpx

    with EdgeLab(work / "latency", ["d1", "d2"], k=4, queue=4) as edge:
        until(lambda: peers(edge, "d1") == ["d2"], 30)

        def measure(headers: dict) -> list[float]:
            out = []
            with httpx.Client(timeout=10) as http:
                for i in range(calls + 50):
                    t = time.perf_counter()
                    r = http.post(f"{edge.http('d1')}/function/echo", content=b"x", headers=headers)
                    if i >= 50:   # warm
                        assert r.status_code == 200, r.text
                        out.append(time.perf_counter() - t)
            return out

        def rtt() -> list[float]:
            import socket
            out = []
            for _ in range(200):
                t = time.perf_counter()
                with socket.create_connection((edge.address("d2"), 18080), timeout=2):
                    out.append(time.perf_counter() - t)
            return out

        rounds = {"local": [], "forward": []}
        for _ in range(3):   # interleaved: the machine's noise hits both alike
            rounds["local"] += edge.lab.call("c1", measure, {"X-P2pfaas-Scheduler-Bypass": "true"})
            rounds["forward"] += edge.lab.call("c1", measure, {"X-P2pfaas-Scheduler-Forward": "true"})
        connect = edge.lab.call("d1", rtt)
        timings = dict(edge.timings)
    result = {"join_s": {k: round(v, 2) for k, v in timings.items() if not k.startswith("join_started")},
              "rtt_ms_p50": statistics.median(connect) * 1e3}
    for name, values in rounds.items():
        result[f"{name}_ms"] = {"p50": statistics.median(values) * 1e3, "p99": pct(values, 0.99) * 1e3, "n": len(values)}
    result["forward_extra_ms_p50"] = result["forward_ms"]["p50"] - result["local_ms"]["p50"]
    result["forward_extra_ms_p99"] = result["forward_ms"]["p99"] - result["local_ms"]["p99"]
    return result


def _faulted(work: Path, name: str, fault, heal, *, rate: float, seconds: float, fault_at: float,
             fault_s: float) -> dict:
    """Load on d3 from d3 (its own callers) and on d1 from c1 (forwarded to d2, d3 when d1 is
    full); ``fault(edge)`` at ``fault_at``, ``heal(edge)`` ``fault_s`` later; what every call got."""
    with EdgeLab(work / name, ["d1", "d2", "d3"], k=2, queue=2) as edge:
        for device in ("d1", "d2", "d3"):
            until(lambda: len(peers(edge, device)) == 2, 30)
        local = work / name / "local-d3.json"
        remote = work / name / "remote-d1.json"
        loads = [start_load(edge, "d3", "d3", local, rate=rate, seconds=seconds),
                 start_load(edge, "c1", "d1", remote, rate=rate * 2, seconds=seconds, transports="http-direct",
                            body="0.4", seed=2)]
        time.sleep(fault_at)
        at = time.time()
        fault(edge)
        gone = until(lambda: "d3" not in peers(edge, "d1"), fault_s, 0.05)
        detected_s = time.time() - at if gone else None
        time.sleep(max(0.0, at + fault_s - time.time()))
        healed_at = time.time()
        heal(edge)
        back = until(lambda: "d3" in peers(edge, "d1"), 60, 0.05)
        recovered_s = time.time() - healed_at if back else None
        for proc in loads:
            proc.wait(timeout=seconds + 200)
        local_calls = json.loads(local.read_text())["calls"]
        remote_calls = json.loads(remote.read_text())["calls"]
    by_d3_during = [c for c in remote_calls if c["by"] == "d3" and at + (detected_s or 0) < c["sent"] < healed_at]
    served_during = [c for c in local_calls if at < c["sent"] < healed_at]
    return {
        "fault_s": fault_s, "peers_dropped_d3_after_s": detected_s, "peers_back_after_heal_s": recovered_s,
        "local_d3": tally(local_calls), "local_d3_during_fault": tally(served_during),
        "remote_d1": tally(remote_calls), "forwards_to_d3_after_detection": len(by_d3_during),
        "remote_unanswered": sum(1 for c in remote_calls if c["answered"] is None),
    }


def partition(work: Path, seconds: float = 60.0, fault_s: float = 30.0, rate: float = 3.0) -> dict:
    return _faulted(work, "partition", lambda e: e.lab.cut("d3"), lambda e: e.lab.heal("d3"),
                    rate=rate, seconds=seconds, fault_at=12.0, fault_s=fault_s)


def hub(work: Path, seconds: float = 60.0, fault_s: float = 30.0, rate: float = 3.0) -> dict:
    def kill(edge: EdgeLab) -> None:
        edge.kill("hub")

    def restart(edge: EdgeLab) -> None:
        edge.start_hub()

    result = _faulted(work, "hub", kill, restart, rate=rate, seconds=seconds, fault_at=12.0, fault_s=fault_s)
    result["note"] = "peers_* : d1's view of d3 (every forward crosses the hub, so a lost hub parts them)"
    return result


def membership(work: Path, sizes=(3, 6, 12), seconds: float = 10.0) -> dict:
    """Heartbeats each node receives per period (its group's) and the hub relays, all in one group
    and in groups of 3 (P2PFaaS's fog networks)."""
    rows = []
    for n in sizes:
        devices = [f"d{i}" for i in range(1, n + 1)]
        for scheme in ("flat", "grouped"):
            groups = {d: f"g{(i // 3) + 1}" for i, d in enumerate(devices)} if scheme == "grouped" else {}
            with EdgeLab(work / f"membership-{n}-{scheme}", devices, k=1, queue=0, groups=groups) as edge:
                group_size = 3 if scheme == "grouped" else n
                for device in devices:
                    until(lambda: len(peers(edge, device)) == min(group_size, n) - 1, 60)
                monitor = json.loads((edge.dir("hub") / "data" / "hub.json").read_text())["monitor"]

                def varz() -> dict:
                    with urllib.request.urlopen(f"{monitor}/varz", timeout=2) as r:
                        return json.loads(r.read())

                def count(device: str) -> int:
                    import asyncio
                    import nats

                    async def run() -> int:
                        url = edge.endpoints(device)["nats_url"]
                        services = json.loads((edge.dir(device) / "data" / "auth" / "services.json").read_text())
                        nc = await nats.connect(url, user="operator", password=services["operator"])
                        seen = 0

                        async def on(msg) -> None:
                            nonlocal seen
                            seen += 1
                        await nc.subscribe("faas.membership.>", cb=on)
                        await asyncio.sleep(seconds)
                        await nc.close()
                        return seen
                    return asyncio.run(run())

                before = edge.lab.call("hub", varz)
                received = edge.lab.call(devices[0], count, devices[0])
                after = edge.lab.call("hub", varz)
                span = seconds
                rows.append({"n": n, "scheme": scheme, "group": group_size,
                             "received_per_node_per_period": received / span,
                             "hub_in_per_period": (after["in_msgs"] - before["in_msgs"]) / span,
                             "hub_out_per_period": (after["out_msgs"] - before["out_msgs"]) / span,
                             "join_all_s": edge.timings["join_all_s"]})
                print(rows[-1], flush=True)
    return {"rows": rows, "note": "received: what one device's server delivers on faas.membership.> (its own "
                                  "heartbeat included); hub in/out: every message through the hub (heartbeats, "
                                  "telemetry, probes)"}


SCENARIOS = {"latency": latency, "partition": partition, "hub": hub, "membership": membership}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--work-dir", type=Path, help="keep every machine's files and logs here")
    args = parser.parse_args()
    reason = why_not()
    if reason:
        print(f"cannot run: {reason}")
        return 2
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="p2pfaas-edge-"))
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    results = {}
    for name in names:
        started = time.monotonic()
        print(f"== {name}", flush=True)
        results[name] = SCENARIOS[name](work)
        results[name]["wall_s"] = round(time.monotonic() - started, 1)
        print(json.dumps(results[name], indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(f"work dir: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
