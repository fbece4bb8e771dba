"""Tiny ONNX graphs with hand-countable activation sizes for the memory tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _weight(name: str, shape: tuple[int, ...], seed: int = 0) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def conv_relu_add(*, input_dims=(1, 2, 4, 4)) -> onnx.ModelProto:
    """x[1,2,4,4] -> Conv -> c -> Relu -> r; MaxPool(r) -> m (graph output), idx (unused); Add(r, x) -> a;
    Reshape(a, Constant shape) -> s (graph output). Every float map is 128 bytes, m 32, idx 64."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["m", "idx"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Constant", [], ["shape"], name="shape_const",
                         value=numpy_helper.from_array(np.array([1, 32], np.int64), "shape")),
        helper.make_node("Add", ["r", "x"], ["a"], name="add"),
        helper.make_node("Reshape", ["a", "shape"], ["s"], name="reshape"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, list(input_dims))],
                  [helper.make_tensor_value_info("s", FLOAT, [1, 32]),
                   helper.make_tensor_value_info("m", FLOAT, [1, 2, 2, 2])],
                  [_weight("w", (2, 2, 1, 1))])


def conv_add(*, relu: bool) -> onnx.ModelProto:
    """x[1,2,4,4] -> Conv -> c; Add(c, x) -> a; (Relu(a) -> y). ORT CPU runs it as one FusedConv with Z = x."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Add", ["c", "x"], ["a"], name="add")]
    if relu:
        nodes.append(helper.make_node("Relu", ["a"], ["y"], name="relu"))
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, [1, 2, 4, 4])],
                  [helper.make_tensor_value_info("y" if relu else "a", FLOAT, [1, 2, 4, 4])],
                  [_weight("w", (2, 2, 1, 1))])


def qdq_conv() -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv(DQ(int8 w)) -> Q -> DQ -> out: float x 128 bytes, uint8 maps 32 bytes."""
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(128, np.uint8), "z"),
        numpy_helper.from_array(np.ones((2, 2, 1, 1), np.int8), "wq"),
        numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_in"),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="dq_w"),
        helper.make_node("Conv", ["xd", "w"], ["y"], name="conv"),
        helper.make_node("QuantizeLinear", ["y", "s", "z"], ["yq"], name="q_out"),
        helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["out"], name="dq_out"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, [1, 2, 4, 4])],
                  [helper.make_tensor_value_info("out", FLOAT, [1, 2, 4, 4])], inits)


def two_branches() -> onnx.ModelProto:
    """x[1,1,8,8] (256 B) -> a1 = Conv 1->16 (4096 B) -> a2 = Conv 16->1 (256 B); the same for b; Add(a2, b2).
    Stored in the order a1, b1, a2, b2, add: both wide maps live at once; running a's branch first halves that."""
    nodes = [
        helper.make_node("Conv", ["x", "wa1"], ["a1"], name="a1"),
        helper.make_node("Conv", ["x", "wb1"], ["b1"], name="b1"),
        helper.make_node("Conv", ["a1", "wa2"], ["a2"], name="a2"),
        helper.make_node("Conv", ["b1", "wb2"], ["b2"], name="b2"),
        helper.make_node("Add", ["a2", "b2"], ["y"], name="add"),
    ]
    inits = [_weight("wa1", (16, 1, 1, 1), 1), _weight("wb1", (16, 1, 1, 1), 2),
             _weight("wa2", (1, 16, 1, 1), 3), _weight("wb2", (1, 16, 1, 1), 4)]
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, [1, 1, 8, 8])],
                  [helper.make_tensor_value_info("y", FLOAT, [1, 1, 8, 8])], inits)


def chain(length: int, *, dims=(1, 8, 16, 16)) -> onnx.ModelProto:
    """``length`` alternating Relu/Sigmoid nodes in a row."""
    names = ["x"] + [f"t{i}" for i in range(length)]
    nodes = [helper.make_node("Relu" if i % 2 else "Sigmoid", [names[i]], [names[i + 1]], name=f"n{i}")
             for i in range(length)]
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, list(dims))],
                  [helper.make_tensor_value_info(names[-1], FLOAT, list(dims))])


def sliced_branches() -> onnx.ModelProto:
    """x[1,1,8,8] (256 B) read by two overlapping Slices of 5 rows (160 B each); each -> Conv 1->16 (2560 B) ->
    GlobalAveragePool (64 B); Add of the two. Running both slices first lets x die early and lowers the peak with x
    counted, but holds both slices at the wide map's step: without x, branch after branch (as ORT runs it) is lower."""
    def rows(lo: int, hi: int, tag: str) -> list[onnx.TensorProto]:
        return [numpy_helper.from_array(np.array(v, np.int64), f"{tag}_{k}")
                for k, v in (("starts", [lo]), ("ends", [hi]), ("axes", [2]))]

    nodes, inits = [], []
    for branch, (lo, hi) in (("a", (0, 5)), ("b", (3, 8))):
        inits += [*rows(lo, hi, branch), _weight(f"w{branch}", (16, 1, 1, 1), 5 if branch == "a" else 6)]
        nodes += [helper.make_node("Slice", ["x", f"{branch}_starts", f"{branch}_ends", f"{branch}_axes"],
                                   [f"{branch}0"], name=f"{branch}_slice"),
                  helper.make_node("Conv", [f"{branch}0", f"w{branch}"], [f"{branch}1"], name=f"{branch}_conv"),
                  helper.make_node("GlobalAveragePool", [f"{branch}1"], [f"{branch}2"], name=f"{branch}_pool")]
    nodes.append(helper.make_node("Add", ["a2", "b2"], ["y"], name="add"))
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, [1, 1, 8, 8])],
                  [helper.make_tensor_value_info("y", FLOAT, [1, 16, 1, 1])], inits)


def stacked_convs(count: int = 6) -> onnx.ModelProto:
    """x[1,1,8,8] -> ``count`` Convs 1->16 (3x3) -> Concat along H: on x86 ORT runs each Conv in NCHWc and converts
    each output back with a ReorderOutput node before the Concat."""
    nodes = [helper.make_node("Conv", ["x", f"w{k}"], [f"c{k}"], name=f"conv{k}", pads=[1, 1, 1, 1])
             for k in range(count)]
    nodes.append(helper.make_node("Concat", [f"c{k}" for k in range(count)], ["y"], name="cat", axis=2))
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, [1, 1, 8, 8])],
                  [helper.make_tensor_value_info("y", FLOAT, [1, 16, 8 * count, 8])],
                  [_weight(f"w{k}", (16, 1, 3, 3), k) for k in range(count)])
