"""``p2pfaas eval p2p``: P2P scheduling algorithms against the Erlang-B bounds, on the real system:
n nodes with K slots and no queue, one hot node, the same seeded Poisson arrivals of exponential
service times for every algorithm. Its rejection rate is set next to Erlang-B(K, A_i) (each node
alone: NoScheduler's expected value) and Erlang-B(nK, sum A_i) (the pooled bound)."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from broker.messages import NodeConfiguration
from nodes.scheduler.algorithms import build_algorithm
from nodes.scheduler.queueing import erlang_b
from nodes.settings import NodeSettings
from p2pfaas.experiments.cluster import ExperimentCluster, Progress, Send, experiment_broker

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


class P2PRun(ExperimentCluster):
    """The nodes of one experiment run: ``async with P2PRun(exp, nats_url, prefix, data_dir)``."""

    def __init__(self, exp: P2PExperiment, nats_url: str, prefix: str, data_dir: Path) -> None:
        self.exp = exp
        settings = [NodeSettings(
            node_id=f"n{i + 1}", nats_url=nats_url, prefix=prefix, data_dir=data_dir,
            runtime="inprocess", heartbeat_period_s=0.2, suspect_after=5, remove_after=20, learner=False,
            initial=NodeConfiguration(parallel_running_functions_max=exp.slots, queue_length_max=0,
                                      queue_enabled=False)) for i in range(exp.nodes)]
        super().__init__(settings, nats_url, prefix, "evalp2p")

    async def run(self, algorithm: Algorithm, arrivals: list[Arrival], run_no: int,
                  progress: Progress | None = None) -> Outcome:
        name, params = algorithm
        per_node = {}
        for node_id in self.ids:
            if name == ROUND_ROBIN and not params:  # the last node is the master
                master = self.ids[-1]
                per_node[node_id] = (name, ["true", "", "true"] if node_id == master else ["false", master, "true"])
            else:
                per_node[node_id] = (name, params)
        printed = await self.configure(per_node)
        targets = list(range(self.exp.nodes))
        if name == ROUND_ROBIN:  # the master only dispatches: its clients submit through a slave
            targets[-1] = self.exp.nodes - 2 if self.exp.nodes > 1 else 0
        sends = [Send(a.at, self.ids[targets[a.node]], f"{a.service_s:.6f}".encode()) for a in arrivals]
        results = await self.drive(sends, f"r{run_no}", printed, progress,
                                   timeout_s=60.0 + 20 * self.exp.mean_service_s)
        served = [(ans, dt) for ans, dt in results if ans is not None and ans.status == 200]
        rejected = sum(1 for ans, _ in results if ans is not None and ans.rejected)
        latencies = [dt for _, dt in served]
        return Outcome(
            algorithm=printed, requests=len(arrivals), served=len(served), rejected=rejected,
            errors=len(arrivals) - len(served) - rejected,
            forwarded=sum(1 for ans, _ in served if ans.hops > 0),
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
    async with experiment_broker(nats_url, data_dir) as (url, directory):
        async with P2PRun(exp, url, prefix, directory) as run:
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
    """``Name`` or ``Name:p1,p2,...`` (as in ``/configuration/scheduler``); ValueError, before
    anything starts, for a name no node knows or parameters it does not take."""
    name, _, params = text.partition(":")
    algorithm = name.strip(), [p.strip() for p in params.split(",")] if params else []
    build_algorithm(*algorithm)
    return algorithm
