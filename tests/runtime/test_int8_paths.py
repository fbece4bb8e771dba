"""The int8 path probe: its integer reference, its weight grids, and that it agrees with the scheme npukit picks
from this CPU's flags."""

from __future__ import annotations

import numpy as np

from npukit.quant.cpu.schemes import cpu_int8_scheme
from npukit.runtime.devices import read_cpu_info
from npukit.runtime.int8_paths import (ROUNDING_STEPS, _exact, _weights, full_range_exact, inexact_summary,
                                       probe_int8_paths)


def test_the_reference_is_integer_convolution() -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (1, 4, 4, 4)).astype(np.uint8)
    w = rng.integers(-127, 128, (2, 4, 3, 3)).astype(np.int8)
    got = _exact(x, w, zero_point=-1, group=1, out_scale=1024.0)
    padded = np.pad(x.astype(np.int64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = np.zeros((1, 4, 4, 2), np.int64)
    for o in range(2):
        for i in range(4):
            for j in range(4):
                want[0, i, j, o] = np.sum(padded[0, i:i + 3, j:j + 3, :] * (w[o].astype(np.int64) + 1).transpose(1, 2, 0))
    np.testing.assert_array_equal(got, np.clip(np.rint(want / 1024.0) + 128, 0, 255))


def test_the_grids_are_what_they_claim() -> None:
    rng = np.random.default_rng(2)
    paired = _weights(rng, "pair-bounded", (8, 64, 1, 1)).astype(np.int32)
    assert np.all(np.abs(paired[:, 0::2]) + np.abs(paired[:, 1::2]) <= 128) and np.abs(paired).max() > 64
    assert np.abs(_weights(rng, "7-bit", (8, 64, 3, 3)).astype(np.int32)).max() <= 64
    assert np.abs(_weights(rng, "full", (8, 64, 1, 1)).astype(np.int32)).max() > 120


def test_the_probe_agrees_with_the_scheme_for_this_cpu() -> None:
    paths = probe_int8_paths()
    assert {p.weights for p in paths} == {"full 8-bit", "pair-bounded", "7-bit"}
    # the grids npukit's reduce_range uses are exact on every CPU, and so are depthwise convs
    assert all(p.steps_off <= ROUNDING_STEPS for p in paths if p.weights != "full 8-bit" or "depthwise" in p.name), \
        inexact_summary(paths)
    scheme = cpu_int8_scheme(read_cpu_info("/proc/cpuinfo"))
    # the flags-based scheme reduces the weight range exactly where full-range weights measure inexact
    assert scheme["reduce_range"] == (not full_range_exact(paths)), (scheme["reason"], inexact_summary(paths))
    if not full_range_exact(paths):
        assert "off by up to" in inexact_summary(paths)
