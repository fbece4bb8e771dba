"""Library messages (Python logging records and warnings from ONNX Runtime's quantizer, torch's exporter, ...)
collected while a verb runs, so they go into its report instead of onto the terminal, counted once per message."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

_active: list[collections.Counter[str]] = []
_native_lock = threading.RLock()  # re-entrant: a capture inside another (a runtime loaded while Tune runs) nests


def _clipped(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut at a word before ``limit`` characters with an ellipsis where longer (the LiteRT
    report's message ended mid-word: "... suppres")."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit].rsplit(" ", 1)[0]
    return f"{cut or flat[:limit]} …"


class _Collect(logging.Handler):
    def __init__(self, sink: collections.Counter[str]) -> None:
        super().__init__(level=logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a library's malformed log call must not break the verb
            text = str(record.msg)
        self.sink[f"{record.levelname} {record.name}: {_clipped(text)}"] += 1


@contextlib.contextmanager
def capture_library_messages() -> Iterator[collections.Counter[str]]:
    """Within the block, warnings and WARNING-or-worse log records of any library are counted instead of printed
    (the root logger gets a collecting handler and stops propagating to stderr); ``drain`` hands them over."""
    sink: collections.Counter[str] = collections.Counter()
    root = logging.getLogger()
    handler = _Collect(sink)
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = [handler]
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    original_showwarning = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        sink[f"{category.__name__}: {_clipped(str(message))}"] += 1

    warnings.showwarning = show
    _active.append(sink)
    try:
        yield sink
    finally:
        _active.remove(sink)
        warnings.showwarning = original_showwarning
        root.handlers = saved_handlers
        root.setLevel(saved_level)


def capturing() -> bool:
    """Whether a capture is active (the CLI's, or a verb's called from Python: ``reported``)."""
    return bool(_active)


def reported(verb: Callable[..., Any]) -> Callable[..., Any]:
    """``verb`` with its library messages and npukit's own notes collected into its report when called from
    Python, as the CLI collects them (an API caller's report lacked "Input shape: taken from the data" and every
    note warned where it arises); inside an active capture it runs as it is."""
    import functools

    @functools.wraps(verb)
    def run(*args: Any, **kwargs: Any) -> Any:
        if capturing():
            return verb(*args, **kwargs)
        with capture_library_messages():
            return verb(*args, **kwargs)

    return run


def drain() -> dict[str, int]:
    """The messages counted so far by the innermost active capture (emptied), or {} outside one."""
    if not _active:
        return {}
    sink = _active[-1]
    out = dict(sink.most_common())
    sink.clear()
    return out


@contextlib.contextmanager
def capture_native_output() -> Iterator[Callable[[], str]]:
    """Redirect file descriptors 1 and 2, where native libraries print (ORT's C++ logger, QNN's libnative notice
    when the HTP backend loads, LiteRT's delegate notices), to a temporary file; yields a reader of what was
    captured, complete once the block has ended. Captures nest: an inner one takes what is printed inside it and
    hands the descriptors back to the outer one."""
    with _native_lock, tempfile.TemporaryFile(mode="w+b") as sink:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        captured: list[str] = []
        try:
            for fd in saved:
                os.dup2(sink.fileno(), fd)
            yield lambda: "".join(captured)
        finally:
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            captured.append(sink.read().decode("utf-8", errors="replace"))
