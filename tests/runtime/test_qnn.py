from __future__ import annotations

import numpy as np
import onnx
import pytest

from npukit.errors import InputError
from npukit.runtime.ort import make_session, run
from npukit.runtime.qnn import (CPU_EP, QNN_EP, make_qnn_session, qnn_available, qnn_node_assignment,
                               session_assignment)
from tests.runtime.conftest import requires_qnn
from tests.runtime.tiny_qdq import qdq_conv_model

pytestmark = requires_qnn

Y_SCALE = 6.0 / 255  # the tiny model's output quantization step


def _feeds(seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).uniform(-1.5, 1.5, (1, 3, 8, 8)).astype(np.float32)}


def test_status_reports_plugin_and_backends():
    status = qnn_available()
    assert status.importable and status.registered and status.reason is None
    assert status.plugin_version and status.qnn_sdk_version
    assert set(status.backends) == {"htp", "cpu"}
    assert status.backends["htp"] is None and status.available
    assert status.as_dict()["available"] is True
    if status.backends["cpu"] is not None:
        assert "cpu" in status.backends["cpu"].lower()


def test_tiny_qdq_conv_on_htp_matches_cpu():
    model = qdq_conv_model()
    feeds = _feeds()
    session = make_qnn_session(model)
    assert session.get_providers()[0] == QNN_EP
    htp = run(session, feeds)[0]
    cpu = run(make_session(model, optimization="disable"), feeds)[0]  # unfused: exact QDQ semantics
    assert htp.shape == cpu.shape == (1, 4, 8, 8)
    steps = np.abs(htp - cpu) / Y_SCALE
    assert steps.max() <= 1.0 + 1e-4  # at most one output quantization step apart
    assert np.mean(steps > 0.5) <= 0.05  # and almost every element identical


def test_symbolic_shape_is_rejected():
    with pytest.raises(InputError, match="symbolic dimension at axis 0") as caught:
        make_qnn_session(qdq_conv_model(batch="N"))
    assert caught.value.hint.startswith("give the sizes it runs at: --input-shape x=1,3,8,8")  # a CLI option, an example


def test_unknown_backend_is_rejected():
    with pytest.raises(InputError, match="unknown QNN backend 'npu'.*"):
        make_qnn_session(qdq_conv_model(), backend="npu")


def test_backend_that_does_not_load_says_why(tmp_path):
    missing = tmp_path / "libQnnMissing.so"
    with pytest.raises(InputError, match="backend does not load: .*libQnnMissing.so") as info:
        make_qnn_session(qdq_conv_model(), provider_options={"backend_path": str(missing)})
    assert "\n" not in info.value.one_line()


def test_cpu_fallback_only_when_allowed(tmp_path):
    model = qdq_conv_model()
    options = {"backend_path": str(tmp_path / "libQnnMissing.so")}
    with pytest.warns(RuntimeWarning, match="did not load"):
        session = make_qnn_session(model, provider_options=options, allow_cpu_fallback=True)
    np.testing.assert_allclose(run(session, _feeds())[0], run(make_session(model), _feeds())[0], rtol=0, atol=1e-6)


def test_unsupported_op_without_fallback_names_it():
    with pytest.raises(InputError, match="does not take every node.*Det"):
        make_qnn_session(qdq_conv_model(tail_op="Det"))


def test_assignment_all_on_qnn():
    assignment = qnn_node_assignment(qdq_conv_model())
    by_name = {n.name: n for n in assignment.nodes}
    assert by_name["conv"].provider == QNN_EP
    assert by_name["dq_w"].provider == QNN_EP
    assert by_name["q_y"].provider == QNN_EP
    assert assignment.partitions == 1
    # With CPU fallback allowed, the QNN EP leaves the graph input's QuantizeLinear to the CPU by default.
    assert by_name["q_x"].provider == CPU_EP and "graph input" in by_name["q_x"].reason
    assert set(assignment.qnn_nodes) | set(assignment.cpu_nodes) == {n.name for n in qdq_conv_model().graph.node}


def test_assignment_reports_rejected_op_with_reason():
    assignment = qnn_node_assignment(qdq_conv_model(tail_op="Det"))
    by_name = {n.name: n for n in assignment.nodes}
    assert by_name["conv"].provider == QNN_EP
    assert by_name["tail"].provider == CPU_EP
    assert "Det" in by_name["tail"].reason and "not supported" in by_name["tail"].reason
    assert assignment.rejected["tail"] == by_name["tail"].reason
    assert assignment.as_dict()["cpu_nodes"] == len(assignment.cpu_nodes)


def test_assignment_names_unnamed_nodes():
    model = qdq_conv_model()
    for node in model.graph.node:
        node.name = ""
    assignment = qnn_node_assignment(model)
    conv = next(n for n in assignment.nodes if n.op_type == "Conv")
    assert conv.name == "Conv_4" and conv.provider == QNN_EP
    onnx.checker.check_model(model)


@pytest.mark.parametrize("tail_op", [None, "Det"])
def test_a_serving_session_places_nodes_as_the_verbose_one_does(tail_op):
    """The runtime reads the placement from the session it serves with (quiet log, one compile): the same provider
    per node as the verbose placement session, the DequantizeLinear the layout transformer replaces included; only
    the rejection reasons need the verbose log."""
    model = qdq_conv_model(tail_op=tail_op) if tail_op else qdq_conv_model()
    verbose = qnn_node_assignment(model)
    quiet = session_assignment(model, make_qnn_session(model, allow_cpu_fallback=True))
    assert [(n.name, n.provider) for n in quiet.nodes] == [(n.name, n.provider) for n in verbose.nodes]
    assert {n.evidence for n in verbose.nodes} - {"assignment"}  # some node was placed by its unit, not the record
    assert quiet.partitions == verbose.partitions
    if tail_op:
        assert verbose.rejected["tail"] != "not taken" and quiet.rejected["tail"] == "not taken"


def _shifted(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``'s conv weights per channel with zero point -1, the integers moved by -1 (the same values), as
    ``quant.cpu.conv_kernel`` moves a conv onto ORT's int8 GEMM on a CPU with VNNI."""
    from onnx import numpy_helper

    shifted = onnx.ModelProto()
    shifted.CopyFrom(model)
    inits = {i.name: i for i in shifted.graph.initializer}
    q = numpy_helper.to_array(inits["w_q"]).astype(np.int16) - 1
    channels = q.shape[0]
    scale = float(numpy_helper.to_array(inits["w_scale"]))
    for name, array in (("w_q", q.astype(np.int8)), ("w_scale", np.full(channels, scale, np.float32)),
                        ("w_zp", np.full(channels, -1, np.int8))):
        inits[name].CopyFrom(numpy_helper.from_array(array, name))
    next(n for n in shifted.graph.node if n.name == "dq_w").attribute.append(onnx.helper.make_attribute("axis", 0))
    return shifted


def test_weights_a_cpu_kernel_choice_moved_off_zero_are_named_when_the_htp_refuses_them() -> None:
    """bench --target qnn-htp on PP-OCR cls from `npukit quantize` (on a VNNI CPU, one conv moved onto ORT's int8
    GEMM with weight zero point -1) failed with ORT's "was not selected by that EP ... a bug in layout transformer"
    and the hint to run analyze, which predicts the model runs whole on the HTP."""
    from npukit.runtime.qnn import shifted_weights

    model = qdq_conv_model()
    shifted = _shifted(model)
    x = np.random.default_rng(0).uniform(-1.5, 1.5, (1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(run(make_session(shifted), {"x": x})[0], run(make_session(model), {"x": x})[0])
    assert shifted_weights(model) == [] and shifted_weights(shifted) == ["conv"]
    from npukit.targets import analyze, get_target  # analyze predicts it (it said the model runs whole)

    assert not [v for v in analyze(model, get_target("qnn-htp")).unsupported if v.op_type == "Conv"]
    (conv,) = [v for v in analyze(shifted, get_target("qnn-htp")).unsupported if v.op_type == "Conv"]
    assert any("non-zero zero point" in r and "--gemm-convs off" in r for r in conv.reasons)
    if not qnn_available():
        pytest.skip("onnxruntime_qnn is not importable")
    with pytest.raises(InputError) as info:
        make_qnn_session(shifted)
    assert "1 layer(s) (conv) have int8 per-channel weights with a non-zero zero point" in info.value.message
    assert "--gemm-convs off" in info.value.hint


def test_float_layers_on_an_htp_without_a_float_unit_are_refused_by_name() -> None:
    """bench --target qnn-htp --soc SM8350 (v68) on a float model, or on a model from `npukit quantize` with its stem
    left float, failed with "Failed to finalize QNN graph ... QNN_COMMON_ERROR_MEM_ALLOC" and the hint to run
    analyze, which predicted the QDQ one whole on the HTP."""
    from onnx import helper

    from npukit.runtime.qnn import float_htp_options

    quantized = qdq_conv_model()
    stem = onnx.ModelProto()
    stem.CopyFrom(quantized)  # the conv's weight read as a float initializer: a layer left in float
    conv = next(n for n in stem.graph.node if n.name == "conv")
    stem.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w_float"))
    conv.input[1] = "w_float"
    one = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1]) for name in ("x", "y")]
    plain = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "f", one[:1], one[1:]))
    for model, said in ((stem, "1 layer(s) of this QDQ model run in float (conv)"),
                        (plain, "a float model cannot run on it")):
        with pytest.raises(InputError, match="HTP v68 \\(Snapdragon 888\\) has no float unit") as info:
            float_htp_options(model, {"htp_arch": "68"})
        assert said in info.value.message and "--soc SM8350" in info.value.hint
    assert float_htp_options(quantized, {"htp_arch": "68"}) == {"htp_arch": "68"}  # all quantized: as given
    assert float_htp_options(stem, {"htp_arch": "75"})["enable_htp_fp16_precision"] == "1"  # v75 runs it in fp16
    context = helper.make_model(helper.make_graph([helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft")],
                                                  "c", [], []))
    float_htp_options(context, {"htp_arch": "68"})  # a compiled graph: nothing float to run
