"""Progress into a file: a line when a task starts, one every ``every_s``, one when it ends."""

from __future__ import annotations

import io

from rich.console import Console

from p2pfaas import progress as progress_module
from p2pfaas.progress import WorkProgress


def test_plain_lines_at_the_start_every_interval_and_at_the_end(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with WorkProgress(console=Console(file=out, width=80), every_s=10.0) as work:
        task = work.add_task("training pg", total=200)
        for step in range(1, 201):
            clock[0] += 0.125   # 25 s in all
            work.update(task, completed=step)
        fraction = work.add_task("bursty -> n1", total=1.0)
        work.update(fraction, completed=0.25)
    lines = out.getvalue().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        "training pg: 1/200 (0 %), 0 s", "training pg: 81/200 (40 %), 10 s", "training pg: 161/200 (80 %), 20 s",
        "training pg: 200/200 (100 %), 25 s", "bursty -> n1: 25 %, 0 s"], lines
    assert "\x1b" not in out.getvalue()


def test_a_terminal_gets_the_bars():
    work = WorkProgress(console=Console(file=io.StringIO(), force_terminal=True))
    assert work._bars is not None
