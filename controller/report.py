"""Reading evaluation reports against the autoscaling targets (DESIGN.md section 7), as rich
tables, Markdown (the README's) and JSON.

The targets, for an RL policy on each scenario: QoS >= 99 %, mean workers <= 1.2x the
instant-resize oracle's, fewer worker-seconds than the smallest fixed pool reaching 99 %, and
fewer scaling actions than the reactive controllers. The QoS ceiling (the largest pool from the
first decision on) shows where 99 % is out of reach for any policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from controller.evaluation import METRICS, EvalReport, PolicyReport

QOS_TARGET_PCT = 99.0
ORACLE_FACTOR = 1.2


@dataclass(frozen=True)
class TargetCheck:
    scenario: str
    policy: str
    qos_pct: float
    qos_ceiling_pct: float
    workers_vs_oracle: float        # mean workers / the oracle's
    worker_seconds: float
    fixed_worker_seconds: float | None   # of the smallest fixed pool reaching 99 % (None: none does)
    scaling_actions: float
    reactive_actions: float

    @property
    def qos_ok(self) -> bool:
        return self.qos_pct >= QOS_TARGET_PCT

    @property
    def workers_ok(self) -> bool:
        return self.workers_vs_oracle <= ORACLE_FACTOR

    @property
    def cheaper_than_fixed(self) -> bool | None:
        return None if self.fixed_worker_seconds is None else self.worker_seconds < self.fixed_worker_seconds

    @property
    def calmer_than_reactive(self) -> bool:
        return self.scaling_actions < self.reactive_actions

    @property
    def passed(self) -> int:
        return sum(bool(x) for x in (self.qos_ok, self.workers_ok, self.cheaper_than_fixed, self.calmer_than_reactive))


def _mean(p: PolicyReport, key: str) -> float:
    return p.metrics[key].mean


def _reference(report: EvalReport, word: str) -> PolicyReport | None:
    return next((p for p in report.policies if p.role == "reference" and word in p.name), None)


def target_checks(reports: Sequence[EvalReport]) -> list[TargetCheck]:
    """One check per scenario: the RL policy meeting most targets (then the fewest worker-seconds)."""
    out = []
    for report in reports:
        oracle, fixed, ceiling = (_reference(report, word) for word in ("oracle", "smallest", "ceiling"))
        reactive = [p for p in report.policies if p.name.startswith("reactive")]
        rl = [p for p in report.policies if p.role == "rl"]
        if oracle is None or not rl or not reactive:
            continue
        fixed_ok = fixed is not None and _mean(fixed, "qos_pct") >= QOS_TARGET_PCT
        checks = [TargetCheck(
            scenario=report.scenario, policy=p.name, qos_pct=_mean(p, "qos_pct"),
            qos_ceiling_pct=_mean(ceiling, "qos_pct") if ceiling else float("nan"),
            workers_vs_oracle=_mean(p, "mean_workers") / _mean(oracle, "mean_workers"),
            worker_seconds=_mean(p, "worker_seconds"),
            fixed_worker_seconds=_mean(fixed, "worker_seconds") if fixed_ok else None,
            scaling_actions=_mean(p, "scaling_actions"),
            reactive_actions=min(_mean(r, "scaling_actions") for r in reactive),
        ) for p in rl]
        out.append(max(checks, key=lambda c: (c.passed, -c.worker_seconds)))
    return out


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "no")


TARGET_HEADERS = ("scenario", "best RL", "QoS % (ceiling)", ">= 99 %", "workers / oracle", "<= 1.2", "worker-s (fixed 99 %)",
                  "< fixed", "actions (reactive)", "< reactive")


def target_rows(checks: Sequence[TargetCheck]) -> list[tuple[str, ...]]:
    return [(
        c.scenario, c.policy, f"{c.qos_pct:.2f} ({c.qos_ceiling_pct:.2f})", _mark(c.qos_ok),
        f"{c.workers_vs_oracle:.2f}", _mark(c.workers_ok),
        f"{c.worker_seconds:.0f} ({'-' if c.fixed_worker_seconds is None else f'{c.fixed_worker_seconds:.0f}'})",
        _mark(c.cheaper_than_fixed), f"{c.scaling_actions:.1f} ({c.reactive_actions:.1f})", _mark(c.calmer_than_reactive),
    ) for c in checks]


def targets_table(checks: Sequence[TargetCheck]):
    from rich.table import Table

    table = Table(title="RL targets: the best RL policy per scenario (ceiling: QoS of the largest pool from the "
                        "first decision on, the most any policy can reach)")
    for header in TARGET_HEADERS:
        table.add_column(header, justify="left" if header in ("scenario", "best RL") else "right")
    for row in target_rows(checks):
        table.add_row(*row)
    return table


def _cell(p: PolicyReport, key: str, fmt: str) -> str:
    stat = p.metrics[key]
    return fmt.format(stat.mean) if stat.std == 0 else f"{fmt.format(stat.mean)} ± {fmt.format(stat.std)}"


def markdown_table(report: EvalReport) -> str:
    headers = ["policy", *(title for title, _ in METRICS.values())]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for p in report.policies:
        name = f"**{p.name}**" if p.role == "rl" else p.name
        lines.append("| " + " | ".join([name, *(_cell(p, k, fmt) for k, (_, fmt) in METRICS.items())]) + " |")
    return "\n".join(lines)


def markdown_report(reports: Sequence[EvalReport], episodes: int, seed: int) -> str:
    parts = []
    for report in reports:
        parts.append(f"#### {report.scenario} ({episodes} episodes, seeds {seed}..{seed + episodes - 1})\n\n"
                     f"{markdown_table(report)}\n")
    checks = target_checks(reports)
    if checks:
        lines = ["| " + " | ".join(TARGET_HEADERS) + " |", "|" + "---|" * len(TARGET_HEADERS)]
        lines += ["| " + " | ".join(row) + " |" for row in target_rows(checks)]
        parts.append("#### RL targets\n\n" + "\n".join(lines) + "\n")
    return "\n".join(parts)


def write_reports(reports: Sequence[EvalReport], path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps([r.model_dump() for r in reports], option=orjson.OPT_INDENT_2))
    return path
