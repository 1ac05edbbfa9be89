"""``p2pfaas eval learning``: the LearningScheduler against NoScheduler and PowerOfN on heterogeneous
nodes, the same seeded arrivals for all; the LearningScheduler is measured after an online warm-up
on other arrivals, during which the nodes' learners train (docs/learning.md)."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from broker import headers as H
from broker.client import Answer
from broker.messages import NodeConfiguration
from nodes.learner.client import RemotePolicy
from nodes.settings import NodeSettings
from p2pfaas.experiments.cluster import ExperimentCluster, Progress, Send, experiment_broker
from p2pfaas.experiments.p2p import Algorithm, percentile


@dataclass
class NodeSpec:
    node_id: str
    slots: int          # K
    speed: float        # 1 = as is; 0.5 = every execution takes twice as long
    rate: float         # requests per second offered to this node by its clients


@dataclass
class TaskType:
    mean_service_s: float   # at speed 1 (gamma distributed, see LearningExperiment.service_shape)
    deadline_s: float       # met when answered 200 within this total time
    share: float            # fraction of the arrivals


@dataclass
class LearningExperiment:
    """The workload and the system under test (defaults: about 9 minutes in all)."""

    nodes: list[NodeSpec] = field(default_factory=lambda: [
        NodeSpec("n1", 4, 1.0, 28.0),    # hot: ~4.6 Erlangs on 4 slots
        NodeSpec("n2", 6, 0.35, 3.0),    # many slots, but slow (an old edge box): a load count misjudges it
        NodeSpec("n3", 6, 1.0, 4.0),     # fast, lightly loaded
    ])
    task_types: list[TaskType] = field(default_factory=lambda: [
        TaskType(0.08, 0.2, 0.5),        # short, tight deadline: misses on the slow node more often than not
        TaskType(0.25, 1.0, 0.5),        # long, loose deadline: the slow node meets it ~4 times in 5
    ])
    queue: int = 0                   # queue length per node (0: no queue, P2PFaaS's experimental setting)
    service_shape: float = 4.0       # gamma shape of service times (coefficient of variation 1/sqrt(shape))
    duration_s: float = 60.0         # of arrivals, per measured algorithm
    warmup_s: float = 180.0          # of arrivals for the LearningScheduler's online warm-up
    seed: int = 1
    power_of_n: list[list[str]] = field(default_factory=lambda: [
        ["1", "2", "true", "1"], ["2", "2", "true", "1"], ["2", "4", "true", "1"]])
    learner_parameters: dict = field(default_factory=lambda: {
        "alpha": 0.1, "beta": 0.01, "epsilon_min": 0.05, "epsilon_decay": 0.99})
    explore: bool = True             # measure the LearningScheduler exploring (as deployed) or greedy

    def algorithms(self) -> list[Algorithm]:
        learning: Algorithm = ("LearningScheduler", [str(len(self.task_types)), str(len(self.nodes) - 1),
                                                     str(self.explore).lower()])
        return [("NoScheduler", ["true"]), *(("PowerOfNScheduler", p) for p in self.power_of_n), learning]


@dataclass(frozen=True)
class Arrival:
    at: float        # seconds after the start
    node: int
    task_type: int
    service_s: float


def poisson_arrivals(exp: LearningExperiment, duration_s: float, seed: int) -> list[Arrival]:
    """Independent Poisson streams per node, types drawn by share, gamma service times."""
    rng = random.Random(seed)
    shares = [t.share for t in exp.task_types]
    out: list[Arrival] = []
    for i, node in enumerate(exp.nodes):
        t = rng.expovariate(node.rate) if node.rate > 0 else math.inf
        while t < duration_s:
            kind = rng.choices(range(len(shares)), shares)[0]
            mean = exp.task_types[kind].mean_service_s
            out.append(Arrival(t, i, kind, rng.gammavariate(exp.service_shape, mean / exp.service_shape)))
            t += rng.expovariate(node.rate)
    return sorted(out, key=lambda a: a.at)


@dataclass
class Outcome:
    algorithm: str
    requests: int
    met: int             # answered 200 within the type's deadline
    rejected: int
    errors: int          # neither served nor rejected in time
    forwarded: int
    latency_p95_s: float  # client-observed, served requests
    met_by_type: list[float]

    @property
    def met_rate(self) -> float:
        return self.met / self.requests if self.requests else 0.0

    @property
    def rejection_rate(self) -> float:
        return self.rejected / self.requests if self.requests else 0.0

    @property
    def ci95(self) -> float:
        p = self.met_rate
        return 1.96 * math.sqrt(p * (1 - p) / self.requests) if self.requests else 0.0


def outcome_of(exp: LearningExperiment, name: str, arrivals: list[Arrival],
               answers: list[tuple[Answer | None, float]]) -> Outcome:
    met_by_type = [[0, 0] for _ in exp.task_types]
    met = rejected = forwarded = 0
    latencies = []
    for a, (answer, latency) in zip(arrivals, answers):
        met_by_type[a.task_type][1] += 1
        if answer is None:
            continue
        if answer.rejected:
            rejected += 1
            continue
        forwarded += answer.hops > 0
        if answer.status == 200:
            latencies.append(latency)
            if answer.timings.total_s <= exp.task_types[a.task_type].deadline_s:
                met += 1
                met_by_type[a.task_type][0] += 1
    served = len(latencies)
    return Outcome(name, len(arrivals), met, rejected, len(arrivals) - served - rejected, forwarded,
                   percentile(latencies, 0.95), [m / n if n else float("nan") for m, n in met_by_type])


class LearningRun(ExperimentCluster):
    """The nodes of one run, each with its learner: ``async with LearningRun(exp, nats_url, prefix, data_dir)``."""

    def __init__(self, exp: LearningExperiment, nats_url: str, prefix: str, data_dir: Path) -> None:
        self.exp = exp
        deadlines = {i: t.deadline_s for i, t in enumerate(exp.task_types)}
        settings = [NodeSettings(
            node_id=spec.node_id, nats_url=nats_url, prefix=prefix, data_dir=data_dir,
            runtime="inprocess", speed=spec.speed, heartbeat_period_s=0.2, suspect_after=5, remove_after=20,
            task_type_deadlines=deadlines,
            initial=NodeConfiguration(parallel_running_functions_max=spec.slots, queue_length_max=exp.queue,
                                      queue_enabled=exp.queue > 0)) for spec in exp.nodes]
        super().__init__(settings, nats_url, prefix, "evallearn")

    async def configure_all(self, algorithm: Algorithm) -> str:
        return await self.configure({node_id: algorithm for node_id in self.ids})

    async def drive_arrivals(self, arrivals: list[Arrival], tag: str, label: str,
                             progress: Progress | None) -> list[tuple[Answer | None, float]]:
        """Send every arrival at its time, with its task type; (answer or None, client latency) each."""
        sends = [Send(a.at, self.ids[a.node], f"{a.service_s:.6f}".encode(), {H.TASK_TYPE: str(a.task_type)})
                 for a in arrivals]
        return await self.drive(sends, tag, label, progress)


@dataclass
class LearningReport:
    experiment: LearningExperiment
    outcomes: list[Outcome]
    warmup_requests: int
    learner: dict   # per node: experiences trained, states, average reward

    def best_power_of_n(self) -> Outcome | None:
        candidates = [o for o in self.outcomes if o.algorithm.startswith("PowerOfN")]
        return max(candidates, key=lambda o: o.met_rate) if candidates else None

    def to_json(self) -> bytes:
        return orjson.dumps({
            "experiment": asdict(self.experiment), "warmup_requests": self.warmup_requests, "learner": self.learner,
            "outcomes": [{**asdict(o), "met_rate": o.met_rate, "rejection_rate": o.rejection_rate, "ci95": o.ci95}
                         for o in self.outcomes],
        }, option=orjson.OPT_INDENT_2)


async def run_experiment(exp: LearningExperiment, *, nats_url: str | None = None, prefix: str = "evallearn",
                         data_dir: Path | None = None, progress: Progress | None = None) -> LearningReport:
    """Every baseline, then the LearningScheduler's warm-up and its measurement."""
    arrivals = poisson_arrivals(exp, exp.duration_s, exp.seed)
    warmup = poisson_arrivals(exp, exp.warmup_s, exp.seed + 1000)
    outcomes: list[Outcome] = []
    async with experiment_broker(nats_url, data_dir) as (url, directory):
        async with LearningRun(exp, url, prefix, directory) as run:
            *baselines, learning = exp.algorithms()
            for run_no, algorithm in enumerate(baselines):
                name = await run.configure_all(algorithm)
                outcomes.append(outcome_of(exp, name, arrivals, await run.drive_arrivals(arrivals, f"r{run_no}", name, progress)))
            for node_id in run.ids:
                await RemotePolicy(run.nc, node_id, prefix=prefix, timeout_s=5).set_parameters(exp.learner_parameters)
            exploring = (learning[0], [*learning[1][:2], "true"])
            await run.configure_all(exploring)
            await run.drive_arrivals(warmup, "warm", "warm-up: LearningScheduler exploring", progress)
            name = await run.configure_all(learning)
            outcomes.append(outcome_of(exp, name, arrivals, await run.drive_arrivals(arrivals, "learn", name, progress)))
            learner = {}
            for node_id in run.ids:
                stats = await RemotePolicy(run.nc, node_id, prefix=prefix, timeout_s=5).stats()
                learner[node_id] = {"experiences": stats.experiences, "states": stats.agent.get("states"),
                                    "average_reward": stats.agent.get("average_reward")}
    return LearningReport(exp, outcomes, len(warmup), learner)


HEADERS = ("algorithm", "deadline met %", "met by type %", "rejected %", "p95 latency", "forwarded %", "requests")


def rows(report: LearningReport) -> list[tuple[str, ...]]:
    best = report.best_power_of_n()
    out = []
    for o in report.outcomes:
        mark = " (best PowerOfN)" if best is not None and o is best else ""
        out.append((o.algorithm + mark, f"{100 * o.met_rate:.1f} ± {100 * o.ci95:.1f}",
                    " / ".join(f"{100 * m:.0f}" for m in o.met_by_type), f"{100 * o.rejection_rate:.1f}",
                    f"{1000 * o.latency_p95_s:.0f} ms", f"{100 * o.forwarded / o.requests:.1f}" if o.requests else "-",
                    f"{o.requests}" + (f" ({o.errors} errors)" if o.errors else "")))
    return out


def caption(report: LearningReport) -> str:
    e = report.experiment
    nodes = ", ".join(f"{n.node_id} K={n.slots} speed {n.speed:g} {n.rate:g} req/s" for n in e.nodes)
    types = ", ".join(f"type {i}: {100 * t.share:.0f} %, mean {1000 * t.mean_service_s:.0f} ms, deadline "
                      f"{1000 * t.deadline_s:.0f} ms" for i, t in enumerate(e.task_types))
    return (f"Nodes: {nodes}; queue {e.queue}. Task types: {types}; gamma service times (shape {e.service_shape:g}). "
            f"{e.duration_s:g} s of Poisson arrivals per algorithm (seed {e.seed}); the LearningScheduler is measured "
            f"{'still exploring (epsilon at its minimum)' if e.explore else 'greedy'} after a {e.warmup_s:g} s online "
            f"warm-up ({report.warmup_requests} requests). "
            f"Deadline met: ± 95 % interval.")


def markdown(report: LearningReport) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(report)]
    return "\n".join(lines) + "\n\n" + caption(report) + "\n"
