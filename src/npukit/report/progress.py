"""Progress for long loops and steps: a transient rich bar or spinner on stderr when it is a terminal; otherwise (a
log file, a pipe, CI) a plain line now and then, only once something has run for ``HEARTBEAT_S`` seconds: short
commands stay silent, a long one shows that it is alive and how far it got."""

from __future__ import annotations

import contextlib
import sys
import threading
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

HEARTBEAT_S = 60.0  # seconds between plain progress lines without a terminal (none before the first has passed)


def _stderr_is_terminal() -> bool | None:
    """Whether stderr is a terminal; None when there is no stderr to write to (none, replaced or closed)."""
    stream = sys.stderr
    try:
        return None if stream is None else bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed stream
        return None


def _console(enabled: bool) -> Console | None:
    """A console on stderr when progress should show (enabled and stderr is a terminal), else None."""
    return Console(stderr=True) if enabled and _stderr_is_terminal() else None


def _plain(enabled: bool) -> bool:
    """Whether plain progress lines go to stderr: enabled, and stderr is there but no terminal."""
    return enabled and _stderr_is_terminal() is False


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


_OPEN: list[_Heartbeat] = []  # the heartbeats open now, innermost last: only the innermost writes


class _Heartbeat:
    """Plain lines on stderr at most every ``HEARTBEAT_S`` seconds: ``tick(text)`` writes one when that long has
    passed since the start or the last line and no heartbeat opened inside this one is running (a step around a
    training loop leaves the lines to the loop)."""

    def __init__(self, description: str) -> None:
        self.description, self.started = description, time.monotonic()
        self.last, self.lines = self.started, 0
        self.stream = sys.stderr  # as it is now: a library quietened inside the block redirects sys.stderr

    def __enter__(self) -> _Heartbeat:
        _OPEN.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self in _OPEN:
            _OPEN.remove(self)

    def tick(self, text: str = "", *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < HEARTBEAT_S or (_OPEN and _OPEN[-1] is not self):
            return
        self.last, self.lines = now, self.lines + 1
        detail = f": {text}" if text else ""
        try:
            print(f"npukit: {self.description}{detail} ({_elapsed(now - self.started)} elapsed)", file=self.stream,
                  flush=True)
        except (OSError, ValueError):  # stderr closed under us: progress is not worth failing for
            pass


def progress(iterable: Iterable[T], *, total: int | None = None, description: str,
             enabled: bool = True) -> Iterator[T]:
    """Yield the items of ``iterable`` while a transient progress bar counts them on stderr.

    ``total`` defaults to ``len(iterable)`` where it has one (otherwise the bar only counts). Nothing is drawn when
    ``enabled`` is False; when stderr is not a terminal, a line says how far it got every ``HEARTBEAT_S`` seconds.
    """
    console = _console(enabled)
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if console is None:
        if not _plain(enabled):
            yield from iterable
            return
        with _Heartbeat(description) as beat:
            for done, item in enumerate(iterable, 1):
                yield item
                beat.tick(f"{done}/{total}" if total is not None else f"{done}")
        return
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
    elapsed seconds to ``timings[key or description]`` (e.g. ``report.timings``), also when the block raises.
    Without a terminal, a block still running after ``HEARTBEAT_S`` seconds says so every ``HEARTBEAT_S``, and
    when it ends."""
    console = _console(enabled)
    started = time.perf_counter()
    try:
        if console is None:
            if _plain(enabled):
                with _heartbeats(description):
                    yield
            else:
                yield
        else:
            with console.status(Text(description)):
                yield
    finally:
        if timings is not None:
            name = key or description
            timings[name] = timings.get(name, 0.0) + (time.perf_counter() - started)


@contextlib.contextmanager
def _heartbeats(description: str) -> Iterator[None]:
    """A thread that writes "still running" every ``HEARTBEAT_S`` seconds while the block runs, and "done" after it
    when it wrote anything."""
    beat, stop = _Heartbeat(description), threading.Event()

    def beating() -> None:
        while not stop.wait(HEARTBEAT_S):
            beat.tick("still running", force=True)

    thread = threading.Thread(target=beating, name="npukit-progress", daemon=True)
    with beat:
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            if beat.lines:
                beat.tick("done", force=True)


@contextlib.contextmanager
def training_bar(total: int, measure: str = "agreement"):
    """A progress callback (step, total, loss, value of ``measure``: the training's agreement measure, "top-1
    agreement" or "SQNR dB") drawing a transient bar on stderr when it is a terminal; else writing a line with the
    same figures every ``HEARTBEAT_S`` seconds."""
    label = measure.replace("top-1 agreement", "agreement")
    console = _console(True)
    if console is None:
        if not _plain(True):
            yield None
            return
        with _Heartbeat("training") as beat:
            def line(done: int, _total: int, loss: float, agreement: float) -> None:
                beat.tick(f"step {done}/{_total}, loss {loss:.4f}, {label} {agreement:.3f}")

            yield line
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    with Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[figures]}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("training", total=total, figures="")

        def update(done: int, _total: int, loss: float, agreement: float) -> None:
            bar.update(task, completed=done, figures=f"loss {loss:.4f}  {label} {agreement:.3f}")

        yield update
