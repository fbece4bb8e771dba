from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from npukit.quant.algorithms.bias_correction import correct_bias
from npukit.quant.calibration.calibrate import calibrate, observe
from npukit.quant.config import QuantConfig, Recipe, Scheme
from npukit.quant.grids import activation_qparams, fake_quantize, weight_axis
from npukit.quant.plan import Decision, TensorSpec
from npukit.quant.qdq import plan_for, quantize, scheme_plan
from tests.quant.conftest import make_samples, tiny_cnn


def _with_quantized_weights(model: onnx.ModelProto, config: QuantConfig) -> onnx.ModelProto:
    """The model with every Conv/Gemm weight replaced by Q(W): weight rounding only, activations in float."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {i.name: i for i in out.graph.initializer}
    for node in out.graph.node:
        if node.op_type in ("Conv", "Gemm"):
            w = numpy_helper.to_array(inits[node.input[1]])
            q = fake_quantize(w, scheme_plan(config).weight_spec(node.input[1], weight_axis(node, per_channel=True)))
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(q, node.input[1]))
    return out


def _channel_means(model: onnx.ModelProto, tensor: str, samples) -> np.ndarray:
    vals = np.concatenate([v[tensor] for v in observe(model, [tensor], samples)])
    return np.moveaxis(vals, 1, 0).reshape(vals.shape[1], -1).mean(axis=1)


def test_fake_quantize_matches_the_int8_grid_of_the_spec() -> None:
    w = np.array([[0.5, -1.0, 0.25], [2.0, 0.1, -0.3]], np.float32)
    q = fake_quantize(w, TensorSpec("int8", symmetric=True, axis=0, quant_min=-127))
    steps = np.array([1.0, 2.0])[:, None] / 127
    np.testing.assert_allclose(q / steps, np.round(q / steps), atol=1e-4)
    assert np.abs(q - w).max() <= steps.max() / 2 + 1e-7
    reduced = fake_quantize(w, TensorSpec("int8", symmetric=True, axis=0, quant_min=-64, quant_max=64))
    np.testing.assert_allclose(reduced * 64 / np.array([1.0, 2.0])[:, None],
                               np.round(reduced * 64 / np.array([1.0, 2.0])[:, None]), atol=1e-4)
    per_tensor = fake_quantize(w, TensorSpec("int8", symmetric=False))
    step = 3.0 / 255  # asymmetric, per tensor: [-1, 2] on 256 levels
    np.testing.assert_allclose(per_tensor / step, np.round(per_tensor / step), atol=1e-3)
    assert np.abs(per_tensor - w).max() <= step / 2 + 1e-6
    fixed = fake_quantize(w, TensorSpec.fixed_weight(np.array([0.1, 0.5]), axis=0))  # a step's own scales
    np.testing.assert_allclose(fixed, [[0.5, -1.0, 0.2], [2.0, 0.0, -0.5]], atol=1e-6)


def test_the_scheme_gives_a_weight_the_levels_ort_quantizes_it_on() -> None:
    def levels(**scheme) -> tuple:
        spec = scheme_plan(QuantConfig(**scheme)).weight_spec("w", 0)
        return spec.quant_min, spec.quant_max, spec.axis, spec.symmetric

    from npukit.quant.config import CpuKernels

    assert levels() == (-127, 127, 0, True)
    assert levels(cpu=CpuKernels(reduce_range=True)) == (-64, 64, 0, True)
    assert levels(scheme=Scheme(per_channel=False, symmetric_weights=False)) == (-128, 127, None, False)


def test_bias_correction_removes_the_shift_it_measures() -> None:
    config = QuantConfig(scheme=Scheme(per_channel=False))
    model = tiny_cnn(spread=1.0)
    samples = make_samples(8)
    result = correct_bias(model, samples, plan=scheme_plan(config))
    onnx.checker.check_model(result.model)
    assert set(result.shifts) == {"conv1", "dw", "pw", "fc"}
    float_mean = _channel_means(model, "c1", samples)
    before = _channel_means(_with_quantized_weights(model, config), "c1", samples) - float_mean
    after = _channel_means(_with_quantized_weights(result.model, config), "c1", samples) - float_mean
    np.testing.assert_allclose(before, result.shifts["conv1"], rtol=1e-4, atol=1e-6)
    assert np.abs(after).max() < 1e-5 < np.abs(before).max()


def test_bias_correction_lowers_the_mean_error_on_held_data() -> None:
    config = QuantConfig(scheme=Scheme(per_channel=False))
    model = tiny_cnn(spread=1.0, seed=3)
    result = correct_bias(model, make_samples(16), plan=scheme_plan(config))
    held = make_samples(16, seed=11)
    ref = _channel_means(model, "y", held)
    before = _channel_means(_with_quantized_weights(model, config), "y", held) - ref
    after = _channel_means(_with_quantized_weights(result.model, config), "y", held) - ref
    assert np.abs(after).mean() < 0.5 * np.abs(before).mean()


def test_with_ranges_the_input_quantization_shift_is_removed_too() -> None:
    config = QuantConfig(scheme=Scheme(per_channel=False))
    model = tiny_cnn(spread=1.0, seed=3)
    samples = make_samples(16)
    ranges = calibrate(model, samples, config=config).ranges
    result = correct_bias(model, samples, plan=plan_for(model, config, ranges))
    # conv1's input is the graph input: the shift is E[Q(W) DQ(Q(x))] - E[W x], measured here independently
    scale, zero = activation_qparams(*ranges["x"], signed=False, symmetric=False)
    x_q = [{"x": ((np.clip(np.round(s["x"] / scale) + zero, 0, 255) - zero) * scale).astype(np.float32)}
           for s in samples]
    expected = (_channel_means(_with_quantized_weights(model, config), "c1", x_q)
                - _channel_means(model, "c1", samples))
    np.testing.assert_allclose(result.shifts["conv1"], expected, rtol=1e-3, atol=1e-5)


def test_quantized_model_mean_error_drops_with_bias_correction() -> None:
    model = tiny_cnn(spread=1.0, seed=3)
    samples, held = make_samples(32), make_samples(32, seed=13)
    ref = _channel_means(model, "y", held)
    errors = []
    for bc in (False, True):
        q = quantize(model, samples, config=QuantConfig(scheme=Scheme(per_channel=False),
                                                        recipe=Recipe(bias_correction=bc))).model
        errors.append(np.abs(_channel_means(q, "y", held) - ref).mean())
    assert errors[1] < 0.7 * errors[0]


def test_reference_weights_make_the_shift_the_whole_remaining_error() -> None:
    """After a rounding step (AdaRound) the model's weights are already on the grid; measured against the original
    float weights the shift is E[Q(W~) x] - E[W x], the layer's whole remaining mean error."""
    config = QuantConfig(scheme=Scheme(per_channel=False))
    model = tiny_cnn(spread=1.0, seed=3)
    samples = make_samples(8)
    rounded = _with_quantized_weights(model, config)
    # a different rounding of conv1: one weight a grid step off
    inits = {i.name: i for i in rounded.graph.initializer}
    w1 = numpy_helper.to_array(inits["w1"]).copy()
    step = np.abs(numpy_helper.to_array(inits["w1"])).max() / 127
    w1[0, 0, 0, 0] += step
    inits["w1"].CopyFrom(numpy_helper.from_array(w1, "w1"))
    original = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name.startswith("w")}
    result = correct_bias(rounded, samples, plan=scheme_plan(config), reference_weights=original)
    expected = _channel_means(rounded, "c1", samples) - _channel_means(model, "c1", samples)
    np.testing.assert_allclose(result.shifts["conv1"], expected, rtol=1e-3, atol=1e-5)
    plain = correct_bias(rounded, samples, plan=scheme_plan(config))  # against its own weights: re-rounding alone
    assert np.abs(plain.shifts["conv1"]).max() < 1e-5 < np.abs(expected).max()


def test_the_plan_sets_each_grid_the_shift_is_measured_on() -> None:
    """A weight with its own grid in the plan (AdaRound's scales) is rounded on that grid, not on one derived from
    its range; an input the plan lifts to 16 bits is read in float; the plan's float nodes are not corrected."""
    config = QuantConfig(scheme=Scheme(per_channel=False))
    model = tiny_cnn(spread=1.0, seed=3)
    samples = make_samples(8)
    ranges = calibrate(model, samples, config=config).ranges
    plan = plan_for(model, config, ranges)
    w1 = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w1"))
    coarse = TensorSpec.fixed_weight(np.array([np.abs(w1).max() / 3]), axis=None)  # 7 levels: a large shift
    fine = correct_bias(model, samples, plan=plan).shifts["conv1"]
    on_grid = correct_bias(model, samples, plan=plan.with_spec("w1", coarse, Decision("test"))).shifts["conv1"]
    assert np.abs(on_grid - fine).max() > 10 * np.abs(fine).max()
    wide = plan.with_spec("x", plan.tensors["x"].as_dtype("uint16"), Decision("test"))
    np.testing.assert_allclose(correct_bias(model, samples, plan=wide).shifts["conv1"],
                               correct_bias(model, samples, plan=scheme_plan(config)).shifts["conv1"], atol=1e-7)
    assert "conv1" not in correct_bias(model, samples, plan=plan.keep_float(["conv1"], Decision("test"))).shifts
