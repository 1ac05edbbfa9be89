"""``p2pfaas eval p2p``: P2P scheduling algorithms against the Erlang-B bounds, on the real system.

n nodes with K slots and no queue, Poisson arrivals with exponential service
times (the ``sleep`` function), one hot node. Every algorithm sees the same
seeded arrivals; its rejection rate is set next to Erlang-B(K, A_i) (each node
alone, NoScheduler's expected value) and Erlang-B(nK, sum A_i) (the pooled bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import orjson

from broker.client import FaasClient
from broker.connection import close_quietly, connect
from broker.embedded import NatsServer
from broker.messages import NodeConfiguration, SchedulerConfiguration
from broker.subjects import Subjects
from nodes.node import Node
from nodes.scheduler.queueing import erlang_b
from nodes.settings import NodeSettings

Algorithm = tuple[str, list[str]]
ROUND_ROBIN = "RoundRobinWithMasterScheduler"
DEFAULT_ALGORITHMS: list[Algorithm] = [
    ("NoScheduler", ["true"]),
    ("ForwardScheduler", ["1"]),
    ("PowerOfNScheduler", ["1", "2", "true", "1"]),
    ("PowerOfNScheduler", ["2", "2", "true", "1"]),
    ("PowerOfNScheduler", ["3", "3", "true", "1"]),
    (ROUND_ROBIN, []),  # no parameters: the last node is the master, the others its slaves
]


@dataclass
class P2PExperiment:
    """The workload and the system under test."""

    nodes: int = 4                 # n
    slots: int = 3                 # K per node; the queue is disabled
    mean_service_s: float = 0.2    # exponential service times
    hot_load: float = 3.0          # Erlangs offered to n1
    cold_load: float = 1.0         # Erlangs offered to every other node
    duration_s: float = 60.0       # of arrivals, per algorithm
    seed: int = 1
    algorithms: list[Algorithm] = field(default_factory=lambda: list(DEFAULT_ALGORITHMS))

    def loads(self) -> list[float]:
        return [self.hot_load] + [self.cold_load] * (self.nodes - 1)


@dataclass(frozen=True)
class Arrival:
    at: float        # seconds after the start
    node: int        # index of the node it is sent to
    service_s: float


def poisson_arrivals(exp: P2PExperiment) -> list[Arrival]:
    """Independent Poisson streams per node (rate A_i / mean service), merged in time order."""
    rng = random.Random(exp.seed)
    out: list[Arrival] = []
    for node, load in enumerate(exp.loads()):
        rate = load / exp.mean_service_s
        t = rng.expovariate(rate) if rate > 0 else math.inf
        while t < exp.duration_s:
            out.append(Arrival(t, node, rng.expovariate(1.0 / exp.mean_service_s)))
            t += rng.expovariate(rate)
    return sorted(out, key=lambda a: a.at)


@dataclass
class References:
    """Erlang-B values for the offered loads ``loads`` (Erlangs per node)."""

    loads: list[float]
    per_node: list[float]   # Erlang-B(K, A_i)
    local_only: float       # arrival-weighted mean of per_node: NoScheduler's expected rejection rate
    pooled: float           # Erlang-B(nK, sum A_i): no scheduler moving requests can do better

    @classmethod
    def of(cls, slots: int, loads: list[float]) -> "References":
        per_node = [erlang_b(slots, a) for a in loads]
        total = sum(loads)
        local = sum(a * b for a, b in zip(loads, per_node)) / total if total else 0.0
        return cls(loads, per_node, local, erlang_b(slots * len(loads), total))


def realised_loads(exp: P2PExperiment, arrivals: list[Arrival]) -> list[float]:
    """The loads this sample actually offered (sum of service times / duration, per node)."""
    work = [0.0] * exp.nodes
    for a in arrivals:
        work[a.node] += a.service_s
    return [w / exp.duration_s for w in work]


@dataclass
class Outcome:
    """What one algorithm achieved."""

    algorithm: str
    requests: int
    served: int
    rejected: int
    errors: int          # neither served nor rejected (timeouts, function errors)
    forwarded: int       # served after at least one forward
    latency_mean_s: float
    latency_p95_s: float

    @property
    def rejection_rate(self) -> float:
        return self.rejected / self.requests if self.requests else 0.0

    @property
    def ci95(self) -> float:
        """Half-width of a normal 95 % interval (treats requests as independent: a lower bound)."""
        p = self.rejection_rate
        return 1.96 * math.sqrt(p * (1 - p) / self.requests) if self.requests else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


Progress = Callable[[str, int, int], None]   # (algorithm, answered, total)


class P2PRun:
    """Owns the nodes of one experiment run: ``async with P2PRun(exp, nats_url, prefix, data_dir)``."""

    def __init__(self, exp: P2PExperiment, nats_url: str, prefix: str, data_dir: Path) -> None:
        self.exp, self.nats_url, self.prefix, self.data_dir = exp, nats_url, prefix, data_dir
        self.subjects = Subjects(prefix)
        self.ids = [f"n{i + 1}" for i in range(exp.nodes)]
        self.nodes: list[Node] = []
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> "P2PRun":
        try:
            for node_id in self.ids:
                settings = NodeSettings(
                    node_id=node_id, nats_url=self.nats_url, prefix=self.prefix, data_dir=self.data_dir,
                    runtime="inprocess", heartbeat_period_s=0.2, suspect_after=5, remove_after=20, learner=False,
                    initial=NodeConfiguration(parallel_running_functions_max=self.exp.slots,
                                              queue_length_max=0, queue_enabled=False))
                self.nodes.append(await self._stack.enter_async_context(Node(settings)))
            for node in self.nodes:
                assert node.pool is not None
                await node.pool.wait_ready(60)
            await _until(lambda: all(len(n.discovery.peers()) == len(self.ids) - 1 for n in self.nodes), 30,
                         "the nodes did not discover each other")
            self.nc = await connect(self.nats_url, "eval-p2p")
            self._stack.push_async_callback(close_quietly, self.nc)
            self.faas = await self._stack.enter_async_context(FaasClient(self.nc, client="evalp2p", prefix=self.prefix))
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def configure(self, algorithm: Algorithm) -> str:
        """Set the algorithm on every node over the configuration subject; returns its printed name."""
        name, params = algorithm
        for node_id in self.ids:
            if name == ROUND_ROBIN and not params:  # the last node is the master
                master = self.ids[-1]
                node_params = ["true", "", "true"] if node_id == master else ["false", master, "true"]
            else:
                node_params = params
            body = orjson.dumps(SchedulerConfiguration(name=name, parameters=node_params).model_dump())
            reply = await self.nc.request(self.subjects.scheduler_config(node_id, "set"), body, timeout=5)
            if reply.headers and reply.headers.get("X-P2pfaas-Status", "200") != "200":
                raise ValueError(f"{name}{node_params}: {reply.data.decode()}")
        return self.nodes[0].scheduler.algorithm.describe()

    async def run(self, algorithm: Algorithm, arrivals: list[Arrival], run_no: int,
                  progress: Progress | None = None) -> Outcome:
        printed = await self.configure(algorithm)
        await _until(lambda: all(n.scheduler.load.n_running + n.scheduler.load.n_queued == 0 for n in self.nodes),
                     120, "nodes did not become idle")
        targets = list(range(self.exp.nodes))
        if algorithm[0] == ROUND_ROBIN:  # the master only dispatches: its clients submit through a slave
            targets[-1] = self.exp.nodes - 2 if self.exp.nodes > 1 else 0
        answered = 0
        timeout_s = 60.0 + 20 * self.exp.mean_service_s

        async def one(i: int, a: Arrival):
            nonlocal answered
            started = time.perf_counter()
            try:
                answer = await self.faas.invoke(self.ids[targets[a.node]], "sleep", f"{a.service_s:.6f}".encode(),
                                                req=f"r{run_no}x{i}", timeout_s=timeout_s)
            except Exception:  # no answer in time, or not accepted by the broker: counted as an error
                answer = None
            answered += 1
            if progress:
                progress(printed, answered, len(arrivals))
            return answer, time.perf_counter() - started

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        tasks = []
        for i, a in enumerate(arrivals):
            delay = t0 + a.at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, a)))
        results = await asyncio.gather(*tasks)
        served = [(ans, dt) for ans, dt in results if ans is not None and ans.result is not None and ans.status == 200]
        rejected = sum(1 for ans, _ in results if ans is not None and ans.rejection is not None)
        latencies = [dt for _, dt in served]
        return Outcome(
            algorithm=printed, requests=len(arrivals), served=len(served), rejected=rejected,
            errors=len(arrivals) - len(served) - rejected,
            forwarded=sum(1 for ans, _ in served if ans.result.hops > 0),
            latency_mean_s=statistics.fmean(latencies) if latencies else float("nan"),
            latency_p95_s=percentile(latencies, 0.95),
        )


@dataclass
class P2PReport:
    experiment: P2PExperiment
    nominal: References
    realised: References
    outcomes: list[Outcome]

    def to_json(self) -> bytes:
        return orjson.dumps({
            "experiment": asdict(self.experiment),
            "references": {"nominal": asdict(self.nominal), "realised": asdict(self.realised)},
            "outcomes": [{**asdict(o), "rejection_rate": o.rejection_rate, "ci95": o.ci95} for o in self.outcomes],
        }, option=orjson.OPT_INDENT_2)


async def run_experiment(exp: P2PExperiment, *, nats_url: str | None = None, prefix: str = "evalp2p",
                         data_dir: Path | None = None, progress: Progress | None = None) -> P2PReport:
    """Run every algorithm of ``exp``; starts a private nats-server unless ``nats_url`` is given."""
    arrivals = poisson_arrivals(exp)
    outcomes: list[Outcome] = []
    with contextlib.ExitStack() as tmp:
        if data_dir is None:
            data_dir = Path(tmp.enter_context(tempfile.TemporaryDirectory(prefix="p2pfaas-eval-")))
        async with contextlib.AsyncExitStack() as stack:
            if nats_url is None:
                server = await stack.enter_async_context(NatsServer(data_dir=data_dir / "nats", port=None))
                nats_url = server.url
            run = await stack.enter_async_context(P2PRun(exp, nats_url, prefix, data_dir))
            for run_no, algorithm in enumerate(exp.algorithms):
                outcomes.append(await run.run(algorithm, arrivals, run_no, progress))
    return P2PReport(exp, References.of(exp.slots, exp.loads()),
                     References.of(exp.slots, realised_loads(exp, arrivals)), outcomes)


def rows(report: P2PReport) -> list[tuple[str, str, str, str, str, str]]:
    """(algorithm, rejected %, mean latency, p95 latency, forwarded %, requests): measured, then the references."""
    out = []
    for o in report.outcomes:
        out.append((o.algorithm, f"{100 * o.rejection_rate:.1f} ± {100 * o.ci95:.1f}",
                    f"{1000 * o.latency_mean_s:.0f} ms", f"{1000 * o.latency_p95_s:.0f} ms",
                    f"{100 * o.forwarded / o.requests:.1f}" if o.requests else "-", f"{o.requests}"
                    + (f" ({o.errors} errors)" if o.errors else "")))
    e, nom, real = report.experiment, report.nominal, report.realised
    out.append((f"Erlang-B(K={e.slots}, A_i) local-only", f"{100 * nom.local_only:.1f} ({100 * real.local_only:.1f})",
                "", "", "", "analytic"))
    out.append((f"Erlang-B(nK={e.nodes * e.slots}, ΣA={sum(nom.loads):g}) pooled",
                f"{100 * nom.pooled:.1f} ({100 * real.pooled:.1f})", "", "", "", "analytic"))
    return out


HEADERS = ("algorithm", "rejected %", "mean latency", "p95 latency", "forwarded %", "requests")


def caption(report: P2PReport) -> str:
    e = report.experiment
    loads = ", ".join(f"{a:g}" for a in e.loads())
    return (f"n={e.nodes} nodes, K={e.slots} slots, no queue; exponential service, mean {e.mean_service_s:g} s; "
            f"offered load per node (Erlangs) {loads}; {e.duration_s:g} s of Poisson arrivals per algorithm, "
            f"seed {e.seed}. Rejected: ± 95 % interval; references: nominal (realised by this sample).")


def markdown(report: P2PReport) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(report)]
    return "\n".join(lines) + "\n\n" + caption(report) + "\n"


def parse_algorithm(text: str) -> Algorithm:
    """``Name`` or ``Name:p1,p2,...`` (as in ``/configuration/scheduler``)."""
    name, _, params = text.partition(":")
    return name.strip(), [p.strip() for p in params.split(",")] if params else []


async def _until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:g} s")
        await asyncio.sleep(0.05)
