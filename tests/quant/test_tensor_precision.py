from __future__ import annotations

import numpy as np
import onnx
import pytest

from npukit.errors import InputError
from npukit.quant.config import Precision, QuantConfig, Scheme
from npukit.quant.precision.sensitivity import output_sqnr
from npukit.quant.precision.tensor_precision import (TIED_OPS, TensorGain, activation_pairs, choose_tensors, scan_gains,
                                                     sixteen_bit_activations, tied_groups, without_rounding)
from npukit.quant.qdq import plan_int16, quantize
from npukit.runtime.ort import make_session
from tests.quant.conftest import make_samples, tiny_cnn


def test_activation_pairs_name_tensors_as_the_float_model_does() -> None:
    model = tiny_cnn(activation="Clip")
    built = quantize(model, make_samples(4), config=QuantConfig(scheme=Scheme(per_channel=False)))
    pairs = activation_pairs(built.model)
    produced = {o for n in built.reference.graph.node for o in n.output} | {"x"}
    assert set(pairs) <= produced and {"x", "y"} <= set(pairs)  # the graph output under its own name
    assert all(q.op_type == "QuantizeLinear" for q in pairs.values())


def test_without_rounding_keeps_the_saturation_and_drops_the_rounding() -> None:
    model = tiny_cnn(activation="Clip")
    samples = make_samples(4)
    built = quantize(model, samples, config=QuantConfig(scheme=Scheme(per_channel=False)))
    q = activation_pairs(built.model)["y"]
    values = {i.name: onnx.numpy_helper.to_array(i) for i in built.model.graph.initializer}
    scale, zero = float(values[q.input[1]]), float(values[q.input[2]])
    lo, hi = (0 - zero) * scale, (255 - zero) * scale
    unrounded = without_rounding(built.model, [q])
    onnx.checker.check_model(unrounded)
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == q.input[0] for n in unrounded.graph.node)
    names = ["y", q.input[0]]
    got = make_session(_with_output(unrounded, q.input[0]), optimization="disable")
    rounded = make_session(built.model, optimization="disable")
    for feeds in samples:
        y, pre = got.run(names, feeds)
        np.testing.assert_allclose(y, np.clip(pre, lo, hi), rtol=0, atol=1e-6)  # exact saturation, no grid
        y_q = rounded.run(["y"], feeds)[0]
        np.testing.assert_allclose(y_q, y, atol=scale / 2 + 1e-6)  # rounding moved it by at most half a step


def _with_output(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    from npukit.quant.calibration.calibrate import with_outputs
    return with_outputs(model, [name])


def test_scan_gains_one_per_candidate_and_the_rounding_removed_is_what_the_gain_measures() -> None:
    model = tiny_cnn(spread=1.0)
    samples = make_samples(8)
    built = quantize(model, samples, config=QuantConfig(scheme=Scheme(per_channel=False)))
    base, n, gains = scan_gains(built.reference, built.model, samples, limit=6)
    assert n == 6 and base > 0
    pairs = activation_pairs(built.model)
    assert {g.tensor for g in gains} == set(pairs) - {"f"}  # Flatten's output shares g's grid: one candidate
    for g in gains:
        assert g.share == pytest.approx(g.gain / base)
        tied = [pairs[g.tensor]] + ([pairs["f"]] if g.tensor == "g" else [])
        alone = output_sqnr(built.reference, without_rounding(built.model, tied), samples[:6])
        assert base - 10.0 ** (-alone / 10.0) == pytest.approx(g.gain, rel=1e-6, abs=1e-12)


def test_tied_groups_follow_ort_shared_grids() -> None:
    groups = tied_groups(tiny_cnn())
    assert groups["g"] == ["g", "f"] and groups["c3"] == ["c3"] and "f" not in groups
    assert {"Flatten", "Reshape", "MaxPool", "Transpose"} <= TIED_OPS and "Conv" not in TIED_OPS


def _gain(tensor: str, gain: float) -> TensorGain:
    return TensorGain(tensor, gain, gain)


def test_choose_tensors_most_gain_per_millisecond_within_the_budget() -> None:
    gains = [_gain("free", 0.02), _gain("cheap", 0.10), _gain("dear", 0.30), _gain("worse", -0.01),
             _gain("untimed", 0.5)]
    added = {"free": -0.01, "cheap": 0.10, "dear": 0.50, "worse": 0.0}  # "untimed" was not among the candidates
    # per ms: free 0.02 / floor 0.05 = 0.4, cheap 1.0, dear 0.6; "worse" never (its rounding helped)
    assert choose_tensors(gains, added, allowed_ms=0.55, floor_ms=0.05) == ["cheap", "free"]  # dear: 0.6 > 0.55
    assert choose_tensors(gains, added, allowed_ms=0.60, floor_ms=0.05) == ["cheap", "dear", "free"]
    assert choose_tensors(gains, added, allowed_ms=0.0, floor_ms=0.05) == ["free"]  # costs nothing measurable


def test_plan_times_its_candidates_and_stays_within_the_budget_and_quantize_builds_it() -> None:
    model = tiny_cnn(spread=1.0, activation="Clip")  # full-range per-channel weights: the 1x1 conv's int8 kernel
    samples = make_samples(12)  # saturates on CPUs without VNNI
    config = QuantConfig(scheme=Scheme(per_channel=True))
    plan = plan_int16(model, samples, config=config, budget=1.0, max_candidates=3)  # scans all 12 (< 16)
    assert plan.samples == 12 and len(plan.added_ms) <= 3
    ranked = sorted((g for g in plan.scanned if g.share >= 0.01), key=lambda g: -g.gain)[:3]
    assert list(plan.added_ms) == [g.tensor for g in ranked]  # the highest gains were timed
    assert set(plan.tensors) <= set(plan.added_ms) and not set(plan.tensors) & set(plan.dropped)
    assert plan.plan_ms <= 2.0 * plan.base_ms  # as timed together at planning
    if plan.tensors:
        assert plan.estimated_sqnr_db > plan.base_sqnr_db
    mixed = quantize(model, samples, config=QuantConfig(scheme=Scheme(per_channel=True),
                                                        precision=Precision(int16_budget=1.0)))
    chosen = mixed.steps.int16_plan["tensors"]
    groups = tied_groups(mixed.reference)
    assert sixteen_bit_activations(mixed.model) == {t for r in chosen for t in groups[r]}
    assert not sixteen_bit_activations(quantize(model, samples, config=config).model)
    summary = mixed.steps.int16_plan
    assert {c["tensor"] for c in summary["candidates"]} >= set(chosen) and summary["budget"] == 1.0


def test_lifting_the_scanned_tensors_raises_the_output_sqnr() -> None:
    model = tiny_cnn(spread=1.0, activation="Clip")
    samples, held = make_samples(12), make_samples(8, seed=4)
    config = QuantConfig(scheme=Scheme(per_channel=True))
    built = quantize(model, samples, config=config)
    _, _, gains = scan_gains(built.reference, built.model, samples, limit=12)
    top = [g.tensor for g in sorted(gains, key=lambda g: -g.gain)[:2]]
    lifted = quantize(model, samples, config=QuantConfig(scheme=Scheme(per_channel=True, int16_tensors=tuple(top))))
    assert output_sqnr(model, lifted.model, held) > output_sqnr(model, built.model, held) + 1.0


@pytest.mark.parametrize("budget", [-0.1, 1.5])
def test_bad_budget(budget) -> None:
    with pytest.raises(InputError, match="int16_budget"):
        QuantConfig(precision=Precision(int16_budget=budget))
    with pytest.raises(InputError, match="int16 budget"):
        plan_int16(tiny_cnn(), make_samples(2), config=QuantConfig(), budget=budget)


def test_a_tied_output_asked_for_alone_fails_naming_the_tensor_to_lift() -> None:
    model, samples = tiny_cnn(), make_samples(4)
    with pytest.raises(InputError, match="f would stay 8-bit.*grid of g") as err:
        quantize(model, samples, config=QuantConfig(scheme=Scheme(per_channel=False, int16_tensors=("f",))))
    assert "name g instead" in err.value.hint
    lifted = quantize(model, samples, config=QuantConfig(scheme=Scheme(per_channel=False, int16_tensors=("g",))))
    assert sixteen_bit_activations(lifted.model) == {"g", "f"}
