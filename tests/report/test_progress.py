"""Progress helpers: silent without a terminal, transient bars with one, timings recorded."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from npukit.report import progress as progress_module
from npukit.report.progress import progress, step


def test_progress_without_tty_yields_everything_silently(capfd):
    assert list(progress(range(5), description="calibrating")) == [0, 1, 2, 3, 4]
    assert list(progress((i for i in range(3)), description="gen", enabled=True)) == [0, 1, 2]
    timings: dict[str, float] = {}
    with step("exporting", timings=timings):
        pass
    with step("exporting", timings=timings, enabled=False):
        pass
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
    assert set(timings) == {"exporting"} and timings["exporting"] >= 0


def test_progress_on_a_terminal_draws_and_clears(monkeypatch):
    sink = io.StringIO()
    monkeypatch.setattr(progress_module, "_console",
                        lambda enabled: Console(file=sink, force_terminal=True, width=80) if enabled else None)
    seen = list(progress(range(4), description="benchmarking"))
    assert seen == [0, 1, 2, 3]
    assert "benchmarking" in sink.getvalue()
    assert list(progress(range(2), description="off", enabled=False)) == [0, 1]
    assert "off" not in sink.getvalue()
    # stopping early closes the bar
    gen = progress(range(100), description="early")
    assert next(gen) == 0
    gen.close()
    with step("compiling", timings=None):
        pass
    assert "compiling" in sink.getvalue()


def test_step_adds_time_even_when_the_block_fails():
    timings = {"export": 1.0}
    with step("Exporting to ONNX", timings=timings, key="export"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError), step("verify", timings=timings):
        raise RuntimeError("boom")
    assert set(timings) == {"export", "verify"}
    assert 1.02 <= timings["export"] < 2.0 and 0 <= timings["verify"] < 1.0
