"""Library messages are counted into the report instead of printed, and the logging setup is restored after."""

from __future__ import annotations

import logging
import warnings

from npukit.report.capture import capture_library_messages, drain


class LibraryWarning(Warning):
    pass


def test_messages_are_counted_and_logging_restored(capsys) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    with capture_library_messages():
        for _ in range(3):
            logging.getLogger().warning("Axis 1 is out-of-range")
        logging.getLogger("onnxruntime.quantization").info("not collected: below WARNING")
        warnings.warn("a library's own warning", LibraryWarning, stacklevel=1)
        messages = drain()
        assert drain() == {}  # drained
    assert messages["WARNING root: Axis 1 is out-of-range"] == 3
    assert messages["LibraryWarning: a library's own warning"] == 1
    assert root.handlers == handlers and root.level == level
    assert "out-of-range" not in capsys.readouterr().err
    assert drain() == {}  # outside any capture
