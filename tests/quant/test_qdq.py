from __future__ import annotations

import numpy as np
import onnx
import pytest

from npukit.errors import InputError
from npukit.quant.config import CalibrationSpec, CpuKernels, QuantConfig, Recipe, Scheme
from npukit.quant.layer_sqnr import layer_sqnr, sqnr_db
from npukit.quant.qdq import integer_kernel_report, quantize
from npukit.runtime.ort import make_session, run
from tests.quant.conftest import make_samples, outputs, tiny_cnn


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return sqnr_db(float(np.sum(ref.astype(np.float64) ** 2)), float(np.sum((ref - got).astype(np.float64) ** 2)))


@pytest.mark.parametrize("config", [
    QuantConfig(),
    QuantConfig(scheme=Scheme(per_channel=False), calibration=CalibrationSpec(method="percentile")),
    QuantConfig(scheme=Scheme(activation_dtype="int8", symmetric_activations=True),
                calibration=CalibrationSpec(method="entropy")),
    QuantConfig(calibration=CalibrationSpec(method="mse"), recipe=Recipe(cle=True, bias_correction=True)),
])
def test_quantize_runs_integer_kernels_and_stays_close(config: QuantConfig) -> None:
    model = tiny_cnn(spread=0.5)
    before = model.SerializeToString()
    result = quantize(model, make_samples(16), config=config)
    assert model.SerializeToString() == before  # the input model is untouched
    onnx.checker.check_model(result.model)
    ops = {n.op_type for n in result.model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    report = integer_kernel_report(result.model)
    assert report["integer_ops"].get("QLinearConv") == 3 and report["integer_ops"].get("QGemm") == 1
    assert report["float_compute_after_dq"] == {} and report["integer_fraction"] == 1.0
    held = make_samples(8, seed=5)
    assert _sqnr(outputs(model, held), outputs(result.model, held)) > 20.0
    assert result.seconds > 0 and result.steps.calibration["samples"] == 16
    assert (result.steps.cle is not None) == config.recipe.cle
    assert (result.steps.bias_correction is not None) == config.recipe.bias_correction
    rows = {r["node"]: r for r in result.per_layer}
    assert rows["conv1"]["quantized"] and rows["fc"]["quantized"]


def test_our_ranges_are_the_ones_ort_uses() -> None:
    """The output's QuantizeLinear scale follows our calibrated range (not ORT's one-sample calibration)."""
    model = tiny_cnn()
    result = quantize(model, make_samples(16), config=QuantConfig())
    lo, hi = result.ranges["c3"]
    q = next(n for n in result.model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "c3")
    scale = next(onnx.numpy_helper.to_array(i) for i in result.model.graph.initializer if i.name == q.input[1])
    assert float(scale) == pytest.approx((hi - lo) / 255, rel=1e-6)


def test_excluded_and_16_bit_nodes() -> None:
    model = tiny_cnn()
    report_plain = integer_kernel_report(model)
    assert report_plain["integer_fraction"] == 0.0 and report_plain["integer_ops"] == {}
    result = quantize(model, make_samples(8), config=QuantConfig(scheme=Scheme(exclude=("fc",), int16_nodes=("pw",))))
    rows = {r["node"]: r for r in result.per_layer}
    assert not rows["fc"]["quantized"] and rows["fc"]["excluded"]
    assert rows["pw"]["activation_bits"] == 16
    types = {onnx.helper.tensor_dtype_to_np_dtype(i.data_type) for i in result.model.graph.initializer
             if i.name.endswith("zero_point")}
    assert np.dtype(np.uint16) in types
    report = integer_kernel_report(result.model)
    # pw reads a 16-bit tensor, so dw (which writes it) runs 16-bit too: only conv1 stays an int8 QLinearConv
    assert report["integer_ops"].get("QLinearConv") == 1
    assert report["float_compute"].get("Gemm", 0) + report["float_compute"].get("FusedGemm", 0) == 1


def test_layer_sqnr_lists_every_layer() -> None:
    model = tiny_cnn()
    samples = make_samples(8)
    result = quantize(model, samples, config=QuantConfig())
    rows = layer_sqnr(result.reference, result.model, samples, limit=4)
    # conv1 -> Relu became one quantized conv: its activation is reported under the Relu's output
    assert {"act1", "act2", "pw", "gap", "fc"} <= {r["node"] for r in rows}
    assert all(np.isfinite(r["sqnr_db"]) and r["sqnr_db"] > 15 for r in rows)


def test_bad_input_is_an_input_error() -> None:
    model = tiny_cnn()
    with pytest.raises(InputError, match="NaN"):
        quantize(model, [{"x": np.full((1, 4, 8, 8), np.inf, np.float32)}], config=QuantConfig())
    with pytest.raises(InputError, match="empty"):
        quantize(model, [], config=QuantConfig())
    with pytest.raises(InputError, match="exclude"):
        quantize(model, make_samples(2), config=QuantConfig(scheme=Scheme(exclude=("nope",))))
    with pytest.raises(InputError, match="only 2"):
        quantize(model, make_samples(2), config=QuantConfig(calibration=CalibrationSpec(samples=4)))


def test_reduce_range_weights_fit_7_bits_and_integer_kernels_match_the_qdq_semantics() -> None:
    """Under reduce_range the u8s8 integer kernels cannot saturate: ORT's optimized run equals the plain QDQ run. The
    3x3 conv's weights take 7 bits; the depthwise conv keeps all 8 (its kernel accumulates in 32 bits); the 1x1 conv
    and the Gemm keep every pair of neighbouring input channels within 128 together."""
    model = tiny_cnn(spread=0.5)
    result = quantize(model, make_samples(8), config=QuantConfig(cpu=CpuKernels(reduce_range=True)))
    weights = {i.name.removesuffix("_quantized"): onnx.numpy_helper.to_array(i).astype(int)
               for i in result.model.graph.initializer
               if i.name.endswith("_quantized") and i.data_type == onnx.TensorProto.INT8}
    assert set(weights) == {"w1", "w2", "w3", "w4"}
    assert np.abs(weights["w1"]).max() == 64
    assert np.abs(weights["w2"]).max() == 127  # depthwise
    for name in ("w3", "w4"):  # 1x1 conv (6, 8, 1, 1) and Gemm with transB (5, 6): K is the second axis
        rows = np.abs(weights[name].reshape(weights[name].shape[0], -1))
        pairs = rows[:, 0::2] + rows[:, 1::2]
        assert pairs.max() <= 128 and pairs.max(axis=1).min() >= 126  # every channel uses its pair budget
        assert np.abs(rows).max() > 64
    held = make_samples(4, seed=21)
    integer = outputs(result.model, held)
    reference = np.stack([run(make_session(result.model, optimization="disable"), s)[0] for s in held])
    assert _sqnr(reference, integer) > 35.0


def test_pair_bounded_weights_run_exactly_on_u8s8_kernels_where_8_bit_ones_saturate() -> None:
    """A 1x1 conv whose largest weights sit side by side and inputs at the top of the uint8 range: the full 8-bit grid
    overflows vpmaddubsw's int16 lanes on CPUs without VNNI (integer run != QDQ semantics), the pair-bounded grid of
    reduce_range does not (on any CPU: the bound holds for every kernel)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = rng.uniform(-0.2, 0.2, (8, 16, 1, 1)).astype(np.float32)
    w[:, 0:2] = 1.0  # the pair (0, 1) holds each channel's two largest weights
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="pw")], "pw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    samples = [{"x": np.full((1, 16, 4, 4), 2.0, np.float32) * rng.uniform(0.9, 1.0, (1, 16, 4, 4)).astype(np.float32)}
               for _ in range(4)]
    result = quantize(model, samples, config=QuantConfig(cpu=CpuKernels(reduce_range=True)))
    q = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}["w_quantized"].astype(int)
    assert np.abs(q[:, 0]).max() == 64 and (np.abs(q[:, 0]) + np.abs(q[:, 1])).max() == 128
    reference = run(make_session(result.model, optimization="disable"), samples[0])[0]
    integer = run(make_session(result.model), samples[0])[0]
    np.testing.assert_allclose(integer, reference, rtol=0, atol=1e-6)


def test_16_bit_tensors_take_only_their_readers_and_writer_off_int8() -> None:
    model = tiny_cnn()
    samples = make_samples(8)
    # pw's output alone: pw (its writer) leaves the int8 kernels; conv1 and dw stay QLinearConv
    result = quantize(model, samples, config=QuantConfig(scheme=Scheme(int16_tensors=("c3",))))
    rows = {r["node"]: r for r in result.per_layer}
    assert rows["pw"]["activation_bits"] == 16 and rows["dw"]["activation_bits"] == 8
    q16 = [n for n in result.model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "c3"]
    zero = next(i for i in result.model.graph.initializer if i.name == q16[0].input[2])
    assert onnx.helper.tensor_dtype_to_np_dtype(zero.data_type) == np.dtype(np.uint16)
    report = integer_kernel_report(result.model)
    assert report["integer_ops"].get("QLinearConv") == 2
    with pytest.raises(InputError, match="int16 tensors"):
        quantize(model, samples, config=QuantConfig(scheme=Scheme(int16_tensors=("nope",))))


def test_nodes_preprocessing_adds_are_named_and_can_be_kept_in_float() -> None:
    """ORT's pre-processing inlines HardSwish as an unnamed HardSigmoid and Mul; a plan chosen on the
    pre-processed graph names them, so they get names there (the same on every run) and can be excluded."""
    model = tiny_cnn()
    act = next(n for n in model.graph.node if n.name == "act2")
    act.op_type = "HardSwish"
    model.opset_import[0].version = 17
    from npukit.quant.qdq import preprocess

    work = preprocess(model)
    added = [n.name for n in work.graph.node if n.name not in {m.name for m in model.graph.node}]
    assert added and all(added) and len(set(added)) == len(added)
    assert [n.name for n in preprocess(model).graph.node] == [n.name for n in work.graph.node]
    result = quantize(model, make_samples(8), config=QuantConfig(scheme=Scheme(exclude=(added[-1],))))
    rows = {r["node"]: r for r in result.per_layer}
    assert rows[added[-1]]["excluded"] and not rows[added[-1]]["quantized"]
    with pytest.raises(InputError, match="not in the model"):
        quantize(model, make_samples(8), config=QuantConfig(scheme=Scheme(exclude=("nowhere",))))


def test_per_channel_weights_need_opset_13() -> None:
    """ORT's quantizer writes per-channel DequantizeLinear nodes (an axis attribute) into an opset-11 model as it is,
    a model ORT then refuses to load: quantize refuses it in one line instead; per tensor it is quantized and loads."""
    import onnxruntime as ort

    model, samples = tiny_cnn(opset=11), make_samples(4)
    with pytest.raises(InputError, match="opset 11; per-channel Q/DQ needs opset 13"):
        quantize(model, samples, config=QuantConfig())
    result = quantize(model, samples, config=QuantConfig(scheme=Scheme(per_channel=False)))
    ort.InferenceSession(result.model.SerializeToString())


def test_elementwise_integer_kernels_do_not_make_float_convs_pass():
    # a QAT model with 4-bit weights: ORT runs QLinearAdd/QLinearMul but computes every conv in float; the report
    # once counted the elementwise kernels as "integer kernels" and the rule let such a model pass
    from types import SimpleNamespace

    from npukit.quant.qdq import integer_failures

    float_convs = {"integer_ops": {"QLinearAdd": 7, "QLinearMul": 26}, "integer_compute": 0,
                   "float_compute_after_dq": {"Conv": 52, "Gemm": 1}, "float_compute": {"Conv": 52, "Gemm": 1},
                   "integer_fraction": 0.0}
    result = SimpleNamespace(steps=SimpleNamespace(float_head_nodes=[]))
    assert integer_failures(float_convs, result) == [
        "no integer kernels: ORT runs all 53 conv/matmul nodes in float (try --per-tensor, or check the model's ops "
        "with npukit analyze --target cpu)"]
    integer_convs = dict(float_convs, integer_compute=52, integer_fraction=52 / 53)
    assert integer_failures(integer_convs, result) == []
    assert integer_failures(dict(float_convs, float_compute={}, float_compute_after_dq={}), result) == []
    # 16-bit activations the plan chose (an int16 budget) have no integer conv in ORT: asked for, not a failure
    assert integer_failures(dict(float_convs, float_compute_16bit=53), result) == []
    assert integer_failures(dict(float_convs, float_compute_16bit=10), result)  # the other 43: float by accident
