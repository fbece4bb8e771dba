"""Kernel profiles: every node of the optimized graph timed, classified by kind, integer kernels told apart."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from npukit.errors import InputError
from npukit.measure.op_profile import KINDS, conv_kind, node_kind, profile_ops
from npukit.quant.config import CalibrationSpec, QuantConfig
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, tiny_cnn


def test_conv_kind() -> None:
    assert conv_kind((16, 8, 1, 1), 1) == "pointwise conv"
    assert conv_kind((16, 8, 3, 3), 1) == "spatial conv"
    assert conv_kind((16, 8, 1), 1) == "pointwise conv"  # 1-D
    assert conv_kind((16, 1, 3, 3), 16) == "depthwise conv"
    assert conv_kind((16, 4, 3, 3), 4) == "grouped conv"
    assert conv_kind((16, 4, 1, 1), 4) == "grouped conv"


def test_node_kind_reads_the_weight_input_of_each_conv_op() -> None:
    shapes = {"w": (8, 1, 3, 3), "wq": (8, 4, 1, 1)}
    dw = helper.make_node("Conv", ["x", "w"], ["y"], group=8)
    qconv = helper.make_node("QLinearConv", ["x", "s", "z", "wq", "ws", "wz", "ys", "yz"], ["y"],
                             domain="com.microsoft")
    assert node_kind(dw, shapes) == "depthwise conv"
    assert node_kind(qconv, shapes) == "pointwise conv"
    assert node_kind(helper.make_node("Conv", ["x", "computed"], ["y"]), shapes) == "spatial conv"
    assert node_kind(helper.make_node("QGemm", ["a"], ["y"]), shapes) == "matmul"
    assert node_kind(helper.make_node("DequantizeLinear", ["a"], ["y"]), shapes) == "quantize"
    assert node_kind(helper.make_node("ReorderOutput", ["a"], ["y"]), shapes) == "layout"
    assert node_kind(helper.make_node("Relu", ["a"], ["y"]), shapes) == "other"


def _by_kind_nodes(profile) -> dict[str, int]:
    return {kind: v["nodes"] for kind, v in profile.by_kind().items()}


def test_profile_float_and_int8_models_interleaved() -> None:
    model = tiny_cnn()
    samples = make_samples(8)
    int8 = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="minmax"))).model
    profiles = profile_ops({"fp32": model, "int8": int8}, warmup=2, runs=6, rounds=3, feeds=samples[0])
    fp32, q = profiles["fp32"], profiles["int8"]
    for p in (fp32, q):
        assert p.latency.runs == 6 and p.kernel_ms > 0 and all(op.median_us >= 0 for op in p.ops)
        assert set(p.by_kind()) <= set(KINDS)
        assert sum(v["ms"] for v in p.by_kind().values()) == pytest.approx(p.kernel_ms)
        assert list(p.by_kind()) == [k for k in KINDS if k in p.by_kind()]
        doc = p.as_dict()
        assert len(doc["ops"]) == len(p.ops) and doc["latency_median_ms"] == p.latency.median_ms
    # the tiny CNN's three convolutions, one of each kind, in float and in int8
    for p in (fp32, q):
        nodes = _by_kind_nodes(p)
        kinds = ("spatial conv", "depthwise conv", "pointwise conv", "matmul")
        assert [nodes[k] for k in kinds] == [1, 1, 1, 1]
    assert not any(op.integer for op in fp32.ops)
    convs = [op for op in q.ops if op.kind.endswith("conv")]
    assert all(op.integer and op.op_type == "QLinearConv" for op in convs)
    assert q.by_kind()["pointwise conv"]["integer_ms"] == pytest.approx(q.by_kind()["pointwise conv"]["ms"])
    assert "quantize" in q.by_kind() and "quantize" not in fp32.by_kind()


def test_profile_random_feeds_and_bad_counts(tmp_path) -> None:
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_cnn(), str(path))
    (profile,) = profile_ops({"m": path}, warmup=0, runs=2, rounds=1).values()
    assert profile.latency.runs == 2 and profile.kernel_ms > 0
    with pytest.raises(InputError, match="no models"):
        profile_ops({})
    with pytest.raises(InputError, match="runs=0"):
        profile_ops({"m": path}, runs=0)
