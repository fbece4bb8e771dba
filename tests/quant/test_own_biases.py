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


def _grouped_upsampling() -> onnx.ModelProto:
    """x[1, 8, 4, 4] -> ConvTranspose 2x2 stride 2, group 4, with a bias (8 output channels, 2 per group) -> y."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 2, 2, 2)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", strides=[2, 2], group=4)
    graph = helper.make_graph([node], "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_grouped_conv_transpose_with_a_bias_is_quantized_per_tensor() -> None:
    """ORT's per-channel quantizer took the weight along axis 1 (2 scales) and divided the 8-channel bias by them:
    'operands could not be broadcast together with shapes (8,) (2,)', an internal error in quantize and compile."""
    from npukit.runtime.qnn import qnn_quant_config
    from npukit.quant.emit.ort_qdq import FeedsReader

    model = _grouped_upsampling()
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 8, 4, 4)).astype(np.float32)} for i in range(4)]
    result = quantize(model, samples, config=QuantConfig())
    scales = [i for i in result.model.graph.initializer if i.name.startswith("w") and "scale" in i.name]
    assert scales and all(len(s.dims) == 0 or s.dims == [1] for s in scales)  # one scale: per tensor
    want = make_session(model).run(None, samples[0])[0]
    got = make_session(result.model).run(None, samples[0])[0]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    config = qnn_quant_config(model, FeedsReader(samples))
    assert "axis" not in config.extra_options["TensorQuantOverrides"]["w"][0]
