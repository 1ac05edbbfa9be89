"""Progress of long work: rich's bars on a terminal; into a file, a pipe or CI (where a bar is drawn
only at the end) a timestamped line per task when it starts, every ``every_s`` seconds, and when it
ends. It takes the part of rich's ``Progress`` the commands use: ``add_task`` and ``update``."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import Progress

PLAIN_EVERY_S = 10.0


@dataclass
class _Task:
    description: str
    total: float | None
    started: float
    completed: float = 0.0
    said: float | None = None     # when its last line was printed
    unsaid: bool = False          # updated since
    ended: bool = False


class WorkProgress:
    def __init__(self, *columns, console: Console | None = None, transient: bool = False,
                 every_s: float = PLAIN_EVERY_S) -> None:
        self.console = console or Console(stderr=True)
        self.every_s = every_s
        self._bars = Progress(*columns, console=self.console, transient=transient) if self.console.is_terminal else None
        self._tasks: list[_Task] = []

    def __enter__(self) -> "WorkProgress":
        if self._bars is not None:
            self._bars.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._bars is not None:
            self._bars.__exit__(*exc)
            return
        for task in self._tasks:   # where it stopped, if its last line is older than that
            if task.unsaid and exc[0] is None:
                self._say(task)

    def add_task(self, description: str, total: float | None = None, **fields) -> int:
        if self._bars is not None:
            return self._bars.add_task(description, total=total, **fields)
        self._tasks.append(_Task(description, total, started=time.monotonic()))
        return len(self._tasks) - 1

    def update(self, task_id: int, *, completed: float | None = None, total: float | None = None,
               advance: float | None = None, description: str | None = None, **fields) -> None:
        if self._bars is not None:
            self._bars.update(task_id, completed=completed, total=total, advance=advance, description=description,
                              **fields)
            return
        task = self._tasks[task_id]
        task.total = task.total if total is None else total
        task.description = task.description if description is None else description
        task.completed = (task.completed + (advance or 0)) if completed is None else completed
        now = time.monotonic()
        done = task.total is not None and task.completed >= task.total
        task.unsaid = True
        if (done and not task.ended) or task.said is None or now - task.said >= self.every_s:
            task.ended = done
            self._say(task, now)

    def _say(self, task: _Task, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        task.said, task.unsaid = now, False
        if task.total in (None, 0):
            amount = f"{task.completed:g}"
        elif task.total == 1:   # a fraction
            amount = f"{100 * task.completed:.0f} %"
        else:
            amount = f"{task.completed:g}/{task.total:g} ({100 * task.completed / task.total:.0f} %)"
        self.console.print(f"{time.strftime('%H:%M:%S')} {task.description}: {amount}, {now - task.started:.0f} s",
                           highlight=False, markup=False, soft_wrap=True)
        self.console.file.flush()
