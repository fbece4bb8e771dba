"""A join of tensors on very different scales (a detector's box coordinates and class scores) stays in float, and
the float head never takes a model's whole compute."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npukit.measure.fidelity import sqnr_db
from npukit.quant.config import FloatHead, Precision, QuantConfig, Scheme
from npukit.quant.precision.joins import mixed_scale_joins
from npukit.quant.qdq import integer_kernel_report, one_sample_ranges, preprocess, quantize
from tests.quant.conftest import make_samples, outputs


def _detector_head() -> onnx.ModelProto:
    """x[1,8,8,8] -> 1x1 conv -> Relu -> {1x1 conv -> * 320 (boxes, 4 channels), 1x1 conv -> Sigmoid (3 scores)}
    -> Concat on channels -> Reshape to (1, 7, 64): a YOLOv8-style (N, 4 + C, anchors) output."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in [("w0", (16, 8, 1, 1)), ("wb", (4, 16, 1, 1)), ("ws", (3, 16, 1, 1))]]
    inits += [numpy_helper.from_array(np.array(320.0, np.float32), "scale"),
              numpy_helper.from_array(np.array([1, 7, 64], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="trunk"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu"),
             helper.make_node("Conv", ["r0", "wb"], ["b0"], name="box_conv"),
             helper.make_node("Sigmoid", ["b0"], ["b1"], name="box_sigmoid"),
             helper.make_node("Mul", ["b1", "scale"], ["boxes"], name="box_scale"),
             helper.make_node("Conv", ["r0", "ws"], ["s0"], name="score_conv"),
             helper.make_node("Sigmoid", ["s0"], ["scores"], name="score_sigmoid"),
             helper.make_node("Concat", ["boxes", "scores"], ["joined"], name="join", axis=1),
             helper.make_node("Reshape", ["joined", "shape"], ["y"], name="flatten")]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _samples(n: int = 8, seed: int = 1) -> list[dict[str, np.ndarray]]:
    return make_samples(n, seed=seed, shape=(1, 8, 8, 8))


def test_the_mixed_join_is_found_with_what_follows() -> None:
    model = preprocess(_detector_head())
    joins = mixed_scale_joins(model, one_sample_ranges(model, _samples(1)[0], QuantConfig()))
    assert [j.node for j in joins] == ["join"] and joins[0].after == ("flatten",)
    assert joins[0].ratio > 100  # coordinates up to 320 against scores up to 1


def test_scores_survive_quantization_only_with_the_join_in_float() -> None:
    model, held = _detector_head(), _samples(4, seed=7)
    reference = outputs(model, held)[:, 0, 4:]  # the class scores
    joined = quantize(model, _samples(), config=QuantConfig(precision=Precision(float_joins=False)))
    assert sqnr_db(reference, outputs(joined.model, held)[:, 0, 4:]) < 10  # one grid over 0..320: scores wiped out
    kept = quantize(model, _samples(), config=QuantConfig())
    assert kept.steps.float_joins["nodes"] == ["join", "flatten"]
    assert sqnr_db(reference, outputs(kept.model, held)[:, 0, 4:]) > 25  # each input on its own grid
    assert integer_kernel_report(kept.model)["integer_fraction"] == 1.0  # the convs stay int8


def _conv_chain(convs: int) -> onnx.ModelProto:
    """x[1,3,16,16] -> (3x3 conv -> Relu) x ``convs`` -> Resize x2: a small segmentation-style net, every conv on
    the stem's chain."""
    rng = np.random.default_rng(1)
    inits, nodes, channels, tensor = [], [], 3, "x"
    for i in range(convs):
        w = numpy_helper.from_array((rng.standard_normal((8, channels, 3, 3)) * 0.2).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes += [helper.make_node("Conv", [tensor, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        channels, tensor = 8, f"r{i}"
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    nodes.append(helper.make_node("Resize", [tensor, "", "scales"], ["y"], name="up", mode="linear"))
    graph = helper.make_graph(nodes, "seg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_the_float_head_never_takes_every_conv() -> None:
    samples = make_samples(4, shape=(1, 3, 16, 16))
    result = quantize(_conv_chain(1), samples, config=QuantConfig(precision=Precision(float_head=FloatHead())))
    assert result.steps.float_stem["nodes"] == [] and "dropped" in result.steps.float_stem
    assert result.steps.float_stem["dropped"]  # the one conv was the stem: quantized whole, and said so
    assert integer_kernel_report(result.model)["integer_fraction"] == 1.0


def test_bounded_activations_keep_their_whole_range() -> None:
    from npukit.quant.qdq import effective_ranges

    model = _detector_head()
    ranges = {"scores": (0.0, 0.53), "b1": (0.0, 0.97), "r0": (0.0, 3.0)}  # a clipping observer's choice
    adjusted = effective_ranges(model, ranges, QuantConfig())
    assert adjusted["scores"] == (0.0, 1.0) and adjusted["b1"] == (0.0, 1.0) and adjusted["r0"] == (0.0, 3.0)
    excluded = QuantConfig(scheme=Scheme(exclude=("score_sigmoid",)))
    assert effective_ranges(model, ranges, excluded)["scores"] == (0.0, 0.53)
