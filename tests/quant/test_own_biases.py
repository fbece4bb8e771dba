"""A bias several nodes read, copied per reader under names of npukit's own before ORT's quantizer copies it under a
name another tensor may hold (torch's GroupNorm exports crashed ``quantize`` and ``compile`` with an internal error)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npukit.quant.config import QuantConfig
from npukit.quant.emit.ort_qdq import own_biases
from npukit.quant.qdq import quantize
from npukit.runtime.ort import make_session


def _shared_bias_model() -> onnx.ModelProto:
    """x -> Conv(w1, b) -> Reshape -> 'b0' -> Conv(w2, b) -> y: one bias read by two convs, and the name ORT's
    quantizer gives its first copy of 'b' already taken by a Reshape's output (whose grid ORT shares with its input:
    the tensor it then found to be an initializer)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.4, name)
             for name, shape in [("w1", (3, 3, 3, 3)), ("w2", (3, 3, 3, 3)), ("b", (3,))]]
    inits.append(numpy_helper.from_array(np.array([1, 3, 8, 8], np.int64), "shape"))
    nodes = [helper.make_node("Conv", ["x", "w1", "b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c1", "shape"], ["b0"], name="reshape"),
             helper.make_node("Conv", ["b0", "w2", "b"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_shared_bias_gets_a_copy_per_reader_and_the_model_quantizes() -> None:
    model = _shared_bias_model()
    owned = own_biases(model)
    biases = [n.input[2] for n in owned.graph.node if n.op_type == "Conv"]
    names = [t.name for t in owned.graph.initializer] + [o for n in owned.graph.node for o in n.output]
    assert biases[0] == "b" and biases[1] not in ("b", "b0") and len(names) == len(set(names))
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(make_session(owned).run(None, {"x": x})[0], make_session(model).run(None, {"x": x})[0])
    assert own_biases(owned) is owned  # nothing shared any more: the same object back
    samples = [{"x": np.random.default_rng(s).standard_normal((1, 3, 8, 8)).astype(np.float32)} for s in range(8)]
    result = quantize(model, samples, config=QuantConfig())  # ORT's quantizer failed on the name it gave its copy
    assert sum(n.op_type == "DequantizeLinear" for n in result.model.graph.node) >= 4
