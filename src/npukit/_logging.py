"""ONNX Runtime's quantizer warns through the logging module's root functions (``logging.warning``), which install a
stderr handler on the root logger the first time (``basicConfig``) and leave it there: a user's own
``logging.basicConfig`` afterwards does nothing, and the quantizer's notes on steps npukit has done ("Axis 1 is
out-of-range for weight ...") print as warnings."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_root_logger() -> Iterator[None]:
    """Run the block with a NullHandler on the root logger (so nothing installs one of its own) and the root level at
    ERROR; the root logger's handlers and level come back as they were on exit."""
    root = logging.getLogger()
    handler = logging.NullHandler()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
