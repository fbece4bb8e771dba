from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from npukit.measure.compare import compare_outputs
from npukit.quant.algorithms.equalize import _ranges, equalize
from tests.quant.conftest import make_samples, outputs, tiny_cnn


def _weight(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


@pytest.mark.parametrize("activation", ["Relu", "LeakyRelu", "PRelu"])
def test_cle_through_relu_is_exact_and_equalizes_ranges(activation: str) -> None:
    model = tiny_cnn(activation=activation, spread=1.0)
    result = equalize(model, absorb_high_bias=False)
    onnx.checker.check_model(result.model)
    assert [n.op_type for n in result.model.graph.node] == [n.op_type for n in model.graph.node]
    assert {(p["conv1"], p["conv2"]) for p in result.pairs} == {("conv1", "dw"), ("dw", "pw")}
    for p in result.pairs:
        assert p["range_spread_after"] < p["range_spread_before"] / 2
    # at convergence each channel's range is the same in both convs of every pair
    for w1, w2, dw in [("w1", "w2", True), ("w2", "w3", False)]:
        r1, r2 = _ranges(_weight(result.model, w1), _weight(result.model, w2), dw)
        np.testing.assert_allclose(r1, r2, rtol=1e-3)
    held = make_samples(4, seed=7)
    errors = compare_outputs(list(outputs(model, held)), list(outputs(result.model, held)))
    assert errors.max_rel < 1e-5
    # the depthwise conv's weights changed, and the input model did not
    assert not np.allclose(_weight(result.model, "w2"), _weight(model, "w2"))
    assert np.array_equal(_weight(model, "w2"), _weight(tiny_cnn(activation=activation, spread=1.0), "w2"))


def test_cle_through_clip_needs_data_and_is_exact_on_it() -> None:
    model = tiny_cnn(activation="Clip", spread=1.0)
    without = equalize(model)
    assert not without.pairs and all("calibration data" in s["reason"] for s in without.skipped)
    samples = make_samples(8)
    result = equalize(model, samples=samples, absorb_high_bias=False)
    assert len(result.pairs) == 2
    assert any(p["range_spread_after"] < p["range_spread_before"] for p in result.pairs)
    errors = compare_outputs(list(outputs(model, samples)), list(outputs(result.model, samples)))
    assert errors.max_rel < 1e-5
    onnx.checker.check_model(result.model)


def test_high_bias_absorption_lowers_the_bias_and_keeps_outputs() -> None:
    model = tiny_cnn(activation="Relu", spread=0.5)
    b2 = next(i for i in model.graph.initializer if i.name == "b2")
    b2.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(b2) + np.float32(6.0), "b2"))  # a high bias
    samples = make_samples(8)
    plain = equalize(model, samples=samples, absorb_high_bias=False)
    absorbed = equalize(model, samples=samples, absorb_high_bias=True)
    assert "dw" in absorbed.absorbed and absorbed.absorbed["dw"] > 0  # dw -> pw: pw has no padding
    assert "conv1" not in absorbed.absorbed  # conv1 -> dw: dw is padded, so nothing moves
    assert (_weight(absorbed.model, "b2") <= _weight(plain.model, "b2") + 1e-7).all()
    held = make_samples(8, seed=9)
    errors = compare_outputs(list(outputs(model, held)), list(outputs(absorbed.model, held)))
    # exact only where the pre-activation stays above what is moved: on held-out data a few border pixels do not
    assert errors.max_rel < 5e-3
    # what is moved never exceeds the smallest pre-activation seen, so on the calibration data itself it is exact
    on_calibration = compare_outputs(list(outputs(model, samples)), list(outputs(absorbed.model, samples)))
    assert on_calibration.max_rel < 1e-5
