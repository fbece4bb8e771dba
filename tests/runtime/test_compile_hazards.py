"""compile on the HTP emulator: the SiLU the HTP computes wrongly is rewritten first, the HTP's own
non-determinism is reported by output, QNN's reasons reach the error, and third-party graph forms (Constant nodes,
BatchNorm, an empty Resize roi) are prepared before quantizing."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import npukit.runtime.compile as compile_module
from npukit.errors import InputError
from npukit.runtime.compile import compile_qnn_context, context_soc, prepare_graph
from npukit.runtime.ort import make_session, run
from npukit.runtime.qnn import _session_error, make_qnn_session, qnn_errors
from tests.runtime.conftest import requires_qnn
from tests.runtime.tiny_qdq import qdq_conv_model, qdq_swish_model

X = {"x": np.random.default_rng(5).uniform(-3, 3, (1, 4, 10, 10)).astype(np.float32)}


@requires_qnn
def test_htp_computes_the_16_bit_swish_wrongly_and_the_compiled_rewrite_right(tmp_path):
    model = qdq_swish_model()
    exact = run(make_session(model, optimization="disable"), X)[0]
    # As measured on the emulator: elements past the first 8x8 tile of the 10x10 map are garbage.
    wrong = run(make_qnn_session(model, provider_options={"htp_arch": "75", "soc_model": "57"}), X)[0]
    assert np.abs(wrong - exact).max() > 0.5
    assert np.abs(wrong - exact)[..., :8, :4].max() < 0.01
    result = compile_qnn_context(model, tmp_path / "swish.onnx", soc="SM8650", feeds=X)
    assert [r["nodes"] for r in result.hazard_rewrites] == [["sig", "mul"]]
    assert result.hazard_rewrites[0]["where"] == "1x4x10x10 after Conv"
    assert result.identical and result.htp_nondeterministic == {} and result.match_summary == "identical"
    compiled = onnx.load(str(tmp_path / "swish.onnx"))
    assert context_soc(compiled) == "SM8650"
    right = run(make_qnn_session(tmp_path / "swish.onnx", provider_options={"htp_arch": "75", "soc_model": "57"}),
                X)[0]
    assert np.abs(right - exact).max() < 0.01  # one 16-bit step of the output is 9.6e-5


@requires_qnn
def test_htp_run_to_run_differences_are_reported_by_output_not_raised(tmp_path, monkeypatch):
    calls = []
    real_run = compile_module.run

    def flaky(session, feeds):  # the second run of the non-compiled session comes out different
        calls.append(session)
        outputs = real_run(session, feeds)
        return [o + 0.5 for o in outputs] if len(calls) == 2 else outputs

    monkeypatch.setattr(compile_module, "run", flaky)
    result = compile_qnn_context(qdq_conv_model(), tmp_path / "ctx.onnx", soc="SM8650")
    assert result.htp_nondeterministic == {"y": pytest.approx(0.5)}
    assert result.identical  # compared on the outputs the HTP computes the same run to run: none left here
    assert "the HTP itself differs run to run on y (up to 0.5)" in result.match_summary
    assert json.dumps(result.as_dict())


def test_qnn_log_errors_and_rejections_reach_the_message():
    log = ("\x1b[1;31m2026-12-01 12:19:20.4 [E:onnxruntime:, qnn_model_wrapper.cc:235 CreateQnnInputOutputTensors] "
           "Failed to create tensor for node: roi_DequantizeLinear tensor_name: roi_QuantizeLinear_Output error "
           "code: 7004\x1b[m\n"
           "2026-12-01 12:19:18.7 [V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED "
           "for 2 nodes in OrtNodeUnit (BatchNormalization) :\n"
           "\tOperator type: DequantizeLinear Node name: bn_bias_DequantizeLinear Node index: 3\n"
           "\tOperator type: BatchNormalization Node name: bn Node index: 4\n"
           "\tREASON : QNN Batchnorm unsupported datatype on HTP.\n\n")
    assert qnn_errors(log) == ["Failed to create tensor for node: roi_DequantizeLinear tensor_name: "
                               "roi_QuantizeLinear_Output error code: 7004"]
    error = _session_error(RuntimeError("[ONNXRuntimeError] : 11 : EP_FAIL : Failed to compose Qnn graph."), log,
                           backend="htp")
    assert isinstance(error, InputError)
    assert "Failed to compose Qnn graph" in error.message and "roi_DequantizeLinear" in error.message
    assert "error code: 7004" in error.message
    assert "bn: QNN Batchnorm unsupported datatype on HTP." in error.message
    assert "bn_bias_DequantizeLinear" not in error.message  # the operator is named, not its Q/DQ nodes


def _paddle_like(size: int = 8, opset: int = 12) -> onnx.ModelProto:
    """What paddle2onnx writes (PP-OCRv4's detector): weights and BatchNorm parameters as Constant nodes, a Shape
    subgraph, and a nearest Resize with an empty roi Constant."""
    rng = np.random.default_rng(0)

    def const(name, array):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array.astype(np.float32), name))

    nodes = [const("w", rng.standard_normal((4, 3, 3, 3)) * 0.3), const("gamma", rng.uniform(0.5, 1.5, 4)),
             const("beta", rng.standard_normal(4) * 0.1), const("mean", rng.standard_normal(4) * 0.1),
             const("var", rng.uniform(0.5, 1.5, 4)), const("roi", np.zeros(0)),
             helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "one"], ["channels"], name="gather", axis=0),
             helper.make_node("Concat", ["zero", "channels", "minus_one"], ["flat_shape"], name="concat", axis=0),
             helper.make_node("Reshape", ["r", "flat_shape"], ["flat"], name="flatten"),
             helper.make_node("Reshape", ["flat", "shape"], ["back"], name="unflatten"),
             const("scales", np.array([1, 1, 2, 2])),
             helper.make_node("Resize", ["back", "roi", "scales"], ["y"], name="up", mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    graph = helper.make_graph(nodes, "paddle_like",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 2 * size, 2 * size])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7 if opset < 21 else 10
    return model


def test_prepare_graph_folds_constants_shapes_and_batchnorm():
    from npukit.frontend.shapes import fix_input_shape

    model = fix_input_shape(_paddle_like(), (1, 3, 8, 8), dynamic_batch=False)
    prepared, summary = prepare_graph(model)
    ops = [n.op_type for n in prepared.graph.node]
    # Constants lifted to initializers, the Shape subgraph folded, the BatchNorm folded into the Conv
    assert ops == ["Conv", "Relu", "Reshape", "Reshape", "Resize"], ops
    assert summary["nodes_before"] == len(model.graph.node) and summary["nodes_after"] == 5
    assert summary["max_rel_error"] < 1e-4


@requires_qnn
def test_compile_prepares_a_paddle_style_float_model(tmp_path):
    from npukit import api

    source = tmp_path / "paddle_like.onnx"
    onnx.save(_paddle_like(), source)
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(1).standard_normal((8, 3, 8, 8)).astype(np.float32))
    out = tmp_path / "paddle_like.ctx.onnx"
    result = api.compile(source, out, soc="SM8650", calib=calib, input_shape="1,3,8,8")
    report = json.loads(out.with_name("paddle_like.ctx.report.json").read_text())["results"]
    assert report["graph_preparation"]["nodes_after"] == 5
    assert report["compile"]["identical"] and report["compile"]["context_nodes"] == 1
    assert result is not None


@requires_qnn
def test_constant_nodes_quantized_as_activations_fail_on_the_htp_as_analyze_predicts(tmp_path):
    """The old compile path (quantizing without preparing the graph) on what paddle2onnx writes: QNN refuses it, the
    error names each node with QNN's reason, and analyze predicts those same nodes."""
    import logging

    from npukit.api import quantize_for_htp
    from npukit.frontend.shapes import fix_input_shape
    from npukit.targets import analyze, get_target

    model = fix_input_shape(_paddle_like(opset=21), (1, 3, 8, 8), dynamic_batch=False)
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 3, 8, 8)).astype(np.float32)} for i in range(2)]
    level = logging.getLogger().level
    qdq = quantize_for_htp(model, samples)
    logging.getLogger().setLevel(level)
    with pytest.raises(InputError) as info:
        compile_qnn_context(qdq, tmp_path / "bad.onnx", soc="SM8650")
    message = info.value.message
    assert "Failed to compose Qnn graph" in message and "roi_DequantizeLinear" in message and "7004" in message
    assert "bn: QNN Batchnorm unsupported datatype on HTP." in message and "up:" in message
    predicted = {v.name: v.reasons for v in analyze(qdq, get_target("qnn-htp")).unsupported}
    assert "Batchnorm unsupported datatype" in predicted["bn"][0]
    assert any("7004" in r for r in predicted["up"]) and any("7004" in r for r in predicted["roi_DequantizeLinear"])
    assert not (tmp_path / "bad.onnx").exists()
