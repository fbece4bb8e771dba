"""quant.qdq.preprocess runs ORT's quantization pre-processing without writing into the working directory, and
falls back to ONNX shape inference when ORT's symbolic shape inference gives up."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npukit.quant.qdq import preprocess


def _down_up_add() -> onnx.ModelProto:
    """y = x + Resize(Conv_stride2(x), x2) with x: [N, 3, H, W]: symbolically ceil(H/2)*2 is not H, so ORT's symbolic
    shape inference stops at the Add (the way it stops on Paddle's OCR detector) and saves its partial model."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((3, 3, 3, 3)).astype(np.float32), "w")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["d"], strides=[2, 2], pads=[1, 1, 1, 1]),
         helper.make_node("Resize", ["d", "", "scales"], ["u"], mode="nearest"),
         helper.make_node("Add", ["x", "u"], ["y"])],
        "down_up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H", "W"])], [w, scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_symbolic_inference_giving_up_leaves_nothing_in_the_cwd(tmp_path, monkeypatch):
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    probe, work = tmp_path / "probe", tmp_path / "work"
    probe.mkdir()
    work.mkdir()
    monkeypatch.chdir(probe)
    try:  # the library's own behaviour, which preprocess must contain
        SymbolicShapeInference.infer_shapes(_down_up_add())
    except Exception as exc:  # noqa: BLE001 - ORT raises a bare Exception
        assert "Incomplete symbolic shape inference" in str(exc)
    assert "sym_shape_infer_temp.onnx" in os.listdir(probe)
    monkeypatch.chdir(work)
    result = preprocess(_down_up_add())
    assert [n.op_type for n in result.graph.node if n.op_type != "Constant"] == ["Conv", "Resize", "Add"]
    assert os.listdir(work) == []


def test_an_assertion_inside_symbolic_inference_falls_back_too(tmp_path, monkeypatch):
    """ORT's symbolic shape inference asserts on some If nodes (Silero VAD's: `assert cls_type in ["tensor_type",
    "sequence_type"]`); that is it giving up too, not an npukit bug, so ONNX shape inference alone is used."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    def assert_like_on_an_if(self):
        raise AssertionError

    monkeypatch.setattr(SymbolicShapeInference, "_infer_impl", assert_like_on_an_if)
    monkeypatch.chdir(tmp_path)
    result = preprocess(_down_up_add())
    assert [n.op_type for n in result.graph.node if n.op_type != "Constant"] == ["Conv", "Resize", "Add"]
    assert os.listdir(tmp_path) == []
