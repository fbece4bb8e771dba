"""npukit.runtime.htp_quant: what the HTP's QDQ model needs beyond ORT's quantizer, each on a tiny model that shows
the cause (the real third-party models, RetinaFace, PP-OCRv4 det and PP-LCNet orientation, are in the module's
docstring)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.runtime import htp_quant
from npukit.runtime.htp_quant import (
    batchnorm_to_mul_add,
    fold_conv_transpose_affine,
    quantize_for_htp,
    widen_activation_grids,
)
from npukit.runtime.ort import make_session, run
from npukit.runtime.qnn import QnnQdqRules, qdq_reference_session
from tests.runtime.conftest import requires_qnn

PLAIN = QnnQdqRules(gptq=False, bias_correction=False, activation_headroom=1.0)  # ORT's quantizer alone


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _sqnr(ref: np.ndarray, out: np.ndarray) -> float:
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    return float(10 * np.log10((ref**2).sum() / ((ref - out) ** 2).sum()))


def _outputs(model: onnx.ModelProto, samples, *, qdq: bool) -> np.ndarray:
    session = qdq_reference_session(model) if qdq else make_session(model)
    return np.concatenate([run(session, s)[0] for s in samples])


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _zero_sum_conv(channels: int = 32, out: int = 16, size: int = 10) -> onnx.ModelProto:
    """A 1x1 conv whose kernels sum to ~0 reading a mostly positive input (after a Relu): the weights' rounding moves
    each kernel's sum, which the input's large mean turns into an offset of the whole output channel."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((out, channels, 1, 1))
    w -= w.mean(axis=1, keepdims=True)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w", "b"], ["y"], name="conv")]
    return _model(nodes, [("x", [1, channels, size, size])], [("y", [1, out, size, size])],
                  {"w": w, "b": rng.standard_normal(out) * 0.1})


def _positive_samples(count: int, seed: int, shape=(1, 32, 10, 10), mean: float = 6.0):
    rng = np.random.default_rng(seed)
    return [{"x": (mean + rng.standard_normal(shape)).astype(np.float32)} for _ in range(count)]


def _int_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The int8 weight tensors (not their zero points)."""
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
            if i.data_type == TensorProto.INT8 and len(i.dims) > 1}


def _int32_biases(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
            if i.data_type == TensorProto.INT32 and not i.name.endswith("zero_point")}


def test_bias_correction_removes_the_offset_of_int8_weight_rounding_and_keeps_the_weights():
    model = _zero_sum_conv()
    calib, held_out = _positive_samples(8, 1), _positive_samples(8, 2)
    plain = quantize_for_htp(model, calib, rules=PLAIN)
    corrected = quantize_for_htp(model, calib, rules=QnnQdqRules(gptq=False, activation_headroom=1.0))
    assert list(corrected.corrected) == ["conv"] and corrected.as_dict()["correction_samples"] == 8
    ref = _outputs(model, held_out, qdq=False)
    before = _sqnr(ref, _outputs(plain.model, held_out, qdq=True))
    after = _sqnr(ref, _outputs(corrected.model, held_out, qdq=True))
    assert after >= before + 7.0, (before, after)  # measured: 33.4 -> 43.5 dB
    weights_plain, weights_corrected = _int_weights(plain.model), _int_weights(corrected.model)
    assert weights_plain.keys() == weights_corrected.keys()
    assert all(np.array_equal(weights_plain[k], weights_corrected[k]) for k in weights_plain)  # integers unchanged
    (bias_plain,), (bias_corrected,) = _int32_biases(plain.model).values(), _int32_biases(corrected.model).values()
    assert not np.array_equal(bias_plain, bias_corrected)


def test_gptq_rerounds_int8_weights_on_the_same_grid_and_lowers_the_layer_error():
    model = _zero_sum_conv()
    calib, held_out = _positive_samples(8, 1), _positive_samples(8, 2)
    plain = quantize_for_htp(model, calib, rules=PLAIN)
    gptq = quantize_for_htp(model, calib, rules=QnnQdqRules(bias_correction=False, activation_headroom=1.0))
    assert list(gptq.rerounded) == ["conv"] and gptq.rerounded["conv"] > 3.0
    ref = _outputs(model, held_out, qdq=False)
    before = _sqnr(ref, _outputs(plain.model, held_out, qdq=True))
    after = _sqnr(ref, _outputs(gptq.model, held_out, qdq=True))
    assert after >= before + 7.0, (before, after)  # measured: 33.4 -> 43.4 dB
    (q_plain,), (q_gptq,) = _int_weights(plain.model).values(), _int_weights(gptq.model).values()
    assert q_gptq.shape == q_plain.shape and np.abs(q_gptq.astype(int)).max() <= 127  # symmetric int8
    assert not np.array_equal(q_plain, q_gptq)
    scales_plain, scales_gptq = _inits(plain.model), _inits(gptq.model)
    for name in (n for n in scales_plain if n.endswith("scale")):  # every grid as ORT chose it
        assert np.array_equal(scales_plain[name], scales_gptq[name]), name


def _conv_transpose_bn(groups: int = 1) -> onnx.ModelProto:
    """ConvTranspose -> Add(per-channel bias) -> BatchNormalization -> Relu, as paddle2onnx writes PP-OCRv4 det's
    head: npukit's float passes fold BatchNorm into Conv only."""
    rng = np.random.default_rng(0)
    c = 8
    inits = {"w": rng.standard_normal((4, c // groups, 2, 2)) * 0.5, "cb": rng.standard_normal((1, c, 1, 1)),
             "g": rng.uniform(0.2, 3, c), "b": rng.standard_normal(c), "m": rng.standard_normal(c),
             "v": rng.uniform(0.01, 4, c)}
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["ct"], name="ct", strides=[2, 2], kernel_shape=[2, 2],
                              group=groups),
             helper.make_node("Add", ["ct", "cb"], ["ab"], name="add"),
             helper.make_node("BatchNormalization", ["ab", "g", "b", "m", "v"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["y"], name="relu")]
    return _model(nodes, [("x", [1, 4, 8, 8])], [("y", [1, c, 16, 16])], inits)


def _normal_samples(count: int, shape, seed: int = 0, scale: float = 1.0):
    return [{"x": (scale * np.random.default_rng(seed + i).standard_normal(shape)).astype(np.float32)}
            for i in range(count)]


@pytest.mark.parametrize("groups", [1, 2])
def test_batchnorm_and_bias_after_a_conv_transpose_fold_into_it_exactly(groups):
    model = _conv_transpose_bn(groups)
    folded, names = fold_conv_transpose_affine(model)
    assert [n.op_type for n in folded.graph.node] == ["ConvTranspose", "Relu"] and names == ["add", "bn"]
    onnx.checker.check_model(folded)
    samples = _normal_samples(2, (1, 4, 8, 8))
    ref, out = _outputs(model, samples, qdq=False), _outputs(folded, samples, qdq=False)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def _add_batchnorm(c: int, side: int) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """Add -> BatchNormalization (not after a conv: the float passes leave it) over (1, c, side, side), and one
    sample."""
    rng = np.random.default_rng(0)
    inits = {"g": rng.uniform(0.2, 3, c), "b": rng.standard_normal(c), "m": rng.standard_normal(c),
             "v": rng.uniform(0.01, 4, c)}
    nodes = [helper.make_node("Add", ["x1", "x2"], ["a"], name="add"),
             helper.make_node("BatchNormalization", ["a", "g", "b", "m", "v"], ["y"], name="bn")]
    shape = [1, c, side, side]
    model = _model(nodes, [("x1", shape), ("x2", shape)], [("y", shape)], inits)
    samples = [{"x1": rng.standard_normal(shape).astype(np.float32),
                "x2": rng.standard_normal(shape).astype(np.float32)}]
    return model, samples


def test_other_batchnorms_become_mul_add_exactly():
    model, samples = _add_batchnorm(6, 5)
    rewritten, names = batchnorm_to_mul_add(model)
    assert [n.op_type for n in rewritten.graph.node] == ["Add", "Mul", "Add"] and names == ["bn"]
    assert not {"g", "b", "m", "v"} & set(_inits(rewritten))
    np.testing.assert_allclose(_outputs(rewritten, samples, qdq=False), _outputs(model, samples, qdq=False),
                               rtol=1e-5, atol=1e-5)


def test_a_batchnorm_whose_constants_are_also_graph_inputs_leaves_no_input_to_feed():
    """IR version 3 models (CenterFace's) list every initializer as a graph input too; the rewritten BatchNorm's
    constants must leave the inputs with the initializers, or ONNX Runtime asks for them to be fed."""
    model, samples = _add_batchnorm(4, 3)
    model.graph.input.extend(helper.make_tensor_value_info(i.name, onnx.TensorProto.FLOAT, list(i.dims))
                             for i in model.graph.initializer)
    rewritten, _ = batchnorm_to_mul_add(model)
    assert [i.name for i in rewritten.graph.input] == ["x1", "x2"]
    np.testing.assert_allclose(_outputs(rewritten, samples, qdq=False), _outputs(model, samples, qdq=False),
                               rtol=1e-5, atol=1e-5)


def _conv_relu6() -> onnx.ModelProto:
    """Conv -> Clip(0, 6) (a Relu6: ORT drops the Clip and lets the output grid clamp) -> Conv."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((4, 3, 3, 3)) * 0.5, "b": rng.standard_normal(4) * 0.1,
             "w2": rng.standard_normal((4, 4, 1, 1)) * 0.5, "lo": np.array(0.0), "hi": np.array(6.0)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["r"], name="relu6"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2")]
    return _model(nodes, [("x", [1, 3, 6, 6])], [("y", [1, 4, 6, 6])], inits)


def test_headroom_keeps_inputs_beyond_the_calibration_range_and_the_clip_bounds():
    model = _conv_relu6()
    calib, louder = _normal_samples(4, (1, 3, 6, 6)), _normal_samples(4, (1, 3, 6, 6), seed=10, scale=1.8)
    narrow = quantize_for_htp(model, calib, rules=PLAIN).model
    wide = quantize_for_htp(model, calib, rules=QnnQdqRules(gptq=False, bias_correction=False))
    assert wide.widened >= 2
    ref = _outputs(model, louder, qdq=False)
    narrow_sqnr = _sqnr(ref, _outputs(narrow, louder, qdq=True))
    assert _sqnr(ref, _outputs(wide.model, louder, qdq=True)) >= narrow_sqnr + 10
    inits = _inits(wide.model)
    # ORT removed the Clip, so its output grid is what clamps: that grid still ends at 6
    assert "Clip" not in {n.op_type for n in wide.model.graph.node}
    assert int(inits["r_zero_point"]) == 0 and abs(65535 * float(inits["r_scale"]) - 6.0) < 1e-3
    # every int32 bias keeps the scale input_scale x weight_scale the HTP's integer conv assumes
    producers = {o: n for n in wide.model.graph.node for o in n.output}
    for node in (n for n in wide.model.graph.node if n.op_type == "Conv"):
        x_scale, w_scale, b_scale = (inits[producers[node.input[i]].input[1]] for i in range(3))
        np.testing.assert_allclose(b_scale, x_scale * w_scale, rtol=1e-5)


def test_headroom_leaves_the_grids_of_bounded_ops_alone():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Mul", ["s", "c"], ["y"], name="mul")]
    model = _model(nodes, [("x", [1, 2, 4, 4])], [("y", [1, 2, 4, 4])],
                   {"w": np.random.default_rng(0).standard_normal((2, 2, 1, 1))})
    qdq = quantize_for_htp(model, _normal_samples(2, (1, 2, 4, 4)), rules=PLAIN).model
    widened, count = widen_activation_grids(model, qdq, 2.0)
    before, after = _inits(qdq), _inits(widened)
    assert np.array_equal(before["s_scale"], after["s_scale"])  # QNN's fixed 16-bit Sigmoid grid
    assert np.isclose(after["c_scale"], 2 * before["c_scale"], rtol=1e-3) and count == 3  # x, c, y


def _small_net() -> onnx.ModelProto:
    """Conv -> HardSwish -> depthwise Conv -> Relu -> ConvTranspose -> Add -> BatchNorm -> Sigmoid: every step of
    quantize_for_htp has something to do."""
    rng = np.random.default_rng(0)
    w2 = rng.standard_normal((8, 1, 3, 3))
    inits = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.4, "b1": rng.standard_normal(8) * 0.1,
             "w2": w2 - w2.mean(axis=(2, 3), keepdims=True), "wt": rng.standard_normal((8, 4, 2, 2)) * 0.3,
             "cb": rng.standard_normal((1, 4, 1, 1)) * 0.1, "g": rng.uniform(0.5, 2, 4), "bb": rng.standard_normal(4),
             "m": rng.standard_normal(4) * 0.1, "v": rng.uniform(0.1, 2, 4)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["h1"], name="hswish"),
             helper.make_node("Conv", ["h1", "w2"], ["c2"], name="dw", pads=[1, 1, 1, 1], group=8),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu"),
             helper.make_node("ConvTranspose", ["r2", "wt"], ["t"], name="up", strides=[2, 2], kernel_shape=[2, 2]),
             helper.make_node("Add", ["t", "cb"], ["tb"], name="up_bias"),
             helper.make_node("BatchNormalization", ["tb", "g", "bb", "m", "v"], ["n"], name="bn"),
             helper.make_node("Sigmoid", ["n"], ["y"], name="sigmoid")]
    return _model(nodes, [("x", [1, 3, 8, 8])], [("y", [1, 4, 16, 16])], inits)


def test_quantize_for_htp_on_a_small_net_beats_the_quantizer_alone_on_cpu():
    model = _small_net()
    calib, held_out = _normal_samples(8, (1, 3, 8, 8)), _normal_samples(4, (1, 3, 8, 8), seed=100)
    result = quantize_for_htp(model, calib)
    info = result.as_dict()
    assert info["folded"] == ["up_bias", "bn"] and info["biases_added"] == 1  # the depthwise conv had none
    assert info["gptq_nodes"] >= 1 and info["bias_corrected_nodes"] == 3 and info["widened_grids"] > 0
    assert "BatchNormalization" not in {n.op_type for n in result.model.graph.node}
    ref = _outputs(model, held_out, qdq=False)
    plain = _sqnr(ref, _outputs(quantize_for_htp(model, calib, rules=PLAIN).model, held_out, qdq=True))
    assert _sqnr(ref, _outputs(result.model, held_out, qdq=True)) > plain


@requires_qnn
def test_the_htp_runs_a_folded_conv_transpose_as_its_qdq_graph_and_a_batchnorm_far_from_it(monkeypatch):
    """QNN's BatchNorm requantizes scale / sqrt(var + eps) on one int8 grid for all channels: after a ConvTranspose
    the HTP lands 4.7 dB from the QDQ graph (PP-OCRv4 det's head: 21.8 dB); folded, 70 dB."""
    from npukit.runtime.qnn import make_qnn_session

    model, samples = _conv_transpose_bn(), _normal_samples(4, (1, 4, 8, 8))
    folded = quantize_for_htp(model, samples, rules=PLAIN).model
    htp = np.concatenate([run(make_qnn_session(folded), s)[0] for s in samples])
    assert _sqnr(_outputs(folded, samples, qdq=True), htp) > 50
    monkeypatch.setattr(htp_quant, "fold_conv_transpose_affine", lambda m: (m, []))
    monkeypatch.setattr(htp_quant, "batchnorm_to_mul_add", lambda m: (m, []))
    unfolded = quantize_for_htp(model, samples, rules=PLAIN).model
    assert "BatchNormalization" in {n.op_type for n in unfolded.graph.node}
    htp_bn = np.concatenate([run(make_qnn_session(unfolded), s)[0] for s in samples])
    assert _sqnr(_outputs(unfolded, samples, qdq=True), htp_bn) < 30


@requires_qnn
def test_the_htp_runs_the_compensated_model_as_its_qdq_graph():
    """GPTQ's integers, the corrected int32 biases and the widened grids (bias scales following them) are what the
    HTP computes: it agrees with the QDQ graph to its own rounding."""
    from npukit.runtime.qnn import make_qnn_session

    model, calib = _small_net(), _normal_samples(8, (1, 3, 8, 8))
    qdq = quantize_for_htp(model, calib).model
    htp = np.concatenate([run(make_qnn_session(qdq), s)[0] for s in calib[:3]])
    assert _sqnr(_outputs(qdq, calib[:3], qdq=True), htp) > 40
    assert _sqnr(_outputs(model, calib[:3], qdq=False), htp) > 35


def test_int4_weights_w4a16_take_gptq_and_bias_correction_on_ort_int4_grid():
    """W4A16: ORT writes int4 symmetric per-channel weights on [-8, 7]; GPTQ re-rounds them on that grid and bias
    correction removes the offset, each lowering the error the 4-bit rounding leaves."""
    import ml_dtypes

    model = _zero_sum_conv()
    calib, held_out = _positive_samples(8, 1), _positive_samples(8, 2)
    w4 = dict(weight_type="int4", activation_headroom=1.0)
    plain = quantize_for_htp(model, calib, rules=QnnQdqRules(gptq=False, bias_correction=False, **w4))
    gptq = quantize_for_htp(model, calib, rules=QnnQdqRules(bias_correction=False, **w4))
    both = quantize_for_htp(model, calib, rules=QnnQdqRules(**w4))
    (weight,) = [numpy_helper.to_array(i) for i in gptq.model.graph.initializer
                 if i.data_type == TensorProto.INT4 and len(i.dims) > 1]
    assert weight.dtype == ml_dtypes.int4 and -8 <= weight.astype(int).min() and weight.astype(int).max() <= 7
    assert list(gptq.rerounded) == ["conv"] and list(both.corrected) == ["conv"]
    ref = _outputs(model, held_out, qdq=False)
    sqnr = {k: _sqnr(ref, _outputs(r.model, held_out, qdq=True)) for k, r in
            (("nearest", plain), ("gptq", gptq), ("gptq+bc", both))}
    assert sqnr["gptq"] >= sqnr["nearest"] + 10.0 and sqnr["gptq+bc"] >= sqnr["gptq"] - 0.5, sqnr  # 3.2 -> 19.2 dB
    eight = _sqnr(ref, _outputs(quantize_for_htp(model, calib, rules=QnnQdqRules(activation_headroom=1.0)).model,
                                held_out, qdq=True))
    assert eight > sqnr["gptq+bc"]  # 4 bits cost fidelity: the report says what was chosen


@requires_qnn
def test_the_htp_runs_int4_weights_as_their_qdq_graph():
    from npukit.runtime.qnn import make_qnn_session

    model, calib = _small_net(), _normal_samples(8, (1, 3, 8, 8))
    qdq = quantize_for_htp(model, calib, rules=QnnQdqRules(weight_type="int4")).model
    assert any(i.data_type == TensorProto.INT4 for i in qdq.graph.initializer)
    htp = np.concatenate([run(make_qnn_session(qdq), s)[0] for s in calib[:3]])
    assert _sqnr(_outputs(qdq, calib[:3], qdq=True), htp) > 40
