from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from npukit.errors import InputError
from npukit.quant.adaround import adaround
from npukit.quant.calibrate import calibrate
from npukit.quant.config import QuantConfig
from npukit.quant.layer_sqnr import sqnr_db
from npukit.quant.qdq import effective_ranges, integer_kernel_report, preprocess, quantize
from tests.quant.conftest import make_samples, outputs, tiny_cnn

ITERATIONS = 300


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return sqnr_db(float(np.sum(ref.astype(np.float64) ** 2)), float(np.sum((ref - got).astype(np.float64) ** 2)))


@pytest.fixture(scope="module")
def setup():
    model = preprocess(tiny_cnn(spread=0.5))
    samples = make_samples(24)
    config = QuantConfig(reduce_range=True, adaround=True, adaround_iterations=ITERATIONS)
    ranges = effective_ranges(model, calibrate(model, samples, config=config).ranges, config)
    result = adaround(model, samples, config=config, ranges=ranges)
    return model, samples, config, ranges, result


def test_learned_rounding_reconstructs_each_layer_at_least_as_well_as_nearest(setup) -> None:
    _, _, _, _, result = setup
    assert {r["node"] for r in result.layers} == {"conv1", "dw", "pw", "fc"} and result.skipped == []
    assert all(r["mse_adaround"] <= r["mse_nearest"] for r in result.layers)
    assert any(r["flipped"] > 0 and r["mse_adaround"] < r["mse_nearest"] for r in result.layers)


def test_weights_are_on_the_7_bit_grid_and_ort_reproduces_the_integers(setup) -> None:
    model, samples, config, _, result = setup
    qdq = quantize(tiny_cnn(spread=0.5), samples, config=config)
    assert qdq.steps["adaround"]["layers"] == 4
    onnx.checker.check_model(qdq.model)
    assert integer_kernel_report(qdq.model)["integer_fraction"] == 1.0
    q_inits = {i.name: numpy_helper.to_array(i) for i in qdq.model.graph.initializer}
    learned = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    for name, entry in result.weight_overrides.items():
        scales = np.array([e["scale"] for e in entry], np.float32)
        w = learned[name]
        shape = (-1,) + (1,) * (w.ndim - 1) if entry[0].get("axis", 0) == 0 else (1, -1)
        ints = w / scales.reshape(shape)
        np.testing.assert_allclose(ints, np.round(ints), atol=1e-3)  # exactly on the grid
        assert np.abs(np.round(ints)).max() == 64  # 7-bit, and the range-setting element is kept
        stored = q_inits[name + "_quantized"].astype(np.int64)
        np.testing.assert_array_equal(stored, np.round(ints).astype(np.int64))
        np.testing.assert_allclose(q_inits[name + "_scale"].reshape(-1), scales, rtol=0)


def test_adaround_improves_the_quantized_model_on_held_data() -> None:
    """With 16-bit activations the 7-bit weight rounding dominates the error: learned rounding must beat nearest.
    (With 8-bit activations on this random-input CNN it does not: measured 32.4 -> 31.9 dB, see the report.)"""
    model = tiny_cnn(spread=0.5)
    samples, held = make_samples(24), make_samples(16, seed=9)
    wide = tuple(n.name for n in model.graph.node)
    ref = outputs(model, held)
    plain = quantize(model, samples, config=QuantConfig(reduce_range=True, int16_nodes=wide))
    learned = quantize(model, samples, config=QuantConfig(reduce_range=True, int16_nodes=wide, adaround=True,
                                                          adaround_iterations=ITERATIONS))
    assert _sqnr(ref, outputs(learned.model, held)) > _sqnr(ref, outputs(plain.model, held)) + 0.3


def test_adaround_rejects_asymmetric_weights_and_bad_counts() -> None:
    with pytest.raises(InputError, match="symmetric"):
        QuantConfig(adaround=True, symmetric_weights=False)
    with pytest.raises(InputError, match="adaround_iterations"):
        QuantConfig(adaround=True, adaround_iterations=0)
