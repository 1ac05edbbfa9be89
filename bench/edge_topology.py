"""A device's nats-server as a LEAF NODE of the hub vs as a CLUSTER MEMBER (routes) with the hub.

    .venv/bin/python bench/edge_topology.py [--json out.json] [--cut 30] [--n 2000]   # root; ~3 min

Five emulated machines (tests/_support/netlab.py: a network namespace each): hub, d1, d2, d3 and c1
(the operator's machine: it makes the streams through the hub's client port and counts them after).
Every server is `.venv/bin/nats-server` with `ping_interval: "2s"`, `ping_max: 2` and its monitoring
port on its own 127.0.0.1:8222; no auth, no TLS (TLS cost nothing measurable, research-26 Q6).

* leaf: the hub has `leafnodes { listen }`; each device is a leaf of it with JetStream domain `dN`;
  stream ASYNC (`faas.async.d3.>`) lives in domain d3.
* cluster: hub + d1..d3 are one cluster with JetStream (one meta group); ASYNC_d3 is R1, placed on
  d3 by tag; R3 (`faas.r3.>`) is R3 on the three devices, its leader moved off d3 before the cut
  (else the majority side would measure an election the cut happened to force).

Each device runs an echo responder on `faas.dN.echo` (a process of its own on its local server).
Rows of the table:

* local / cross-device p50, p99: sequential nats-py request/reply from d1 to d1's responder, and to
  d2's (leaf: d1 -> hub -> d2; cluster: d1 -> d2 over their route); 2,000 requests after 100 warm-up
  ones, 3 interleaved rounds: median of the rounds (range).
* nats-server RSS: per device server, after the latency rounds.
* cut d3: its link down `--cut` s. Probes every 0.2 s (timeout 0.5 s), counted ok/sent during the cut:
  on d3 a local request, a JetStream publish to the stream on d3, every 1 s an ephemeral consumer
  created on it (the JetStream API); on d1 a request to d3's responder; in the cluster also a
  publish to R3 from d3 and from d1 (the majority side). "After heal" = what failed after the link
  came back and when the last failure was.
* d3 / hub notices: seconds from the cut until the server's /leafz (/routez) no longer lists the
  other side (polled every 0.2 s); reconnect: seconds from the heal until it lists it again.
* d3's meta leader (cluster): when d3's /jsz stops naming a leader, and when it names one again;
  which server led the meta group at the cut (d3 itself, or one on the majority side) is said too.
* stored / acked: the stream's message count (read from c1 after the run) against the publishes
  that got an ack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nats
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout
from nats.js.api import ConsumerConfig, Placement
from nats.js.errors import APIError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "_support"))
from netlab import NetLab, why_not  # noqa: E402

NATS_SERVER = Path(sys.executable).parent / "nats-server"
DEVICES = ["d1", "d2", "d3"]
SERVERS = ["hub", *DEVICES]
LOCAL = "nats://127.0.0.1:4222"   # a device's clients talk to their own server only
PING = 'ping_interval: "2s"\nping_max: 2\n'   # the default (2 min x 2) notices a silent cut after minutes
BEFORE_S, AFTER_S, EVERY_S, TIMEOUT_S = 5.0, 20.0, 0.2, 0.5


def config(topo: str, m: str, lab: NetLab, store: Path) -> str:
    ips = {s: lab.address(s) for s in SERVERS}
    listen = "0.0.0.0:4222" if m == "hub" else "127.0.0.1:4222"   # only the hub takes clients from elsewhere (c1)
    text = f'server_name: "{m}"\nlisten: "{listen}"\nhttp: "127.0.0.1:8222"\n{PING}'
    if topo == "leaf":
        text += f'jetstream {{ store_dir: "{store}", domain: "{m}" }}\n'
        if m == "hub":
            text += 'leafnodes { listen: "0.0.0.0:7422" }\n'
        else:   # redial every 1 s after a loss (the default is also 1 s; said so it is visible)
            text += f'leafnodes {{ reconnect: "1s", remotes: [ {{ urls: ["nats://{ips["hub"]}:7422"] }} ] }}\n'
    else:
        routes = json.dumps([f"nats-route://{ip}:6222" for s, ip in ips.items() if s != m])
        tags = json.dumps(["hub"] if m == "hub" else [m, "device"])
        text += (f'server_tags: {tags}\njetstream {{ store_dir: "{store}" }}\n'
                 f'cluster {{ name: "edge", listen: "{ips[m]}:6222", routes: {routes}, '
                 f'ping_interval: "2s", ping_max: 2 }}\n')
    return text


def http_json(path: str) -> dict:   # called inside a machine's namespace
    with urllib.request.urlopen(f"http://127.0.0.1:8222{path}", timeout=1) as r:
        return json.loads(r.read())


def until(lab: NetLab, machine: str, pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if lab.call(machine, pred):
                return
        except Exception:   # not up yet
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not within {timeout_s:.0f} s")


def short(exc: BaseException) -> str:
    if isinstance(exc, APIError):
        return f"{exc.code}/{exc.err_code}"
    if isinstance(exc, NoRespondersError):
        return "no responders"
    return "timeout" if isinstance(exc, (NatsTimeout, asyncio.TimeoutError)) else type(exc).__name__


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# -- what runs inside the machines -------------------------------------------------------------
async def responder(subject: str) -> None:
    nc = await nats.connect(LOCAL)

    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe(subject, cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()   # until NetLab ends the process


async def latency(subject: str, n: int) -> dict:
    nc = await nats.connect(LOCAL)
    warm, deadline = 0, time.monotonic() + 15
    while warm < 100:   # warm-up; the first ones may wait for interest to cross the hub
        try:
            await nc.request(subject, b"x" * 16, timeout=1)
            warm += 1
        except (NoRespondersError, NatsTimeout):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        await nc.request(subject, b"x" * 16, timeout=2)
        lat.append((time.perf_counter() - t) * 1e6)
    await nc.close()
    return {"p50_us": round(pct(lat, 0.5)), "p99_us": round(pct(lat, 0.99))}


async def probe(specs: list[tuple], end: float) -> dict:
    """specs: (name, every_s, kind, target); kind req | pub | api. Returns {name: [(t, outcome)]}."""
    nc = await nats.connect(LOCAL, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream(timeout=TIMEOUT_S)
    logs: dict[str, list] = {name: [] for name, *_ in specs}

    act = {"req": lambda target, i: nc.request(target, b"p", timeout=TIMEOUT_S),
           "pub": lambda target, i: js.publish(f"{target}.{i}", b"p", timeout=TIMEOUT_S),
           # an ephemeral consumer: needs the JetStream API (in a cluster, the meta leader)
           "api": lambda target, i: js.add_consumer(target, ConsumerConfig(inactive_threshold=2.0), timeout=TIMEOUT_S)}

    async def loop(name: str, every: float, kind: str, target: str) -> None:
        i = 0
        while time.monotonic() < end:
            t = time.monotonic()
            try:
                await act[kind](target, i)
                out = "ok"
            except Exception as exc:   # every failure is an outcome to count
                out = short(exc)
            logs[name].append((t, out))
            i += 1
            await asyncio.sleep(max(0.0, t + every - time.monotonic()))
    await asyncio.gather(*(loop(*s) for s in specs))
    await nc.close()
    return logs


def watch(peer: str, kind: str, meta: bool, stop: threading.Event) -> list[tuple]:
    """Every 0.2 s: (t, does this server list `peer` in /leafz or /routez, its meta leader or None)."""
    rows = []
    while not stop.is_set():
        t = time.monotonic()
        try:
            if kind == "leaf":
                sees = peer in [x.get("name") for x in http_json("/leafz").get("leafs") or []]
            else:
                sees = peer in [x.get("remote_name") for x in http_json("/routez").get("routes") or []]
            leader = (http_json("/jsz").get("meta_cluster") or {}).get("leader") if meta else None
        except Exception:   # a slow answer: no sample
            stop.wait(EVERY_S)
            continue
        rows.append((t, sees, leader))
        stop.wait(max(0.0, t + EVERY_S - time.monotonic()))
    return rows


async def streams(url: str, domain: str | None, create: list[dict], read: list[str]) -> dict:
    nc = await nats.connect(url)
    js = nc.jetstream(domain=domain, timeout=5)
    for cfg in create:
        for attempt in range(60):   # a fresh cluster's meta leader takes a moment to accept
            try:
                await js.add_stream(**cfg)
                break
            except Exception:
                if attempt == 59:
                    raise
                await asyncio.sleep(0.25)
    if "R3" in read:   # R3's leader off d3 (see the docstring)
        for _ in range(5):
            if (await js.stream_info("R3")).cluster.leader != "d3":
                break
            await nc.request("$JS.API.STREAM.LEADER.STEPDOWN.R3", b"", timeout=5)
            await asyncio.sleep(2)
    out = {}
    for name in read:
        info = await js.stream_info(name)
        out[name] = {"msgs": info.state.messages, "leader": info.cluster.leader if info.cluster else None}
    await nc.close()
    return out


# -- one topology ------------------------------------------------------------------------------
def first(rows: list[tuple], since: float, pred) -> float | None:
    return next((round(t - since, 1) for t, *rest in rows if t >= since and pred(*rest)), None)


def summary(log: list[tuple], cut: float, heal: float) -> dict:
    during = [o for t, o in log if cut <= t < heal]
    after = [(t - heal, o) for t, o in log if t >= heal]
    fails = [dt for dt, o in after if o != "ok"]
    return {"before": f"{sum(o == 'ok' for t, o in log if t < cut)}/{sum(t < cut for t, o in log)}",
            "ok": sum(o == "ok" for o in during), "n": len(during),
            "errors": Counter(o for o in during if o != "ok").most_common(3),
            "first_ok_after_heal_s": next((round(dt, 1) for dt, o in after if o == "ok"), None),
            "failed_after_heal": len(fails), "last_fail_after_heal_s": round(max(fails), 1) if fails else None,
            "acked": sum(o == "ok" for t, o in log)}


def run(topo: str, work: Path, n: int, cut_s: float) -> dict:
    res: dict = {"topology": topo}
    stream = "ASYNC" if topo == "leaf" else "ASYNC_d3"
    with NetLab([*SERVERS, "c1"]) as lab:
        servers = {}
        for m in SERVERS:
            (work / f"{m}.conf").write_text(config(topo, m, lab, work / m))
            servers[m] = lab.popen(m, [str(NATS_SERVER), "-c", str(work / f"{m}.conf")],
                                   stdout=open(work / f"{m}.log", "w"), stderr=subprocess.STDOUT)
        for m in SERVERS:
            until(lab, m, lambda: http_json("/healthz").get("status") == "ok", 20, f"{m} healthy")
        if topo == "leaf":
            until(lab, "hub", lambda: len(http_json("/leafz").get("leafs") or []) == 3, 20, "3 leaf connections")
            create = [dict(name="ASYNC", subjects=["faas.async.d3.>"])]
        else:
            until(lab, "hub", lambda: (lambda mc: mc.get("leader") and mc.get("cluster_size") == 4)(
                http_json("/jsz").get("meta_cluster") or {}), 30, "a meta leader of 4")
            create = [dict(name="ASYNC_d3", subjects=["faas.async.d3.>"], num_replicas=1, placement=Placement(tags=["d3"])),
                      dict(name="R3", subjects=["faas.r3.>"], num_replicas=3, placement=Placement(tags=["device"]))]
        hub_url = f"nats://{lab.address('hub')}:4222"
        domain = "d3" if topo == "leaf" else None   # c1 reaches d3's domain through the hub
        names = [c["name"] for c in create]
        res["streams_at_start"] = lab.call("c1", asyncio.run, streams(hub_url, domain, create, names))
        for d in DEVICES:
            p = lab.popen(d, [sys.executable, __file__, "--responder", f"faas.{d}.echo"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            assert p.stdout.readline().strip() == b"ready", f"responder on {d}"

        for _ in range(3):   # interleaved: a slow moment of the shared machine hits both rows
            for key, subject in (("local_d1", "faas.d1.echo"), ("cross_d1_d2", "faas.d2.echo")):
                res.setdefault(key, []).append(lab.call("d1", asyncio.run, latency(subject, n)))
        res["rss_mib"] = {m: round(int(next(line.split()[1] for line in Path(f"/proc/{p.pid}/status").read_text().splitlines()
                                             if line.startswith("VmRSS"))) / 1024, 1) for m, p in servers.items()}

        specs = {"d3": [("d3 req", EVERY_S, "req", "faas.d3.echo"), ("d3 pub", EVERY_S, "pub", "faas.async.d3.p"),
                        ("d3 api", 1.0, "api", stream)],
                 "d1": [("d1 req d3", EVERY_S, "req", "faas.d3.echo")]}
        if topo == "cluster":
            specs["d3"].append(("d3 pub R3", EVERY_S, "pub", "faas.r3.d3"))
            specs["d1"].append(("d1 pub R3", EVERY_S, "pub", "faas.r3.d1"))
        stop = threading.Event()
        with ThreadPoolExecutor(len(specs) + 2) as pool:
            try:
                watches = {m: pool.submit(lab.call, m, watch, peer, topo, topo == "cluster" and m == "d3", stop)
                           for m, peer in (("d3", "hub"), ("hub", "d3"))}
                end = time.monotonic() + BEFORE_S + cut_s + AFTER_S
                probes = {m: pool.submit(lab.call, m, asyncio.run, probe(s, end)) for m, s in specs.items()}
                time.sleep(BEFORE_S)
                cut = time.monotonic()
                lab.cut("d3")
                time.sleep(cut_s)
                lab.heal("d3")
                heal = time.monotonic()
                logs = {k: v for f in probes.values() for k, v in f.result().items()}
            finally:
                stop.set()
            d3_rows, hub_rows = watches["d3"].result(), watches["hub"].result()
        res["probes"] = {k: summary(v, cut, heal) for k, v in logs.items()}
        res["d3_notices_s"] = first(d3_rows, cut, lambda sees, _: not sees)
        res["hub_notices_s"] = first(hub_rows, cut, lambda sees, _: not sees)
        res["d3_reconnects_s"] = first(d3_rows, heal, lambda sees, _: sees)
        res["hub_reconnects_s"] = first(hub_rows, heal, lambda sees, _: sees)
        if topo == "cluster":
            res["meta_leader_at_cut"] = next((ld for t, _, ld in reversed(d3_rows) if t < cut), None)
            res["d3_meta_leader_lost_s"] = first(d3_rows, cut, lambda _, ld: not ld)
            res["d3_meta_leader_back_s"] = first(d3_rows, heal, lambda _, ld: bool(ld))
        time.sleep(1)   # the last publishes stored
        res["streams_after"] = lab.call("c1", asyncio.run, streams(hub_url, domain, [], names))
    return res


# -- the table ---------------------------------------------------------------------------------
def lat_cell(rounds: list[dict], key: str) -> str:
    vals = [r[key] for r in rounds]
    return f"{statistics.median(vals):,.0f} µs ({min(vals):,}-{max(vals):,})"


def probe_cell(p: dict | None, heal_detail: bool = False) -> str:
    if p is None:
        return "n/a"
    cell = f"{p['ok']}/{p['n']} ok" + (f" ({', '.join(e for e, _ in p['errors'])})" if p["errors"] else "")
    if heal_detail and p["failed_after_heal"]:
        cell += f"; after heal {p['failed_after_heal']} failed, the last at +{p['last_fail_after_heal_s']} s"
    elif heal_detail and p["ok"] < p["n"]:
        cell += f"; first ok +{p['first_ok_after_heal_s']} s after heal"
    return cell


def table(results: dict, cut_s: float) -> str:
    def sec(v):
        return "-" if v is None else f"{v} s"

    def counts(r):
        acked = {"ASYNC": r["probes"]["d3 pub"]["acked"], "ASYNC_d3": r["probes"]["d3 pub"]["acked"]}
        if "d1 pub R3" in r["probes"]:
            acked["R3"] = r["probes"]["d3 pub R3"]["acked"] + r["probes"]["d1 pub R3"]["acked"]
        return ", ".join(f"{k} {v['msgs']}/{acked[k]}" for k, v in r["streams_after"].items())
    rows = [("local req/reply d1, p50 (range)", lambda r: lat_cell(r["local_d1"], "p50_us")),
            ("local p99", lambda r: lat_cell(r["local_d1"], "p99_us")),
            ("cross-device d1 -> d2, p50", lambda r: lat_cell(r["cross_d1_d2"], "p50_us")),
            ("cross-device p99", lambda r: lat_cell(r["cross_d1_d2"], "p99_us")),
            ("nats-server RSS per device", lambda r: "-".join(f"{r['rss_mib'][d]:.0f}" for d in DEVICES) + " MiB"),
            (f"**cut d3 {cut_s:.0f} s**: d3 local request/reply", lambda r: probe_cell(r["probes"]["d3 req"])),
            ("d3 JS publish to its stream (local domain / R1)", lambda r: probe_cell(r["probes"]["d3 pub"])),
            ("d3 JS API (create an ephemeral consumer)", lambda r: probe_cell(r["probes"]["d3 api"], True)),
            ("d3 publish to R3", lambda r: probe_cell(r["probes"].get("d3 pub R3"), True)),
            ("d1 publish to R3 (majority side)", lambda r: probe_cell(r["probes"].get("d1 pub R3"), True)),
            ("d1 -> d3 request", lambda r: probe_cell(r["probes"]["d1 req d3"], True)),
            ("d3 notices (leaf/route gone)", lambda r: sec(r["d3_notices_s"])),
            ("hub notices", lambda r: sec(r["hub_notices_s"])),
            ("d3's meta leader: lost after the cut / back after heal",
             lambda r: f"{sec(r['d3_meta_leader_lost_s'])} / {sec(r['d3_meta_leader_back_s'])} (leader at the cut: "
             f"{r['meta_leader_at_cut']})" if "meta_leader_at_cut" in r else "own domain: always itself"),
            ("reconnect after heal: d3 / hub sees it", lambda r: f"{sec(r['d3_reconnects_s'])} / {sec(r['hub_reconnects_s'])}"),
            ("stored / acked publishes", counts)]
    out = ["| | leaf | cluster |", "|---|---|---|"]
    out += [f"| {label} | {cell(results['leaf'])} | {cell(results['cluster'])} |" for label, cell in rows]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--cut", type=float, default=30, help="seconds d3's link stays down")
    parser.add_argument("--n", type=int, default=2000, help="requests per latency round")
    parser.add_argument("--responder", help=argparse.SUPPRESS)   # the echo process on a device
    args = parser.parse_args()
    if args.responder:
        asyncio.run(responder(args.responder))
        return 0
    reason = why_not()
    if reason:
        print(f"skipped: {reason}")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # NetLab's cleanup runs on SIGTERM too
    results = {}
    for topo in ("leaf", "cluster"):
        work = Path(tempfile.mkdtemp(prefix=f"edge-topology-{topo}-"))
        started = time.monotonic()
        print(f"== {topo}", flush=True)
        try:
            results[topo] = run(topo, work, args.n, args.cut)
        except BaseException:
            print(f"{topo} failed; its configs and server logs are in {work}", flush=True)
            raise
        results[topo]["wall_s"] = round(time.monotonic() - started, 1)
        shutil.rmtree(work, ignore_errors=True)
    print(table(results, args.cut))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
