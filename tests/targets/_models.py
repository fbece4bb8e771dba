"""Tiny ONNX graphs for the target tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    inferred = onnx.shape_inference.infer_shapes(model)
    for out, done in zip(model.graph.output, inferred.graph.output):
        if not out.type.tensor_type.HasField("shape"):
            out.CopyFrom(done)
    return model


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def single(op, shape=(1, 3, 8, 8), opset=17, inits=(), extra_inputs=(), out_shape=None, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", *extra_inputs], ["y"], **attrs)
    return make([node], [vi("x", list(shape))], [vi("y", out_shape)], inits, opset)


def conv_relu_erf_conv(batch="N") -> onnx.ModelProto:
    """Conv -> Erf -> Conv: Erf is the op QNN HTP lacks."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Erf", ["a"], ["b"], name="erf"),
             helper.make_node("Conv", ["b", "w2"], ["y"], name="conv2")]
    return make(nodes, [vi("x", [batch, 3, 8, 8])], [vi("y", None)], [w1, w2])


def shape_computed_flatten(batch: int | str = 1, *, opset: int = 13) -> onnx.ModelProto:
    """A Paddle export's flatten (PP-OCR's classifier; a detector head's anchor grid has the same form): Reshape to
    [Slice(Cast(Shape(p), int32), 0, 1), -1], the two parts joined by a Concat on axis -1, which ORT's symbolic
    inference refuses and ONNX's does not follow: y's size is known only once the constants are folded."""
    def constant(name: str, value: int) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array([value], np.int32)))

    nodes = [constant("zero", 0), constant("one", 1), constant("axis0", 0), constant("minus1_32", -1),
             helper.make_node("Relu", ["x"], ["p"]),
             helper.make_node("Shape", ["p"], ["s"]),
             helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.INT32),
             helper.make_node("Slice", ["s32", "zero", "one", "axis0"], ["n32"]),
             helper.make_node("Cast", ["n32"], ["n"], to=TensorProto.INT64),
             helper.make_node("Cast", ["minus1_32"], ["minus1"], to=TensorProto.INT64),
             helper.make_node("Concat", ["n", "minus1"], ["target"], axis=-1),
             helper.make_node("Reshape", ["p", "target"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("x", [batch, 3, 4, 4])], [vi("y", [batch, "k"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
