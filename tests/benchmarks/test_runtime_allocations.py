"""The native allocation counter of benchmarks/runtime_allocations.py counts what it should: ORT's own allocations
per run, fewer with the outputs bound once than with a plain session.run that allocates them every call."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from ._load import load_benchmark

ra = load_benchmark("runtime_allocations")


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")),
                    reason="no C compiler on PATH: the LD_PRELOAD counter cannot be built here")
def test_the_counter_sees_ort_s_allocations_and_the_bound_outputs_save_some(tmp_path) -> None:
    library = ra.build_counter(tmp_path)
    (name, (model, feeds)), = ra._tiny(tmp_path).items()
    np.savez(tmp_path / "feeds.npz", **feeds)
    counts = ra.count_calls(library, model, tmp_path / "feeds.npz", calls=300)
    assert set(counts) == {"plain_session_run", "bound_buffers", "runtime_run_into_callers_arrays"}
    assert all(v > 0 for v in counts.values())  # ORT allocates inside every Run, bound or not
    assert counts["bound_buffers"] < counts["plain_session_run"]  # outputs bound once, not made per call
