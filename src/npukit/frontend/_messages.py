"""One-line summaries of exceptions for InputError messages (ANSI colours and blank lines removed)."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(exc: BaseException | str) -> str:
    """The first non-empty line of an exception's text, or its type name when it has none."""
    text = _ANSI.sub("", str(exc))
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__ if isinstance(exc, BaseException) else ""
