"""Invocation paths side by side in one run: p2pfaas over HTTP, NATS (direct and durable) and MQTT
against bare baselines on the same machine, with issue 8's targets as PASS/MISS.

Run from the repository root: ``.venv/bin/python bench/invoke_path.py [--quick] [--json OUT] [--profile DIR]``;
bench/README.md says what every row means. Every party is its own OS process (bench/parties.py)
and dies with this one; baseline and p2pfaas phases alternate (ABBA) over the repetitions; the
table shows medians and the median of the per-repetition ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from parties import (
    FN, Party, bridge_main, devices_main, die_with_parent, js_consumer_main, loadgen_main, node_main,
    responder_main, sleep_until,
)
from probes import CpuMeter, HttpLoad, count_messages, load_average, record_profiles, summarize_collapsed

PREFIX = "bench"
HTTP_PATH = f"/function/{FN}"
ECHO_DEFAULT = "echo, uvicorn defaults (h11, asyncio)"
ECHO_FAST = "echo, uvicorn httptools + uvloop"
ECHO_SERVERS = {ECHO_DEFAULT: ("h11", "asyncio"), ECHO_FAST: ("httptools", "uvloop")}
# QUOTED, not measured here: issue 8's figures for the original P2PFaaS (Go, K=64, NoScheduler)
# under `hey` on the machine the issue was written on (2,430 req/s with 32 connections, "1.00 ms"
# sequential p50). Its table row says so; it is a reference, never a ratio's baseline.
GO_P2PFAAS_QUOTED = {"c32_rps": 2430.0, "seq_p50_us": 1000.0}
GO_ORIGINAL = "P2PFaaS Go original (built here, echo behind it)"   # bench/go_original.py, when it can be built
# issue 8's (vs the FastAPI echo), and issue 30's: vs the Go original measured in the same run, durable 40 %
TARGETS = {"http": 0.75, "http_p50": 3.0, "nats": 0.25, "nats_p50": 3.0, "async": 0.40, "mqtt": 0.30,
           "go_http": 1.5, "go_http_p50": 1.0}


def bridges_variant(spec: str) -> str:
    """A layout of the HTTP bridge: ``node`` (in the node's process, with its in-process door: what
    ``p2pfaas up`` runs), ``node+N`` (that and N processes of its own on the same port: ``up
    --http-processes N+1``), ``N`` (N processes of its own: ``p2pfaas bridge http``, compose)."""
    spec = str(spec)
    if spec == "node":
        return "p2pfaas, bridge in the node's process"
    if spec.startswith("node+"):
        n = int(spec[5:])
        return f"p2pfaas, node's process + {n} bridge process{'es' if n > 1 else ''}"
    n = int(spec)
    return f"p2pfaas, {n} bridge process{'es' if n > 1 else ''}"


def bridge_layout(spec: str) -> tuple[bool, int]:
    """(served by the node's process, how many bridge processes of their own)."""
    spec = str(spec)
    if spec == "node":
        return True, 0
    if spec.startswith("node+"):
        return True, int(spec[5:])
    return False, int(spec)


def med(values) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


class Bench:
    """Starts every party once, runs the repetitions, stops everything (also on Ctrl-C/SIGTERM)."""

    def __init__(self, args: argparse.Namespace, console) -> None:
        self.args, self.console = args, console
        self.tmp = Path(tempfile.mkdtemp(prefix="p2pfaas-invoke-bench-"))
        self.parties: list[Party] = []
        self.echo_apps: dict[str, asyncio.subprocess.Process] = {}
        self.http_ports: dict[str, int] = {}
        self.bridges: dict[str, list[Party]] = {}
        self.server = None
        self.meter: CpuMeter | None = None
        self.http: HttpLoad | None = None
        self.go_procs: list = []
        self.go_missing: list[str] = []

    def log(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}")

    # -- parties ----------------------------------------------------------------------------
    def spawn(self, name: str, target, *args: Any) -> Party:
        party = Party(name, target, *args)
        self.parties.append(party)
        return party

    async def start(self) -> None:
        from broker.embedded import NatsServer, free_port

        a = self.args
        self.server = NatsServer(data_dir=self.tmp / "nats", port=None, mqtt_port=0)
        await self.server.start()
        url = self.server.url
        self.log(f"nats-server {url}, MQTT :{self.server.mqtt_port} (JetStream in {self.tmp}); load average {load_average()}")
        self.http = HttpLoad(a.http_loadgen, self.tmp, a.payload, HTTP_PATH)
        self.loadgen = self.spawn("loadgen", loadgen_main, url)
        self.responder = self.spawn("responder", responder_main, url)
        self.consumer = self.spawn("js-consumer", js_consumer_main, url)
        in_node: list[int] = []
        for spec in a.bridges:
            port = free_port()
            self.http_ports[bridges_variant(spec)] = port
            by_node, own = bridge_layout(spec)
            if by_node:
                in_node.append(port)
            self.bridges[bridges_variant(spec)] = [self.spawn(f"bridge{spec}-{i}", bridge_main, url, PREFIX, port)
                                                   for i in range(own)]
        self.node = self.spawn("node", node_main, url, PREFIX, str(self.tmp / "node"), a.k, a.queue, a.loss, a.node_loop,
                               a.runtime, in_node)
        for name, (http, loop) in ECHO_SERVERS.items():
            port = free_port()
            self.http_ports[name] = port
            self.echo_apps[name] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "uvicorn", "echo_app:app", "--app-dir", str(Path(__file__).parent),
                "--host", "127.0.0.1", "--port", str(port), "--http", http, "--loop", loop, "--no-access-log",
                "--log-level", "warning", stdin=asyncio.subprocess.DEVNULL, preexec_fn=die_with_parent)
        if {1, 2} & a.rows:
            await self._start_go_original(free_port)
        await asyncio.gather(*(p.ready() for p in self.parties))
        # devices last: nats-server's MQTT needs the streams the node created
        self.devices = self.spawn("mqtt-devices", devices_main, self.server.mqtt_port, PREFIX, a.mqtt_devices,
                                  a.mqtt_window, a.payload)
        await self.devices.ready()
        for name, port in self.http_ports.items():
            await wait_http(port, self.echo_apps.get(name))
        groups = {"loadgen": [self.loadgen.pid], "devices": [self.devices.pid], "responder": [self.responder.pid],
                  "js consumer": [self.consumer.pid], "node": [self.node.pid],
                  "workers": self.node.info["worker_pids"], "nats-server": [self.server.proc.pid]}
        groups.update({name: [p.pid for p in parties] for name, parties in self.bridges.items()})
        groups.update({name: [proc.pid] for name, proc in self.echo_apps.items()})
        if self.go_procs:
            groups[GO_ORIGINAL] = [proc.pid for proc in self.go_procs]
        self.meter = CpuMeter(groups)
        self.log(f"node n1: K={a.k}, queue {a.queue}, NoScheduler({str(a.loss).lower()}), {len(groups['workers'])} "
                 f"workers ({a.runtime}), {a.node_loop} loop; HTTP bridge layouts {', '.join(a.bridges)}; "
                 f"{a.mqtt_devices} MQTT devices x {a.mqtt_window} in flight; HTTP load: {a.http_loadgen}")

    async def _start_go_original(self, free_port) -> None:
        """The Go original beside us (bench/go_original.py), when this machine can build and run it."""
        import go_original

        self.go_missing = ["--no-go-original"] if not self.args.go_original else go_original.missing()
        if self.go_missing:
            self.log(f"the P2PFaaS Go original is not measured: missing {', '.join(self.go_missing)}")
            return
        self.log("building the P2PFaaS Go original (stack-scheduler) and its echo")
        work = self.tmp / "go-original"
        work.mkdir()
        scheduler, echo = await asyncio.to_thread(go_original.build, work)
        self.go_procs = await asyncio.to_thread(go_original.start, work, scheduler, echo, free_port(), 64)
        self.http_ports[GO_ORIGINAL] = go_original.PORT

    async def stop(self) -> None:
        if self.go_procs:
            import go_original

            await asyncio.to_thread(go_original.stop, self.go_procs)
        for party in reversed(self.parties):
            await party.stop()
        for proc in self.echo_apps.values():
            if proc.returncode is None:
                proc.terminate()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(proc.wait(), 10)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if self.server is not None:
            await self.server.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- phases -------------------------------------------------------------------------------
    async def http_phase(self, variant: str, conns: int, duration_s: float) -> dict:
        assert self.meter is not None and self.http is not None
        before = self.meter.sample()
        result = await self.http.run(self.http_ports[variant], conns, duration_s)
        result["cpu"] = CpuMeter.usage(before, self.meter.sample(), result["requests"])
        return result

    async def timed(self, asks: list[tuple[Party, str, dict]], duration_s: float, warmup_s: float) -> tuple[list[dict], dict]:
        """Every ask gets the same window (after ``warmup_s``); CPU is sampled at its edges."""
        assert self.meter is not None
        start_at = time.time() + 0.1 + warmup_s
        end_at = start_at + duration_s
        window = {"start_at": start_at, "end_at": end_at, "payload": self.args.payload}
        tasks = [asyncio.create_task(party.ask(cmd, {**params, **window}, timeout=end_at - time.time() + 60))
                 for party, cmd, params in asks]
        await sleep_until(start_at)
        before = self.meter.sample()
        await sleep_until(end_at)
        after = self.meter.sample()
        return list(await asyncio.gather(*tasks)), {"before": before, "after": after}

    async def nats_phase(self, kind: str, n: int, duration_s: float) -> dict:
        (result,), cpu = await self.timed([(self.loadgen, kind, {"n": n, "prefix": PREFIX})], duration_s, self.args.warmup_s)
        result["cpu"] = CpuMeter.usage(cpu["before"], cpu["after"], result["ok"] + result["refused"])
        return result

    async def js_phase(self, duration_s: float) -> dict:
        (published, consumed), cpu = await self.timed(
            [(self.loadgen, "js_publish", {"window": self.args.js_window}), (self.consumer, "count", {})],
            duration_s, self.args.warmup_s)
        result = {**published, **consumed, "rps": consumed["consumed_rps"]}
        result["cpu"] = CpuMeter.usage(cpu["before"], cpu["after"], consumed["consumed_rps"] * duration_s)
        return result

    async def mqtt_phase(self, duration_s: float) -> dict:
        (result,), cpu = await self.timed([(self.devices, "run", {})], duration_s, self.args.warmup_s)
        result["cpu"] = CpuMeter.usage(cpu["before"], cpu["after"], result["rps"] * duration_s)
        return result

    # -- the run ------------------------------------------------------------------------------
    async def warm_up(self) -> None:
        """Untimed: connections, imports, stream files and caches of every path."""
        a = self.args
        seconds = 0.5 if a.quick else 1.0
        self.log("warm-up (untimed)")
        if {1, 2} & a.rows:
            for variant in self.http_ports:
                await self.http.run(self.http_ports[variant], a.http_conns, 1.0)
        if {3, 5} & a.rows:
            await self.nats_phase("raw", a.inflight, seconds)
            await self.nats_phase("direct", a.inflight, seconds)
        if 4 in a.rows:
            await self.nats_phase("async", a.inflight, seconds)
            await self.nats_phase("raw_durable", a.inflight, seconds)
            await self.js_phase(seconds)
        if 5 in a.rows:
            await self.mqtt_phase(seconds)

    async def repetition(self, rep: int) -> dict:
        a = self.args

        def abba(variants: list[str]) -> list[str]:
            return variants if rep % 2 == 0 else variants[::-1]

        out: dict[str, dict[str, dict]] = {}
        said: list[str] = []
        p2p = [bridges_variant(n) for n in a.bridges]
        if 1 in a.rows:
            h = out["http"] = {}
            go = [GO_ORIGINAL] if self.go_procs else []
            for variant in abba([ECHO_DEFAULT, *go, *p2p, ECHO_FAST]):
                h[variant] = await self.http_phase(variant, a.http_conns, a.thr_s)
            said.append(f"HTTP c{a.http_conns} echo {h[ECHO_DEFAULT]['rps']:,.0f} | "
                        + " | ".join(f"{v.split(', ')[1]} {h[v]['rps']:,.0f}" for v in p2p) + " req/s")
        if 2 in a.rows:
            h = out["http_seq"] = {}
            go = [GO_ORIGINAL] if self.go_procs else []
            for variant in abba([ECHO_DEFAULT, *go, bridges_variant(a.default_bridges), ECHO_FAST]):
                h[variant] = await self.http_phase(variant, 1, a.seq_s)
            said.append(f"HTTP p50 echo {h[ECHO_DEFAULT]['p50_us']:,.0f} / p2pfaas "
                        f"{h[bridges_variant(a.default_bridges)]['p50_us']:,.0f} µs")
        if 3 in a.rows:
            n = out["nats_seq"] = {}
            for kind in abba(["raw", "direct"]):
                n[kind] = await self.nats_phase(kind, 1, a.seq_s)
            said.append(f"NATS p50 raw {n['raw']['p50_us']:,.0f} / direct {n['direct']['p50_us']:,.0f} µs")
        if {3, 5} & a.rows:
            n = out["nats"] = {}
            for kind in abba(["raw", "direct"]):
                n[kind] = await self.nats_phase(kind, a.inflight, a.thr_s)
            said.append(f"raw {n['raw']['rps']:,.0f} / direct {n['direct']['rps']:,.0f} req/s")
        if 4 in a.rows:
            d = out["async"] = {}
            for kind in abba(["raw", "raw2", "async"]):
                d[kind] = await self.js_phase(a.thr_s) if kind == "raw" else \
                    await self.nats_phase("raw_durable" if kind == "raw2" else "async", a.inflight, a.thr_s)
            said.append(f"JetStream {d['raw']['rps']:,.0f} / two stores {d['raw2']['rps']:,.0f} / "
                        f"async {d['async']['rps']:,.0f} /s")
        if 5 in a.rows:
            out["mqtt"] = {"mqtt": await self.mqtt_phase(a.thr_s)}
            said.append(f"MQTT {out['mqtt']['mqtt']['rps']:,.0f} /s")
        self.log(f"rep {rep + 1}/{a.reps}: " + "; ".join(said) + problems(out))
        return out

    def _load(self, label: str, start_at: float, end_at: float) -> asyncio.Task:
        """Untimed load on one path (for the profiles)."""
        a = self.args
        window = {"start_at": start_at, "end_at": end_at, "payload": a.payload}
        timeout = end_at - time.time() + 60
        if label == "http":
            port = self.http_ports[bridges_variant(a.default_bridges)]
            return asyncio.create_task(self.http.run(port, a.http_conns, end_at - time.time()))
        if label == "mqtt":
            return asyncio.create_task(self.devices.ask("run", window, timeout=timeout))
        return asyncio.create_task(self.loadgen.ask(label, {**window, "n": a.inflight, "prefix": PREFIX}, timeout=timeout))

    async def profile(self) -> dict:
        """py-spy of the node, its two busiest workers and each path's front process under load, and the
        messages nats-server carries per request."""
        a = self.args
        out_dir, seconds = Path(a.profile), max(3.0, a.thr_s)
        bridges = [p.pid for p in self.bridges[bridges_variant(a.default_bridges)]]
        summary: dict[str, Any] = {}
        for label, front in (("http", {"bridges": bridges}), ("direct", {"loadgen": [self.loadgen.pid]}),
                             ("async", {"loadgen": [self.loadgen.pid]}), ("mqtt", {"devices": [self.devices.pid]})):
            self.log(f"profiling {label} ({seconds:g} s under load, py-spy --native)")
            start_at = time.time() + 1.5
            end_at = start_at + seconds + 1.0
            load = self._load(label, start_at, end_at)
            workers = await busiest_workers(self.node.info["worker_pids"], 2, 1.0)
            counter = asyncio.create_task(count_messages(self.server.url, PREFIX, seconds))
            files = await record_profiles({"node": [self.node.pid], "workers": workers, **front}, out_dir, label, seconds)
            counts = await counter
            rps = (await load)["rps"]
            summary[label] = {kind: summarize_collapsed(paths) for kind, paths in files.items()}
            summary[label]["rps_while_profiling"] = rps
            summary[label]["messages_per_request"] = {k: round(v / max(1.0, rps * seconds), 2) for k, v in counts.items()}
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.log(f"profiles: collapsed stacks (py-spy raw format) and summary.json in {out_dir}")
        return summary


def problems(out: dict) -> str:
    notes = []
    for phase, variants in out.items():
        for variant, r in variants.items():
            bad = {k: r[k] for k in ("errors", "refused", "lost") if r.get(k)}
            if bad:
                notes.append(f"{phase}/{variant}: " + ", ".join(f"{k} {v}" for k, v in bad.items())
                             + (f" ({r['last_error']})" if r.get("last_error") else ""))
    return (" [yellow]" + "; ".join(notes) + "[/yellow]") if notes else ""


async def wait_http(port: int, proc: asyncio.subprocess.Process | None, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.returncode is not None:
            raise RuntimeError(f"the echo app on :{port} exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"nothing listens on :{port} after {timeout_s:g} s")


async def busiest_workers(pids: list[int], count: int, over_s: float) -> list[int]:
    from probes import cpu_seconds

    before = {p: cpu_seconds(p) for p in pids}
    await asyncio.sleep(over_s)
    return sorted(pids, key=lambda p: cpu_seconds(p) - before[p], reverse=True)[:count]


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------
def per_rep(reps: list[dict], phase: str, variant: str, key: str) -> list[float]:
    return [r[phase][variant][key] for r in reps if variant in r.get(phase, {})]


def paired_ratio(reps: list[dict], num: tuple[str, str, str], den: tuple[str, str, str]) -> float:
    return med([r[num[0]][num[1]][num[2]] / r[den[0]][den[1]][den[2]] for r in reps
                if num[0] in r and den[0] in r and r[den[0]][den[1]][den[2]]])


def build_rows(reps: list[dict], args) -> list[dict]:
    rows: list[dict] = []

    def row(metric: str, base: tuple, sys_: tuple, target_key: str | None, higher_is_better: bool, unit: str) -> None:
        if not per_rep(reps, *base) or not per_rep(reps, *sys_):
            return
        ratio = paired_ratio(reps, sys_, base)
        target = TARGETS.get(target_key) if target_key else None
        verdict = "" if target is None else ("PASS" if (ratio >= target if higher_is_better else ratio <= target) else "MISS")
        rows.append({"metric": metric, "baseline": med(per_rep(reps, *base)), "p2pfaas": med(per_rep(reps, *sys_)),
                     "ratio": ratio, "target": target, "higher_is_better": higher_is_better, "verdict": verdict,
                     "unit": unit})

    c = args.http_conns
    for spec in args.bridges:
        v = bridges_variant(spec)
        default = " (default)" if spec == args.default_bridges else ""
        row(f"1. HTTP req/s, {c} conns, {v.split(', ', 1)[1]}{default}",
            ("http", ECHO_DEFAULT, "rps"), ("http", v, "rps"), "http", True, "%")
    dv = bridges_variant(args.default_bridges)
    row(f"   HTTP p99 µs, {c} conns (info)", ("http", ECHO_DEFAULT, "p99_us"), ("http", dv, "p99_us"), None, False, "x")
    row("2. HTTP p50 µs, 1 conn", ("http_seq", ECHO_DEFAULT, "p50_us"), ("http_seq", dv, "p50_us"), "http_p50", False, "x")
    row(f"1g. HTTP req/s, {c} conns, vs the P2PFaaS Go original", ("http", GO_ORIGINAL, "rps"), ("http", dv, "rps"),
        "go_http", True, "x")
    row("2g. HTTP p50 µs, 1 conn, vs the P2PFaaS Go original", ("http_seq", GO_ORIGINAL, "p50_us"),
        ("http_seq", dv, "p50_us"), "go_http_p50", False, "x")
    floor_row(rows, reps)
    row(f"3. NATS req/s, {args.inflight} in flight (direct)", ("nats", "raw", "rps"), ("nats", "direct", "rps"), "nats", True, "%")
    row("   NATS p50 µs, sequential (direct)", ("nats_seq", "raw", "p50_us"), ("nats_seq", "direct", "p50_us"), "nats_p50", False, "x")
    row(f"   NATS p50 µs, {args.inflight} in flight (info)", ("nats", "raw", "p50_us"), ("nats", "direct", "p50_us"), None, False, "x")
    row(f"4. durable async /s, {args.inflight} in flight vs raw JetStream", ("async", "raw", "rps"), ("async", "async", "rps"),
        "async", True, "%")
    row(f"   durable async vs raw nats-py durable calls, {args.inflight} in flight (info)", ("async", "raw2", "rps"),
        ("async", "async", "rps"), None, True, "%")
    row("   raw nats-py durable calls vs raw JetStream (info: row 4's ceiling)", ("async", "raw", "rps"),
        ("async", "raw2", "rps"), None, True, "%")
    row(f"5. MQTT QoS 1 /s, {args.mqtt_devices}x{args.mqtt_window} in flight vs NATS direct",
        ("nats", "direct", "rps"), ("mqtt", "mqtt", "rps"), "mqtt", True, "%")
    return rows


def floor_row(rows: list[dict], reps: list[dict]) -> None:
    """Row 2g's floor: a call to a worker behind nats-server crosses an HTTP server and a NATS
    request/reply (6 wake-ups; the Go original's path has 4). Their bare p50s, summed per repetition,
    against the Go original's p50: what p2pfaas would reach if its node and worker cost nothing."""
    per = [(r["http_seq"][ECHO_FAST]["p50_us"] + r["nats_seq"]["raw"]["p50_us"], r["http_seq"][GO_ORIGINAL]["p50_us"])
           for r in reps if {GO_ORIGINAL, ECHO_FAST} <= r.get("http_seq", {}).keys() and "raw" in r.get("nats_seq", {})]
    if per:
        rows.append({"metric": "   2g's floor: httptools echo p50 + raw NATS request/reply p50 (info)",
                     "baseline": med([go for _, go in per]), "p2pfaas": med([f for f, _ in per]),
                     "ratio": med([f / go for f, go in per]), "target": None, "higher_is_better": False,
                     "verdict": "", "unit": "x"})


def fmt_ratio(r: dict) -> str:
    v = r["ratio"]
    if v != v:
        return "-"
    return f"{v:.0%}" if r["unit"] == "%" else f"{v:.2f}x"


def fmt_target(r: dict) -> str:
    if r["target"] is None:
        return ""
    if r["higher_is_better"]:
        return f"≥ {r['target']:g}x" if r["unit"] == "x" else f"≥ {r['target']:.0%}"
    return f"≤ {r['target']:g}x"


CPU_COLUMNS = {
    "load gen": ("loadgen", "devices", "http tool"),
    "baseline server": ("responder", "js consumer", ECHO_DEFAULT, ECHO_FAST, GO_ORIGINAL),
    "bridges": None,   # every bridge variant
    "node": ("node",),
    "workers": ("workers",),
    "nats-server": ("nats-server",),
}


def cpu_columns(cpu: dict) -> dict[str, float]:
    out = {}
    for column, names in CPU_COLUMNS.items():
        if names is None:
            names = tuple(k for k in cpu if k.startswith("p2pfaas,"))
        out[column] = sum(cpu.get(n, 0.0) for n in names)
    out["sum"] = sum(out.values())
    out["others"] = cpu["others"]
    out["machine busy"] = cpu["machine_busy"]
    return out


def cpu_table_rows(reps: list[dict], args) -> list[tuple[str, dict[str, float]]]:
    plan = [(f"HTTP c{args.http_conns}: {v}", "http", v) for v in
            [ECHO_DEFAULT, ECHO_FAST, GO_ORIGINAL, *(bridges_variant(n) for n in args.bridges)]]
    plan += [(f"NATS {args.inflight} in flight: raw request/reply", "nats", "raw"),
             (f"NATS {args.inflight} in flight: p2pfaas direct", "nats", "direct"),
             ("JetStream: raw publish_async + pull/ack", "async", "raw"),
             (f"async {args.inflight} in flight: raw nats-py durable calls", "async", "raw2"),
             (f"async {args.inflight} in flight: p2pfaas durable", "async", "async"),
             ("MQTT QoS 1: p2pfaas via nats-server", "mqtt", "mqtt")]
    rows = []
    for label, phase, variant in plan:
        per = [cpu_columns(r[phase][variant]["cpu"]) for r in reps if variant in r.get(phase, {})]
        if per:
            rows.append((label, {k: med([p[k] for p in per]) for k in per[0]}))
    return rows


def stage_rows(reps: list[dict], args) -> list[tuple[str, dict[str, float]]]:
    rows = []
    for label, phase, variant in (("direct, sequential", "nats_seq", "direct"),
                                  (f"direct, {args.inflight} in flight", "nats", "direct"),
                                  (f"durable async, {args.inflight} in flight", "async", "async")):
        stages = [r[phase][variant]["stages_us"] for r in reps if "stages_us" in r.get(phase, {}).get(variant, {})]
        if stages:
            rows.append((label, {k: med([s[k] for s in stages]) for k in stages[0]}))
    return rows


def http_reference_rows(reps: list[dict], args) -> list[tuple[str, list[str]]]:
    rows = []
    for v in [ECHO_DEFAULT, ECHO_FAST, GO_ORIGINAL, *(bridges_variant(n) for n in args.bridges)]:
        if not per_rep(reps, "http", v, "rps"):
            continue
        seq = per_rep(reps, "http_seq", v, "p50_us")
        rows.append((v, [f"{med(per_rep(reps, 'http', v, 'rps')):,.0f}", f"{med(per_rep(reps, 'http', v, 'p50_us')):,.0f}",
                         f"{med(per_rep(reps, 'http', v, 'p99_us')):,.0f}", f"{med(seq):,.0f}" if seq else "-"]))
    if not per_rep(reps, "http", GO_ORIGINAL, "rps"):
        rows.append(("P2PFaaS Go original: quoted from issue 8 (hey, its machine), not measured in this run",
                     [f"{GO_P2PFAAS_QUOTED['c32_rps']:,.0f}", "-", "-", f"{GO_P2PFAAS_QUOTED['seq_p50_us']:,.0f}"]))
    return rows


def render(results: dict, args, console) -> None:
    from rich.table import Table

    reps = results["reps"]
    t = Table(title=f"Invocation paths (medians of {len(reps)} repetition(s); ratio = median of per-repetition ratios)")
    for col, just in (("row", "left"), ("baseline", "right"), ("p2pfaas", "right"), ("ratio", "right"),
                      ("target", "center"), ("", "center")):
        t.add_column(col, justify=just)
    for r in results["rows"]:
        verdict = {"PASS": "[green]PASS[/green]", "MISS": "[red]MISS[/red]"}.get(r["verdict"], "")
        t.add_row(r["metric"], f"{r['baseline']:,.0f}", f"{r['p2pfaas']:,.0f}", fmt_ratio(r), fmt_target(r), verdict)
    console.print(t)
    console.print("[dim]baselines: 1-2 FastAPI echo on uvicorn defaults (h11, asyncio); 1g-2g the P2PFaaS Go original "
                  "(stack-scheduler built from its source, NoScheduler, K=64, the Go echo behind it); 3 raw nats-py "
                  "request/reply to an echo responder; 4 raw JetStream (publish_async pipelined, pull 256 + ack, end to "
                  f"end); 5 the p2pfaas NATS direct path of row 3. HTTP load: {args.http_loadgen}.[/dim]")
    knative = results.get("knative")
    if knative:
        import knative_rule

        console.print("[bold]6. Knative's rule[/bold] (a 100 ms function at 1,000 req/s, open loop, K=128; "
                      "p95 <= 110 ms, p99 <= 130 ms, all 200, memory flat; bench/knative_rule.py)")
        console.print("\n".join(knative_rule.describe(knative)) if "skipped" not in knative else f"  {knative['skipped']}")

    h = Table(title=f"HTTP endpoints ({args.http_loadgen}; µs)", show_lines=False) if 1 in args.rows else None
    if h is not None:
        for col in ("endpoint", f"req/s c{args.http_conns}", f"p50 c{args.http_conns}", f"p99 c{args.http_conns}",
                    "p50 1 conn"):
            h.add_column(col, justify="left" if col == "endpoint" else "right")
        for name, cells in http_reference_rows(reps, args):
            h.add_row(name, *cells)
        console.print(h)

    stage_table = stage_rows(reps, args)
    if stage_table:
        s = Table(title="Where a p2pfaas call's time goes (medians, µs, from the answer's timing headers)")
        keys = ("transit", "scheduling", "queueing", "execution", "node_total", "return", "e2e")
        s.add_column("path")
        for k in keys:
            s.add_column(k.replace("_", " "), justify="right")
        for label, stages in stage_table:
            s.add_row(label, *(f"{stages[k]:,.0f}" for k in keys))
        console.print(s)
        console.print("[dim]transit: caller sent → node got it (async: → stored); scheduling: the algorithm's decision; "
                      "queueing: waiting for a worker slot (async: + waiting in the stream); node total: arrival → "
                      "answer sent; return: answer sent → caller has it (e2e - transit - node total)[/dim]")

    c = Table(title="CPU µs per request, by process (medians; 'others' = everything else on the machine meanwhile)")
    c.add_column("phase")
    cols = [*CPU_COLUMNS, "sum", "others", "machine busy"]
    for col in cols:
        c.add_column(col, justify="right")
    for label, cpu in cpu_table_rows(reps, args):
        c.add_row(label, *(f"{cpu[k]:.0%}" if k == "machine busy" else f"{cpu[k]:,.0f}" for k in cols))
    if c.row_count:
        console.print(c)
    mq = per_rep(reps, "mqtt", "mqtt", "p50_us")
    if mq:
        console.print(f"[dim]MQTT: p50 {med(mq):,.0f} µs, p99 {med(per_rep(reps, 'mqtt', 'mqtt', 'p99_us')):,.0f} µs per "
                      "request[/dim]")
    if per_rep(reps, "async", "raw", "published_rps"):
        console.print(f"[dim]raw JetStream: producer's publishes acknowledged "
                      f"{med(per_rep(reps, 'async', 'raw', 'published_rps')):,.0f}/s (at most {args.js_window} "
                      f"waiting for the consumer)[/dim]")
    for label, prof in (results.get("profile") or {}).items():
        mpr = prof.get("messages_per_request", {})
        console.print(f"[bold]profile {label}[/bold]: {prof['rps_while_profiling']:,.0f}/s while profiling; messages per "
                      f"request {sum(mpr.values()):.1f}: " + ", ".join(f"{k} {v}" for k, v in sorted(mpr.items(), key=lambda x: -x[1])))
        for kind, p in prof.items():
            if isinstance(p, dict) and p.get("samples"):
                console.print(f"  {kind} ({p['samples']} samples) self: "
                              + "; ".join(f"{f.split(' (')[0]} {pct}%" for f, pct in p["self_top"][:8]))
                console.print(f"  {kind} inclusive: " + "; ".join(f"{f.split(' (')[0]} {pct}%" for f, pct in p["incl_top"][:10]))


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="p2pfaas invocation paths (HTTP, NATS direct, durable async, MQTT) vs bare "
                                            "baselines, side by side in one run, with issue 8's targets.")
    p.add_argument("--quick", action="store_true", help="1 repetition, short phases (1-1.5 min)")
    p.add_argument("--json", metavar="OUT", help="write every measurement (per repetition) and the table rows as JSON")
    p.add_argument("--report", metavar="JSON", nargs="+",
                   help="measure nothing: print the tables of runs saved with --json, their repetitions pooled")
    p.add_argument("--markdown", action="store_true", help="with --report: print the tables as Markdown")
    p.add_argument("--profile", metavar="DIR", help="also py-spy the node, bridges, busiest workers and load generator "
                                                    "under each load; collapsed stacks + summary.json in DIR")
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--thr-s", type=float, default=3.0, help="seconds per throughput phase (default 3)")
    p.add_argument("--seq-s", type=float, default=2.0, help="seconds per sequential-latency phase (default 2)")
    p.add_argument("--warmup-s", type=float, default=0.5, help="untimed seconds before each NATS/MQTT window (default 0.5)")
    p.add_argument("--http-loadgen", choices=("wrk", "hey"), default="wrk", help="HTTP load generator (default wrk)")
    p.add_argument("--http-conns", type=int, default=32, help="HTTP connections (default 32)")
    p.add_argument("--no-go-original", dest="go_original", action="store_false",
                   help="do not build and measure the P2PFaaS Go original (bench/go_original.py)")
    p.add_argument("--bridges", default="node,node+1,1",
                   help="HTTP bridge layouts to measure: node (in the node's process, what `up` runs), node+N (and N "
                        "processes of its own on the port), N (N processes of its own, as `p2pfaas bridge http`); "
                        "default node,node+1,1")
    p.add_argument("--default-bridges", default=None, help="the layout the sequential row uses (default: the first)")
    p.add_argument("--inflight", type=int, default=200, help="NATS/async calls in flight (default 200)")
    p.add_argument("--payload", default="hello", help="request body, every path (default hello)")
    p.add_argument("--k", type=int, default=16, help="node's K: running slots and worker processes (default 16)")
    p.add_argument("--queue", type=int, default=100, help="node's queue length (default 100)")
    p.add_argument("--loss", type=lambda v: v.lower() in ("1", "true", "yes"), default=False,
                   help="NoScheduler's loss parameter: reject when K and the queue are full (default false)")
    p.add_argument("--node-loop", choices=("uvloop", "asyncio"), default="uvloop", help="the node process's event loop")
    p.add_argument("--runtime", choices=("process", "inprocess"), default="process", help="the node's worker runtime")
    p.add_argument("--rows", default="1,2,3,4,5,6",
                   help="which rows to measure (default all: 1,2,3,4,5,6; 6 is Knative's rule, on a stack of its own)")
    p.add_argument("--knative-s", type=float, default=40.0,
                   help="row 6: seconds of the 100 ms function at 1,000 req/s (default 40; the rule: 300)")
    p.add_argument("--js-window", type=int, default=2048,
                   help="raw JetStream: most messages published but not yet consumed (default 2048)")
    p.add_argument("--mqtt-devices", type=int, default=8, help="MQTT device connections (default 8)")
    p.add_argument("--mqtt-window", type=int, default=25, help="QoS 1 requests each device keeps outstanding (default 25)")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.thr_s, args.seq_s, args.warmup_s = 1, 2.0, 1.0, 0.3
    args.bridges = list(dict.fromkeys(b.strip() for b in args.bridges.split(",") if b.strip()))
    args.rows = {int(r) for r in args.rows.split(",") if r.strip()}
    if not args.rows or not args.rows <= {1, 2, 3, 4, 5, 6}:
        p.error("--rows: some of 1,2,3,4,5,6")
    try:
        layouts = [bridge_layout(b) for b in args.bridges]
    except ValueError:
        layouts = []
    if not layouts or any(own < (0 if by_node else 1) for by_node, own in layouts):
        p.error("--bridges: one or more of node, node+N, N (N >= 1), e.g. node,node+1,1")
    args.default_bridges = args.default_bridges or args.bridges[0]
    if args.default_bridges not in args.bridges:
        p.error(f"--default-bridges {args.default_bridges} is not among --bridges {args.bridges}")
    if min(args.reps, args.inflight, args.k, args.http_conns, args.mqtt_devices, args.mqtt_window) < 1:
        p.error("counts must be >= 1")
    if args.profile and Path(args.profile).exists() and not Path(args.profile).is_dir():
        p.error(f"--profile {args.profile}: exists and is not a directory")
    return args


async def run(args, console) -> dict:
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)   # SIGTERM cleans up like Ctrl-C
    bench = Bench(args, console)
    results: dict[str, Any] = {
        "config": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items() if k != "json"},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "load_average_before": load_average(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "reps": [],
    }
    try:
        if args.rows - {6}:
            await bench.start()
            await bench.warm_up()
            for rep in range(args.reps):
                results["reps"].append(await bench.repetition(rep))
            if args.profile:
                results["profile"] = await bench.profile()
    finally:
        results["load_average_after"] = load_average()
        await bench.stop()
        loop.remove_signal_handler(signal.SIGTERM)
    if 6 in args.rows:   # after the others: its own stack, K=128 (bench/knative_rule.py)
        import knative_rule

        if shutil.which("go") is None:
            results["knative"] = {"skipped": "Go is not installed: its load generator cannot be built"}
        else:
            results["knative"] = await asyncio.to_thread(knative_rule.run, args.knative_s, 1000.0, 128, False, bench.log)
    return results


def markdown(results: dict, args) -> str:
    """The result tables as Markdown (for bench/README.md)."""
    reps = results["reps"]
    lines = ["| row | baseline | p2pfaas | ratio | target | |", "|---|---:|---:|---:|:---:|:---:|"]
    for r in results["rows"]:
        lines.append(f"| {r['metric'].strip()} | {r['baseline']:,.0f} | {r['p2pfaas']:,.0f} | {fmt_ratio(r)} | "
                     f"{fmt_target(r)} | {r['verdict']} |")
    if 1 in args.rows:
        lines += ["", f"| HTTP endpoint ({args.http_loadgen}) | req/s c{args.http_conns} | p50 µs c{args.http_conns} | "
                      f"p99 µs c{args.http_conns} | p50 µs 1 conn |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in http_reference_rows(reps, args)]
    stages = stage_rows(reps, args)
    if stages:
        keys = ("transit", "scheduling", "queueing", "execution", "node_total", "return", "e2e")
        lines += ["", "| timings, µs (medians) | " + " | ".join(k.replace("_", " ") for k in keys) + " |",
                  "|---|" + "---:|" * len(keys)]
        lines += [f"| {label} | " + " | ".join(f"{st[k]:,.0f}" for k in keys) + " |" for label, st in stages]
    cols = [*CPU_COLUMNS, "sum", "others", "machine busy"]
    cpu = cpu_table_rows(reps, args)
    if cpu:
        lines += ["", "| CPU µs per request | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        lines += [f"| {label} | " + " | ".join(f"{c[k]:.0%}" if k == "machine busy" else f"{c[k]:,.0f}" for k in cols)
                  + " |" for label, c in cpu]
    return "\n".join(lines)


def report_saved(paths: list[str], console, as_markdown: bool = False) -> int:
    """The tables of saved runs (--json), their repetitions pooled: medians over all of them."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    args = argparse.Namespace(**runs[0]["config"])
    args.rows, args.bridges = set(args.rows), [str(b) for b in args.bridges]
    args.default_bridges = str(args.default_bridges)
    reps = [rep for run in runs for rep in run["reps"]]
    results = {"reps": reps, "rows": build_rows(reps, args)}
    if as_markdown:
        print(markdown(results, args))
        return 0
    render(results, args, console)
    console.print("[dim]runs: " + "; ".join(f"{r['started']} ({len(r['reps'])} reps, load average "
                                             f"{r['load_average_before']} → {r['load_average_after']})" for r in runs)
                  + "[/dim]")
    return 0


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.report:
        return report_saved(args.report, console, args.markdown)
    started = time.monotonic()
    try:
        results = asyncio.run(run(args, console))
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("[yellow]interrupted; everything it started was stopped[/yellow]")
        return 130
    results["rows"] = build_rows(results["reps"], args)
    results["elapsed_s"] = time.monotonic() - started
    render(results, args, console)
    console.print(f"[dim]{results['started']}, {results['elapsed_s']:.0f} s; load average before "
                  f"{results['load_average_before']}, after {results['load_average_after']}; "
                  f"command: {' '.join(['python', *sys.argv])}[/dim]")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
        console.print(f"[dim]JSON written to {args.json}[/dim]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
