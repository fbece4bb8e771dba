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


def test_native_captures_nest_and_each_takes_its_own_lines(capfd) -> None:
    """A capture inside another in the same thread (a runtime loaded by optimize's driver while Tune's output is
    captured) takes what is printed inside it and hands fds 1 and 2 back to the outer one; it used to deadlock."""
    import os
    import threading

    from npukit.report.capture import capture_native_output

    result: dict[str, str] = {}

    def nested() -> None:
        with capture_native_output() as outer:
            os.write(2, b"outer before\n")
            with capture_native_output() as inner:
                os.write(1, b"inner\n")
            os.write(2, b"outer after\n")
        result["outer"], result["inner"] = outer(), inner()

    worker = threading.Thread(target=nested, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "nested native captures deadlocked"
    assert result["inner"] == "inner\n"
    assert result["outer"] == "outer before\nouter after\n"
    assert "inner" not in capfd.readouterr().out


def test_a_long_message_is_cut_at_a_word_not_mid_word() -> None:
    """LiteRT's report showed a message cut at 300 characters mid-word ("... suppres")."""
    long = "TensorFlow notice " + "word " * 70 + "suppressing further messages"
    with capture_library_messages():
        warnings.warn(long, LibraryWarning, stacklevel=1)
        (message,) = drain()
    assert message.endswith("word …") and len(message) <= len("LibraryWarning: ") + 302


def test_a_verb_called_from_python_collects_its_notes_as_the_cli_does():
    """npukit.quantize(..., calib=array) wrote a report without "Input shape: taken from the data": the notes are
    warnings that only the CLI's capture collected. The API's verbs capture too; inside a capture, they join it."""
    from npukit.report.capture import capturing, reported

    seen = {}

    def verb():
        warnings.warn("a note", LibraryWarning, stacklevel=1)
        seen["active"], seen["messages"] = capturing(), drain()

    reported(verb)()
    assert seen["active"] and seen["messages"] == {"LibraryWarning: a note": 1} and not capturing()
    with capture_library_messages():
        reported(verb)()
        assert capturing()
    import npukit

    assert npukit.quantize.__name__ == "quantize" and "post-training" in npukit.quantize.__doc__
