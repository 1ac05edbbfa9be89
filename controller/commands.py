"""``p2pfaas eval scaling``, ``train scaling`` and ``eval trace-sample`` (typer); heavy imports
happen inside them so that ``p2pfaas --help`` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from controller.names import (BASELINE_NAMES, MODEL_SUFFIX, RL_NAMES, SB3_SUFFIX, PolicyNameError, canonical, known,
                              rl_agent)

FAMILY_NAMES = ("generated", "paper")   # controller/workloads.py FAMILIES (not imported: --help stays fast)
EVERYTHING = ("bursty", "steady", "spike", "diurnal", *FAMILY_NAMES)
_SCENARIO_HELP = ("'all' (every shipped scenario and both families), a shipped scenario (bursty, steady, "
                  "spike, diurnal), 'generated' (workloads drawn by controller/workloads.py from the episode "
                  "seeds, never used in training), 'paper' (the farm-skeleton paper's setting, its details "
                  "drawn from the seeds) or the path of a scenario JSON/YAML file.")


def _check_scenario(scenario: str) -> None:
    from controller.scenario import ScenarioError, load_scenario

    if scenario in FAMILY_NAMES:
        return
    try:
        load_scenario(scenario)
    except ScenarioError as exc:
        raise typer.BadParameter(str(exc), param_hint="--scenario") from exc


def _policy_specs(wanted: list[str], models_dir: Path):
    from controller.baselines import make_baseline
    from controller.evaluation import PolicySpec
    from controller.policies import model_for
    from controller.scenario import load_scenario
    from controller.training import load_rl_policy

    specs = []
    for name in wanted:
        if name.endswith(SB3_SUFFIX):     # a Stable-Baselines3 model
            from controller.sb3 import load_sb3_policy

            path = Path(name)
            try:
                load_sb3_policy(path, load_scenario("bursty"))   # said now, not in the middle of the tables
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--policies") from None
            specs.append(PolicySpec(path.name, lambda sc, path=path: load_sb3_policy(path, sc), "rl"))
        elif name.endswith(MODEL_SUFFIX):   # a model file, as up --controller takes it
            path = Path(name)
            specs.append(PolicySpec(path.name, lambda sc, path=path: load_rl_policy(path, sc, name=path.name), "rl"))
        elif name in RL_NAMES:
            path, _ = model_for(name, models_dir)
            if not path.is_file():
                raise typer.BadParameter(f"no {name} model at {path}; train one: p2pfaas train scaling {name}",
                                         param_hint="--policies")
            specs.append(PolicySpec(name, lambda sc, path=path, name=name: load_rl_policy(path, sc, name=name), "rl"))
        else:
            specs.append(PolicySpec(name, lambda sc, name=name: make_baseline(name, sc), "baseline"))
    return specs


def eval_scaling(
    scenario: Annotated[str, typer.Option(help=_SCENARIO_HELP)] = "all",
    episodes: Annotated[int, typer.Option(min=1, help="Episodes per policy; episode i has seed SEED+i and the same tasks for every policy.")] = 10,
    seed: Annotated[int, typer.Option(min=0, max=2**32 - 1, help="Seed of the first evaluation episode (training never uses seeds below 2**32).")] = 0,
    policies: Annotated[
        str,
        typer.Option(help=f"Comma-separated policies, or 'all' (the baselines and the RL agents): "
                          f"{known(auto=False)}. An RL agent runs your model in --models-dir, else the shipped "
                          "one."),
    ] = "all",
    references: Annotated[bool, typer.Option(help="Add the best fixed pool reaching 99 % and the instant-resize oracle (both with hindsight).")] = True,
    rules: Annotated[bool, typer.Option(help="Add the causal rules of controller/frontier.py as peers (shown: the best by return and the cheapest at 99 %).")] = True,
    models_dir: Annotated[Path, typer.Option(help="Where your own trained models are looked up (p2pfaas train scaling writes there).")] = Path("data/models"),
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the full reports (metrics, per-episode totals, time series) as JSON here.")] = None,
    plots_dir: Annotated[Optional[Path], typer.Option("--plots", help="Also save PNG plots of workers, queue and QoS over time into this directory.")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Also write the tables as Markdown here (the README's).")] = None,
) -> None:
    """Run every scaling policy on the same seeded episodes and print one table per scenario, then
    a check of the RL targets (docs/autoscaling.md).

    QoS is the fraction of all tasks of an episode that met their deadline; workers and
    worker-seconds count every billed worker (starting, ready, stopping). The oracle knows each
    step's arrival rate and resizes instantly; it and the best fixed pool are chosen with
    hindsight. RL models come from --models-dir if you trained one, else from the package.
    """
    from rich.console import Console

    from controller.evaluation import evaluate, write_plots
    from controller.frontier import rules as causal_rules
    from controller.report import (markdown_report, paper_checks, paper_table, report_table, target_checks,
                                   targets_tables, write_reports, write_summary_plot)
    from p2pfaas.progress import WorkProgress

    scenarios = list(EVERYTHING) if scenario == "all" else [scenario]
    for name in scenarios:
        _check_scenario(name)
    wanted = [*BASELINE_NAMES, *RL_NAMES] if policies.strip() == "all" else [p.strip() for p in policies.split(",") if p.strip()]
    if not wanted:
        raise typer.BadParameter(f"no policy given; known: {known(auto=False)}", param_hint="--policies")
    try:
        wanted = [canonical(p, auto=False) for p in wanted]
    except PolicyNameError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policies") from None
    if len(set(wanted)) < len(wanted):
        raise typer.BadParameter(f"a policy is named twice: {', '.join(wanted)}", param_hint="--policies")
    specs = _policy_specs(wanted, models_dir)
    console = Console()   # the terminal's width; 80 columns in a file, which every table fits
    reports = []
    with WorkProgress(console=Console(stderr=True), transient=True) as progress:
        peers = causal_rules() if rules else []
        bar = progress.add_task("evaluating", total=len(scenarios) * (len(specs) + bool(peers) + 4 * references))
        for name in scenarios:
            def step(policy: str, name=name) -> None:
                progress.update(bar, advance=1, description=f"{name}: {policy}")

            reports.append(evaluate(name, specs, episodes=episodes, seed=seed, references=references, progress=step,
                                    rules=peers))
    for report in reports:
        console.print(report_table(report, console.width), "")
    if references:
        for table in targets_tables(target_checks(reports)):
            console.print(table, "")
        if paper_checks(reports):
            console.print(paper_table(paper_checks(reports)))
    if json_out is not None:
        console.print(f"report: {write_reports(reports, json_out)}")
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(markdown_report(reports, episodes, seed))
        console.print(f"markdown: {markdown}")
    if plots_dir is not None:
        for report in reports:
            for path in write_plots(report, plots_dir):
                console.print(f"plot: {path}")
        if references and len(reports) > 1:
            console.print(f"plot: {write_summary_plot(reports, plots_dir / 'scaling-summary.png')}")


def train_scaling(
    agent: Annotated[str, typer.Argument(help=f"RL agent to train: {', '.join(RL_NAMES)} (ppo: pg).")],
    workloads: Annotated[str, typer.Option(help="'mixed' (the default: half generated workloads, half the shipped scenarios, all on training seeds), 'mixed-paper' (the paper's setting for a quarter of the episodes, mixed for the rest), 'generated' or 'paper' (one family), one scenario (name or file), or a weighted mix of those, NAME:WEIGHT,... (e.g. 'paper:40,bursty:20,mixed:40').")] = "mixed",
    steps: Annotated[Optional[int], typer.Option(min=1, help="Environment steps (control periods) to train for (default: pg 300,000, dqn and sarsa 200,000: minutes).")] = None,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the agent and of the training episodes (drawn >= 2**32, never an evaluation seed).")] = 0,
    action_mode: Annotated[str, typer.Option(help="Action space: 'target' (keep, or a square-root-staffing size: jumps in one step), 'unit' (-1/0/+1) or 'wide' (-4..+4).")] = "target",
    out: Annotated[Optional[Path], typer.Option(help="Model file (.npz) to write (default data/models/scaling-<agent>-<workloads>-<mode>.npz, which up/eval then prefer over the shipped one).")] = None,
    ship: Annotated[bool, typer.Option(help="Write the package's shipped model controller/models/scaling-<agent>.npz instead (maintainers).")] = False,
    warm_start: Annotated[int, typer.Option(min=0, help="pg, target mode: first imitate, on this many training episodes, the target action that did best held constant (minutes per 1,000); 0: none.")] = 0,
    learning_rate: Annotated[Optional[float], typer.Option(min=0.0, help="The optimizer's step size (default: the agent's, 1e-4 for pg and dqn).")] = None,
    from_model: Annotated[Optional[Path], typer.Option(help="Fine-tune: go on training this saved model (.npz of the same agent and action mode) instead of a new one; its sidecar is kept in the new one's.")] = None,
    widen: Annotated[bool, typer.Option(help="With --from-model: a model of the 14 observation fields of older releases goes on training with all 16 (its first layer gets zero weights for the long-memory fields, so it starts deciding as before).")] = False,
    miss_cost: Annotated[Optional[float], typer.Option(min=0.0, help="What a missed deadline costs in training, in the task's work (default: the env's, 60). Higher trains a more cautious policy; eval scaling judges every policy at the default.")] = None,
) -> None:
    """Train an RL scaling agent on the simulated farm and save it (portable .npz + a JSON sidecar
    recording the command and seed)."""
    import shlex
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from controller.features import ACTION_MODES, RewardConfig
    from controller.training import DEFAULT_STEPS, NotContinuable, rl_agents, shipped_model, train_agent
    from p2pfaas.progress import WorkProgress

    try:
        agent = rl_agent(agent)
    except PolicyNameError as exc:
        raise typer.BadParameter(str(exc), param_hint="AGENT") from None
    if agent not in rl_agents():
        raise typer.BadParameter(f"unknown agent {agent!r}; available: {', '.join(rl_agents()) or 'none'}", param_hint="AGENT")
    if action_mode not in ACTION_MODES:
        raise typer.BadParameter(f"must be one of {', '.join(ACTION_MODES)}", param_hint="--action-mode")
    if widen and from_model is None:
        raise typer.BadParameter("widens a saved model's input: it needs --from-model", param_hint="--widen")
    if warm_start and (agent != "pg" or action_mode != "target"):
        raise typer.BadParameter("a warm start trains pg in the 'target' action mode", param_hint="--warm-start")
    from controller.scenario import load_scenario
    from controller.workloads import FAMILIES, TRAINING_MIXES, MixError, is_mix, parse_mix

    families = (*FAMILIES, *TRAINING_MIXES)
    if is_mix(workloads):
        try:
            parse_mix(workloads)
        except MixError as exc:
            raise typer.BadParameter(str(exc), param_hint="--workloads") from None
    elif workloads not in families:
        _check_scenario(workloads)
    target = workloads if workloads in families or is_mix(workloads) else load_scenario(workloads)
    total = steps or DEFAULT_STEPS[agent]
    command = "p2pfaas " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["train"] else ""
    columns = (TextColumn("training {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with WorkProgress(*columns) as progress:
        demos = progress.add_task("demonstrations (warm start)", total=warm_start) if warm_start else None
        task = progress.add_task(f"{agent} on {workloads}", total=total)
        try:
            trained = train_agent(agent, target, total, seed=seed, action_mode=action_mode, command=command,
                                  out=shipped_model(agent) if ship else out, warm_start=warm_start,
                                  learning_rate=learning_rate, from_model=from_model, widen=widen,
                                  reward=RewardConfig(miss_cost=miss_cost) if miss_cost is not None else None,
                                  warm_start_progress=lambda done, all_: progress.update(demos, completed=done, total=all_),
                                  progress=lambda done, all_: progress.update(task, completed=done, total=all_))
        except NotContinuable as exc:
            raise typer.BadParameter(str(exc), param_hint="--from-model") from None
    Console().print(f"model: {trained.path} ({trained.path.stat().st_size / 1024:.0f} KiB, "
                    f"{trained.metadata['train_seconds']:g} s)")


def trace_sample(
    directory: Annotated[Path, typer.Argument(help="Where to write the sample (created if missing).")],
    seed: Annotated[int, typer.Option(min=0, help="Seed of the generated day.")] = 0,
    functions: Annotated[int, typer.Option(min=1, max=100, help="Functions in the day.")] = 6,
) -> None:
    """Write one generated day in the Azure Functions 2019 trace format (invocations per minute and
    duration percentiles) and a scenario that replays it; nothing is downloaded. The real trace's
    files (AzurePublicDataset, AzureFunctionsDataset2019) go in the same scenario's `trace` section."""
    from controller.traces import sample_scenario, write_azure_sample

    try:
        invocations, durations = write_azure_sample(directory, seed=seed, functions=functions)
        scenario = sample_scenario(directory, invocations, durations)
    except OSError as exc:
        raise typer.BadParameter(f"{directory}: {exc}", param_hint="DIRECTORY") from exc
    print(f"wrote {invocations}\n      {durations}\n      {scenario}")
    print(f"try:  p2pfaas eval scaling --scenario {scenario}")
