"""Patterns the QNN HTP takes but computes wrongly: found in float and QDQ models, predicted by analyze, rewritten
exactly by --fix (no QNN needed here; tests/runtime/test_compile_hazards.py runs them on the HTP emulator)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npukit.runtime.ort import make_session, run
from npukit.targets import analyze, apply_fixes, get_target
from npukit.targets.hazards import find_hazards, guard_hazards
from tests.runtime.tiny_qdq import qdq_swish_model as qdq_swish
from tests.targets._models import make, vi


def swish_after(producer: str = "Conv", *, height: int = 10, width: int = 10, channels: int = 4) -> onnx.ModelProto:
    """x -> producer -> Sigmoid -> Mul(., Sigmoid): a float SiLU after a Conv, an Add or a MaxPool."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.3, "w"),
             numpy_helper.from_array(np.array(0.25, np.float32), "k")]
    first = {"Conv": helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             "Add": helper.make_node("Add", ["x", "k"], ["c"], name="add"),
             "MaxPool": helper.make_node("MaxPool", ["x"], ["c"], name="pool", kernel_shape=[3, 3],
                                         pads=[1, 1, 1, 1])}[producer]
    nodes = [first, helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Mul", ["c", "s"], ["y"], name="mul")]
    return make(nodes, [vi("x", [1, channels, height, width])], [vi("y", None)], inits)


HTP = get_target("qnn-htp")


def test_swish_after_a_conv_is_a_hazard_only_in_the_measured_band():
    [match] = find_hazards(swish_after("Conv"), HTP)
    assert match.nodes == ("sig", "mul") and match.input == "c" and match.hazard.fix == "silu_split_input"
    assert match.site.producer == "Conv" and match.where == "1x4x10x10 after Conv"
    assert "garbage" in match.reason and "as npukit quantizes" in match.reason  # float: once quantized to 16 bits
    assert find_hazards(swish_after("MaxPool"), HTP)  # a pool writes the same tiled layout
    for height, width in ((8, 10), (13, 16), (40, 9)):  # measured right on the emulator
        assert find_hazards(swish_after("Conv", height=height, width=width), HTP) == [], (height, width)
    for height, width in ((9, 1), (12, 200), (200, 8)):
        assert find_hazards(swish_after("Conv", height=height, width=width), HTP), (height, width)
    assert find_hazards(swish_after("Add"), HTP) == []  # x * Sigmoid(x) after an Add: right on the emulator
    assert find_hazards(swish_after("Conv"), get_target("cpu")) == []  # a profile without hazards


def test_qdq_swish_is_found_through_qdq_pairs_only_with_16_bit_activations():
    [match] = find_hazards(qdq_swish(), HTP)
    assert match.nodes == ("sig", "mul") and match.site.activation_dtype == "uint16"
    assert find_hazards(qdq_swish(activations=TensorProto.UINT8), HTP) == []
    assert find_hazards(qdq_swish(height=16, width=16), HTP) == []


def test_rewrite_is_exact_on_the_qdq_graph_and_removes_the_hazard():
    model = qdq_swish()
    guarded = guard_hazards(model, HTP)
    assert [m.nodes for m in guarded.rewritten] == [("sig", "mul")] and guarded.left == ()
    assert find_hazards(guarded.model, HTP) == []
    mul = next(n for n in guarded.model.graph.node if n.name == "mul")
    assert "c_dq" not in mul.input  # the product reads a copy of the Conv output, not the Sigmoid's own input
    x = {"x": np.random.default_rng(2).uniform(-3, 3, (1, 4, 10, 10)).astype(np.float32)}
    before = run(make_session(model, optimization="disable"), x)[0]
    after = run(make_session(guarded.model, optimization="disable"), x)[0]
    assert np.array_equal(before, after)
    assert guard_hazards(qdq_swish(height=16, width=16), HTP).rewritten == ()


def test_analyze_predicts_the_hazard_and_fix_removes_it():
    a = analyze(qdq_swish(), HTP)
    wrong = {v.name: v for v in a.inaccurate}
    assert set(wrong) == {"sig", "mul"} and all(v.supported and v.fix == "silu_split_input" for v in wrong.values())
    assert "fused Swish" in wrong["mul"].warnings[0] and "1x4x10x10 after Conv" in wrong["mul"].warnings[0]
    assert any("computes 1 node pattern(s) wrongly" in n for n in a.notes)
    assert a.as_dict()["nodes_inaccurate"] == 2
    fixed = apply_fixes(qdq_swish(), HTP)
    [entry] = [f for f in fixed.applied if f["fix"] == "silu_split_input"]
    assert entry["rewrites"] == 1 and fixed.errors is not None and fixed.errors.max_abs == 0.0
    assert analyze(fixed.model, HTP).inaccurate == ()
    # A float model: reported (it runs wrongly once quantized to 16 bits), rewritten by compile after quantizing;
    # --fix leaves it, since ONNX Runtime's basic optimizations would drop a float Mul(x, 1) again.
    float_model = swish_after("Conv")
    wrong = analyze(float_model, HTP).inaccurate
    assert [v.name for v in wrong] == ["sig", "mul"] and all(v.fix is None for v in wrong)
    assert "npukit compile then rewrites it" in wrong[0].warnings[0]
    kept = apply_fixes(float_model, HTP)
    [entry] = [f for f in kept.applied if f["fix"] == "silu_split_input"]
    assert entry["rewrites"] == 0 and "float model" in entry["notes"][0] and kept.errors is None


def _quantized_unit(op: str, inputs: list[tuple[str, np.ndarray]], out_shape: list[int], **attrs) -> onnx.ModelProto:
    """x (uint16 Q/DQ) and constant inputs each behind its own DQ -> ``op`` -> Q/DQ: one quantized node unit."""
    inits = [numpy_helper.from_array(np.array(0.01, np.float32), "s16"),
             numpy_helper.from_array(np.array(32768, np.uint16), "z16")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s16", "z16"], ["x_q"], name="q_x"),
             helper.make_node("DequantizeLinear", ["x_q", "s16", "z16"], ["x_dq"], name="dq_x")]
    names = ["x_dq"]
    for name, array in inputs:
        inits += [numpy_helper.from_array(array, f"{name}_q"), numpy_helper.from_array(np.array(0.01, np.float32),
                                                                                         f"{name}_s"),
                  numpy_helper.from_array(np.zeros((), array.dtype), f"{name}_z")]
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [name],
                                      name=f"dq_{name}"))
        names.append(name)
    nodes += [helper.make_node(op, names, ["y"], name="op", **attrs),
              helper.make_node("QuantizeLinear", ["y", "s16", "z16"], ["y_q"], name="q_y"),
              helper.make_node("DequantizeLinear", ["y_q", "s16", "z16"], ["y_dq"], name="dq_y")]
    return make(nodes, [vi("x", [1, 4, 4, 4])], [vi("y_dq", out_shape)], inits, opset=21)


def test_quantized_batchnorm_needs_a_uint8_or_int32_bias():
    def bn(bias_dtype):
        params = [("scale", np.ones(4, np.uint8)), ("bias", np.ones(4, bias_dtype)),
                  ("mean", np.zeros(4, np.uint8)), ("var", np.ones(4, np.uint8))]
        return _quantized_unit("BatchNormalization", params, [1, 4, 4, 4])

    bad = {v.name: v for v in analyze(bn(np.uint16), HTP).nodes}["op"]
    assert not bad.supported and "Batchnorm unsupported datatype on HTP" in bad.reasons[0]
    assert {v.name: v for v in analyze(bn(np.uint8), HTP).nodes}["op"].supported


def test_quantized_empty_resize_roi_is_predicted_to_fail():
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")

    def resize(roi: np.ndarray) -> onnx.ModelProto:
        model = _quantized_unit("Resize", [("roi", roi)], [1, 4, 8, 8], mode="nearest")
        op = next(n for n in model.graph.node if n.name == "op")
        op.input.append("scales")
        model.graph.initializer.append(scales)
        return model

    bad = {v.name: v for v in analyze(resize(np.zeros(0, np.uint16)), HTP).nodes}["op"]
    assert not bad.supported and any("7004" in r for r in bad.reasons)
