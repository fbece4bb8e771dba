from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npukit.measure.compare import compare_outputs
from npukit.quant.algorithms.stream_equalize import equalize_streams, find_stream_groups
from npukit.quant.calibration.calibrate import channel_statistics
from npukit.quant.config import ActivationEqualization, CalibrationSpec, QuantConfig, Recipe
from npukit.quant.layer_sqnr import sqnr_db
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, outputs, tiny_cnn

STREAM = ("s1", "s2", "r", "rr", "mp")


def residual_model(*, seed: int = 0, spread: float = 1.5, clip_consumer: bool = False) -> onnx.ModelProto:
    """x[1,4,8,8] -> {Conv a 1x1, Conv b 3x3} (4->6, the same unequal channel gains) -> Add -> Relu -> MaxPool
    -> Conv c 1x1 (6->5); Relu's output also feeds a depthwise Conv d (and, with ``clip_consumer``, a Clip).
    The consumers weigh channel i by 1 / gain_i, so every channel matters as much downstream."""
    rng = np.random.default_rng(seed)
    gain = 10.0 ** rng.uniform(-spread, spread, 6)
    arrays = {
        "wa": rng.standard_normal((6, 4, 1, 1)) * gain[:, None, None, None], "ba": rng.standard_normal(6) * gain,
        "wb": rng.standard_normal((6, 4, 3, 3)) * 0.3 * gain[:, None, None, None], "bb": rng.standard_normal(6),
        # consumers weigh each channel inversely to its gain, as BatchNorm folding leaves real nets: every channel
        # matters downstream, however small its range
        "wc": rng.standard_normal((5, 6, 1, 1)) * 0.5 / gain[None, :, None, None], "bc": rng.standard_normal(5) * 0.1,
        "wd": rng.standard_normal((6, 1, 3, 3)) * 0.5 / gain[:, None, None, None], "bd": rng.standard_normal(6) * 0.1,
        "lo": np.float32(0.0), "hi": np.float32(6.0),
    }
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in arrays.items()]
    nodes = [
        helper.make_node("Conv", ["x", "wa", "ba"], ["s1"], name="a"),
        helper.make_node("Conv", ["x", "wb", "bb"], ["s2"], name="b", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["s1", "s2"], ["r"], name="add"),
        helper.make_node("Relu", ["r"], ["rr"], name="relu"),
        helper.make_node("MaxPool", ["rr"], ["mp"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["mp", "wc", "bc"], ["c"], name="c"),
        helper.make_node("Conv", ["rr", "wd", "bd"], ["d"], name="d", pads=[1, 1, 1, 1], group=6),
    ]
    outs = [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 5, 4, 4]),
            helper.make_tensor_value_info("d", TensorProto.FLOAT, [1, 6, 8, 8])]
    if clip_consumer:
        nodes.append(helper.make_node("Clip", ["rr", "lo", "hi"], ["k"], name="clip"))
        outs.append(helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 6, 8, 8]))
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                [1, 4, 8, 8])], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _group_peaks(model: onnx.ModelProto, samples) -> np.ndarray:
    stats = channel_statistics(model, list(STREAM), samples)
    return np.max([np.maximum(np.abs(s.min), np.abs(s.max)) for s in stats.values()], axis=0)


def test_a_residual_stream_is_one_group_with_all_its_producers_and_consumers() -> None:
    groups, _ = find_stream_groups(residual_model())
    stream = [g for g in groups if "r" in g.tensors]
    assert len(stream) == 1
    assert set(stream[0].tensors) == set(STREAM)
    assert set(stream[0].producers) == {"a", "b"} and set(stream[0].consumers) == {"c", "d"}


def test_full_equalization_gives_every_channel_the_same_range_and_keeps_outputs() -> None:
    model = residual_model()
    samples = make_samples(8)
    before = _group_peaks(model, samples)
    assert before.max() / before.min() > 10  # the toy really is unequal
    result = equalize_streams(model, samples, alpha=1.0, max_scale=1e4)
    onnx.checker.check_model(result.model)
    after = _group_peaks(result.model, samples)
    np.testing.assert_allclose(after, before.max(), rtol=1e-4)  # every channel at the largest one's range
    capped = _group_peaks(equalize_streams(model, samples, alpha=1.0, max_scale=10.0).model, samples)
    np.testing.assert_allclose(capped, np.minimum(before * 10.0, before.max()), rtol=1e-4)
    held = make_samples(8, seed=5)
    errors = compare_outputs(list(outputs(model, held)), list(outputs(result.model, held)))
    assert errors.max_rel < 1e-5


def test_alpha_zero_changes_nothing_and_half_lies_between() -> None:
    model = residual_model()
    samples = make_samples(8)
    zero = equalize_streams(model, samples, alpha=0.0)
    for a, b in zip(model.graph.initializer, zero.model.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    half = _group_peaks(equalize_streams(model, samples, alpha=0.5).model, samples)
    before = _group_peaks(model, samples)
    assert before.max() / before.min() > half.max() / half.min() > 1.01


def test_a_stream_that_reaches_a_clip_is_left_alone_with_the_reason() -> None:
    model = residual_model(clip_consumer=True)
    result = equalize_streams(model, make_samples(4), alpha=1.0)
    assert not [g for g in result.groups if "r" in g["tensors"]]
    assert any("Clip" in s["reason"] for s in result.skipped)


def test_the_tiny_cnn_head_goes_through_pooling_and_flatten_to_the_gemm() -> None:
    groups, _ = find_stream_groups(tiny_cnn())
    head = next(g for g in groups if "c3" in g.tensors)
    assert head.producers == ("pw",) and head.consumers == ("fc",)
    samples = make_samples(6)
    result = equalize_streams(tiny_cnn(), samples, alpha=1.0)
    errors = compare_outputs(list(outputs(tiny_cnn(), samples)), list(outputs(result.model, samples)))
    assert errors.max_rel < 1e-5


def test_equalized_streams_quantize_with_less_error() -> None:
    model = residual_model(spread=1.5)
    calib, held = make_samples(16), make_samples(16, seed=11)
    want = outputs(model, held)

    def sqnr(config: QuantConfig) -> float:
        got = outputs(quantize(model, calib, config=config).model, held)
        return sqnr_db(float(np.sum(want.astype(np.float64) ** 2)), float(np.sum((want - got).astype(np.float64) ** 2)))

    plain = sqnr(QuantConfig(calibration=CalibrationSpec(method="minmax")))
    equalized = sqnr(QuantConfig(calibration=CalibrationSpec(method="minmax"),
                                 recipe=Recipe(activation_equalization=ActivationEqualization(alpha=1.0))))
    assert equalized > plain + 3.0
