"""Side-by-side evaluation of scaling policies on the same seeded episodes, and RL training.

Every policy sees exactly the same tasks (arrivals, service times, deadlines) in
episode ``i``: the workload depends only on the episode seed ``seed + i``. Training
episodes are drawn by the env from seeds >= 2**32, so they never coincide.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from controller.baselines import RLPolicy, ScalingPolicy
from controller.env import ACTION_DELTAS, TRAINING_SEED_FLOOR, FarmBackend, FarmScalingEnv, RewardConfig, SimulatedFarm
from controller.scenario import Scenario, load_scenario
from controller.simulator import EpisodeTotals, FarmSimulator

RL_KINDS = ("dqn", "pg", "sarsa")
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
    workload: str          # fingerprint of the episode's tasks, equal across policies ("" if not simulated)
    episode_return: float
    totals: EpisodeTotals
    steps: list[StepRecord]


class MetricStat(_Frozen):
    mean: float
    std: float             # sample standard deviation over episodes (0 for one episode)


class PolicyReport(_Frozen):
    name: str
    metrics: dict[str, MetricStat]
    episodes: list[EpisodeResult]


class EvalReport(_Frozen):
    scenario: str
    seed: int
    episode_seeds: list[int]
    mean_load_workers: list[float]  # arrival rate x mean service per step of episode 0 (the need)
    policies: list[PolicyReport]


# --------------------------------------------------------------------------- running
def run_episode(
    scenario: Scenario,
    policy: ScalingPolicy,
    seed: int,
    reward: RewardConfig | None = None,
    backend: FarmBackend | None = None,
) -> EpisodeResult:
    """One episode of ``policy`` on the workload of ``seed``, with the env's dynamics and reward
    (on the simulator unless another ``FarmBackend`` is given)."""
    reward = reward or RewardConfig()
    bounds = scenario.workers
    backend = backend if backend is not None else SimulatedFarm(scenario)
    policy.reset()
    telemetry = backend.reset(seed)  # includes the warm-up period
    target, total = bounds.initial, 0.0
    steps = [_record(telemetry, target, 0.0)]
    for _ in range(scenario.steps):
        wanted = min(bounds.max, max(bounds.min, int(policy.decide(telemetry, target))))
        changed, target = wanted != target, wanted
        backend.apply(target)
        telemetry = backend.advance(scenario.step_seconds)
        r = reward.reward(telemetry, bounds.max, changed)
        total += r
        steps.append(_record(telemetry, target, r))
    simulator = getattr(backend, "simulator", None)
    workload = simulator.workload_fingerprint() if isinstance(simulator, FarmSimulator) else ""
    return EpisodeResult(seed=seed, workload=workload, episode_return=total, totals=backend.totals(), steps=steps)


def _record(t, target: int, reward: float) -> StepRecord:
    return StepRecord(
        time=t.time, target=target, ready=t.workers_ready, starting=t.workers_starting, queue=t.queue_length,
        arrival_rate=t.arrival_rate, qos=t.qos, latency_p95_s=t.latency_p95_s, reward=reward,
    )


def _stat(values: Sequence[float]) -> MetricStat:
    array = np.asarray(values, dtype=np.float64)
    return MetricStat(mean=float(array.mean()), std=float(array.std(ddof=1)) if len(array) > 1 else 0.0)


def summarise(name: str, episodes: list[EpisodeResult]) -> PolicyReport:
    columns = {
        "qos_pct": [100 * e.totals.qos for e in episodes],
        "mean_workers": [e.totals.mean_workers for e in episodes],
        "max_workers": [e.totals.max_workers for e in episodes],
        "worker_seconds": [e.totals.worker_seconds for e in episodes],
        "scaling_actions": [e.totals.scaling_actions for e in episodes],
        "latency_p95_s": [e.totals.latency_p95_s for e in episodes],
        "episode_return": [e.episode_return for e in episodes],
    }
    return PolicyReport(name=name, metrics={k: _stat(v) for k, v in columns.items()}, episodes=episodes)


def evaluate(
    scenario: Scenario | str,
    policies: Sequence[ScalingPolicy],
    episodes: int = 10,
    seed: int = 0,
    reward: RewardConfig | None = None,
) -> EvalReport:
    """Run every policy on episodes ``seed .. seed + episodes - 1`` (the same workloads for all)."""
    scenario = load_scenario(scenario)
    if episodes < 1:
        raise ValueError("episodes must be >= 1")
    if not (0 <= seed and seed + episodes <= TRAINING_SEED_FLOOR):
        raise ValueError(f"evaluation seeds must lie in [0, 2**32) so they never meet training seeds, got {seed}")
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(f"policy names must be unique, got {names}")
    seeds = list(range(seed, seed + episodes))
    reports = [summarise(p.name, [run_episode(scenario, p, s, reward) for s in seeds]) for p in policies]
    need = [r.arrival_rate * scenario.mean_service_s for r in reports[0].episodes[0].steps] if reports else []
    return EvalReport(scenario=scenario.name, seed=seed, episode_seeds=seeds, mean_load_workers=need, policies=reports)


# --------------------------------------------------------------------------- RL agents
def rl_agents() -> dict[str, type]:
    """The RL agent classes by kind; empty when the learner's algorithms are not installed."""
    try:
        from nodes.learner.algorithms import AGENTS
    except ImportError:
        return {}
    return {kind: AGENTS[kind] for kind in RL_KINDS if kind in AGENTS}


def agent_config(kind: str, agent_class: type, steps: int, env: FarmScalingEnv) -> Any:
    """Hyper-parameters for the scaling env: exploration over the first third of training,
    and for tabular SARSA a coarse grid on the fields that drive the decision."""
    config_class = getattr(agent_class, "config_class", None)
    if config_class is None:
        return None
    fields = {f.name for f in dataclasses.fields(config_class)}
    values: dict[str, Any] = {}
    if "exploration_steps" in fields:
        values["exploration_steps"] = max(1, steps // 3)
    if "learning_starts" in fields:
        values["learning_starts"] = min(1_000, max(1, steps // 10))
    if kind == "sarsa" and {"bins", "low", "high"} <= fields:
        # Fields: backlog, ready, starting, load, throughput, latency mean/max, qos, gap. One bin
        # ignores a field; the pool size and the gap to the needed workers carry the decision.
        values["bins"] = (2, 10, 2, 1, 1, 1, 1, 2, 8)
        values["low"] = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.95, -0.3)
        values["high"] = (0.2, 1.0, 0.1, 1.0, 1.0, 1.0, 1.0, 1.0, 0.3)
    return config_class(**values)


@contextlib.contextmanager
def _torch_threads(n: int):
    """Small networks train several times faster on one thread, most of all on a busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def model_path(models_dir: Path, kind: str, scenario: Scenario, action_mode: str = "unit") -> Path:
    return Path(models_dir) / f"scaling-{kind}-{scenario.name}-{action_mode}.pt"


@dataclasses.dataclass(frozen=True)
class TrainedAgent:
    kind: str
    path: Path
    metrics: dict


def train_agent(
    kind: str,
    scenario: Scenario | str,
    steps: int,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    out: Path | None = None,
    models_dir: Path = Path("data/models"),
    action_mode: str = "unit",
) -> TrainedAgent:
    """Train a ``kind`` agent on the simulated scenario (env-drawn seeds, disjoint from
    evaluation's) and save it to ``out`` (default ``models_dir/scaling-<kind>-<scenario>-<mode>.pt``)."""
    scenario = load_scenario(scenario)
    agents = rl_agents()
    if kind not in agents:
        raise ValueError(f"unknown RL agent {kind!r}; available: {', '.join(agents) or 'none (nodes.learner.algorithms missing)'}")
    env = FarmScalingEnv(scenario, action_mode=action_mode)
    agent_class = agents[kind]
    config = agent_config(kind, agent_class, steps, env)
    agent = agent_class(env.observation_space.shape[0], int(env.action_space.n), config=config, seed=seed)
    with _torch_threads(1):
        metrics = agent.learn(env, total_steps=steps, seed=seed, progress=progress)
    path = Path(out) if out is not None else model_path(models_dir, kind, scenario, action_mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    agent.save(path)
    return TrainedAgent(kind=kind, path=path, metrics=metrics)


def load_rl_policy(kind: str, path: Path, scenario: Scenario, action_mode: str = "unit") -> RLPolicy:
    agent = rl_agents()[kind].load(path)
    return RLPolicy(kind, agent, scenario, ACTION_DELTAS[action_mode])


# --------------------------------------------------------------------------- output
def report_table(report: EvalReport, qos_target: float = 0.99):
    """A rich table, mean ± std over episodes; policies reaching the QoS target in bold."""
    from rich.table import Table

    n = len(report.episode_seeds)
    table = Table(title=f"scenario {report.scenario}: {n} episode(s), seeds {report.episode_seeds[0]}..{report.episode_seeds[-1]}")
    table.add_column("policy")
    for title, _ in METRICS.values():
        table.add_column(title, justify="right")
    for p in report.policies:
        cells = [f"{fmt.format(p.metrics[k].mean)} ± {fmt.format(p.metrics[k].std)}" for k, (_, fmt) in METRICS.items()]
        style = "bold" if p.metrics["qos_pct"].mean >= 100 * qos_target else None
        table.add_row(p.name, *cells, style=style)
    return table


def write_plots(report: EvalReport, out_dir: Path) -> list[Path]:
    """Workers, queue and window QoS over time of episode 0, one line per policy (PNG)."""
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
