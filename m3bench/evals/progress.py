"""A rich progress bar on stderr: done / total and items/s (resumed items count as done, not as speed)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text


class ItemsPerSecond(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-- items/s" if speed is None else f"{speed:.2f} items/s")


@contextlib.contextmanager
def item_progress(label: str, total: int, already_done: int) -> Iterator[Callable[[], None]]:
    """Yields `advance()`, to be called once per finished item."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), ItemsPerSecond(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task(label, total=total, completed=already_done)
        yield lambda: progress.advance(task)
