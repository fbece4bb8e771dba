"""The ONNX graph as a torch program computes what ONNX Runtime computes, op by op and on whole models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.quant.qat.program import OnnxProgram, with_logits
from npukit.runtime.ort import make_session
from tests.quant.conftest import tiny_cnn

RNG = np.random.default_rng(0)


def _const(name: str, value, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _model(nodes, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, atol: float = 1e-5) -> None:
    session = make_session(model)
    expected = session.run(None, feeds)
    program = OnnxProgram(model)
    with torch.no_grad():
        got = program({k: torch.from_numpy(v) for k, v in feeds.items()})
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.shape == e.shape
        np.testing.assert_allclose(g.numpy(), e, atol=atol, rtol=1e-5)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


@pytest.mark.parametrize("activation", ["Relu", "Clip", "LeakyRelu", "PRelu"])
def test_tiny_cnn_matches_ort(activation):
    _compare(tiny_cnn(activation=activation), {"x": _x(1, 4, 8, 8)})


def test_detector_style_ops_match_ort():
    """Conv stride 2 with uneven pads, SiLU, Split, Resize (nearest), Concat, Reshape, Transpose, Softmax, Slice,
    MaxPool with ceil mode, Sigmoid, SpaceToDepth / DepthToSpace: the ops YOLO-style models are made of."""
    w1, w2 = _x(8, 3, 3, 3) * 0.3, _x(8, 8, 1, 1) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[0, 0, 1, 1], strides=[2, 2]),
        helper.make_node("Sigmoid", ["c1"], ["s1"]),
        helper.make_node("Mul", ["c1", "s1"], ["a1"]),
        helper.make_node("Split", ["a1", "split"], ["p", "q"], axis=1),
        helper.make_node("MaxPool", ["q"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                         ceil_mode=1),
        helper.make_node("Resize", ["m", "", "scales"], ["u"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Slice", ["u", "starts", "ends", "axes"], ["us"]),
        helper.make_node("Concat", ["p", "us"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w2"], ["c2"]),
        helper.make_node("Reshape", ["c2", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Softmax", ["t"], ["y"], axis=-1),
        helper.make_node("SpaceToDepth", ["c2"], ["sd"], blocksize=2),
        helper.make_node("DepthToSpace", ["sd"], ["ds"], blocksize=2, mode="DCR"),
        helper.make_node("Sigmoid", ["ds"], ["z"]),
    ]
    inits = [_const("w1", w1), _const("w2", w2), _const("split", [4, 4], np.int64),
             _const("scales", [1, 1, 2, 2]), _const("starts", [0, 0], np.int64), _const("ends", [8, 8], np.int64),
             _const("axes", [2, 3], np.int64), _const("shape", [1, 8, -1], np.int64)]
    model = _model(nodes, [_vi("x", [1, 3, 16, 16])], [_vi("y", None), _vi("z", None)], inits)
    _compare(model, {"x": _x(1, 3, 16, 16)})


def test_segmenter_and_ocr_style_ops_match_ort():
    """ConvTranspose, linear Resize (half pixel), HardSwish / HardSigmoid, GlobalAveragePool, AveragePool, Pad,
    ReduceMean, MatMul, Gemm, Flatten, Div, Sub, Pow, Sqrt, Unsqueeze / Squeeze, Gather, LayerNormalization."""
    wt, wg = _x(4, 2, 2, 2) * 0.3, _x(2, 6) * 0.3
    nodes = [
        helper.make_node("ConvTranspose", ["x", "wt"], ["ct"], strides=[2, 2], pads=[0, 0, 1, 1]),
        helper.make_node("HardSwish", ["ct"], ["hs"]),
        helper.make_node("Resize", ["hs", "", "scales"], ["lin"], mode="linear",
                         coordinate_transformation_mode="half_pixel"),
        helper.make_node("AveragePool", ["lin"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Pad", ["ap", "pads"], ["pd"], mode="reflect"),
        helper.make_node("HardSigmoid", ["pd"], ["hsg"], alpha=0.2, beta=0.5),
        helper.make_node("GlobalAveragePool", ["hsg"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["f"]),
        helper.make_node("Gemm", ["f", "wg"], ["g"]),
        helper.make_node("ReduceMean", ["hsg", "rm_axes"], ["rm"], keepdims=0),
        helper.make_node("Sub", ["rm", "one"], ["sub"]),
        helper.make_node("Pow", ["sub", "two"], ["pw"]),
        helper.make_node("Add", ["pw", "one"], ["pa"]),
        helper.make_node("Sqrt", ["pa"], ["sq"]),
        helper.make_node("Div", ["sq", "two"], ["dv"]),
        helper.make_node("MatMul", ["dv", "wm"], ["mm"]),
        helper.make_node("Unsqueeze", ["mm", "zero"], ["un"]),
        helper.make_node("Squeeze", ["un", "zero"], ["sqz"]),
        helper.make_node("Gather", ["sqz", "idx"], ["ga"], axis=1),
        helper.make_node("LayerNormalization", ["ga", "ln_s", "ln_b"], ["ln"], axis=-1),
    ]
    inits = [_const("wt", wt), _const("wg", wg), _const("scales", [1, 1, 2, 2]),
             _const("pads", [0, 0, 1, 1, 0, 0, 1, 1], np.int64), _const("rm_axes", [3], np.int64),
             _const("one", 1.0), _const("two", 2.0), _const("wm", _x(17, 5)), _const("zero", [0], np.int64),
             _const("idx", [0, 1, 1], np.int64), _const("ln_s", _x(5)), _const("ln_b", _x(5))]
    model = _model(nodes, [_vi("x", [1, 4, 8, 8])], [_vi("g", None), _vi("ln", None)], inits, opset=18)
    _compare(model, {"x": _x(1, 4, 8, 8)})


def test_unsupported_op_is_refused_by_name_when_built():
    nodes = [helper.make_node("NonMaxSuppression", ["b", "s"], ["y"])]
    model = _model(nodes, [_vi("b", [1, 4, 4]), _vi("s", [1, 1, 4])], [_vi("y", None, TensorProto.INT64)], [])
    with pytest.raises(InputError, match="NonMaxSuppression"):
        OnnxProgram(model)


def test_weights_train_and_constants_do_not():
    program = OnnxProgram(tiny_cnn(activation="Clip"))
    trained = set(program.trained_initializers())
    assert trained == {"w1", "b1", "w2", "b2", "w3", "b3", "w4", "b4"}  # Clip bounds stay constants
    loss = program({"x": torch.from_numpy(_x(1, 4, 8, 8))})[0].square().sum()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in program.trained_initializers().values())


@pytest.mark.parametrize("axis, replaced", [(-1, True), (1, True), (0, False)])
def test_with_logits_distills_on_what_a_last_axis_softmax_reads(axis, replaced):
    model = tiny_cnn()
    model.graph.output[0].name = "p"
    model.graph.node.append(helper.make_node("Softmax", ["y"], ["p"], name="softmax", axis=axis))
    model.graph.output[0].type.tensor_type.shape.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 5])
                                                          .tensor_type.shape)
    out = with_logits(model, 0)
    assert (out.graph.output[0].name == "y") == replaced and (out is model) != replaced
    assert model.graph.output[0].name == "p"  # the model itself is untouched
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    if replaced:
        logits = OnnxProgram(out)({"x": torch.from_numpy(x)})[0]
        probs = OnnxProgram(model)({"x": torch.from_numpy(x)})[0]
        torch.testing.assert_close(torch.softmax(logits, -1), probs)
    assert with_logits(tiny_cnn(), 0) is not None and with_logits(tiny_cnn(), 0).graph.output[0].name == "y"


@pytest.mark.parametrize("opset", [11, 14])
def test_with_logits_finds_a_softmax_behind_shape_ops(opset):
    # opset conversion writes an opset-11 Softmax as Flatten -> Softmax -> Reshape, Paddle ends in Identity: a
    # substituted model and its original must both distill on the logits (one on probabilities, one on logits, and
    # training pulled an exact substitute 100 dB away from the original)
    model = tiny_cnn()
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", opset))
    model.graph.output[0].name = "out"
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 5], np.int64), "shape"))
    model.graph.node.extend([helper.make_node("Flatten", ["y"], ["flat"], axis=1),
                             helper.make_node("Softmax", ["flat"], ["p"], axis=1 if opset < 13 else -1),
                             helper.make_node("Reshape", ["p", "shape"], ["p2"]),
                             helper.make_node("Identity", ["p2"], ["out"])])
    out = with_logits(model, 0)
    assert out is not model and out.graph.output[0].name == "flat"
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32))
    torch.testing.assert_close(torch.softmax(OnnxProgram(out)({"x": x})[0], -1), OnnxProgram(model)({"x": x})[0])


def test_a_twin_s_logits_are_found_behind_its_quantized_softmax_output(softmax_twin):
    """A twin's Softmax output goes through its output quantizer (a FakeQuant): the logits behind it are what
    training distils on, as on the float model (MTCNN ONet's 8-bit probabilities, mostly exact 0s, made a loss no
    epoch moved)."""
    from npukit.quant.qat.program import logits_of

    result, twin = softmax_twin
    assert logits_of(result.reference, 0) == "y"
    logits = logits_of(twin.model, 0)
    producer = next(n for n in twin.model.graph.node if logits in n.output)
    assert producer.op_type == "FakeQuant" and list(producer.input) == ["y"]  # the quantized logits
    out = with_logits(twin.model, 0)
    assert out is not twin.model and out.graph.output[0].name == logits
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((1, 4, 8, 8)).astype(np.float32))
    output_quant = next(n for n in twin.model.graph.node if list(n.output) == ["p"])
    key = next(helper.get_attribute_value(a) for a in output_quant.attribute if a.name == "key").decode()
    step = float(twin.quant[key].scale().max())  # the probabilities' grid
    with torch.no_grad():
        probabilities = twin.program()({"x": x})[0]
        torch.testing.assert_close(torch.softmax(OnnxProgram(out, twin.quant)({"x": x})[0], -1), probabilities,
                                   rtol=0, atol=step / 2 + 1e-6)
