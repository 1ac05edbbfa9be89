"""One run of the stack under load with faults injected one after another: open-loop load on
every transport, the fault, recovery, a short load after it, a bounded wait for the answers
of async calls, then the counts (bench/README.md, "Fault suite")."""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from broker.client import FaasClient
from broker.connection import close_quietly, connect
from broker.streams import async_stream, deadletter_stream
from broker.subjects import Subjects
from fault_suite import transports as T
from fault_suite.faults import Fault, FaultError
from fault_suite.ledger import AFTER, LOAD, Row
from fault_suite.stack import NODE, UpStack
from nodes.intake import consumer_name

log = logging.getLogger(__name__)
PREFIX = "faas"
SUBJECTS = Subjects(PREFIX)


@dataclass
class Options:
    seed: int = 1
    rate: float = 4.0             # calls per second per transport (Poisson arrivals): ~55 % of K=4 with 5 transports
    load_s: float = 24.0          # load under the fault; the fault comes at a third of it
    after_s: float = 4.0          # load after recovery: every call must succeed
    recover_s: float = 90.0       # bound on recovery (healthz 200, every worker ready)
    drain_s: float = 60.0         # bound on the answers of accepted async calls after the load
    direct_timeout_s: float = 20.0   # a direct call silent for this long is lost
    k: int = 4
    queue: int = 64
    disk_size: str = "64m"
    work_dir: Path = Path("/tmp/p2pfaas-faults")

    @classmethod
    def quick(cls, **kw) -> "Options":
        return cls(**{"load_s": 6.0, "after_s": 2.0, "recover_s": 60.0, "drain_s": 30.0,
                      "direct_timeout_s": 15.0, **kw})


@dataclass
class FaultReport:
    fault: str
    title: str
    mode: str
    rows: list[Row] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    healthz: int = 0
    error: str | None = None
    unchecked: list[str] = field(default_factory=list)   # checks that could not be made (a MISS: not proven)
    logs: str = ""

    def misses(self) -> list[str]:
        """Why this run is not a PASS (empty: PASS)."""
        out = [f"error: {self.error}"] if self.error else []
        out += [f"not checked: {what}" for what in self.unchecked]
        for row in self.rows:
            if row.lost:
                out.append(f"{row.transport}: {row.lost} lost")
            if row.duplicated:
                out.append(f"{row.transport}: {row.duplicated} duplicated")
            if row.overload:
                out.append(f"{row.transport}: {row.overload} accepted and then refused for overload")
            if not row.recovered:
                out.append(f"{row.transport}: {row.after_ok}/{row.after_sent} calls ok after recovery")
        if not self.error and self.healthz != 200:
            out.append(f"/healthz {self.healthz} at the end")
        return out

    def as_json(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"},
                "rows": [asdict(r) for r in self.rows], "misses": self.misses()}


def transports_for(mode: str, faults: list[Fault]) -> list[str]:
    """HTTP, NATS and the mode's MQTT; a Mosquitto-mode run of faults that are not about the
    Mosquitto side loads only its MQTT row (the other rows come from the nats-mode run)."""
    mqtt = T.MQTT_NATS if mode == "nats" else T.MQTT_MOSQUITTO
    if mode == "mosquitto" and not any(f.mosquitto_only for f in faults):
        return [mqtt]
    return [T.HTTP_DIRECT, T.HTTP_ASYNC, T.NATS_DIRECT, T.NATS_ASYNC, mqtt]


class Load:
    """Open loop: each transport sends on its own seeded Poisson clock, whatever the answers do."""

    def __init__(self, transports: list[T.Transport], rate: float, rng: random.Random, tag: str) -> None:
        self.transports, self.rate, self.tag = transports, rate, tag
        self.rngs = [random.Random(rng.random()) for _ in transports]
        self.sent = 0

    async def run(self, phase: str, seconds: float) -> None:
        await asyncio.gather(*(self._one(i, t, phase, seconds) for i, t in enumerate(self.transports)))

    async def _one(self, i: int, transport: T.Transport, phase: str, seconds: float) -> None:
        rng, loop = self.rngs[i], asyncio.get_running_loop()
        start = next_at = loop.time()
        while True:
            next_at += rng.expovariate(self.rate)
            if next_at - start >= seconds:
                return
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            self.sent += 1
            payload = f"{rng.uniform(0.02, 0.2):.3f}".encode()   # the sleep function's seconds
            transport.send(f"{self.tag}{i}-{self.sent}", payload, phase)


def make_transports(names: list[str], stack: UpStack, nc, tag: str, opts: Options) -> list[T.Transport]:
    made = {
        T.HTTP_DIRECT: lambda: T.HttpDirect(stack.http_url, "http-n1", opts.direct_timeout_s),
        T.HTTP_ASYNC: lambda: T.HttpAsync(stack.http_url, "http-n1", opts.direct_timeout_s),
        T.NATS_DIRECT: lambda: T.NatsDirect(nc, f"{tag}nd", PREFIX, opts.direct_timeout_s),
        T.NATS_ASYNC: lambda: T.NatsAsync(nc, f"{tag}na", PREFIX),
        T.MQTT_NATS: lambda: T.MqttDevice(T.MQTT_NATS, "127.0.0.1", stack.mqtt_port, f"{tag}mq", PREFIX,
                                          stack.device(f"{tag}mq")),
        T.MQTT_MOSQUITTO: lambda: T.MqttDevice(T.MQTT_MOSQUITTO, "127.0.0.1", stack.mqtt_port, f"{tag}mq", PREFIX,
                                               stack.device(f"{tag}mq")),
    }
    return [made[name]() for name in names]


async def run_session(mode: str, faults: list[Fault], opts: Options, say: Callable[[str], None] = print
                      ) -> list[FaultReport]:
    """Start one stack (``up --mqtt mode``), run ``faults`` on it one after the other, stop it."""
    root = opts.work_dir / f"{mode}-{'-'.join(f.name for f in faults)}"
    reports = [FaultReport(f.name, f.title, mode, logs=str(root)) for f in faults]
    mount = root / "disk" if any(f.tmpfs for f in faults) else None
    if mount is not None:
        why = _mount_tmpfs(mount, opts.disk_size)
        if why:
            for r in reports:
                r.error = f"skipped: cannot mount a tmpfs ({why})"
            return reports
    stack = UpStack(root, mode, k=opts.k, queue=opts.queue, data_dir=(mount / "data") if mount else None)
    names = transports_for(mode, faults)
    try:
        say(f"[{mode}] starting p2pfaas up (data dir {stack.data_dir})")
        try:
            await stack.start()
        except RuntimeError as exc:
            for r in reports:
                r.error = f"up did not start: {exc}"
            return reports
        for i, (fault, report) in enumerate(zip(faults, reports)):
            tag = f"s{opts.seed}{mode[0]}{i}{fault.name[:2]}"
            try:
                await asyncio.wait_for(_run_fault(stack, fault, names, report, opts, tag, say), _bound(opts))
            except asyncio.TimeoutError:
                report.error = f"the run did not finish within its bound of {_bound(opts):g} s"
            except (FaultError, RuntimeError, OSError) as exc:
                report.error = str(exc)
            say(f"[{mode}] {fault.name}: " + ("PASS" if not report.misses() else "MISS: " + "; ".join(report.misses())))
    finally:
        notes = await stack.stop()
        if notes:
            reports[-1].events += notes
        if mount is not None:   # the logs outlive the tmpfs
            for src, dst in ((stack.data_dir / "logs", root / "logs"), (stack.data_dir / "nats", root / "nats")):
                shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("jetstream"))
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
    return reports


def _bound(opts: Options) -> float:
    """Every phase is bounded; so is a whole fault run."""
    return opts.load_s + opts.after_s + opts.recover_s + opts.drain_s + 2 * opts.direct_timeout_s + 180


async def _run_fault(stack: UpStack, fault: Fault, names: list[str], report: FaultReport, opts: Options, tag: str,
                     say: Callable[[str], None]) -> None:
    nc = await connect(stack.nats_url, f"fault-suite-{tag}", credentials=stack.operator())
    transports = make_transports(names, stack, nc, tag, opts)
    lookup = FaasClient(nc, client=f"{tag}lk", prefix=PREFIX)
    started = time.monotonic()

    def event(text: str) -> None:
        report.events.append(f"{time.monotonic() - started:6.1f} s  {text}")
        say(f"[{stack.mqtt}] {fault.name}: {text}")

    try:
        await asyncio.gather(*(t.start() for t in transports))
        load = Load(transports, opts.rate, random.Random(f"{opts.seed}-{fault.name}-{stack.mqtt}"), tag)
        event(f"load {opts.rate:g}/s per transport on {', '.join(names)}")
        loading = asyncio.create_task(load.run(LOAD, opts.load_s))
        await asyncio.sleep(opts.load_s / 3)
        try:
            event(await fault.inject(stack, random.Random(f"{opts.seed}-{fault.name}")))
            await asyncio.sleep(fault.hold_s(opts.load_s))
            event(await fault.end(stack))
        finally:
            await loading
        healthy = await stack.healthy(opts.recover_s)
        event("recovered: /healthz 200, every worker ready" if healthy
              else f"NOT recovered within {opts.recover_s:g} s (/healthz {(await stack.health())[0]})")
        # the backlog of the outage first: calls made after it then meet an idle system
        waited = await _drain(transports, opts.drain_s)
        event(f"answers of the load under the fault: waited {waited:.1f} s (bound {opts.drain_s:g} s)")
        await load.run(AFTER, opts.after_s)
        waited = await _drain(transports, opts.drain_s)
        event(f"load after recovery sent; its answers: waited {waited:.1f} s")
        for t in transports:
            await t.settle(lookup)
        report.unchecked += await _count_stored_duplicates(nc, transports)
        report.rows = [t.ledger.row() for t in transports]
        if any(row.lost for row in report.rows):
            for line in await _diagnose(nc, transports):
                event(line)
        report.healthz = (await stack.health())[0]
        event(f"done: /healthz {report.healthz}")
    finally:
        for t in transports:
            await t.close()
        await close_quietly(nc)


async def _drain(transports: list[T.Transport], timeout_s: float) -> float:
    """Wait until no direct call is in flight and every async call is answered or refused
    (bounded); returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        busy = [t for t in transports if (t.direct and t.in_flight()) or (not t.direct and t.ledger.pending())]
        if not busy:
            break
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def _count_stored_duplicates(nc, transports: list[T.Transport]) -> list[str]:
    """More than one answer kept in the results stream for one request id is a duplicate.
    Returns what could not be checked (the stream could not be read): the run is then a MISS,
    since no duplicate found is not the same as none there."""
    unchecked = []
    for t in transports:
        if t.direct:
            continue
        keys = t.answer_keys() if isinstance(t, T.HttpAsync) else {req: req for req in t.ledger.calls}
        try:
            counts = await T.stored_answer_counts(nc, PREFIX, t.client)
        except Exception as exc:   # the stream cannot be read: the report says so (a MISS)
            log.warning("results stream of %s: %s", t.client, exc)
            unchecked.append(f"{t.name}: answers stored per request id (results stream unreadable: "
                             f"{type(exc).__name__} {exc})")
            continue
        t.ledger.stored_duplicates |= {req for req, key in keys.items() if counts.get(key, 0) > 1}
    return unchecked


async def _diagnose(nc, transports: list[T.Transport]) -> list[str]:
    """Where lost async calls are: still in the async stream (not consumed), held by the node's
    consumer (ack pending), or dead-lettered."""
    js, out = nc.jetstream(), []
    try:
        info = await js.consumer_info(async_stream(SUBJECTS), consumer_name(NODE))
        out.append(f"consumer {info.name}: {info.num_pending} not yet delivered, {info.num_ack_pending} "
                   f"delivered and not acknowledged, {info.num_redelivered} redelivered")
        for t in transports:
            lost = [req for req, c in t.ledger.calls.items() if c.accepted and not c.answered]
            if t.direct or not lost:
                continue
            keys = t.answer_keys() if isinstance(t, T.HttpAsync) else {req: req for req in lost}
            stream = await js.stream_info(async_stream(SUBJECTS), subjects_filter=f"{PREFIX}.async.*.*.{t.client}.*")
            waiting = {s.rsplit(".", 1)[1] for s in (stream.state.subjects or {})}
            held = sum(keys.get(req) in waiting for req in lost)
            out.append(f"{t.name}: {len(lost)} lost, {held} of them still in the async stream; e.g. {lost[:3]}")
        dead = await js.stream_info(deadletter_stream(SUBJECTS))
        out.append(f"dead-letter stream: {dead.state.messages} messages")
    except Exception as exc:   # diagnostics only
        out.append(f"diagnostics failed: {type(exc).__name__} {exc}")
    return out


def _mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at ``path`` (needs root); the reason when it cannot."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited with {done.returncode}")
