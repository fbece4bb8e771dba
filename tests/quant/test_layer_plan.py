from __future__ import annotations

import pytest

from npukit.errors import InputError
from npukit.quant.config import CalibrationSpec, QuantConfig, Recipe, Scheme
from npukit.quant.precision.layer_plan import (Check, LayerOption, assignment_of, lifted, plan_layer_precision,
                                               search_order, smallest_passing)
from npukit.quant.precision.sensitivity import output_sqnr
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, tiny_cnn


def _option(node: str, precision: str, gain: float, ms: float) -> LayerOption:
    return LayerOption(node, precision, gain, gain, ms)


def test_the_order_is_gain_per_millisecond_and_a_later_option_upgrades_its_layer() -> None:
    options = [_option("a", "int16", 0.5, 1.0), _option("a", "float32", 0.1, 0.0), _option("b", "int16", 0.3, 0.2),
               _option("c", "float32", 0.0, 0.0), _option("d", "int16", -0.1, 0.1)]
    order = search_order(options, floor_ms=0.01)
    # a:float32 costs under the floor (0.1 / 0.01 = 10), b 1.5 per ms, a:int16 0.5; no gain: left out
    assert [(o.node, o.precision) for o in order] == [("a", "float32"), ("b", "int16"), ("a", "int16")]
    assert assignment_of(order[:2]) == {"a": "float32", "b": "int16"}
    assert assignment_of(order) == {"a": "int16", "b": "int16"}  # a's 16-bit option removes more: it replaces
    assert assignment_of(list(reversed(order))) == {"a": "int16", "b": "int16"}  # never downgraded


@pytest.mark.parametrize("needed", [1, 2, 3, 5, 8, 13])
def test_the_smallest_passing_size_is_found(needed: int) -> None:
    probed = []

    def check(n: int) -> bool:
        probed.append(n)
        return n >= needed

    assert smallest_passing(13, check) == needed
    assert len(probed) <= 2 * 4 + 1  # doubling then bisecting: logarithmic
    assert smallest_passing(13, lambda n: False) is None


def test_lifted_puts_layers_where_the_quantizer_reads_them() -> None:
    config = lifted(QuantConfig(scheme=Scheme(exclude=("x",))), {"a": "int16", "b": "float32"})
    assert config.scheme.int16_nodes == ("a",) and config.scheme.exclude == ("x", "b")
    with pytest.raises(InputError, match="unknown layer precision"):
        lifted(QuantConfig(), {"a": "int4"})


def _sqnr_floor(model, samples, floor: float):
    def accept(candidate) -> Check:
        value = output_sqnr(model, candidate, samples)
        return Check(value >= floor, f"{value:.2f} dB")
    return accept


def test_the_plan_lifts_layers_until_the_floor_is_met_and_builds_as_checked() -> None:
    model, samples = tiny_cnn(spread=1.0), make_samples(12)
    config = QuantConfig(scheme=Scheme(per_channel=False))
    base = output_sqnr(model, quantize(model, samples, config=config).model, samples)
    plan = plan_layer_precision(model, samples, config=config, accept=_sqnr_floor(model, samples, base + 3.0))
    assert plan.met and 1 <= len(plan.assignment) <= 5
    assert set(plan.assignment.values()) <= {"int16", "float32"}
    assert {n for n, _ in plan.sensitivity} == {"conv1", "dw", "pw", "gap", "fc"}  # not the tied Flatten
    assert len(plan.options) == 2 * 5 and plan.tried[0] == {"lifted": 0, "candidates": 0, "passed": False,
                                                                "line": f"{base:.2f} dB"}
    assert plan.tried[-1]["passed"] or any(t["passed"] for t in plan.tried)
    # the config returned builds the model that passed: the same lifts, the same function
    final = quantize(model, samples, config=plan.config, why=plan.why)
    assert output_sqnr(model, final.model, samples) >= base + 3.0
    assert plan.plan_sqnr_db >= base + 3.0 > plan.base_sqnr_db - 0.01
    lifted_steps = {d.step for n in plan.assignment for d in final.plan.float_nodes.get(n, ())}
    assert lifted_steps <= {"mixed_precision"}
    assert set(plan.timing) == {"int8", "plan", "all_16bit"} and all(v > 0 for v in plan.timing.values())


def test_nothing_is_lifted_when_the_int8_model_passes_and_an_unreachable_floor_is_not_met() -> None:
    model, samples = tiny_cnn(spread=1.0), make_samples(8)
    config = QuantConfig(scheme=Scheme(per_channel=False))
    easy = plan_layer_precision(model, samples, config=config, accept=_sqnr_floor(model, samples, 0.0))
    assert easy.met and easy.assignment == {} and [t["lifted"] for t in easy.tried] == [0]
    # every layer lifted to float32 reproduces the float model (inf dB): only a check nothing passes is unreachable
    hard = plan_layer_precision(model, samples, config=config, accept=lambda candidate: Check(False, "never"),
                                max_layers=3)
    assert not hard.met and not any(t["passed"] for t in hard.tried)
    # while nothing passes, more layers are measured (3, then 2 more) and the search runs again on all of them
    assert {t["candidates"] for t in hard.tried} == {0, 3, 5} and len(hard.options) == 2 * 5
    assert 1 <= len(hard.assignment) <= 5
    with pytest.raises(InputError, match="at least 1"):
        plan_layer_precision(model, samples, config=config, accept=_sqnr_floor(model, samples, 0.0), max_layers=0)


def test_the_search_builds_from_the_model_as_emitted_bias_correction_included() -> None:
    import numpy as np

    from npukit.quant.qdq import build_qdq
    from npukit.runtime.ort import make_session

    model, samples = tiny_cnn(spread=1.0), make_samples(8)
    config = QuantConfig(scheme=Scheme(per_channel=False), recipe=Recipe(bias_correction=True))
    built = quantize(model, samples, config=config)
    first = samples[0]
    assert not np.array_equal(make_session(built.source).run(None, first)[0],
                              make_session(built.reference).run(None, first)[0])  # the biases were corrected
    rebuilt = build_qdq(built.source, samples[0], config, built.ranges, {})
    for feeds in samples:
        want = make_session(built.model).run(None, feeds)[0]
        np.testing.assert_array_equal(make_session(rebuilt).run(None, feeds)[0], want)



@pytest.mark.parametrize("case", ["joins", "fragile"])
def test_a_candidate_keeps_every_float_node_quantize_chose(case: str) -> None:
    """The precision planners build candidates straight from the ranges (``build_qdq``) with the config
    ``keep_decided_floats`` gives: the float head, the float joins and squares and the fragile depthwise convs that
    ``quantize`` chose stay float there too, so the candidate without lifts is the model quantize built."""
    import numpy as np

    from npukit.quant.qdq import build_qdq, decided_floats, keep_decided_floats
    from npukit.runtime.ort import make_session
    from tests.quant import test_fragile, test_joins

    if case == "joins":
        model, samples, config = test_joins._detector_head(), test_joins._samples(), QuantConfig()
    else:
        model, samples = test_fragile._net(300.0), test_fragile._samples(8, 1)
        config = QuantConfig(calibration=CalibrationSpec(method="minmax"))
    built = quantize(model, samples, config=config)
    chosen = decided_floats(built)
    assert chosen and {d.step for d in chosen.values()} == {"float_joins" if case == "joins" else "float_fragile"}
    rebuilt = build_qdq(built.source, samples[0], keep_decided_floats(config, built), built.ranges, {})
    for feeds in samples:
        np.testing.assert_array_equal(make_session(rebuilt).run(None, feeds)[0],
                                      make_session(built.model).run(None, feeds)[0])
