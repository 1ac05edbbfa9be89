"""The fault suite's output: one table per fault (rows = transports) and a PASS/MISS line."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fault_suite.runner import FaultReport


def fault_table(reports: list[FaultReport]) -> Table:
    """The rows of every run of one fault (its nats-mode and Mosquitto-mode stacks)."""
    first = reports[0]
    table = Table(title=f"{first.fault}: {first.title}", title_justify="left", show_lines=False)
    for name in ("transport", "up --mqtt", "sent", "accepted", "answered", "errors", "overload", "refused", "lost",
                 "dup", "after ok", "reasons"):
        table.add_column(name, justify="left" if name in ("transport", "up --mqtt", "reasons") else "right",
                         overflow="fold")
    for report in reports:
        for row in report.rows:
            reasons = "; ".join(f"{n}x {why}" for why, n in sorted(row.reasons.items(), key=lambda kv: -kv[1]))
            if row.redelivered:
                reasons = f"{row.redelivered}x same answer redelivered (QoS 1); " + reasons
            table.add_row(row.transport, report.mode, str(row.sent), str(row.accepted), str(row.answered),
                          str(row.errors), _mark(row.overload), str(row.refused), _mark(row.lost), "-" if row.duplicated is None
                          else _mark(row.duplicated), f"{row.after_ok}/{row.after_sent}", reasons or "")
    return table


def _mark(n: int) -> str:
    return f"[bold red]{n}[/]" if n else "0"


def verdict(reports: list[FaultReport]) -> tuple[bool, str]:
    misses = [f"[{r.mode}] {m}" for r in reports for m in r.misses()]
    name = reports[0].fault
    return (not misses, f"{name}: PASS" if not misses else f"{name}: MISS ({'; '.join(misses)})")


def print_reports(reports: list[FaultReport], console: Console | None = None) -> bool:
    """Every fault's table, events and verdict; True when every fault passed."""
    console = console or Console(width=200)
    by_fault: dict[str, list[FaultReport]] = {}
    for r in reports:
        by_fault.setdefault(r.fault, []).append(r)
    lines, ok = [], True
    for runs in by_fault.values():
        console.print(fault_table(runs))
        for r in runs:
            for e in r.events:
                console.print(f"  [{r.mode}] {e}", markup=False, highlight=False)
            for row in r.rows:
                for kind, ids in row.examples.items():
                    console.print(f"  [{r.mode}] {row.transport} {kind}, e.g.: {'; '.join(ids)}", markup=False,
                                  highlight=False)
            if r.error:
                console.print(f"  [{r.mode}] error: {r.error}", markup=False)
            console.print(f"  [{r.mode}] logs: {r.logs}", markup=False)
        passed, line = verdict(runs)
        ok &= passed
        lines.append(line)
        console.print(("[green]" if passed else "[red]") + line + "[/]")
        console.print()
    for line in lines:
        console.print(line, markup=False, highlight=False)
    return ok
