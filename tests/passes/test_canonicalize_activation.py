"""CanonicalizeActivationPass: Relu, Clip, HardSwish and GlobalAveragePool spellings become the single ops."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper, helper

from npukit.passes.canonicalize_activation import CanonicalizeActivationPass

from .tiny import apply, assert_equivalent, const, info, make_model, op_types

SHAPE = [2, 3, 4, 4]


def _model(nodes: list, inits: list, *, opset: int = 17, out_shape: list | None = None):
    return make_model(nodes, [info("x", SHAPE)], [info("y", out_shape or SHAPE)], inits, opset=opset)


def _run(model, expected: list[str], *, scale: float = 4.0) -> CanonicalizeActivationPass:
    pass_ = CanonicalizeActivationPass()
    out = apply(pass_, model)
    assert op_types(out) == expected
    assert pass_.rewrites == 1
    assert_equivalent(model, out, rtol=1e-6, scale=scale)
    return pass_


def test_max_zero_becomes_relu() -> None:
    _run(_model([helper.make_node("Max", ["x", "zero"], ["y"])], [const("zero", 0.0)]), ["Relu"])


@pytest.mark.parametrize("form", ["min_max", "max_min", "min_relu"])
def test_min_max_becomes_clip_with_initializer_bounds(form: str) -> None:
    nodes = {
        "min_max": [helper.make_node("Max", ["x", "zero"], ["t"]), helper.make_node("Min", ["t", "six"], ["y"])],
        "max_min": [helper.make_node("Min", ["six", "x"], ["t"]), helper.make_node("Max", ["t", "zero"], ["y"])],
        "min_relu": [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Min", ["t", "six"], ["y"])],
    }[form]
    model = _model(nodes, [const("zero", 0.0), const("six", 6.0)])
    pass_ = CanonicalizeActivationPass()
    out = apply(pass_, model)
    assert op_types(out) == ["Clip"]
    bounds = {t.name: float(numpy_helper.to_array(t)) for t in out.graph.initializer}
    _, lo_name, hi_name = out.graph.node[0].input
    assert (bounds[lo_name], bounds[hi_name]) == (0.0, 6.0)
    assert_equivalent(model, out, rtol=0.0, scale=4.0)


@pytest.mark.parametrize("with_inf_max", [False, True])
def test_clip_zero_to_inf_becomes_relu(with_inf_max: bool) -> None:
    inputs = ["x", "zero", "inf"] if with_inf_max else ["x", "zero"]
    _run(_model([helper.make_node("Clip", inputs, ["y"])], [const("zero", 0.0), const("inf", np.inf)]), ["Relu"])


def _relu6_plus3(x: str, out: str) -> list:
    return [helper.make_node("Add", [x, "three"], [out + "_shift"]),
            helper.make_node("Clip", [out + "_shift", "zero", "six"], [out])]


HS_CONSTS = [const("three", 3.0), const("zero", 0.0), const("six", 6.0), const("sixth", 1 / 6)]


@pytest.mark.parametrize("form", ["div_outside", "mul_sixth_outside", "div_inside", "mul_sixth_inside"])
def test_x_times_relu6_over_six_becomes_hardswish(form: str) -> None:
    nodes = _relu6_plus3("x", "r")
    if form == "div_outside":
        nodes += [helper.make_node("Mul", ["x", "r"], ["p"]), helper.make_node("Div", ["p", "six"], ["y"])]
    elif form == "mul_sixth_outside":
        nodes += [helper.make_node("Mul", ["r", "x"], ["p"]), helper.make_node("Mul", ["sixth", "p"], ["y"])]
    elif form == "div_inside":
        nodes += [helper.make_node("Div", ["r", "six"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["r", "sixth"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    _run(_model(nodes, HS_CONSTS), ["HardSwish"])


def test_x_times_hardsigmoid_becomes_hardswish() -> None:
    model = _model([helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5),
                    helper.make_node("Mul", ["x", "h"], ["y"])], [])
    _run(model, ["HardSwish"])


@pytest.mark.parametrize(("opset", "axes"), [(17, [2, 3]), (18, [-1, -2])])
def test_spatial_reduce_mean_becomes_global_average_pool(opset: int, axes: list[int]) -> None:
    if opset >= 18:
        node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)
        inits = [const("axes", axes, np.int64)]
    else:
        node = helper.make_node("ReduceMean", ["x"], ["y"], axes=axes, keepdims=1)
        inits = []
    _run(_model([node], inits, opset=opset, out_shape=[2, 3, 1, 1]), ["GlobalAveragePool"], scale=1.0)


@pytest.mark.parametrize(
    ("nodes", "inits", "out_shape", "opset", "reason"),
    [
        ([helper.make_node("Max", ["x", "half"], ["y"])], [const("half", 0.5)], None, 17, "not 0: not a Relu"),
        ([helper.make_node("Max", ["x", "six"], ["t"]), helper.make_node("Min", ["t", "zero"], ["y"])],
         [const("six", 6.0), const("zero", 0.0)], None, 17, "Clip needs min <= max"),
        ([helper.make_node("HardSigmoid", ["x"], ["h"]), helper.make_node("Mul", ["x", "h"], ["y"])],
         [], None, 17, "alpha=0.2, beta=0.5 is not x/6 + 0.5"),
        ([helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1 / 6), helper.make_node("Mul", ["x", "h"], ["y"])],
         [], None, 13, "HardSwish needs opset 14"),
        ([*_relu6_plus3("x", "r"), helper.make_node("Mul", ["x", "r"], ["p"]),
          helper.make_node("Div", ["p", "five"], ["y"])], [*HS_CONSTS, const("five", 5.0)], None, 17, None),
        ([helper.make_node("Add", ["x", "two"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["r"]),
          helper.make_node("Mul", ["x", "r"], ["p"]), helper.make_node("Div", ["p", "six"], ["y"])],
         [const("two", 2.0), const("zero", 0.0), const("six", 6.0)], None, 17, "not x * Clip(x + 3, 0, 6)"),
        ([helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)], [], [2, 3], 17, "keepdims=0"),
        ([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1)], [], [2, 1, 4, 4], 17,
         "not exactly the spatial axes"),
    ],
)
def test_near_misses_are_kept_with_reason(nodes: list, inits: list, out_shape: list | None, opset: int,
                                          reason: str | None) -> None:
    model = _model(nodes, inits, opset=opset, out_shape=out_shape)
    pass_ = CanonicalizeActivationPass()
    out = apply(pass_, model)
    assert op_types(out) == op_types(model)
    assert pass_.rewrites == 0
    if reason is None:
        assert not pass_.notes
    else:
        assert any(reason in n for n in pass_.notes), pass_.notes


def test_inner_min_with_other_consumer_is_kept() -> None:
    model = make_model(
        [helper.make_node("Max", ["x", "zero"], ["t"]), helper.make_node("Min", ["t", "six"], ["y"]),
         helper.make_node("Neg", ["t"], ["z"])],
        [info("x", SHAPE)],
        [info("y", SHAPE), info("z", SHAPE)],
        [const("zero", 0.0), const("six", 6.0)],
    )
    pass_ = CanonicalizeActivationPass()
    out = apply(pass_, model)
    assert op_types(out) == ["Relu", "Min", "Neg"]  # the Max alone still becomes Relu
    assert any("other consumers" in n for n in pass_.notes)
    assert_equivalent(model, out, rtol=0.0, scale=4.0)


def test_forms_limit_the_rewrites_to_those_asked_for() -> None:
    """substitute forms only the HardSwish it rewrites: a model's Max(x, 0) and spatial ReduceMean stay as written
    (with every form they become Relu and GlobalAveragePool; on PP-OCRv4 rec that rewrote its LayerNorms' means
    and said "input rank unknown" for the ones it could not)."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=1),
             helper.make_node("HardSigmoid", ["m"], ["h"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["m", "h"], ["s"]), helper.make_node("Max", ["s", "zero"], ["y"])]
    model = _model(nodes, [const("zero", 0.0)], out_shape=[2, 3, 1, 1])
    only = CanonicalizeActivationPass(forms=("clip", "hardswish"))
    assert op_types(apply(only, model)) == ["ReduceMean", "HardSwish", "Max"] and only.rewrites == 1
    every = CanonicalizeActivationPass()
    assert op_types(apply(every, model)) == ["GlobalAveragePool", "HardSwish", "Relu"] and every.rewrites == 3
    with pytest.raises(ValueError, match="unknown forms"):
        CanonicalizeActivationPass(forms=("gelu",))
