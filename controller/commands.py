"""Command functions for ``p2pfaas eval scaling`` and ``p2pfaas train scaling`` (typer).

The CLI mounts them, e.g. ``eval_app.command("scaling")(eval_scaling)``. Heavy imports
(numpy, gymnasium, torch) happen inside the functions so ``p2pfaas --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

BASELINE_NAMES = ("reactive-avg", "reactive-max", "keda", "kpa", "hpa", "fixed")
RL_NAMES = ("dqn", "pg", "sarsa")
_SCENARIO_HELP = "Shipped scenario (bursty, steady, spike, diurnal) or the path of a scenario JSON/YAML file."


def _load(scenario: str):
    from controller.scenario import ScenarioError, load_scenario

    try:
        return load_scenario(scenario)
    except ScenarioError as exc:
        raise typer.BadParameter(str(exc), param_hint="--scenario") from exc


def _train(kinds: list[str], scenario, steps: int, seed: int, models_dir: Path | None, out: Path | None, action_mode: str) -> dict[str, Path]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from controller.evaluation import train_agent

    paths: dict[str, Path] = {}
    columns = (TextColumn("training {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns) as progress:
        for kind in kinds:
            task = progress.add_task(f"{kind} on {scenario.name}", total=steps)
            trained = train_agent(
                kind, scenario, steps, seed=seed, out=out, models_dir=models_dir or Path("data/models"), action_mode=action_mode,
                progress=lambda done, total, task=task: progress.update(task, completed=done, total=total),
            )
            paths[kind] = trained.path
    return paths


def eval_scaling(
    scenario: Annotated[str, typer.Option(help=_SCENARIO_HELP)] = "bursty",
    episodes: Annotated[int, typer.Option(min=1, help="Episodes per policy; episode i has seed SEED+i and the same tasks for every policy.")] = 10,
    seed: Annotated[int, typer.Option(min=0, max=2**32 - 1, help="Seed of the first evaluation episode (training never uses seeds below 2**32).")] = 0,
    policies: Annotated[
        str,
        typer.Option(
            help=f"Comma-separated policies, or 'all'. Baselines: {', '.join(BASELINE_NAMES)} (the initial size) or "
            f"fixed-<n>. RL agents: {', '.join(RL_NAMES)}."
        ),
    ] = "all",
    models_dir: Annotated[Path, typer.Option(help="Where RL models are read, and written when one has to be trained first.")] = Path("data/models"),
    train_steps: Annotated[int, typer.Option(min=1, help="Environment steps to train an RL agent that has no saved model.")] = 20_000,
    retrain: Annotated[bool, typer.Option(help="Train the RL agents even when a saved model exists.")] = False,
    action_mode: Annotated[str, typer.Option(help="RL action space: 'unit' (-1/0/+1 worker) or 'wide' (-4..+4).")] = "unit",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the full report (metrics, per-episode totals, time series) as JSON here.")] = None,
    plots_dir: Annotated[Optional[Path], typer.Option("--plots", help="Also save PNG plots of workers, queue and QoS over time into this directory.")] = None,
) -> None:
    """Run every scaling policy on the same seeded episodes of a scenario and print one table.

    QoS is the fraction of all tasks of an episode that met their deadline; workers and
    worker-seconds count every billed worker (starting, ready, stopping). RL agents without
    a saved model in --models-dir are trained first (on seeds disjoint from evaluation's).
    """
    from rich.console import Console

    from controller.baselines import is_baseline, make_baseline
    from controller.env import ACTION_DELTAS
    from controller.evaluation import evaluate, load_rl_policy, model_path, report_table, rl_agents, write_json, write_plots

    sc = _load(scenario)
    if action_mode not in ACTION_DELTAS:
        raise typer.BadParameter(f"must be one of {', '.join(ACTION_DELTAS)}", param_hint="--action-mode")
    available_rl = list(rl_agents())
    wanted = [*BASELINE_NAMES, *available_rl] if policies.strip() == "all" else [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in wanted if not is_baseline(p) and p not in available_rl]
    if unknown or not wanted:
        known = ", ".join([*BASELINE_NAMES, "fixed-<n>", *available_rl])
        raise typer.BadParameter(f"unknown policy {', '.join(unknown) or '(none given)'}; known: {known}", param_hint="--policies")
    console = Console()
    rl = [p for p in wanted if p in available_rl]
    to_train = [k for k in rl if retrain or not model_path(models_dir, k, sc, action_mode).is_file()]
    if to_train:
        _train(to_train, sc, train_steps, seed=0, models_dir=models_dir, out=None, action_mode=action_mode)
    chosen = [
        load_rl_policy(p, model_path(models_dir, p, sc, action_mode), sc, action_mode) if p in available_rl else make_baseline(p, sc)
        for p in wanted
    ]
    report = evaluate(sc, chosen, episodes=episodes, seed=seed)
    console.print(report_table(report))
    if json_out is not None:
        console.print(f"report: {write_json(report, json_out)}")
    if plots_dir is not None:
        for path in write_plots(report, plots_dir):
            console.print(f"plot: {path}")


def train_scaling(
    agent: Annotated[str, typer.Argument(help=f"RL agent to train: {', '.join(RL_NAMES)}.")],
    scenario: Annotated[str, typer.Option(help=_SCENARIO_HELP)] = "bursty",
    steps: Annotated[int, typer.Option(min=1, help="Environment steps (control periods) to train for.")] = 20_000,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the agent and of the training episodes (drawn >= 2**32, never an evaluation seed).")] = 0,
    action_mode: Annotated[str, typer.Option(help="Action space: 'unit' (-1/0/+1 worker) or 'wide' (-4..+4).")] = "unit",
    out: Annotated[Optional[Path], typer.Option(help="Model file to write (default data/models/scaling-<agent>-<scenario>-<mode>.pt).")] = None,
) -> None:
    """Train an RL scaling agent on the simulated farm of a scenario and save the model."""
    from rich.console import Console

    from controller.env import ACTION_DELTAS
    from controller.evaluation import rl_agents

    sc = _load(scenario)
    if agent not in rl_agents():
        raise typer.BadParameter(f"unknown agent {agent!r}; available: {', '.join(rl_agents()) or 'none'}", param_hint="AGENT")
    if action_mode not in ACTION_DELTAS:
        raise typer.BadParameter(f"must be one of {', '.join(ACTION_DELTAS)}", param_hint="--action-mode")
    paths = _train([agent], sc, steps, seed=seed, models_dir=None, out=out, action_mode=action_mode)
    Console().print(f"model: {paths[agent]}")
