"""An ONNX model as a torch program (npukit.frontend.onnx_torch): the graph at a fixed shape, constants folded, run
on torch, equal to ONNX Runtime, exportable by torch.export; what it cannot take refused in one line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.frontend.onnx_torch import torch_program
from npukit.runtime.ort import make_session

SHAPE = (1, 3, 8, 8)


def _init(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _model(batch: str | int = "N") -> onnx.ModelProto:
    """Conv -> Clip (bounds as inputs) -> HardSigmoid gate -> pool -> a Reshape whose shape is computed from the
    input's (Shape, Gather, Concat: constant once the batch is fixed) -> Gemm (transB) -> Softmax: the patterns an
    exporter writes that torch.export cannot read as tensors."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["r"]),
        helper.make_node("HardSigmoid", ["r"], ["g"], alpha=0.2, beta=0.5),
        helper.make_node("Mul", ["r", "g"], ["m"]),
        helper.make_node("GlobalAveragePool", ["m"], ["p"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["p", "shape"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    inits = [_init("w", rng.normal(size=(6, 3, 3, 3)).astype(np.float32)),
             _init("b", rng.normal(size=6).astype(np.float32)), _init("lo", np.float32(0.0)),
             _init("hi", np.float32(6.0)), _init("zero", np.int64(0)), _init("axes", np.array([0], np.int64)),
             _init("minus_one", np.array([-1], np.int64)),
             _init("fw", rng.normal(size=(4, 6)).astype(np.float32)),
             _init("fb", rng.normal(size=4).astype(np.float32))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_program_equals_onnx_runtime_and_torch_export_reads_its_constants():
    model = _model()
    program, note = torch_program(model, SHAPE, label="m.onnx")
    x = np.random.default_rng(1).normal(size=SHAPE).astype(np.float32)
    session = make_session(model, optimization="disable")
    (reference,) = session.run(None, {"x": x})
    with torch.no_grad():
        (got,) = program(torch.from_numpy(x))
    np.testing.assert_allclose(got.numpy(), reference, rtol=1e-5, atol=1e-6)
    assert "runs as a torch program" in note and "against ONNX Runtime" in note
    # the Reshape's shape and the Clip's bounds are numbers in the exported program, the Gemm a linear layer;
    # reading them leaves no node behind
    exported = torch.export.export(program, (torch.from_numpy(x),), strict=False)
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert "aten.linear.default" in targets
    assert not [t for t in targets if "resolve" in t or "_local_scalar" in t], targets
    (again,) = exported.module()(torch.from_numpy(x))
    np.testing.assert_array_equal(again.detach().numpy(), got.numpy())
    assert not list(program.parameters()) or not any(p.requires_grad for p in program.parameters())


def _two_inputs() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _integer_input() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Cast", ["a"], ["y"], to=TensorProto.FLOAT)], "g",
                              [helper.make_tensor_value_info("a", TensorProto.INT64, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _unknown_op() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Det", ["r"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _cubic_resize() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Resize", ["a", "", "scales"], ["y"], mode="cubic")], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [_init("scales", np.array([1, 1, 2, 2], np.float32))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("model, shape, message", [
    (_two_inputs, (1, 4), "has 2 inputs (a, b)"),
    (_integer_input, (1, 4), "input a is int64"),
    (_unknown_op, (1, 4, 4), "operators npukit cannot run as torch: Det"),
    # an op's form npukit has no torch for: said for what the program is built for, not for training
    (_cubic_resize, (1, 2, 4, 4), "Resize mode cubic is not supported for a torch program built from m.onnx"),
])
def test_what_it_cannot_take_is_refused_by_name(model, shape, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        torch_program(model(), shape, label="m.onnx")


def test_a_program_that_differs_from_onnx_runtime_is_refused(monkeypatch):
    """An operator npukit's torch form computed differently would make every later check compare with the wrong
    model: the program is checked against ORT first."""
    from npukit.quant.qat import ops

    monkeypatch.setitem(ops.OPS, "Softmax", lambda inputs, attrs, opset: [torch.sigmoid(inputs[0])])
    with pytest.raises(InputError, match="differs from ONNX Runtime on output y"):
        torch_program(_model(), SHAPE, label="m.onnx")


def test_a_matmul_by_a_constant_matrix_is_a_linear_layer():
    """MatMul by a constant matrix (+ the Add of a constant vector that alone reads it) over [N, L, C], as a
    transformer's projections: ORT fuses it into one Gemm, which the plan quantizes as one layer; torch.export sees a
    linear (weight [out, in], the bias a parameter), so the plan's weights can be carried onto it. A matrix two
    MatMuls share stays a MatMul."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["q"]),
             helper.make_node("Relu", ["q"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"]),
             helper.make_node("MatMul", ["r", "shared"], ["s1"]), helper.make_node("MatMul", ["r", "shared"], ["s2"]),
             helper.make_node("Add", ["s1", "s2"], ["z"])]
    inits = [_init("w", rng.normal(size=(8, 6)).astype(np.float32)), _init("b", rng.normal(size=6).astype(np.float32)),
             _init("w2", rng.normal(size=(6, 3)).astype(np.float32)),
             _init("shared", rng.normal(size=(6, 3)).astype(np.float32))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 8])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 5, 3]) for n in "yz"], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    program, _ = torch_program(model, (1, 5, 8), label="m.onnx")
    x = torch.randn(1, 5, 8)
    exported = torch.export.export(program, (x,), strict=False)
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert targets.count("aten.linear.default") == 2 and targets.count("aten.matmul.default") == 2, targets
    assert sorted(tuple(p.shape) for p in program.parameters()) == [(3, 6), (6,), (6, 3), (6, 8)]


def test_its_onnx_exports_keep_the_models_input_and_output_names(tmp_path):
    """The verbs plan on and report the program's ONNX export: named as the user's model names its tensors, not
    input / output_0, output_1 (a verdict named RetinaFace's worst output 'output_0')."""
    from npukit.verbs.common import scratch_export, torch_source

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["save_infer_model/scale_0.tmp_1"]),
         helper.make_node("GlobalAveragePool", ["c"], ["pooled"])], "g",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("save_infer_model/scale_0.tmp_1", TensorProto.FLOAT, ["N", 4, 8, 8]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", 4, 1, 1])],
        [_init("w", rng.normal(size=(4, 3, 3, 3)).astype(np.float32))])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    source, shape = torch_source(path, None, "1,3,8,8", needs="", otherwise="", from_onnx=True)
    assert source.input_names == ("image",) and source.output_names == ("save_infer_model/scale_0.tmp_1", "pooled")
    exported, result = scratch_export(source, shape, what="a test")
    assert [i.name for i in exported.graph.input] == ["image"] and result.passed
    assert [o.name for o in exported.graph.output] == ["save_infer_model/scale_0.tmp_1", "pooled"]


def test_a_difference_within_onnx_runtimes_own_is_allowed_and_said(monkeypatch):
    """A deep U-Net at 1024 x 1024 moves by 4.3e-3 of its range between ORT's optimized and unoptimized runs (float32
    sums reordered); the torch program, off by 2.0e-4, was refused as 'an npukit limitation'. Over the tolerance
    but within twice ORT's own movement: taken, and the note says so; beyond it: refused, the allowance named."""
    import npukit.runtime.ort as ort
    from npukit.passes import pipeline
    from npukit.quant.qat import ops

    softmax = ops.OPS["Softmax"]
    monkeypatch.setitem(ops.OPS, "Softmax", lambda inputs, attrs, opset: [softmax(inputs, attrs, opset)[0] * 1.0005])
    with pytest.raises(InputError, match=r"allowed 0\.0001.*twice what ORT's graph optimizations move it by"):
        torch_program(_model(), SHAPE, label="m.onnx")  # ORT runs this model the same either way: no allowance

    class Moved:  # ORT with its optimizations on, as on the U-Net: outputs moved by 1e-3 of their range
        def __init__(self, session):
            self.session = session

        def run(self, names, feeds):
            return [o * 1.001 for o in self.session.run(names, feeds)]

        def __getattr__(self, name):
            return getattr(self.session, name)

    plain = ort.make_session

    def make_session(model, **kw):
        return plain(model, **kw) if kw.get("optimization") == "disable" else Moved(plain(model, **kw))
    monkeypatch.setattr(ort, "make_session", make_session)
    monkeypatch.setattr(pipeline, "make_session", make_session)  # the control is optimize-graph's
    program, note = torch_program(_model(), SHAPE, label="m.onnx")
    assert "within twice what ONNX Runtime's own graph optimizations move the outputs by: 0.001 of the range" in note
