"""The kernel-profile benchmark's arithmetic on profiles whose answers are known."""

from __future__ import annotations

import pytest

from npukit.measure.latency import LatencyResult
from npukit.measure.op_profile import OpProfile, OpTime

from ._load import load_benchmark

ik = load_benchmark("int8_kernels")


def _profile(pointwise_us: float, depthwise_us: float, *, integer: bool, latency_ms: float) -> OpProfile:
    ops = (OpTime("pw", "QLinearConv" if integer else "Conv", "pointwise conv", integer, pointwise_us),
           OpTime("dw", "QLinearConv" if integer else "Conv", "depthwise conv", integer, depthwise_us))
    if integer:
        ops += (OpTime("q", "QuantizeLinear", "quantize", False, 500.0),)
    return OpProfile(ops=ops, latency=LatencyResult.from_times([latency_ms] * 3, threads=1))


def test_pointwise_needed() -> None:
    fp32 = {"kernel_ms": 10.0, "by_kind": {"pointwise conv": {"ms": 8.0}, "depthwise conv": {"ms": 2.0}}}
    int8 = {"kernel_ms": 7.0, "by_kind": {"pointwise conv": {"ms": 5.0}, "depthwise conv": {"ms": 2.0}}}
    # 0.5 x 10 ms = 5 ms, depthwise keeps 2 ms, so pointwise must fit in 3 ms: 8 / 3 faster than FP32
    assert ik.pointwise_needed(fp32, int8) == pytest.approx(8.0 / 3.0)
    slow_rest = {"kernel_ms": 11.0, "by_kind": {"pointwise conv": {"ms": 5.0}, "depthwise conv": {"ms": 6.0}}}
    assert ik.pointwise_needed(fp32, slow_rest) is None


def test_analyse_and_markdown() -> None:
    profiles = {"fp32": _profile(8000.0, 2000.0, integer=False, latency_ms=11.0),
                "q": _profile(5000.0, 2000.0, integer=True, latency_ms=8.0)}
    out = ik.analyse(profiles, {"fp32": "FP32", "q": "int8 model"})
    q = out["q"]
    assert q["kernel_ms"] == pytest.approx(7.5) and q["kernel_ratio"] == pytest.approx(0.75)
    assert q["latency_ratio"] == pytest.approx(8.0 / 11.0)
    assert q["by_kind"]["pointwise conv"]["speedup"] == pytest.approx(1.6)
    assert q["by_kind"]["quantize"]["speedup"] is None  # FP32 has no such kernels
    assert q["pointwise_speedup_needed"] == pytest.approx(8.0 / (5.0 - 2.5))
    doc = {"machine": {"cpu": {"model": "cpu", "int8_features": {"avx2": True}, "has_int8_dot": False}},
           "onnxruntime": "1", "runs": 3, "models": out}
    text = ik.markdown(doc)
    assert "| pointwise conv | 8.00, 1 | 5.00 (1.60x), 1 |" in text
    assert "int8 model: pointwise convs 3.2x faster than FP32 (measured: 1.60x)" in text
