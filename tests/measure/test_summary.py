"""Model summary: MACs, parameters and shapes against hand-computed numbers on tiny models, and MobileNetV2."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.measure.summary import summarize


def _init(name: str, shape: tuple[int, ...], seed: int = 0) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _conv_gemm_model() -> onnx.ModelProto:
    # x (N,3,8,8) -Conv 3x3 s2 p1-> (N,4,4,4) -Conv group 2, dilation 2, pad 2-> (N,4,4,4) -Reshape-> (N,64) -Gemm-> 10
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", kernel_shape=[3, 3], group=2,
                         dilations=[2, 2], pads=[2, 2, 2, 2]),
        helper.make_node("Reshape", ["c2", "shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "w3", "b3"], ["y"], name="fc"),
    ]
    inits = [
        _init("w1", (4, 3, 3, 3)), _init("b1", (4,)), _init("w2", (4, 2, 3, 3)), _init("w3", (64, 10)),
        _init("b3", (10,)), numpy_helper.from_array(np.array([-1, 64], dtype=np.int64), "shape"),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


CONV1_MACS = 1 * 4 * 4 * 4 * (3 * 3 * 3)  # output elements x (C/group) x kernel = 1728
CONV2_MACS = 1 * 4 * 4 * 4 * (2 * 3 * 3)  # = 1152
GEMM_MACS = 1 * 10 * 64  # = 640
PARAMS = 4 * 3 * 3 * 3 + 4 + 4 * 2 * 3 * 3 + 64 * 10 + 10  # the int64 shape constant is not a parameter


def test_conv_gemm_macs_params_and_rows() -> None:
    model = _conv_gemm_model()
    before = model.SerializeToString()
    s = summarize(model)
    assert model.SerializeToString() == before  # the caller's model is untouched
    assert s.macs == CONV1_MACS + CONV2_MACS + GEMM_MACS == 3520
    assert s.parameters == PARAMS == 834
    assert s.ops == {"Conv": 2, "Relu": 1, "Reshape": 1, "Gemm": 1}
    assert s.nodes == 5
    assert s.unknown_mac_layers == 0
    assert s.input_shapes == {"x": (1, 3, 8, 8)}
    assert s.serialized_bytes == model.ByteSize()
    rows = {r.name: r for r in s.layers}
    assert rows["conv1"].macs == CONV1_MACS and rows["conv1"].params == 112
    assert rows["conv1"].output_shape == (1, 4, 4, 4) and rows["conv1"].output_bytes == 64 * 4
    assert rows["conv2"].macs == CONV2_MACS and rows["conv2"].params == 72
    assert rows["fc"].macs == GEMM_MACS and rows["fc"].params == 650 and rows["fc"].output_shape == (1, 10)
    assert rows["relu1"].macs == 0 and rows["flatten"].params == 0
    assert s.other_flops == 64  # the Relu
    top = s.largest_activations[0]
    assert top.bytes == 3 * 8 * 8 * 4 and top.name == "x" and top.dtype == "float32"
    assert len(s.as_dict()["layers"]) == 5


def test_input_shape_fixes_the_batch_and_is_checked() -> None:
    model = _conv_gemm_model()
    assert summarize(model, input_shape=(2, 3, 8, 8)).macs == 2 * 3520
    with pytest.raises(InputError, match="rank"):
        summarize(model, input_shape=(3, 8, 8))
    with pytest.raises(InputError, match="does not fit"):
        summarize(model, input_shape=(1, 1, 8, 8))


def test_batched_matmul_and_conv_transpose() -> None:
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["m"], name="mm"),
        helper.make_node("ConvTranspose", ["x", "w"], ["t"], name="deconv", kernel_shape=[2, 2], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes, "mm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4, 5]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
        [_init("b", (5, 6)), _init("w", (2, 3, 2, 2))],
    )
    s = summarize(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    rows = {r.name: r for r in s.layers}
    assert rows["mm"].macs == 2 * 3 * 4 * 6 * 5 and rows["mm"].output_shape == (2, 3, 4, 6)
    # every input element meets (M/group) x kernel weights: 18 x 3 x 4
    assert rows["deconv"].macs == 18 * 3 * 4 and rows["deconv"].output_shape == (1, 3, 6, 6)
    assert s.macs == 720 + 216


def test_qdq_model_counts_the_same_conv_macs(tmp_path: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):  # type: ignore[override]
            return next(self.items, None)

    onnx.save(_conv_gemm_model(), tmp_path / "f.onnx")
    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    q = onnx.load(tmp_path / "q.onnx")
    assert "DequantizeLinear" in {n.op_type for n in q.graph.node}
    s = summarize(q)
    assert s.ops["Conv"] == 2
    assert s.macs == 3520
    assert s.parameters == PARAMS  # int8 weights + int32 biases; scales and zero points excluded
    assert {r.name: r.params for r in s.layers if r.op == "Conv"} == {"conv1": 112, "conv2": 72}


@pytest.mark.slow
def test_mobilenet_v2_macs() -> None:
    import torch
    import torchvision

    net = torchvision.models.mobilenet_v2().eval()
    buf = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(1, 3, 224, 224),), buf, dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "N"}})
    s = summarize(onnx.load_from_string(buf.getvalue()))
    assert 290e6 < s.macs < 320e6
    assert s.ops["Conv"] == 52 and s.ops["Gemm"] == 1
    assert s.unknown_mac_layers == 0
    assert 3.3e6 < s.parameters < 3.6e6  # 3.5M in torch; the exporter folds BatchNorm into the convs
    assert s.largest_activations[0].shape == (1, 96, 112, 112)


def test_unknown_spatial_dims_leave_macs_unknown_until_given() -> None:
    model = _conv_gemm_model()
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    s = summarize(model)
    rows = {r.name: r for r in s.layers}
    assert rows["conv1"].macs is None and rows["conv1"].output_bytes is None
    assert s.unknown_mac_layers >= 2 and s.macs <= GEMM_MACS
    assert summarize(model, input_shape=(1, 3, 8, 8)).macs == 3520


def _computed_reshape(divisor: int = 1) -> onnx.ModelProto:
    """x[1,3,8,8] -> Reshape to (1, prod(shape(x)) / divisor) -> MatMul (192, 5): a size the graph computes, which
    shape inference does not follow (ReduceProd of a Shape)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
             helper.make_node("Div", ["n", "divisor"], ["m"]),
             helper.make_node("Concat", ["one", "m"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "w"], ["y"])]
    inits = [numpy_helper.from_array(np.array([divisor], np.int64), "divisor"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.ones((192, 5), np.float32), "w")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_sizes_the_graph_computes_are_taken_from_one_run():
    from npukit.verbs.common import summary_of

    model = _computed_reshape()
    assert summarize(model).unknown_mac_layers == 1  # shape inference alone leaves the MatMul unknown
    summary = summary_of(model)
    assert summary.unknown_mac_layers == 0 and summary.macs == 192 * 5
    broken = summary_of(_computed_reshape(divisor=3))  # does not run on any input: the partial count stays
    assert broken.unknown_mac_layers == 1


def test_control_flow_branches_are_counted_apart() -> None:
    """silero VAD's work is inside an If's branches: inspect said "5 nodes, 0 parameters", as if it were empty; the
    branches' nodes and parameters (nested ones too) are counted apart, since one branch runs per call."""
    matmul = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4])], [_init("w", (4, 4))])
    nested = helper.make_graph([helper.make_node("Relu", ["x"], ["n"])], "nested", [],
                               [helper.make_tensor_value_info("n", TensorProto.FLOAT, [1, 4])])
    other = helper.make_graph([helper.make_node("If", ["c"], ["e"], then_branch=nested, else_branch=nested)],
                              "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 4])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=matmul, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    summary = summarize(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert (summary.nodes, summary.parameters) == (1, 0)
    assert (summary.branch_nodes, summary.branch_parameters) == (4, 16)  # MatMul; If, and its two Relu branches


@pytest.mark.parametrize("op, gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_recurrent_layers_count_their_macs(op: str, gates: int) -> None:
    """ddddocr's OCR model's DynamicQuantizeLSTM counted 0 MACs (and 0 energy): a recurrent layer multiplies the
    input by W and the state by R at every step, for every batch row and direction."""
    seq, batch, inputs, hidden, directions = 5, 2, 3, 4, 2
    node = helper.make_node(op, ["x", "w", "r"], ["y"], name="rnn", hidden_size=hidden, direction="bidirectional")
    graph = helper.make_graph(
        [node], "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_init("w", (directions, gates * hidden, inputs)), _init("r", (directions, gates * hidden, hidden), 1)])
    summary = summarize(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert summary.macs == seq * batch * directions * gates * hidden * (inputs + hidden)
