"""The rich console every ``attnconf`` table and progress bar writes through, and the progress display itself.

rich answers a closed pipe (``attnconf backends | head``) by pointing stdout at /dev/null and raising
``SystemExit(1)``, which would make a reader that stops early look like a failure.  :class:`PipeConsole` raises
``BrokenPipeError`` instead, which :func:`conformance.cli.main` ends quietly with exit 141 like any other closed
pipe (:mod:`conformance.exits`).

:func:`progress` is the progress display of ``run``, ``warmup`` and ``fuzz`` on stderr: rich's live bar in a
terminal; elsewhere (a CI log, a file, a pipe) plain lines, one each time the work crosses another
:data:`LINE_STEP` percent and one at the end (:class:`LineProgress`), never a redrawn line.
"""

from __future__ import annotations

import errno
import sys
import time
from typing import Any

from rich.console import Console

__all__ = ["LINE_STEP", "LineProgress", "PipeConsole", "progress"]

#: Without a terminal, the progress display prints a line each time the work crosses another multiple of this
#: many percent (and at the end).
LINE_STEP = 10


class PipeConsole(Console):
    """A rich ``Console`` whose closed output raises ``BrokenPipeError``."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "the reader of this output went away")


class _Task:
    def __init__(self, description: str, total: float | None, completed: float, fields: dict[str, Any]) -> None:
        self.description, self.total, self.completed, self.fields = description, total, completed, fields
        self.start = time.monotonic()
        self.shown_step = 0  # the last multiple of the step printed
        self.shown: tuple[float, str] | None = None  # (completed, fields text) of the last line printed


class LineProgress:
    """The part of ``rich.progress.Progress`` attnconf uses (a context manager, :meth:`add_task`, :meth:`update`),
    printing plain lines to ``file`` (stderr): ``DESCRIPTION: DONE/TOTAL (P%) after S s: FIELDS`` each time a task
    crosses another multiple of ``step`` percent, and each task's last state when the display closes (unless that
    line was just printed).  ``FIELDS`` are the task's fields (rich markup dropped) after ``unit``.  Nothing is
    printed when ``disable``."""

    def __init__(self, *, file: Any = None, disable: bool = False, step: int = LINE_STEP, unit: str = "") -> None:
        self.file, self.disable, self.step, self.unit = file, disable, step, unit
        self.tasks: list[_Task] = []

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            for task in self.tasks:
                if task.shown != (task.completed, self._fields(task)):
                    self._print(task)

    def add_task(self, description: str, total: float | None = 100.0, completed: float = 0, **fields: Any) -> int:
        self.tasks.append(_Task(description, total, completed, fields))
        return len(self.tasks) - 1

    def update(
        self,
        task_id: int,
        *,
        total: float | None = None,
        completed: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        **fields: Any,
    ) -> None:
        task = self.tasks[task_id]
        if total is not None:
            task.total = total
        if completed is not None:
            task.completed = completed
        if advance is not None:
            task.completed += advance
        if description is not None:
            task.description = description
        task.fields.update({k: v for k, v in fields.items() if k not in ("refresh", "visible")})
        step = int(self._percent(task) // self.step)
        if step > task.shown_step:
            task.shown_step = step
            self._print(task)

    @staticmethod
    def _percent(task: _Task) -> float:
        return 100.0 * min(task.completed / task.total, 1.0) if task.total else 0.0

    @staticmethod
    def _fields(task: _Task) -> str:
        from rich.text import Text

        return " ".join(Text.from_markup(str(v)).plain for v in task.fields.values() if str(v))

    def _print(self, task: _Task) -> None:
        if self.disable:
            return
        unit = f" {self.unit}" if self.unit else ""
        done = f"{task.completed:.0f}/{task.total:.0f}{unit} ({self._percent(task):.0f}%) " if task.total else ""
        fields = self._fields(task)
        line = f"{task.description}: {done}after {time.monotonic() - task.start:.0f} s" + (
            f": {fields}" if fields else ""
        )
        print(line, file=self.file or sys.stderr, flush=True)
        task.shown = (task.completed, fields)


def progress(*columns: Any, disable: bool = False, unit: str = "") -> Any:
    """The progress display on stderr: ``rich.progress.Progress(*columns)`` when stderr is a terminal, else a
    :class:`LineProgress` (``unit`` names what its counts count, e.g. ``s`` for a time budget)."""
    console = PipeConsole(stderr=True)
    if console.is_terminal:
        from rich.progress import Progress

        return Progress(*columns, console=console, disable=disable)
    return LineProgress(disable=disable, unit=unit)
