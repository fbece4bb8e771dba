"""Progress for long loops and steps: a transient rich bar or spinner on stderr, silent when stderr is no terminal."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterable, Iterator, MutableMapping
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

T = TypeVar("T")


def _console(enabled: bool) -> Console | None:
    """A console on stderr when progress should show (enabled and stderr is a terminal), else None."""
    if not enabled:
        return None
    stream = sys.stderr
    try:
        if stream is None or not stream.isatty():
            return None
    except (AttributeError, ValueError):  # replaced or closed stream
        return None
    return Console(stderr=True)


def progress(iterable: Iterable[T], *, total: int | None = None, description: str,
             enabled: bool = True) -> Iterator[T]:
    """Yield the items of ``iterable`` while a transient progress bar counts them on stderr.

    ``total`` defaults to ``len(iterable)`` where it has one (otherwise the bar only counts). Nothing is drawn when
    ``enabled`` is False or stderr is not a terminal (tests, CI logs, pipes).
    """
    console = _console(enabled)
    if console is None:
        yield from iterable
        return
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn()]
    if total is not None:
        columns.append(TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in iterable:
            yield item
            bar.advance(task)


@contextlib.contextmanager
def step(description: str, *, timings: MutableMapping[str, float] | None = None, key: str | None = None,
         enabled: bool = True) -> Iterator[None]:
    """Show a transient spinner with ``description`` while the block runs (same rules as ``progress``) and add the
    elapsed seconds to ``timings[key or description]`` (e.g. ``report.timings``), also when the block raises."""
    console = _console(enabled)
    started = time.perf_counter()
    try:
        if console is None:
            yield
        else:
            with console.status(Text(description)):
                yield
    finally:
        if timings is not None:
            name = key or description
            timings[name] = timings.get(name, 0.0) + (time.perf_counter() - started)


@contextlib.contextmanager
def training_bar(total: int):
    """A progress callback (step, total, loss, agreement) drawing a transient bar on stderr when it is a terminal."""
    console = _console(True)
    if console is None:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    with Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[figures]}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("training", total=total, figures="")

        def update(done: int, _total: int, loss: float, agreement: float) -> None:
            bar.update(task, completed=done, figures=f"loss {loss:.4f}  agreement {agreement:.3f}")

        yield update
