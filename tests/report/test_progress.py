"""Progress helpers: transient bars on a terminal; without one, silent for short work and a plain line now and then
for long work; timings recorded."""

from __future__ import annotations

import contextlib
import io
import time

import pytest
from rich.console import Console

from npukit.report import progress as progress_module
from npukit.report.progress import progress, step, training_bar


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


def test_without_a_terminal_long_work_says_now_and_then_how_far_it_got(capfd, monkeypatch):
    monkeypatch.setattr(progress_module, "HEARTBEAT_S", 0.05)
    for _ in progress(range(3), description="calibrating"):
        time.sleep(0.06)
    with step("compiling for the HTP"):
        time.sleep(0.3)
    with step("training (2 epochs)"), training_bar(3) as update:
        for done in (1, 2, 3):
            time.sleep(0.06)
            update(done, 3, 0.5 / done, 0.9)
    with step("writing"):
        pass
    with step("exporting"), contextlib.redirect_stderr(io.StringIO()):  # a library quietened inside the step
        time.sleep(0.3)
    lines = capfd.readouterr().err.splitlines()
    assert lines[0].startswith("npukit: calibrating: 1/3 (") and "elapsed" in lines[0]
    assert "npukit: calibrating: 3/3" in lines[2]
    assert "npukit: compiling for the HTP: still running" in lines[3]
    assert any(line.startswith("npukit: compiling for the HTP: done (") for line in lines)
    training = [line for line in lines if "training" in line]
    assert training and all(line.startswith("npukit: training: step ") for line in training), training
    assert "step 3/3, loss 0.1667, agreement 0.900" in training[-1]
    assert not any("writing" in line for line in lines)  # short work stays silent
    assert "npukit: exporting: still running" in lines[-2] and "npukit: exporting: done" in lines[-1]
