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
