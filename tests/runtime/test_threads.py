"""Threads that call ONNX Runtime stop and are joined when the wait for them is interrupted (a Ctrl-C): serve-bench
interrupted while it measured the core split or a closed loop left them inside ORT's Run, and the interpreter's
teardown aborted the process (exit 134, "terminate called without an active exception")."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from npukit._threads import run_threads
from npukit.measure.load import closed_loop


@pytest.fixture(autouse=True)
def _ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt while a test runs, whatever an earlier test or library set (ignored, it hung
    the suite)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupted_wait_stops_and_joins_every_thread_before_it_goes_on() -> None:
    calls, started = [0, 0], threading.Barrier(3)
    deadline = time.monotonic() + 20.0  # a bound, so that a lost signal fails the test instead of hanging it

    def work(k: int, halt: threading.Event) -> None:
        started.wait()
        while not halt.is_set() and time.monotonic() < deadline:
            calls[k] += 1
            time.sleep(0.001)

    threading.Timer(0.0, lambda: (started.wait(), time.sleep(0.05), os.kill(os.getpid(), signal.SIGINT))).start()
    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt):
        run_threads(work, 2)
    time.sleep(0.01)  # the timer thread's own end
    assert threading.active_count() <= before - 1 and all(calls)


def test_an_interrupted_closed_loop_leaves_no_client_running() -> None:
    inside = threading.Event()

    def call(_feeds) -> None:
        inside.set()
        time.sleep(0.01)

    threading.Timer(0.0, lambda: (inside.wait(), os.kill(os.getpid(), signal.SIGINT))).start()
    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt):
        closed_loop(call, [{"x": np.zeros(1)}], clients=3, duration_s=20.0)
    time.sleep(0.01)
    assert threading.active_count() <= before - 1  # no client thread left (the 20 s loop would still be going)
