"""Side-by-side evaluation of scaling policies on the same seeded episodes (episode ``i``'s tasks
depend only on seed ``seed + i``; training seeds are >= 2**32), with hindsight references."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from controller.baselines import FixedSize, RLPolicy, ScalingPolicy
from controller.env import TRAINING_SEED_FLOOR, FarmBackend, RewardConfig, SimulatedFarm
from controller.oracle import ORACLE_BETAS, InstantResizeOracle, LookaheadOracle, smallest_passing
from controller.panic import PanicRule
from controller.scenario import Scenario, load_scenario
from controller.simulator import EpisodeTotals, FarmSimulator
from controller.workloads import FAMILIES, family_scenario

METRICS = {  # key -> (column title, format)
    "qos_pct": ("QoS %", "{:.2f}"),
    "mean_workers": ("mean workers", "{:.2f}"),
    "max_workers": ("max workers", "{:.1f}"),
    "worker_seconds": ("worker-s", "{:.0f}"),
    "scaling_actions": ("scaling actions", "{:.1f}"),
    "latency_p95_s": ("p95 latency s", "{:.2f}"),
    "episode_return": ("return", "{:.2f}"),
}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class StepRecord(_Frozen):
    time: float
    target: int
    ready: int
    starting: int
    queue: int
    arrival_rate: float
    qos: float
    latency_p95_s: float
    reward: float


class EpisodeResult(_Frozen):
    seed: int
    scenario: str = ""
    workload: str          # fingerprint of the episode's tasks, equal across policies ("" if not simulated)
    episode_return: float
    totals: EpisodeTotals
    steps: list[StepRecord]


class MetricStat(_Frozen):
    mean: float
    std: float             # sample standard deviation over episodes (0 for one episode)


class PolicyReport(_Frozen):
    name: str
    role: str = "policy"   # "baseline", "rl" or "reference"
    metrics: dict[str, MetricStat]
    episodes: list[EpisodeResult]


class EvalReport(_Frozen):
    scenario: str
    seed: int
    episode_seeds: list[int]
    mean_load_workers: list[float]  # arrival rate x mean service per step of episode 0 (the need)
    policies: list[PolicyReport]


# --------------------------------------------------------------------------- running
RULE = "rule"   # the role of a causal rule's report (controller/frontier.py)
PolicyFactory = Callable[[Scenario], ScalingPolicy]


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """A policy built afresh per scenario (each generated episode is a new scenario)."""

    name: str
    make: PolicyFactory
    role: str = "policy"   # "baseline", "rl", "rule" (controller/frontier.py) or "reference"
    panic: bool | None = None   # the controller's reaction between periods; None: RL policies only

    @property
    def reacts(self) -> bool:
        return self.role == "rl" if self.panic is None else self.panic


def run_episode(
    scenario: Scenario,
    policy: ScalingPolicy,
    seed: int,
    reward: RewardConfig | None = None,
    backend: FarmBackend | None = None,
    panic: bool = False,
) -> EpisodeResult:
    """One episode of ``policy`` on the workload of ``seed``, with the env's dynamics and reward."""
    reward = reward or RewardConfig()
    bounds = scenario.workers
    if backend is None:
        backend = SimulatedFarm(scenario, instant=getattr(policy, "instant_resize", False),
                                panic=PanicRule(scenario) if panic else None)
    if hasattr(policy, "bind"):
        policy.bind(backend.simulator)
    policy.reset()
    telemetry = backend.reset(seed)  # includes the warm-up period
    target, total = bounds.initial, 0.0
    steps = [_record(telemetry, target, 0.0)]
    for _ in range(scenario.steps):
        wanted = bounds.clamp(policy.decide(telemetry, target))
        changed, target = wanted != target, wanted
        backend.apply(target)
        telemetry = backend.advance(scenario.step_seconds)
        target = getattr(backend, "target", target)   # raised between periods by the panic rule
        r = reward.reward(telemetry, scenario, changed)
        total += r
        steps.append(_record(telemetry, target, r))
    simulator = getattr(backend, "simulator", None)
    workload = simulator.workload_fingerprint() if isinstance(simulator, FarmSimulator) else ""
    return EpisodeResult(seed=seed, scenario=scenario.name, workload=workload, episode_return=total,
                         totals=backend.totals(), steps=steps)


def _record(t, target: int, reward: float) -> StepRecord:
    return StepRecord(
        time=t.time, target=target, ready=t.workers_ready, starting=t.workers_starting, queue=t.queue_length,
        arrival_rate=t.arrival_rate, qos=t.qos, latency_p95_s=t.latency_p95_s, reward=reward,
    )


def _stat(values: Sequence[float]) -> MetricStat:
    array = np.asarray(values, dtype=np.float64)
    return MetricStat(mean=float(array.mean()), std=float(array.std(ddof=1)) if len(array) > 1 else 0.0)


def summarise(name: str, episodes: list[EpisodeResult], role: str = "policy") -> PolicyReport:
    columns = {
        "qos_pct": [100 * e.totals.qos for e in episodes],
        "mean_workers": [e.totals.mean_workers for e in episodes],
        "max_workers": [e.totals.max_workers for e in episodes],
        "worker_seconds": [e.totals.worker_seconds for e in episodes],
        "scaling_actions": [e.totals.scaling_actions for e in episodes],
        "latency_p95_s": [e.totals.latency_p95_s for e in episodes],
        "episode_return": [e.episode_return for e in episodes],
    }
    return PolicyReport(name=name, role=role, metrics={k: _stat(v) for k, v in columns.items()}, episodes=episodes)


def episode_workloads(scenario: Scenario | str, episodes: int, seed: int) -> list[tuple[Scenario, int]]:
    """(scenario, seed) of episodes ``seed ..``; a family (generated, paper) draws the scenario too."""
    if episodes < 1:
        raise ValueError("episodes must be >= 1")
    if not (0 <= seed and seed + episodes <= TRAINING_SEED_FLOOR):
        raise ValueError(f"evaluation seeds must lie in [0, 2**32) so they never meet training seeds, got {seed}")
    seeds = range(seed, seed + episodes)
    if isinstance(scenario, str) and scenario in FAMILIES:
        return [(family_scenario(scenario, s), s) for s in seeds]
    sc = load_scenario(scenario)
    return [(sc, s) for s in seeds]


def _spec(policy: ScalingPolicy | PolicySpec) -> PolicySpec:
    if isinstance(policy, PolicySpec):
        return policy
    role = "rl" if isinstance(policy, RLPolicy) else "baseline"
    return PolicySpec(policy.name, lambda _scenario, p=policy: p, role)


def run_policy(spec: PolicySpec, workloads: list[tuple[Scenario, int]], reward: RewardConfig | None = None) -> PolicyReport:
    return summarise(spec.name, [run_episode(sc, spec.make(sc), s, reward, panic=spec.reacts) for sc, s in workloads],
                     spec.role)


def notable_rules(reports: list[PolicyReport], qos_target: float = 0.99) -> list[PolicyReport]:
    """The best rule by return and the cheapest reaching the QoS target, renamed to say so (once if both)."""
    if not reports:
        return []
    n = len(reports)
    best = max(reports, key=lambda p: p.metrics["episode_return"].mean)
    passing = [p for p in reports if p.metrics["qos_pct"].mean >= 100 * qos_target]
    cheapest = min(passing, key=lambda p: p.metrics["mean_workers"].mean) if passing else None
    if cheapest is best:
        return [best.model_copy(update={"name": f"rule {best.name} (best of {n} rules, cheapest at 99 %)"})]
    out = [best.model_copy(update={"name": f"rule {best.name} (best of {n} rules)"})]
    if cheapest is not None:
        out.append(cheapest.model_copy(update={"name": f"rule {cheapest.name} (cheapest of {n} at 99 %)"}))
    return out


def _mean_qos(report: PolicyReport) -> float:
    return report.metrics["qos_pct"].mean / 100


def tune_oracle(workloads: list[tuple[Scenario, int]], qos_target: float = 0.99,
                reward: RewardConfig | None = None, oracle: type[InstantResizeOracle] = InstantResizeOracle,
                label: str = "oracle") -> PolicyReport:
    """The oracle with the smallest beta reaching the QoS target (else the largest, named so)."""
    runs: dict[float, PolicyReport] = {}

    def run(beta: float) -> PolicyReport:
        if beta not in runs:
            runs[beta] = run_policy(PolicySpec(label, lambda sc: oracle(sc, beta)), workloads, reward)
        return runs[beta]

    beta = smallest_passing(ORACLE_BETAS, lambda b: _mean_qos(run(b)) >= qos_target)
    missed = beta is None
    beta = ORACLE_BETAS[-1] if beta is None else beta
    name = f"{label} (beta {beta:g}, hindsight{', below the target' if missed else ''})"
    return run(beta).model_copy(update={"name": name, "role": "reference"})


def tune_lookahead_oracle(workloads: list[tuple[Scenario, int]], qos_target: float = 0.99,
                          reward: RewardConfig | None = None) -> PolicyReport:
    return tune_oracle(workloads, qos_target, reward, LookaheadOracle, "lookahead oracle")


def best_fixed_pool(workloads: list[tuple[Scenario, int]], qos_target: float = 0.99,
                    reward: RewardConfig | None = None) -> PolicyReport:
    """The smallest fixed pool reaching the QoS target: one per scenario, each generated workload its own."""
    groups: dict[str, list[tuple[Scenario, int]]] = {}
    for sc, s in workloads:
        groups.setdefault(sc.name, []).append((sc, s))
    by_seed: dict[int, EpisodeResult] = {}
    sizes = []
    for group in groups.values():
        bounds = group[0][0].workers
        runs: dict[int, PolicyReport] = {}

        def run(n: int) -> PolicyReport:
            if n not in runs:
                runs[n] = run_policy(PolicySpec(f"fixed-{n}", lambda sc: FixedSize(sc, n)), group, reward)
            return runs[n]

        size = smallest_passing(list(range(max(1, bounds.min), bounds.max + 1)),
                                lambda n: _mean_qos(run(n)) >= qos_target) or bounds.max
        sizes.append(size)
        for (_, s), episode in zip(group, run(size).episodes):
            by_seed[s] = episode
    name = (f"fixed-{sizes[0]} (smallest for 99 %, hindsight)" if len(sizes) == 1 else
            f"fixed (smallest for 99 % per workload: {min(sizes)}-{max(sizes)}, hindsight)")
    return summarise(name, [by_seed[s] for _, s in workloads], "reference")


def largest_pool(workloads: list[tuple[Scenario, int]], qos_target: float = 0.99,
                 reward: RewardConfig | None = None) -> PolicyReport:
    """``workers.max`` from the first decision on: its QoS is the ceiling."""
    report = run_policy(PolicySpec("largest", lambda sc: FixedSize(sc, sc.workers.max)), workloads, reward)
    sizes = sorted({sc.workers.max for sc, _ in workloads})
    size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return report.model_copy(update={"name": f"fixed-{size} (largest: QoS ceiling)", "role": "reference"})


def evaluate(
    scenario: Scenario | str,
    policies: Sequence[ScalingPolicy | PolicySpec],
    episodes: int = 10,
    seed: int = 0,
    reward: RewardConfig | None = None,
    references: bool = False,
    qos_target: float = 0.99,
    progress: Callable[[str], None] | None = None,
    rules: Sequence[PolicySpec] = (),
) -> EvalReport:
    """Every policy on episodes ``seed .. seed + episodes - 1``; ``references`` adds the largest pool,
    the best fixed pool and both oracles; of ``rules`` the :func:`notable_rules` are kept."""
    workloads = episode_workloads(scenario, episodes, seed)
    specs = [_spec(p) for p in policies]
    names = [p.name for p in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"policy names must be unique, got {names}")
    if len({sc.name for sc, _ in workloads}) > 1 and not all(isinstance(p, PolicySpec) for p in policies):
        raise ValueError("generated workloads need PolicySpec factories: every episode is another scenario")
    reports = []
    for spec in specs:
        if progress:
            progress(spec.name)
        reports.append(run_policy(spec, workloads, reward))
    if rules:
        if progress:
            progress(f"{len(rules)} causal rules")
        reports.extend(notable_rules([run_policy(r, workloads, reward) for r in rules], qos_target))
    if references:
        for name, reference in (("largest pool", largest_pool), ("best fixed pool", best_fixed_pool),
                                ("oracle", tune_oracle), ("lookahead oracle", tune_lookahead_oracle)):
            if progress:
                progress(name)
            reports.append(reference(workloads, qos_target, reward))
    first = workloads[0][0]
    need = [r.arrival_rate * first.mean_service_s for r in reports[0].episodes[0].steps] if reports else []
    title = scenario if isinstance(scenario, str) and scenario in FAMILIES else first.name
    return EvalReport(scenario=title, seed=seed, episode_seeds=[s for _, s in workloads], mean_load_workers=need,
                      policies=reports)


# --------------------------------------------------------------------------- output
def write_plots(report: EvalReport, out_dir: Path) -> list[Path]:
    """PNG of workers, queue and period QoS over episode 0, a line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, (workers, queue, qos) = plt.subplots(3, 1, figsize=(12, 9), sharex=True, layout="constrained")
    for p in report.policies:
        steps = p.episodes[0].steps
        t = [s.time for s in steps]
        workers.step(t, [s.ready + s.starting for s in steps], where="post", label=p.name)
        queue.step(t, [s.queue for s in steps], where="post", label=p.name)
        qos.step(t, [100 * s.qos for s in steps], where="post", label=p.name)
    if report.policies:
        t = [s.time for s in report.policies[0].episodes[0].steps]
        workers.plot(t, report.mean_load_workers, "k--", linewidth=1, label="load (arrivals x mean service)")
    workers.set_ylabel("workers (ready + starting)")
    queue.set_ylabel("queue length")
    queue.set_yscale("symlog")
    qos.set_ylabel("QoS of the period %")
    qos.set_xlabel("time s")
    fig.legend(*workers.get_legend_handles_labels(), loc="outside right upper", fontsize="small")
    workers.set_title(f"{report.scenario}, episode seed {report.episode_seeds[0]}")
    path = out_dir / f"scaling-{report.scenario}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def write_json(report: EvalReport, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.model_dump_json(indent=2))
    return path
