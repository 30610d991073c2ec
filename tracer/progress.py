"""Progress bars for work that can take more than a couple of seconds (loading runs, diff, export).

With ``rich`` installed and stderr a terminal, a rich progress bar; otherwise a plain fallback that
stays silent for quick work and prints one line to stderr when a task ends after more than
``PLAIN_AFTER_S`` seconds. Progress never goes to stdout: stdout carries the command's result.

Usage::

    with task("Loading run", total=len(files)) as t:
        for f in files:
            ...
            t.advance()

    for f in track(files, "Loading run"):
        ...
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import IO, TypeVar

T = TypeVar("T")

#: The plain fallback reports a task only when it took longer than this.
PLAIN_AFTER_S = 2.0


class _Task:
    """A running task: call :meth:`advance` as work completes."""

    def __init__(self, description: str, total: float | None) -> None:
        self.description = description
        self.total = total
        self.completed = 0.0

    def advance(self, amount: float = 1.0) -> None:
        self.completed += amount


class _RichTask(_Task):
    def __init__(self, description: str, total: float | None, progress, task_id) -> None:
        super().__init__(description, total)
        self._progress = progress
        self._id = task_id

    def advance(self, amount: float = 1.0) -> None:
        super().advance(amount)
        self._progress.advance(self._id, amount)


def _use_rich(stream: IO[str]) -> bool:
    if os.environ.get("MEMTRACE_PROGRESS", "").lower() in ("0", "off", "no", "false"):
        return False
    try:
        isatty = stream.isatty()
    except (AttributeError, ValueError):
        isatty = False
    if not isatty:
        return False
    try:
        import rich.progress  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def task(description: str, total: float | None = None, *, stream: IO[str] | None = None) -> Iterator[_Task]:
    """A progress bar for one task of ``total`` steps (None: unknown), on stderr."""
    stream = stream if stream is not None else sys.stderr
    start = time.monotonic()
    if _use_rich(stream):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%")]
        with Progress(*columns, TimeElapsedColumn(), console=Console(file=stream), transient=True) as progress:
            task_id = progress.add_task(description, total=total)
            yield _RichTask(description, total, progress, task_id)
        return
    t = _Task(description, total)
    yield t
    elapsed = time.monotonic() - start
    if elapsed > PLAIN_AFTER_S:
        print(f"memtrace: {description}: done in {elapsed:.1f} s", file=stream)


def track(
    items: Iterable[T], description: str, *, total: int | None = None, stream: IO[str] | None = None
) -> Iterator[T]:
    """Iterate over ``items`` with a progress bar."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with task(description, total, stream=stream) as t:
        for item in items:
            yield item
            t.advance()
