from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import npukit.quant.calibration.calibrate as calibrate_module
from npukit.quant.calibration.auto import split_samples
from npukit.quant.calibration.calibrate import calibrate, make_observer
from npukit.quant.calibration.observers import RANGE_METHODS, MultiObserver
from npukit.quant.config import AdaRound, CalibrationSpec, QuantConfig, Recipe, from_flat
from npukit.quant.layer_sqnr import sqnr_db
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, outputs, tiny_cnn


def _outlier_model(kind: str) -> onnx.ModelProto:
    """x[1,4,32,32] -> depthwise 1x1 Conv (x1.5) -> Relu -> depthwise 1x1 Conv (x0.5) -> y  (kind="relu": rare
    large inputs carry the output) or x -> Exp -> depthwise 1x1 Conv (x1, -2) -> Sigmoid -> y  (kind="exp": Exp
    stretches rare inputs into huge values that the Sigmoid saturates)."""
    def depthwise(name: str, src: str, dst: str, scale: float, shift: float) -> onnx.NodeProto:
        inits.extend([numpy_helper.from_array(np.full((4, 1, 1, 1), scale, np.float32), f"{name}_w"),
                      numpy_helper.from_array(np.full(4, shift, np.float32), f"{name}_b")])
        return helper.make_node("Conv", [src, f"{name}_w", f"{name}_b"], [dst], name=name, group=4)

    inits: list[onnx.TensorProto] = []
    if kind == "relu":
        nodes = [depthwise("conv1", "x", "c", 1.5, 0.0), helper.make_node("Relu", ["c"], ["a"], name="relu"),
                 depthwise("conv2", "a", "y", 0.5, 0.0)]
    else:
        nodes = [helper.make_node("Exp", ["x"], ["e"], name="exp"), depthwise("conv", "e", "d", 1.0, -2.0),
                 helper.make_node("Sigmoid", ["d"], ["y"], name="sigmoid")]
    graph = helper.make_graph(nodes, "outliers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 32, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _outlier_samples(n: int, *, scale: float, outlier: float, seed: int = 3) -> list[dict[str, np.ndarray]]:
    """Gaussian background of std ``scale`` with one element per sample set to ``outlier``."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        x = (rng.standard_normal((1, 4, 32, 32)) * scale).astype(np.float32)
        x.flat[rng.integers(x.size)] = outlier
        samples.append({"x": x})
    return samples


def _sqnr(model: onnx.ModelProto, quant: onnx.ModelProto, samples: list[dict[str, np.ndarray]]) -> float:
    ref, got = outputs(model, samples).astype(np.float64), outputs(quant, samples).astype(np.float64)
    return sqnr_db(float(np.sum(ref ** 2)), float(np.sum((ref - got) ** 2)))


def test_multi_observer_answers_every_method_like_the_dedicated_observer() -> None:
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(3000).astype(np.float32) * s for s in (1.0, 3.0, 0.5)]
    data[1][7] = 60.0
    for extra in ({}, {"symmetric_activations": True, "activation_dtype": "int8"}):
        multi = make_observer(from_flat(method="auto", percentile=99.9, num_bins=512, **extra))
        assert isinstance(multi, MultiObserver)
        dedicated = {m: make_observer(from_flat(method=m, percentile=99.9, num_bins=512, **extra))
                     for m in RANGE_METHODS}
        for x in data:
            multi.update(x)
            for obs in dedicated.values():
                obs.update(x)
        ranges = multi.ranges()
        assert list(ranges) == list(RANGE_METHODS)
        for method, obs in dedicated.items():
            assert ranges[method] == pytest.approx(obs.range(), rel=1e-6, abs=1e-9), method
        assert ranges["percentile"][1] < ranges["minmax"][1] / 2  # the outlier is clipped


def test_calibrate_auto_gives_every_method_from_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = calibrate_module.observe
    monkeypatch.setattr(calibrate_module, "observe", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = tiny_cnn()
    samples = make_samples(6)
    auto = calibrate(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="auto")))
    assert len(calls) == 1 and auto.samples == 6 and set(auto.candidates) == set(RANGE_METHODS)
    for method in RANGE_METHODS:
        single = calibrate(model, samples, config=QuantConfig(calibration=CalibrationSpec(method=method)))
        assert set(auto.candidates[method]) == set(single.ranges)
        for name, r in single.ranges.items():
            assert auto.candidates[method][name] == pytest.approx(r, rel=1e-6, abs=1e-9), (method, name)
    assert auto.ranges == auto.candidates["minmax"]
    assert auto.with_method("mse").ranges == auto.candidates["mse"]
    # graph input and output keep min-max whatever the method
    assert all(auto.candidates[m]["x"] == auto.candidates["minmax"]["x"] for m in RANGE_METHODS)


def test_split_holds_out_the_last_quarter() -> None:
    assert (split_samples(16).calibration, split_samples(16).held_out_start, split_samples(16).note) == (12, 12, "")
    assert (split_samples(8).calibration, split_samples(8).held_out) == (6, 2)
    small = split_samples(3)
    assert (small.calibration, small.held_out_start, small.held_out) == (3, 2, 1) and "only 3" in small.note


def test_auto_keeps_minmax_when_rare_large_values_carry_the_output() -> None:
    model = _outlier_model("relu")
    samples = _outlier_samples(16, scale=0.05, outlier=100.0)
    result = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="auto", percentile=99.9)))
    auto = result.steps.auto
    assert set(auto["candidates"]) == set(RANGE_METHODS)
    assert auto["chosen"] == "minmax" and result.steps.calibration["chosen"] == "minmax"
    assert (auto["calibration_samples"], auto["held_out_samples"]) == (12, 4)
    scores = auto["candidates"]
    assert scores["minmax"] > max(scores["percentile"], scores["entropy"]) + 10.0, auto
    assert scores["minmax"] >= scores["mse"]  # MSE weighs the outliers' error too, and may keep them
    onnx.checker.check_model(result.model)
    held = _outlier_samples(6, scale=0.05, outlier=100.0, seed=9)
    assert _sqnr(model, result.model, held) > 20.0


def test_auto_clips_when_outliers_waste_the_range() -> None:
    model = _outlier_model("exp")
    samples = _outlier_samples(16, scale=1.0, outlier=7.0)
    result = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="auto", percentile=99.9)))
    auto = result.steps.auto
    scores = auto["candidates"]
    assert auto["chosen"] != "minmax" and scores[auto["chosen"]] == max(scores.values())
    assert scores[auto["chosen"]] > scores["minmax"] + 10.0, auto
    minmax = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="minmax")))
    held = _outlier_samples(6, scale=1.0, outlier=7.0, seed=9)
    assert _sqnr(model, result.model, held) > _sqnr(model, minmax.model, held) + 10.0
    # once chosen (on 12 samples, scored on the other 4), the method's ranges come from all 16: the same as
    # calibrating with the chosen method alone
    alone = calibrate(model, samples,
                      config=QuantConfig(calibration=CalibrationSpec(method=auto["chosen"], percentile=99.9)))
    assert set(result.ranges) == set(alone.ranges)
    for name, r in alone.ranges.items():
        assert result.ranges[name] == pytest.approx(r, rel=1e-6, abs=1e-9), name


def test_auto_composes_with_cle_adaround_and_bias_correction(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = calibrate_module.MultiObserver.update
    monkeypatch.setattr(calibrate_module.MultiObserver, "update", lambda self, x: calls.append(1) or real(self, x))
    model = tiny_cnn(spread=0.5)
    samples = make_samples(8)
    config = QuantConfig(calibration=CalibrationSpec(method="auto"),
                         recipe=Recipe(cle=True, bias_correction=True, adaround=AdaRound(iterations=20)))
    result = quantize(model, samples, config=config)
    assert {"cle", "auto", "adaround", "bias_correction"} <= set(result.steps.ran())
    assert result.steps.ran() == ["cle", "float_fragile", "auto", "calibration", "adaround", "bias_correction",
                                  "plan", "float_convs"]
    tensors = result.steps.calibration["tensors"]
    interior = tensors - 2  # graph input and output use min-max observers
    # one pass over all 8 samples, one histogram per tensor: the 6 calibration samples for the choice, then the 2
    # held-out ones added to the same histograms for the chosen method's final ranges
    assert len(calls) == interior * 8
    onnx.checker.check_model(result.model)
    held = make_samples(8, seed=5)
    assert _sqnr(model, result.model, held) > 20.0


def test_few_samples_calibrate_on_all_with_a_note() -> None:
    result = quantize(tiny_cnn(), make_samples(4), config=QuantConfig(calibration=CalibrationSpec(method="auto")))
    auto = result.steps.auto
    assert (auto["calibration_samples"], auto["held_out_samples"]) == (4, 1) and "only 4" in auto["note"]
    assert result.steps.calibration["samples"] == 4


@pytest.mark.parametrize("bias_correction", [False, True])
def test_auto_scores_candidates_bias_corrected_when_the_final_model_is(monkeypatch, bias_correction) -> None:
    """With bias correction asked, every candidate is bias-corrected on the calibration part only (the held-out
    samples score it), all in one pass, then the chosen one once more on all samples; without it, no candidate is.
    The one pass gives each candidate the correction ``correct_bias`` gives it alone."""
    import npukit.quant.qdq as qdq_module

    calls: list[tuple[int | None, int]] = []
    real_each, real = qdq_module.correct_bias_each, qdq_module.correct_bias
    made: dict[str, onnx.ModelProto] = {}

    def counting_each(model, samples, *, plans, limit, **kwargs):
        calls.append((limit, len(plans)))
        out = real_each(model, samples, plans=plans, limit=limit, **kwargs)
        for key, one in plans.items():  # the shared pass against each plan alone
            alone = real(model, samples, plan=one, limit=limit, **kwargs)
            assert set(alone.shifts) == set(out[key].shifts)
            for node, shift in alone.shifts.items():
                np.testing.assert_array_equal(out[key].shifts[node], shift)
            made[key] = out[key].model
        return out

    def counting(model, samples, *, plan, limit, **kwargs):
        calls.append((limit, 1))
        return real(model, samples, plan=plan, limit=limit, **kwargs)

    monkeypatch.setattr(qdq_module, "correct_bias_each", counting_each)
    monkeypatch.setattr(qdq_module, "correct_bias", counting)
    result = quantize(tiny_cnn(spread=0.5), make_samples(16),
                      config=QuantConfig(calibration=CalibrationSpec(method="auto"),
                                         recipe=Recipe(bias_correction=bias_correction)))
    candidates = len(RANGE_METHODS) - len(result.steps.auto["identical_ranges"])
    split = split_samples(16)
    assert calls == ([(split.calibration, candidates), (None, 1)] if bias_correction else [])
    assert len(made) == (candidates if bias_correction else 0)
