"""Evaluation reports against the RL targets (docs/autoscaling.md, "RL targets") as rich tables,
Markdown and JSON. The limit is the lookahead oracle; the peers are the baselines and the causal
rules of controller/frontier.py. An RL policy must reach 99 % QoS wherever a peer does, beat every
peer's return, and use <= 1.15x the lookahead oracle's workers at 99 %."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from controller.evaluation import METRICS, RULE, EvalReport, PolicyReport

QOS_TARGET_PCT = 99.0
PAPER = "paper"            # the paper's setting has the paper's own targets (its SARSA: 99.2 %, 14.78, 24)
PAPER_QOS_PCT, PAPER_WORKERS, PAPER_ACTIONS = 99.2, 14.0, 24
ORACLE_FACTOR = 1.2        # the instant-resize oracle's scale in the summary plot (information)
LOOKAHEAD_FACTOR = 1.15    # the limit: mean workers over the lookahead oracle's


@dataclass(frozen=True)
class TargetCheck:
    scenario: str
    policy: str
    qos_pct: float
    qos_ceiling_pct: float
    peer_reaches_99: bool             # some baseline or rule reaches 99 %: then the policy must too
    workers_vs_lookahead: float       # mean workers / the lookahead oracle's
    episode_return: float
    best_peer: str
    best_peer_return: float
    gap_se: float                     # standard error of the per-episode return gap to the best peer
    scaling_actions: float
    reactive_actions: float

    @property
    def qos_ok(self) -> bool | None:
        return self.qos_pct >= QOS_TARGET_PCT if self.peer_reaches_99 else None

    @property
    def workers_ok(self) -> bool:
        return self.qos_pct >= QOS_TARGET_PCT and self.workers_vs_lookahead <= LOOKAHEAD_FACTOR

    @property
    def gap(self) -> float:
        return self.episode_return - self.best_peer_return

    @property
    def beats_peers(self) -> bool:
        return self.gap > 0

    @property
    def peer_name(self) -> str:
        """The best peer's name without its note ("rule X (best of 12 rules)" -> "rule X")."""
        return self.best_peer.split(" (")[0]


def _mean(p: PolicyReport, key: str) -> float:
    return p.metrics[key].mean


def paired_se(p: PolicyReport, q: PolicyReport) -> float:
    """Standard error of the mean per-episode return difference of two policies run on the same
    seeds; NaN for a single episode. A gap within about two of them is for more episodes to decide."""
    if [e.seed for e in p.episodes] != [e.seed for e in q.episodes]:
        raise ValueError(f"{p.name} and {q.name} did not run the same episodes")
    gaps = [a.episode_return - b.episode_return for a, b in zip(p.episodes, q.episodes)]
    return statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else float("nan")


def _reference(report: EvalReport, word: str, unless: str = "\0") -> PolicyReport | None:
    return next((p for p in report.policies if p.role == "reference" and word in p.name and unless not in p.name), None)


def target_checks(reports: Sequence[EvalReport]) -> list[TargetCheck]:
    """One check per RL policy and scenario that has the references and a peer."""
    out = []
    for report in reports:
        oracle, lookahead, ceiling = (_reference(report, "oracle", unless="lookahead"), _reference(report, "lookahead"),
                                      _reference(report, "ceiling"))
        peers = [p for p in report.policies if p.role in ("baseline", RULE)]
        reactive = [p for p in peers if p.role == "baseline" and p.name.startswith("reactive")]
        rl = [p for p in report.policies if p.role == "rl"]
        if oracle is None or lookahead is None or not rl or not peers:
            continue
        best = max(peers, key=lambda p: _mean(p, "episode_return"))
        out.extend(TargetCheck(
            scenario=report.scenario, policy=p.name, qos_pct=_mean(p, "qos_pct"),
            qos_ceiling_pct=_mean(ceiling, "qos_pct") if ceiling else float("nan"),
            peer_reaches_99=any(_mean(q, "qos_pct") >= QOS_TARGET_PCT for q in peers),
            workers_vs_lookahead=_mean(p, "mean_workers") / _mean(lookahead, "mean_workers"),
            episode_return=_mean(p, "episode_return"), best_peer=best.name,
            best_peer_return=_mean(best, "episode_return"), gap_se=paired_se(p, best),
            scaling_actions=_mean(p, "scaling_actions"),
            reactive_actions=min((_mean(r, "scaling_actions") for r in reactive), default=float("nan")),
        ) for p in rl)
    return out


@dataclass(frozen=True)
class PaperCheck:
    policy: str
    qos_pct: float
    mean_workers: float
    scaling_actions: float

    @property
    def ok(self) -> bool:
        return (self.qos_pct >= PAPER_QOS_PCT and self.mean_workers <= PAPER_WORKERS
                and self.scaling_actions < PAPER_ACTIONS)


def paper_checks(reports: Sequence[EvalReport]) -> list[PaperCheck]:
    """The paper's targets for every RL policy on the ``paper`` family."""
    return [PaperCheck(p.name, _mean(p, "qos_pct"), _mean(p, "mean_workers"), _mean(p, "scaling_actions"))
            for report in reports if report.scenario == PAPER for p in report.policies if p.role == "rl"]


PAPER_HEADERS = ("RL policy", f"QoS % (>= {PAPER_QOS_PCT:g})", f"mean workers (<= {PAPER_WORKERS:g})",
                 f"actions (< {PAPER_ACTIONS})", "met")


def paper_rows(checks: Sequence[PaperCheck]) -> list[tuple[str, ...]]:
    return [(c.policy, f"{c.qos_pct:.2f}", f"{c.mean_workers:.2f}", f"{c.scaling_actions:.1f}", _mark(c.ok))
            for c in checks]


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "no")


TARGET_HEADERS = ("scenario", "RL policy", "QoS % (ceiling)", ">= 99 % (if a peer is)", "workers / lookahead",
                  "<= 1.15 at 99 %", "return (best peer)", "> peers", "gap ± se", "actions (reactive)")


def target_rows(checks: Sequence[TargetCheck]) -> list[tuple[str, ...]]:
    return [(
        c.scenario, c.policy, f"{c.qos_pct:.2f} ({c.qos_ceiling_pct:.2f})", _mark(c.qos_ok),
        f"{c.workers_vs_lookahead:.2f}", _mark(c.workers_ok),
        f"{c.episode_return:.1f} ({c.peer_name} {c.best_peer_return:.1f})", _mark(c.beats_peers),
        _gap(c),
        f"{c.scaling_actions:.1f} ({c.reactive_actions:.1f})",
    ) for c in checks]


def _gap(c: TargetCheck) -> str:
    return f"{c.gap:+.1f}" if math.isnan(c.gap_se) else f"{c.gap:+.1f} ± {c.gap_se:.1f}"


def _cell(p: PolicyReport, key: str, fmt: str) -> str:
    stat = p.metrics[key]
    return fmt.format(stat.mean) if stat.std == 0 else f"{fmt.format(stat.mean)} ± {fmt.format(stat.std)}"


def _markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def markdown_table(report: EvalReport) -> str:
    cells = [[_cell(p, k, fmt) for k, (_, fmt) in METRICS.items()] for p in report.policies]
    return _markdown(["policy", *(title for title, _ in METRICS.values())],
                     [[f"**{p.name}**" if p.role == "rl" else p.name, *c] for p, c in zip(report.policies, cells)])


def markdown_report(reports: Sequence[EvalReport], episodes: int, seed: int) -> str:
    parts = []
    for report in reports:
        parts.append(f"#### {report.scenario} ({episodes} episodes, seeds {seed}..{seed + episodes - 1})\n\n"
                     f"{markdown_table(report)}\n")
    checks = target_checks(reports)
    if checks:
        parts.append("#### RL targets\n\n" + _markdown(TARGET_HEADERS, target_rows(checks)) + "\n")
    papers = paper_checks(reports)
    if papers:
        parts.append(f"#### The paper's setting: its own targets\n\n{_markdown(PAPER_HEADERS, paper_rows(papers))}\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------- the terminal
# Tables fit 80 columns; names are never cut, a policy's note goes into the legend under its table.
GAP = 2   # between columns: one space of padding and the box's separator
TERMINAL_TITLES = {"qos_pct": "QoS %", "mean_workers": "workers", "max_workers": "max", "worker_seconds": "worker-s",
                   "scaling_actions": "actions", "latency_p95_s": "p95 s", "episode_return": "return"}


def _fits(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> bool:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    return sum(widths) + GAP * (len(headers) - 1) <= width


def text_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], *, text: Sequence[int] = (0,),
               caption: str | None = None, styles: Sequence[str | None] | None = None, words: Sequence[int] = ()):
    """The ``text`` columns are never wrapped nor cut, the ``words`` columns wrap between words, and the
    other columns (numbers) fold only their cells, never their header; the caption wraps to the console."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0), title_justify="left")
    for i, header in enumerate(headers):
        # a header's longest word is the narrowest a column gets: "retur|n" read as two words
        table.add_column(header, justify="left" if i in text or i in words else "right", no_wrap=i in text,
                         overflow="fold", min_width=max(len(w) for w in header.split()))
    for i, row in enumerate(rows):
        table.add_row(*row, style=styles[i] if styles else None)
    return Group(table, Text(caption)) if caption else table


def report_table(report: EvalReport, width: int = 80, qos_target: float = 0.99):
    """A row per policy: mean ± std if that fits ``width``, else means; bold where QoS reaches the target."""
    n = len(report.episode_seeds)
    headers = ["policy", *(TERMINAL_TITLES[k] for k in METRICS)]
    labels, legend = [], []
    for p in report.policies:
        name, _, note = p.name.partition(" (")
        label = ("best rule" if "best of" in note else "cheapest rule") if p.role == RULE else name
        labels.append(label)
        if note:
            legend.append(f"{label}: {name.removeprefix('rule ') + ', ' if label != name else ''}{note.rstrip(')')}")

    def rows(spread: bool) -> list[list[str]]:
        return [[label, *(fmt.format(p.metrics[k].mean) + (f"±{fmt.format(p.metrics[k].std)}" if spread else "")
                          for k, (_, fmt) in METRICS.items())] for label, p in zip(labels, report.policies)]

    spread = _fits(headers, rows(True), width)
    legend.insert(0, f"{'mean ± std' if spread else 'means'} over the episodes (bold: QoS >= {100 * qos_target:g} %)")
    return text_table(f"scenario {report.scenario}: {n} episode(s), seeds {report.episode_seeds[0]}.."
                      f"{report.episode_seeds[-1]}", headers, rows(spread), caption="\n".join(legend),
                      styles=["bold" if p.metrics["qos_pct"].mean >= 100 * qos_target else None
                              for p in report.policies])


def targets_tables(checks: Sequence[TargetCheck]) -> list:
    limit = text_table(
        "RL targets: QoS and the limit",
        ("scenario", "RL", "QoS %", "ceiling", ">= 99 %", "/ lookahead", "<= 1.15", "actions"),
        [(c.scenario, c.policy, f"{c.qos_pct:.2f}", f"{c.qos_ceiling_pct:.2f}", _mark(c.qos_ok),
          f"{c.workers_vs_lookahead:.2f}", _mark(c.workers_ok), f"{c.scaling_actions:.1f}") for c in checks],
        text=(0, 1), caption=">= 99 %: needed where a baseline or a rule reaches 99 % (n/a: none does); ceiling: "
                             "the largest pool's QoS; / lookahead: mean workers over the lookahead oracle's, at "
                             "most 1.15 at 99 %; actions: scaling actions (the reactive baselines' are above)")
    peers = text_table(
        "RL targets: the peers", ("scenario", "RL", "return", "> peers", "best peer", "peer's", "gap ± se"),
        [(c.scenario, c.policy, f"{c.episode_return:.1f}", _mark(c.beats_peers), c.peer_name,
          f"{c.best_peer_return:.1f}", _gap(c)) for c in checks], text=(0, 1), words=(4,),
        caption="peers: every baseline and causal rule; return: the env's (higher is better), the best peer's; "
                "gap: the return minus the best peer's, ± its standard error over the same episodes (a gap "
                "within about two of them is for more episodes to decide: --episodes)")
    return [limit, peers]


def paper_table(checks: Sequence[PaperCheck]):
    return text_table(
        "the paper's setting: its own targets", ("RL", "QoS %", "workers", "actions", "met"), paper_rows(checks),
        caption=f"QoS >= {PAPER_QOS_PCT:g} %, mean workers <= {PAPER_WORKERS:g}, fewer than {PAPER_ACTIONS} "
                f"actions (the paper's SARSA: 99.2 %, 14.78 workers, 24 actions)")


def write_reports(reports: Sequence[EvalReport], path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps([r.model_dump() for r in reports], option=orjson.OPT_INDENT_2))
    return path


def write_summary_plot(reports: Sequence[EvalReport], path: Path, highlight: Sequence[str] = ("pg",)) -> Path:
    """The README's PNG: workers over episode 0 of the first report (left), QoS vs workers / the
    oracle's for every policy of every report (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (series, scatter) = plt.subplots(1, 2, figsize=(10.5, 3.8), layout="constrained")
    first = reports[0]
    shown = [p for p in first.policies
             if p.name in highlight or p.name == "reactive-max" or p.role == "reference" and "ceiling" not in p.name]
    for p in shown:
        steps = p.episodes[0].steps
        width = 2.2 if p.name in highlight else 1.2
        series.step([s.time for s in steps], [s.ready + s.starting for s in steps], where="post",
                    linewidth=width, label=p.name.split(" (")[0] + (" (hindsight)" if p.role == "reference" else ""))
    t = [s.time for s in first.policies[0].episodes[0].steps]
    series.plot(t, first.mean_load_workers, "k:", linewidth=1, label="load (arrivals x S)")
    series.set(title=f"{first.scenario}, episode 0: workers (ready + starting)", xlabel="time s", ylabel="workers")
    series.legend(fontsize="x-small", loc="upper left")
    markers = {"rl": "o", "baseline": "s", RULE: "D", "reference": "^"}
    for i, report in enumerate(reports):
        oracle = _reference(report, "oracle", unless="lookahead")
        if oracle is None:
            continue
        for p in report.policies:
            if "ceiling" in p.name:
                continue
            x = _mean(p, "mean_workers") / _mean(oracle, "mean_workers")
            scatter.scatter(x, _mean(p, "qos_pct"), marker=markers.get(p.role, "o"), color=f"C{i}", s=28,
                            edgecolors="black" if p.name in highlight else "none")
        scatter.scatter([], [], color=f"C{i}", label=report.scenario)
    scatter.axhline(QOS_TARGET_PCT, color="grey", linewidth=0.8, linestyle="--")
    scatter.axvline(ORACLE_FACTOR, color="grey", linewidth=0.8, linestyle="--")
    scatter.set(title="QoS vs workers / oracle's (o RL, s baseline, D rule, ^ hindsight; < 85 % not shown)",
                xlabel="mean workers / instant-resize oracle's", ylabel="QoS %", ylim=(85, 100.5))
    scatter.title.set_fontsize("small")
    scatter.legend(fontsize="x-small", loc="lower right")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
