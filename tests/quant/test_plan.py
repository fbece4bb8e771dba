"""The quantization plan: specs checked on creation, decisions kept in order, and the QDQ emitter writing exactly the
plan (read back from the emitted model) with the quantized model close to the float one on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest

from npukit.errors import InputError
from npukit.quant.calibration.calibrate import calibrate
from npukit.quant.config import CalibrationSpec, CpuKernels, QuantConfig, Scheme
from npukit.quant.emit.ort_qdq import emit_qdq, ort_overrides, resolve_grids
from npukit.quant.plan import Decision, QuantPlan, TensorSpec
from npukit.quant.qdq import plan_for, preprocess, quantize
from tests.quant.conftest import make_samples, outputs, tiny_cnn


@pytest.mark.parametrize("kwargs, message", [
    ({"dtype": "int7"}, "unknown dtype"),
    ({"dtype": "int8", "quant_min": -200}, "not inside"),
    ({"dtype": "uint8", "scale": (0.1,), "zero_point": (300,)}, "zero points must lie"),
    ({"dtype": "int4", "block_size": 32}, "needs an axis"),
    ({"dtype": "float16", "scale": (0.1,)}, "has no grid"),
    ({"dtype": "int8", "scale": (0.1, 0.2)}, "per-tensor spec has one scale"),
    ({"dtype": "int8", "axis": 0, "scale": (0.1, 0.0)}, "positive"),
    ({"dtype": "uint8", "range": (1.0, -1.0)}, "min <= max"),
])
def test_a_spec_that_cannot_be_is_refused(kwargs, message) -> None:
    with pytest.raises(InputError, match=message):
        TensorSpec(**kwargs)


def test_specs_for_every_precision_the_later_steps_need() -> None:
    int4 = TensorSpec("int4", symmetric=True, axis=1, block_size=32)
    assert (int4.quant_min, int4.quant_max, int4.bits, int4.granularity) == (-8, 7, 4, "per block of 32 (axis 1)")
    assert TensorSpec("uint16", range=(-1.0, 3.0)).bits == 16
    wide = TensorSpec("uint8", range=(-1.0, 3.0)).as_dtype("uint16")
    assert (wide.quant_min, wide.quant_max, wide.range) == (0, 65535, (-1.0, 3.0))
    assert TensorSpec("float16").is_float and TensorSpec("float16").granularity == "float"
    reduced = TensorSpec("int8", symmetric=True, quant_min=-64, quant_max=64)
    assert not reduced.full_range and TensorSpec("int8", symmetric=True, quant_min=-127).full_range
    weight = TensorSpec.fixed_weight(np.array([[0.5], [0.25]]), axis=0)
    assert weight.scale == (0.5, 0.25) and weight.zero_point == (0, 0) and weight.symmetric
    assert TensorSpec.fixed_weight(np.array([0.5, 0.25]), axis=None).scale == (0.5,)


def test_the_plan_keeps_every_decision_in_order_and_cannot_be_changed_in_place() -> None:
    plan = QuantPlan()
    plan = plan.with_spec("x", TensorSpec("uint8", range=(0.0, 1.0)), Decision("calibration", "minmax"))
    lifted = plan.with_spec("x", TensorSpec("uint16", range=(0.0, 1.0)), Decision("int16", "named"))
    lifted = lifted.keep_float(["head"], Decision("float_stem", "faster in float"))
    assert [d.step for d in lifted.provenance("x")] == ["calibration", "int16"]
    assert plan.spec("x").dtype == "uint8" and lifted.spec("x").dtype == "uint16"  # a new plan each step
    with pytest.raises(TypeError):
        lifted.tensors["x"] = TensorSpec("int8")  # type: ignore[index]
    summary = lifted.summary()
    assert summary["dtypes"] == {"uint16": 1} and summary["decided_last_by"] == {"int16": 1}
    assert summary["float_nodes"] == {"head": ["float_stem: faster in float"]}
    with pytest.raises(InputError, match="integer dtype"):
        QuantPlan(activation_dtype="float16")


def test_ranges_set_on_the_plan_keep_each_tensor_s_dtype_and_say_who_set_them() -> None:
    plan = QuantPlan(symmetric_activations=True).with_spec(
        "wide", TensorSpec("uint16", symmetric=True), Decision("int16_plan", "within the budget"))
    plan = plan.with_ranges({"wide": (-1.0, 2.0), "a": (0.0, 6.0)}, Decision("calibration", "minmax"))
    plan = plan.with_ranges({"a": (0.0, 4.0)}, Decision("range_search", "higher SQNR"))
    plan = plan.with_spec("w", TensorSpec.fixed_weight(np.array([0.5]), axis=None), Decision("adaround", "learned"))
    assert plan.ranges() == {"wide": (-1.0, 2.0), "a": (0.0, 4.0)}  # the weight grid has no range
    assert plan.spec("wide").dtype == "uint16" and plan.spec("a") == TensorSpec("uint8", symmetric=True,
                                                                                range=(0.0, 4.0))
    assert [d.step for d in plan.provenance("wide")] == ["int16_plan", "calibration"]
    assert [d.step for d in plan.provenance("a")] == ["calibration", "range_search"]
    assert list(plan.set_by("int16_plan")) == ["wide"] and list(plan.set_by("adaround")) == ["w"]
    assert list(plan.set_by("calibration")) == ["wide", "a"]


def _setup(config: QuantConfig):
    model = preprocess(tiny_cnn(spread=0.5))
    samples = make_samples(8)
    ranges = calibrate(model, samples, config=config).ranges
    return model, samples, ranges


def test_the_emitted_model_is_the_plan() -> None:
    config = QuantConfig(scheme=Scheme(int16_tensors=("a1",), exclude=("fc",)), cpu=CpuKernels(reduce_range=True))
    model, samples, ranges = _setup(config)
    plan = plan_for(model, config, ranges)
    assert plan.spec("a1").dtype == "uint16" and [d.step for d in plan.provenance("a1")][-1] == "int16"
    assert plan.spec("w2").full_range and plan.last_step("w2") == "cpu_scheme"  # depthwise: all 8 bits
    assert plan.spec("w3").scale is not None  # 1x1 conv: the pair-bounded grid, fixed
    assert list(plan.float_nodes) == ["fc"]
    qdq = emit_qdq(model, samples[0], plan)
    resolved, wrong = resolve_grids(model, qdq, plan)
    assert wrong == []
    for name in ("a1", "x"):  # the emitted grid spans the planned range (ORT widens it to take 0)
        spec = resolved.spec(name)
        lo, hi = min(spec.range[0], 0.0), max(spec.range[1], 0.0)
        levels = 65535 if spec.dtype == "uint16" else 255
        assert spec.scale[0] == pytest.approx((hi - lo) / levels, rel=1e-5)
    np.testing.assert_allclose(resolved.spec("w3").scale, plan.spec("w3").scale, rtol=1e-6)
    assert resolved.spec("b1").dtype == "int32" and resolved.last_step("b1") == "ort_quantizer"
    assert not any(n.op_type == "DequantizeLinear" and n.output[0] in {i for m in qdq.graph.node if m.name == "fc"
                                                                      for i in m.input[1:]} for n in qdq.graph.node)
    # the quantized model against the unmodified one on the same inputs
    ref, got = outputs(model, samples), outputs(qdq, samples)
    err = np.sum((ref - got) ** 2) / np.sum(ref ** 2)
    assert 10 * np.log10(1 / err) > 25


def test_a_tensor_the_emitter_did_not_quantize_as_planned_is_listed() -> None:
    config = QuantConfig()
    model, samples, ranges = _setup(config)
    plan = plan_for(model, config, ranges)
    qdq = emit_qdq(model, samples[0], plan)
    claimed = plan.with_spec("a1", plan.spec("a1").as_dtype("uint16"), Decision("test", "claimed"))
    _, wrong = resolve_grids(model, qdq, claimed)
    assert wrong == ["a1: uint16 -> uint8"]


def test_overrides_carry_fixed_weight_grids_and_16_bit_types() -> None:
    config = QuantConfig(scheme=Scheme(int16_tensors=("a1",)))
    model, _, ranges = _setup(config)
    weight = TensorSpec.fixed_weight(np.full(6, 0.01), axis=0)
    overrides = ort_overrides(model, plan_for(model, config, ranges, {"w3": weight}))
    assert len(overrides["w3"]) == 6 and overrides["w3"][0]["axis"] == 0
    assert overrides["w3"][0]["scale"] == np.float32(0.01) and overrides["w3"][0]["zero_point"] == np.int8(0)
    assert "quant_type" in overrides["a1"][0] and "quant_type" not in overrides["x"][0]


def test_quantize_returns_the_plan_as_emitted_with_its_provenance() -> None:
    samples = make_samples(8)
    config = QuantConfig(scheme=Scheme(exclude=("fc",)), calibration=CalibrationSpec(method="percentile"))
    result = quantize(tiny_cnn(spread=0.5), samples, config=config)
    plan = result.plan
    assert result.steps.plan["not_as_planned"] == [] and plan.float_nodes["fc"][0].step == "exclude"
    assert plan.provenance("a1")[0] == Decision("calibration", "percentile over 8 samples")
    assert {s.dtype for t, s in plan.tensors.items() if t.startswith("w") and t != "w4"} == {"int8"}
