"""``p2pfaas eval``, ``train``, ``farm`` and ``controller``: experiments, training, the farm and its live controller."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from broker.errors import BrokerUnavailable
from controller.names import known
from p2pfaas.cli_common import (START_THE_STACK, _attach, _logging, _policy_name, _reported, command_group,
                                console, on_stack)
from p2pfaas.cli_functions import DataDir, NatsUrl, Prefix

eval_app = command_group("Experiments: run the real system on seeded workloads and compare with references.")
train_app = command_group("Train models (saved under data/models by default).")
farm_app = command_group("The farm: emit a scenario's tasks into a node.")


def _evaluate(title: str, experiment, exp, nats_url: str | None, json_out: Optional[Path], bar_width: int,
              width: int, total: int | None = None) -> None:
    """Run ``experiment.run_experiment(exp)`` with one progress bar per phase, then print its table
    (its HEADERS, rows() and caption()) and, if asked, write its JSON."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from p2pfaas.progress import WorkProgress

    progress = WorkProgress(TextColumn(f"{{task.description:<{bar_width}}}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console)
    bars: dict[str, int] = {}

    def advance(name: str, done: int, phase_total: int) -> None:
        if name not in bars:
            bars[name] = progress.add_task(name, total=total or phase_total)
        progress.update(bars[name], completed=done)

    todo = "check --nats-url (without it a private nats-server is started)"
    with _reported(BrokerUnavailable, todo=todo), progress:
        report = asyncio.run(experiment.run_experiment(exp, nats_url=nats_url, progress=advance))
    table = Table(title=title, caption=experiment.caption(report))
    for i, header in enumerate(experiment.HEADERS):
        table.add_column(header, no_wrap=True, justify="left" if i == 0 else "right")
    for row in experiment.rows(report):
        table.add_row(*row)
    out = Console()
    if not out.is_terminal:  # piped into a file: do not squeeze the table into 80 columns
        out = Console(width=width)
    out.print(table)
    if json_out:
        json_out.write_bytes(report.to_json())
        console.print(f"report written to {json_out}")

@eval_app.command("p2p")
def eval_p2p(
    nodes: int = typer.Option(4, "--nodes", min=2, max=16, help="n: number of nodes."),
    slots: int = typer.Option(3, "--k", min=1, max=64, help="K: slots per node (the queue is disabled)."),
    service: float = typer.Option(0.2, "--service", min=0.001, help="Mean exponential service time, seconds."),
    hot_load: float = typer.Option(3.0, "--hot-load", min=0.0, help="Erlangs offered to the hot node n1."),
    cold_load: float = typer.Option(1.0, "--cold-load", min=0.0, help="Erlangs offered to every other node."),
    duration: float = typer.Option(60.0, "--duration", min=1.0, help="Seconds of arrivals per algorithm."),
    seed: int = typer.Option(1, "--seed", help="Seed of the arrivals and service times."),
    algorithm: list[str] = typer.Option([], "--algorithm", "-a",
                                        help="Name or Name:p1,p2,... (repeatable; default: NoScheduler, ForwardScheduler, 3 PowerOfN variants, RoundRobin)."),
    nats_url: Optional[str] = typer.Option(None, help="Run against this NATS (default: a private nats-server)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the full report here."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """P2P scheduling vs the Erlang-B bounds: rejection rate and latency per algorithm, one hot node."""
    from p2pfaas.experiments import p2p

    _logging(verbose)
    exp = p2p.P2PExperiment(nodes=nodes, slots=slots, mean_service_s=service, hot_load=hot_load,
                            cold_load=cold_load, duration_s=duration, seed=seed)
    if algorithm:
        with _reported(ValueError):
            exp.algorithms = [p2p.parse_algorithm(a) for a in algorithm]
    _evaluate("p2pfaas eval p2p", p2p, exp, nats_url, json_out, 40, 140, total=len(p2p.poisson_arrivals(exp)))

@eval_app.command("learning")
def eval_learning(
    duration: float = typer.Option(60.0, "--duration", min=1.0, help="Seconds of arrivals per measured algorithm."),
    warmup: float = typer.Option(180.0, "--warmup", min=0.0, help="Seconds of arrivals of the LearningScheduler's online warm-up."),
    seed: int = typer.Option(1, "--seed", help="Seed of the arrivals, task types and service times."),
    power_of_n: list[str] = typer.Option([], "--power-of-n", help="PowerOfN parameters F,T,loss,maxHops to compare (repeatable; default: three settings)."),
    greedy: bool = typer.Option(False, "--greedy", help="Measure the learned policy greedy (default: still exploring, as deployed)."),
    nats_url: Optional[str] = typer.Option(None, help="Run against this NATS (default: a private nats-server)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the full report here."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """LearningScheduler vs NoScheduler and PowerOfN: deadlines met on heterogeneous nodes (docs/learning.md)."""
    from p2pfaas.experiments import learning

    _logging(verbose)
    exp = learning.LearningExperiment(duration_s=duration, warmup_s=warmup, seed=seed, explore=not greedy)
    if power_of_n:
        exp.power_of_n = [[p.strip() for p in spec.split(",")] for spec in power_of_n]
    _evaluate("p2pfaas eval learning", learning, exp, nats_url, json_out, 44, 160)

def mount_scaling_commands() -> None:
    from controller.commands import eval_scaling, trace_sample, train_scaling

    eval_app.command("scaling")(eval_scaling)
    eval_app.command("trace-sample")(trace_sample)
    train_app.command("scaling")(train_scaling)

@train_app.command("scheduling")
def train_scheduling(
    duration: float = typer.Option(600.0, "--duration", min=10.0, help="Simulated seconds of arrivals to train on."),
    seed: int = typer.Option(7, "--seed", help="Seed of the simulated arrivals and of the agents."),
    node_id: str = typer.Option("n1", "--node", help="Whose table to keep (the hot node decides most)."),
    out: Optional[Path] = typer.Option(None, help="Model file (.npz) to write (default data/models/scheduling-dsarsa.npz)."),
    ship: bool = typer.Option(False, help="Write the package's shipped model nodes/learner/shipped/scheduling-dsarsa.npz (maintainers)."),
) -> None:
    """Train the LearningScheduler's table on a seeded simulation of `eval learning`'s nodes (seconds,
    deterministic) and save it with a JSON sidecar; learners start new scheduling models from it."""
    import shlex

    import orjson

    from nodes.learner.algorithms.portable import save_portable
    from nodes.learner.settings import SHIPPED_SCHEDULING_MODEL
    from p2pfaas.experiments.learning import LearningExperiment
    from p2pfaas.experiments.learning_sim import measure_greedy, train_scheduling_tables

    exp = LearningExperiment()
    if node_id not in {n.node_id for n in exp.nodes}:
        raise typer.BadParameter(f"no node {node_id!r} in the experiment", param_hint="--node")
    from p2pfaas.progress import WorkProgress

    with WorkProgress(console=console) as progress:
        bar = progress.add_task(f"simulating {duration:g} s", total=1)
        agents = train_scheduling_tables(
            exp, duration, seed, progress=lambda done, total: progress.update(bar, completed=done, total=total))
    own = measure_greedy(exp, agents, seed + 1)                                    # each node its own table
    shared = measure_greedy(exp, {n.node_id: agents[node_id] for n in exp.nodes}, seed + 1)   # all this one
    path = SHIPPED_SCHEDULING_MODEL if ship else (out or Path("data/models/scheduling-dsarsa.npz"))
    metadata = {
        "purpose": "scheduling", "algorithm": "dsarsa", "node": node_id, "seed": seed, "duration_s": duration,
        "command": "p2pfaas " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "state": "[task type, free slots here, free slots of peer 0, peer 1] (0/1/2+)",
        "simulated_deadline_met_each_node_its_table": round(own.met_rate, 4),
        "simulated_deadline_met_all_nodes_this_table": round(shared.met_rate, 4),
        "simulated_rejected_all_nodes_this_table": round(shared.rejected / max(1, shared.requests), 4),
    }
    save_portable(path, agents[node_id], metadata)
    path.with_suffix(".json").write_bytes(orjson.dumps(metadata, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    console.print(f"model: {path}: {len(agents[node_id].q)} states. Simulated, greedy: every node with its own "
                  f"table meets {100 * own.met_rate:.1f} % of deadlines, every node with {node_id}'s "
                  f"{100 * shared.met_rate:.1f} % ({100 * shared.rejected / max(1, shared.requests):.1f} % rejected)")

def controller_cmd(
    node_id: str = typer.Option("n1", "--node", help="Node of the pool."),
    pool: str = typer.Option("farm", help="Pool to scale (the `up` stack's farm pool is 'farm'; 'default' scales K)."),
    policy: str = typer.Option("auto", help=f"auto (the shipped RL model), or {known(auto=False)}."),
    learn_online: bool = typer.Option(True, help="RL policies: seed the node's learner, use its online-trained weights, roll back to the shipped ones if live QoS drops."),
    scenario: str = typer.Option("bursty", help="Scenario giving worker bounds and observation normalisation."),
    panic: Optional[bool] = typer.Option(None, "--panic/--no-panic", help="Raise the target between decisions when the load outgrows the pool (Knative's panic mode; default: for RL policies, which are trained with it)."),
    functions: bool = typer.Option(False, "--functions/--no-functions", help="Also scale every function that has a pool of its own, on every node, with its deployment's policy (`up` does)."),
    models_dir: Path = typer.Option(Path("data/models"), help="Where trained scaling models are looked up."),
    nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO."),
) -> None:
    """Scale a pool live: telemetry in, scale commands and learning experiences out (Ctrl-C stops)."""
    from broker.connection import close_quietly, connect
    from controller.live import LiveController
    from controller.policies import resolve_policy
    from controller.scenario import ScenarioError, load_scenario
    from broker import handoff
    from p2pfaas.parts import run_part

    handoff.take()
    _logging(verbose)
    _policy_name(policy, "--policy")
    with _reported(ScenarioError):
        sc = load_scenario(scenario)
    with _reported(ValueError, todo="see --policy in --help"):
        chosen, name, note = resolve_policy(policy, sc, models_dir)
    url, _ = _attach(data_dir, nats_url)

    def show(step) -> None:
        t = step.telemetry
        console.print(f"{time.strftime('%H:%M:%S')} arrivals {t.arrival_rate:6.2f}/s  queue {t.queue_length:4d}  "
                      f"workers {t.workers_ready:3d}+{t.workers_starting:<2d} -> target {step.target:3d}  QoS {t.qos:6.1%}"
                      + (f"  model {step.model_version}" if step.model_version else ""))

    def panicked(pulse, previous: int, target: int) -> None:
        console.print(f"{time.strftime('%H:%M:%S')} panic: {pulse.arrivals} arrivals in {pulse.window_s:.1f} s, "
                      f"queue {pulse.queue_length}, workers {pulse.workers_ready}+{pulse.workers_starting} "
                      f"-> target {previous} -> {target}")

    def scaling_function(controller) -> None:
        console.print(f"{time.strftime('%H:%M:%S')} function {controller.pool} on {controller.node}: "
                      f"scaled by {controller.policy_name}")

    async def start():
        nc = await connect(url, f"controller-{node_id}-{pool}")
        controller = LiveController(nc, node_id, pool, chosen, sc, prefix=prefix, policy_name=name, on_step=show,
                                    on_panic=panicked, learn_online=learn_online, models_dir=models_dir,
                                    react_between_periods=panic)
        await controller.start()
        scaler = None
        if functions:
            from controller.functions import FunctionScaler
            scaler = await FunctionScaler(nc, sc, prefix=prefix, models_dir=models_dir, learn_online=learn_online,
                                          on_start=scaling_function).start()
        return nc, controller, scaler

    async def stop(part) -> None:
        nc, controller, scaler = part
        if scaler is not None:
            await scaler.stop()
        await controller.stop()
        await close_quietly(nc)

    def announce(part) -> None:
        if note:
            console.print(f"[yellow]note:[/] {note}")
        if part[1].learner_note:
            console.print(f"[yellow]note:[/] {part[1].learner_note}")
        console.print(f"controlling {node_id}/{pool} with {name}"
                      f"{', raising between decisions when the load outgrows the pool' if part[1].reacts else ''}"
                      f"{', and every function with a pool of its own' if part[2] is not None else ''}; Ctrl-C to stop")

    with _reported(BrokerUnavailable, todo=START_THE_STACK):
        run_part(start, stop, announce)

@farm_app.command("run")
def farm_run(
    scenario: str = typer.Option("bursty", help="Shipped scenario name or a scenario file."),
    node_id: str = typer.Option("n1", "--node", help="Node to send the tasks to."),
    pool: str = typer.Option("farm", help="The pool that runs them (the `up` stack's autoscaled pool is 'farm'): its worker-seconds are measured."),
    seed: int = typer.Option(0, help="Seed of the arrivals and service times."),
    speed: float = typer.Option(1.0, min=0.1, max=100.0, help="Time compression: >1 runs faster (rates x speed, service and deadlines / speed). The pool's control period and cold starts are not compressed, so QoS is comparable with the simulator only at 1."),
    fn: str = typer.Option("sleep", help="Function that plays a task (its payload is the service time)."),
    nats_url: Optional[str] = NatsUrl, data_dir: Path = DataDir, prefix: str = Prefix,
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the QoS and the pool's figures here."),
) -> None:
    """Emit a scenario's tasks (Poisson arrivals, sampled service times, deadlines); report QoS and
    what the pool spent (worker-seconds, mean/max workers, scaling actions, deciding models)."""
    import orjson

    from controller.emitter import POOL_FIGURES, FarmEmitter, PoolMeter
    from p2pfaas.progress import WorkProgress
    from controller.scenario import ScenarioError, load_scenario

    with _reported(ScenarioError):
        sc = load_scenario(scenario)
    running: dict = {}   # what a Ctrl-C leaves to report: the emitter's figures and the meter's

    async def work(nc, subjects):
        emitter = running["emitter"] = FarmEmitter(nc, node_id, sc, seed=seed, prefix=prefix, fn=fn, speed=speed)
        async with PoolMeter(nc, node_id, pool, prefix=prefix) as meter:
            running["meter"] = meter
            with WorkProgress(console=console) as progress:
                bar = progress.add_task(f"{sc.name} -> {node_id}", total=1.0)

                def update(fraction, report):
                    progress.update(bar, completed=fraction,
                                    description=f"{sc.name} -> {node_id}: {report.submitted} sent, {report.completed} done")
                await emitter.run(update)
                progress.update(bar, completed=1.0)

    try:
        on_stack(data_dir, nats_url, prefix, "farm-emitter", work)
    except KeyboardInterrupt:
        if "meter" not in running:   # nothing sent yet
            raise typer.Exit(130)
        running["emitter"].report.interrupted = True   # (also when it came as the run was ending)
    report, meter = running["emitter"].report, running["meter"]
    if report.interrupted:
        console.print(f"[yellow]interrupted{f' ({report.stopped_because})' if report.stopped_because else ''}:[/] "
                      "the figures cover the run so far; tasks without an answer yet are not counted "
                      "(those stored still run on the pool)")
    console.print(f"tasks {report.submitted}, completed {report.completed}, errors {report.errors}, "
                  f"unfinished {report.unfinished}, lost {report.lost}, "
                  f"QoS {f'{report.qos:.2%}' if report.settled else '-'}, "
                  f"p95 latency {report.p95_s:.2f} s")
    totals = meter.totals()
    if totals is not None:
        console.print(f"pool {node_id}/{pool}: {totals.worker_seconds:.0f} worker-s over {totals.duration_s:.0f} s, "
                      f"mean {totals.mean_workers:.2f} / max {totals.max_workers} workers, "
                      f"{totals.scaling_actions} scaling actions; decided by "
                      + ", ".join(f"{k} ({n})" for k, n in meter.policies.items()))
    else:
        console.print(f"[yellow]no telemetry of pool {node_id}/{pool} seen: worker-seconds unknown[/]")
    if json_out is not None:
        json_out.write_bytes(orjson.dumps({
            "scenario": sc.name, "seed": seed, "speed": speed, "tasks": report.submitted, "completed": report.completed,
            "errors": report.errors, "unfinished": report.unfinished, "lost": report.lost, "qos": report.qos,
            "p95_s": report.p95_s, "interrupted": report.interrupted, "stopped_because": report.stopped_because,
            "pool": totals.model_dump(include=POOL_FIGURES) if totals else None, "decided_by": meter.policies,
        }, option=orjson.OPT_INDENT_2))
    if report.interrupted and not report.stopped_because:   # Ctrl-C
        raise typer.Exit(130)
    if report.lost or report.errors or report.unfinished:
        raise typer.Exit(1)
