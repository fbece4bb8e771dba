"""ensure_opset: a model below the opset a step needs is converted and verified; failures say why, exit 2."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.frontend import opset as opset_module
from npukit.frontend.opset import PER_CHANNEL_QDQ_OPSET, ensure_opset, onnx_opset


def _opset12_model() -> onnx.ModelProto:
    """Conv -> ReduceSum(axes attribute) -> Squeeze(axes attribute): both attributes became inputs in opset 13."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("ReduceSum", ["c"], ["s"], axes=[2, 3], keepdims=1),
         helper.make_node("Squeeze", ["s"], ["y"], axes=[2, 3])],
        "v12", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    return model


def test_upgrade_is_converted_and_verified() -> None:
    model = _opset12_model()
    converted, upgrade = ensure_opset(model, PER_CHANNEL_QDQ_OPSET, reason="per-channel Q/DQ")
    assert onnx_opset(converted) == 13 and onnx_opset(model) == 12
    assert {len(n.input) for n in converted.graph.node if n.op_type in ("Squeeze", "ReduceSum")} == {2}
    assert upgrade is not None and (upgrade.from_opset, upgrade.to_opset) == (12, 13)
    assert upgrade.inputs == "seeded random inputs" and upgrade.samples == 2 and upgrade.max_rel_error <= 1e-6
    feeds = [{"x": np.random.default_rng(i).uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)} for i in range(6)]
    _, on_data = ensure_opset(model, 13, reason="per-channel Q/DQ", feeds=feeds)
    assert on_data is not None and on_data.inputs == "calibration samples" and on_data.samples == 4
    assert ensure_opset(converted, 13, reason="per-channel Q/DQ") == (converted, None)


def test_converter_failure_says_why_and_what_to_do(monkeypatch) -> None:
    def fail(model, version):
        raise RuntimeError("No Adapter For Squeeze")

    monkeypatch.setattr(onnx.version_converter, "convert_version", fail)
    with pytest.raises(InputError) as info:
        ensure_opset(_opset12_model(), 13, reason="per-channel Q/DQ", alternative="pass --per-tensor")
    text = info.value.one_line()
    assert info.value.exit_code == 2 and "\n" not in text
    assert "from opset 12 to 13 (which per-channel Q/DQ needs) failed in onnx.version_converter" in text
    assert "No Adapter For Squeeze" in text and "pass --per-tensor; or pass a copy of the model at opset 13" in text
    assert "re-export" not in text  # a third-party file cannot be re-exported by its user


def test_an_output_left_without_a_shape_is_repaired_before_conversion() -> None:
    """ONNX requires a shape on a graph output; a model whose output lost it (as npukit's static-shape step used to
    leave PP-OCR's and RetinaFace's) is repaired from shape inference, not blamed on the converter."""
    model = _opset12_model()
    model.graph.output[0].type.tensor_type.ClearField("shape")
    with pytest.raises(onnx.checker.ValidationError, match="Field 'shape' of 'type' is required"):
        onnx.checker.check_model(model)
    converted, upgrade = ensure_opset(model, PER_CHANNEL_QDQ_OPSET, reason="per-channel Q/DQ")
    assert upgrade is not None and onnx_opset(converted) == 13
    assert [d.dim_value for d in converted.graph.output[0].type.tensor_type.shape.dim] == [1, 4]


def test_an_output_no_inference_can_shape_is_named_not_blamed_on_the_converter() -> None:
    graph = helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")], "gelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])], [helper.make_tensor_value_info("y", 1, None)])
    graph.output[0].type.tensor_type.ClearField("shape")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 7
    with pytest.raises(InputError) as info:
        ensure_opset(model, PER_CHANNEL_QDQ_OPSET, reason="per-channel Q/DQ")
    assert "fails the ONNX checker before conversion" in info.value.message and "'y'" in info.value.message
    assert "onnx.version_converter" not in info.value.message


def test_a_conversion_that_changes_outputs_is_refused(monkeypatch) -> None:
    real = onnx.version_converter.convert_version

    def wrong(model, version):  # a converter bug: the weights come out scaled
        converted = real(model, version)
        w = next(t for t in converted.graph.initializer if t.name == "w")
        w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * np.float32(1.01), "w"))
        return converted

    monkeypatch.setattr(opset_module.onnx.version_converter, "convert_version", wrong)
    with pytest.raises(InputError, match="changed output 'y'") as info:
        ensure_opset(_opset12_model(), 13, reason="per-channel Q/DQ")
    assert "not the model, is at fault" in info.value.message
