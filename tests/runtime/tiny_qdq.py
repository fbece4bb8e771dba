"""Tiny hand-built QDQ models for the QNN runtime tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def qdq_conv_model(*, batch: int | str = 1, channels: int = 4, size: int = 8, tail_op: str | None = None,
                   seed: int = 0) -> onnx.ModelProto:
    """Q/DQ(x) -> Conv 3x3 (int8 symmetric per-tensor weights, int32 bias) -> Relu -> Q/DQ, uint8 activations.

    ``tail_op`` appends one float op on the output (e.g. "Det" after a reshape to square matrices, which the QNN EP
    does not support)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3
    w_scale = float(np.abs(w).max() / 127)
    x_scale, y_scale = 4.0 / 255, 6.0 / 255
    bias = rng.standard_normal(channels).astype(np.float32) * 0.1
    inits = [
        numpy_helper.from_array(np.array(x_scale, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "x_zp"),
        numpy_helper.from_array(np.round(w / w_scale).clip(-127, 127).astype(np.int8), "w_q"),
        numpy_helper.from_array(np.array(w_scale, np.float32), "w_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "w_zp"),
        numpy_helper.from_array(np.round(bias / (x_scale * w_scale)).astype(np.int32), "b_q"),
        numpy_helper.from_array(np.array(x_scale * w_scale, np.float32), "b_scale"),
        numpy_helper.from_array(np.array(0, np.int32), "b_zp"),
        numpy_helper.from_array(np.array(y_scale, np.float32), "y_scale"),
        numpy_helper.from_array(np.array(0, np.uint8), "y_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["x_q"], name="q_x"),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zp"], ["x_dq"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w_dq"], name="dq_w"),
        helper.make_node("DequantizeLinear", ["b_q", "b_scale", "b_zp"], ["b_dq"], name="dq_b"),
        helper.make_node("Conv", ["x_dq", "w_dq", "b_dq"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", "y_scale", "y_zp"], ["r_q"], name="q_y"),
        helper.make_node("DequantizeLinear", ["r_q", "y_scale", "y_zp"], ["y"], name="dq_y"),
    ]
    out_shape: list[int | str] = [batch, channels, size, size]
    output = "y"
    if tail_op is not None:
        assert isinstance(batch, int)
        inits.append(numpy_helper.from_array(np.array([batch * channels, size, size], np.int64), "square"))
        nodes.append(helper.make_node("Reshape", ["y", "square"], ["y_sq"], name="reshape"))
        nodes.append(helper.make_node(tail_op, ["y_sq"], ["z"], name="tail"))
        out_shape, output = [batch * channels], "z"
    graph = helper.make_graph(
        nodes, "tiny_qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def float_conv_model(*, channels: int = 4, size: int = 8, seed: int = 0) -> onnx.ModelProto:
    """x -> Conv 3x3 (float32 weights and bias) -> Relu: a float model without any Q/DQ node."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
             numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32) * 0.1, "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "tiny_float_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def qdq_swish_model(*, activations: int = TensorProto.UINT16, height: int = 10, width: int = 10,
                    channels: int = 4) -> onnx.ModelProto:
    """Q/DQ(x) -> Conv 3x3 (int8 per-channel weights) -> Q/DQ -> Sigmoid -> Q/DQ -> Mul(conv, sigmoid) -> Q/DQ: a
    SiLU after a Conv the way ORT's quantizer writes it, with ``activations`` (uint16: what the HTP computes wrongly
    at height 9..12)."""
    rng = np.random.default_rng(1)
    c = channels
    w = rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.3
    w_scale = (np.abs(w).reshape(c, -1).max(1) / 127).astype(np.float32)
    act = helper.tensor_dtype_to_np_dtype(activations)
    top = float(np.iinfo(act).max)

    def qparams(name: str, lo: float, hi: float) -> list[onnx.TensorProto]:
        scale = (hi - lo) / top
        return [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
                numpy_helper.from_array(np.array(round(-lo / scale), act), f"{name}_z")]

    inits = [numpy_helper.from_array(np.round(w / w_scale[:, None, None, None]).astype(np.int8), "w_q"),
             numpy_helper.from_array(w_scale, "w_s"), numpy_helper.from_array(np.zeros(c, np.int8), "w_z"),
             *qparams("x", -3.0, 3.0), *qparams("c", -6.0, 6.0), *qparams("s", 0.0, 1.0), *qparams("y", -0.3, 6.0)]

    def qdq(name: str, source: str, params: str) -> list[onnx.NodeProto]:
        return [helper.make_node("QuantizeLinear", [source, f"{params}_s", f"{params}_z"], [f"{name}_q"],
                                 name=f"{name}_QuantizeLinear"),
                helper.make_node("DequantizeLinear", [f"{name}_q", f"{params}_s", f"{params}_z"], [f"{name}_dq"],
                                 name=f"{name}_DequantizeLinear")]

    nodes = [*qdq("x", "x", "x"),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w_dq"], name="w_DequantizeLinear", axis=0),
             helper.make_node("Conv", ["x_dq", "w_dq"], ["c"], name="conv", pads=[1, 1, 1, 1]), *qdq("c", "c", "c"),
             helper.make_node("Sigmoid", ["c_dq"], ["s"], name="sig"), *qdq("s", "s", "s"),
             helper.make_node("Mul", ["c_dq", "s_dq"], ["y"], name="mul"), *qdq("y", "y", "y")]
    shape = [1, c, height, width]
    graph = helper.make_graph(nodes, "qdq_swish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y_dq", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model
