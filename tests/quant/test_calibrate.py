from __future__ import annotations

import numpy as np
import pytest

from npukit.errors import InputError
from npukit.quant.calibration.calibrate import (Calibration, calibrate, channel_statistics, float_activations,
                                                observe)
from npukit.quant.config import CalibrationSpec, QuantConfig, Scheme
from tests.quant.conftest import make_samples, tiny_cnn


def test_minmax_ranges_match_the_activations_seen() -> None:
    model = tiny_cnn()
    samples = make_samples(6)
    names = float_activations(model)
    assert names[0] == "x" and {"c1", "a1", "c2", "a2", "c3", "y"} <= set(names)
    seen = {n: [np.inf, -np.inf] for n in names}
    for values in observe(model, names, samples):
        for n, v in values.items():
            seen[n] = [min(seen[n][0], v.min()), max(seen[n][1], v.max())]
    ticks = []
    result = calibrate(model, samples, config=QuantConfig(), progress=ticks.append)
    assert result.samples == 6 and ticks == [1, 2, 3, 4, 5, 6]
    for n in names:
        lo, hi = result.ranges[n]
        assert lo == pytest.approx(min(seen[n][0], 0.0), rel=1e-6)
        assert hi == pytest.approx(max(seen[n][1], 0.0), rel=1e-6)
    assert result.ranges["a1"][0] == 0.0  # after Relu


def test_calib_samples_takes_the_first_n() -> None:
    result = calibrate(tiny_cnn(), iter(make_samples(10)), config=QuantConfig(calibration=CalibrationSpec(samples=3)))
    assert result.samples == 3


@pytest.mark.parametrize("bad, message", [
    ([], "empty"),
    ([{"x": np.full((1, 4, 8, 8), np.nan, np.float32)}], "NaN"),
    ([{"x": np.ones((1, 4, 8, 8), np.float64)}], "dtype"),
    ([{"x": np.ones((1, 3, 8, 8), np.float32)}], "shape"),
    ([{"input": np.ones((1, 4, 8, 8), np.float32)}], "inputs"),
    (["not a mapping"], "mapping"),
])
def test_bad_calibration_data_is_an_input_error(bad, message: str) -> None:
    with pytest.raises(InputError, match=message):
        calibrate(tiny_cnn(), bad, config=QuantConfig())


def test_fewer_samples_than_asked_is_an_input_error() -> None:
    with pytest.raises(InputError, match="only 2"):
        calibrate(tiny_cnn(), make_samples(2), config=QuantConfig(calibration=CalibrationSpec(samples=5)))


def test_int16_nodes_must_exist() -> None:
    with pytest.raises(InputError, match="not in the model"):
        calibrate(tiny_cnn(), make_samples(1), config=QuantConfig(scheme=Scheme(int16_nodes=("nope",))))


def test_channel_statistics() -> None:
    model = tiny_cnn()
    samples = make_samples(3)
    stats = channel_statistics(model, ["c1"], samples)["c1"]
    values = np.concatenate([v["c1"] for v in observe(model, ["c1"], samples)])
    flat = np.moveaxis(values, 1, 0).reshape(8, -1)
    np.testing.assert_allclose(stats.mean, flat.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.std, flat.std(1), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(stats.max, flat.max(1), rtol=1e-6)


@pytest.mark.parametrize("method", ["auto", "minmax", "entropy", "mse", "percentile"])
def test_calibration_fed_in_two_parts_is_one_pass(method) -> None:
    """auto's method choice reads the ranges of the first samples, then the same observers take the rest: the ranges
    (every method's, for auto) are those of one pass over all samples, exactly."""
    model = tiny_cnn(spread=0.5)
    samples = make_samples(10, seed=3)
    config = QuantConfig(calibration=CalibrationSpec(method=method))
    ticks: list[int] = []
    parts = Calibration(model, config).feed(samples, stop=7)
    first = parts.result()
    assert first.samples == 7 and first.ranges == calibrate(model, samples[:7], config=config).ranges
    whole = parts.feed(samples, start=7, stop=10, progress=ticks.append).result()
    once = calibrate(model, samples, config=config)
    assert ticks == [8, 9, 10] and whole.samples == once.samples == 10
    assert whole.ranges == once.ranges and whole.candidates == once.candidates
    if method == "auto":
        for name in ("entropy", "mse"):  # the method chosen later reads the same ranges as calibrating with it alone
            alone = QuantConfig(calibration=CalibrationSpec(method=name))
            assert whole.with_method(name).ranges == calibrate(model, samples, config=alone).ranges
    with pytest.raises(ValueError, match="the next must start at 10"):
        parts.feed(samples, start=8)


@pytest.mark.parametrize("method", ["minmax", "mse", "auto"])
def test_a_returned_sigmoid_spans_its_whole_range_whatever_was_observed(method) -> None:
    """Calibration that never saw a positive class logit (no object in its images) would cap every confident score
    at 0.5: a sigmoid the model returns keeps [-6, 6] on its input; one inside the model (a SiLU, read by the Mul
    too) keeps what was observed."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Conv", ["x", "w"], ["logits"], name="head"),
             helper.make_node("Sigmoid", ["logits"], ["gate"], name="silu_sigmoid"),
             helper.make_node("Mul", ["logits", "gate"], ["silu"], name="silu"),
             helper.make_node("Reshape", ["logits", "shape"], ["flat"], name="flatten"),
             helper.make_node("Sigmoid", ["flat"], ["scores"], name="scores")]
    graph = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 32]),
                               helper.make_tensor_value_info("silu", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor("w", TensorProto.FLOAT, [2, 2, 1, 1], [1.0, 0.0, 0.0, 1.0]),
                               helper.make_tensor("shape", TensorProto.INT64, [2], [1, 32])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    samples = [{"x": -rng.uniform(1.0, 9.0, (1, 2, 4, 4)).astype(np.float32)} for _ in range(6)]  # background only
    ranges = calibrate(model, samples, config=QuantConfig(calibration=CalibrationSpec(method=method))).ranges
    # the returned sigmoid's input, and before it (logits, read by the SiLU too: the returned sigmoid decides)
    assert ranges["flat"][1] >= 6.0 and ranges["logits"][1] >= 6.0

    inside = helper.make_model(helper.make_graph(nodes[:3], "silu", graph.input, [graph.output[1]], graph.initializer),
                               opset_imports=[helper.make_opsetid("", 17)])
    lo, hi = calibrate(inside, samples, config=QuantConfig()).ranges["logits"]
    assert hi <= 0.0 and lo >= -9.0  # observed: the SiLU's input grid is not widened
