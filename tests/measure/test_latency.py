"""Latency: sane positive numbers for one model and for interleaved models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.measure.latency import LatencyResult, measure_latency, measure_latency_interleaved


def _matmul_model(size: int) -> bytes:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((size, size)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", size])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _sane(result: LatencyResult, runs: int) -> None:
    assert result.runs == runs == len(result.times_ms)
    assert all(t > 0 for t in result.times_ms)
    assert 0 < result.min_ms <= result.median_ms <= result.p90_ms <= max(result.times_ms)
    assert result.min_ms <= result.mean_ms <= max(result.times_ms)
    assert result.median_ms == pytest.approx(float(np.median(result.times_ms)))


def test_measure_latency(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(_matmul_model(64))
    result = measure_latency(path, threads=1, warmup=2, runs=7)
    _sane(result, 7)
    assert result.threads == 1
    feeds = {"x": np.ones((4, 64), dtype=np.float32)}
    _sane(measure_latency(_matmul_model(64), warmup=0, runs=3, feeds=feeds), 3)
    assert result.as_dict()["runs"] == 7


def test_interleaved_gives_every_model_its_runs() -> None:
    results = measure_latency_interleaved({"small": _matmul_model(8), "large": _matmul_model(1024)},
                                          threads=1, warmup=2, runs=9, rounds=4)
    assert list(results) == ["small", "large"]
    for result in results.values():
        _sane(result, 9)
    # a 1x1024 @ 1024x1024 MatMul (1M MACs, ~0.1 ms) against 1x8 @ 8x8 (64 MACs: the call's overhead alone); at
    # 256 the two were within the overhead's noise on a shared host (0.020 vs 0.022 ms, order flipped once in CI)
    assert results["large"].median_ms > results["small"].median_ms


def test_bad_counts_are_input_errors() -> None:
    with pytest.raises(InputError):
        measure_latency(_matmul_model(8), runs=0)
    with pytest.raises(InputError):
        measure_latency(_matmul_model(8), threads=0)
    with pytest.raises(InputError):
        measure_latency_interleaved({}, runs=3)
