"""Rich progress bars for the runner's ``progress(stage, done, total)`` callback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

#: the runner's ``progress(stage, done, total)`` (vflink.runner.train.Progress), spelt out here
#: so that importing this module does not import the runner (and torch)
ProgressFn = Callable[[str, int, int], None]

__all__ = ["epoch_progress"]


@contextmanager
def epoch_progress(label: str, console: Console) -> Iterator[ProgressFn]:
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("epochs"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(stage: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
