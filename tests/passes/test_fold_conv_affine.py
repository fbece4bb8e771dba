"""FoldConvAffinePass: Mul / Add / Sub / Div by a per-channel or scalar constant after a Conv folds into it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npukit.passes.fold_conv_affine import FoldConvAffinePass

from .tiny import apply, assert_equivalent, const, constant_node, info, make_model, op_types

RNG = np.random.default_rng(11)


def _conv(bias: bool = True, group: int = 1, channels: int = 6) -> tuple[list, list]:
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    inits = [const("w", RNG.normal(size=(channels, 4 // group, 3, 3)))]
    if bias:
        inits.append(const("b", RNG.normal(size=channels)))
    return [helper.make_node("Conv", inputs, ["c"], group=group, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                             name="conv")], inits


@pytest.mark.parametrize("shape", [(), (1,), (6, 1, 1), (1, 6, 1, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_mul_then_add_fold_into_the_conv(shape: tuple, bias: bool) -> None:
    nodes, inits = _conv(bias)
    nodes += [helper.make_node("Mul", ["k", "c"], ["m"]),  # the constant first, as paddle2onnx writes it
              helper.make_node("Add", ["m", "d"], ["y"])]
    inits += [const("k", RNG.uniform(0.5, 2.0, size=shape)), const("d", RNG.normal(size=shape))]
    model = make_model(nodes, [info("x", [1, 4, 5, 5])], [info("y", [1, 6, 5, 5])], inits)
    pass_ = FoldConvAffinePass()
    out = apply(pass_, model)
    assert op_types(out) == ["Conv"]
    assert pass_.rewrites == 2
    assert out.graph.node[0].name == "conv" and out.graph.node[0].output[0] == "y"
    assert_equivalent(model, out, rtol=1e-5)


@pytest.mark.parametrize("op", ["Sub", "Div"])
def test_sub_and_div_by_a_constant_fold(op: str) -> None:
    nodes, inits = _conv(group=2)
    nodes += [helper.make_node(op, ["c", "k"], ["y"])]
    inits += [const("k", RNG.uniform(0.5, 2.0, size=(1, 6, 1, 1)))]
    model = make_model(nodes, [info("x", [1, 4, 5, 5])], [info("y", [1, 6, 5, 5])], inits)
    out = apply(FoldConvAffinePass(), model)
    assert op_types(out) == ["Conv"]
    assert_equivalent(model, out, rtol=1e-5)


def test_a_constant_node_operand_folds() -> None:
    nodes, inits = _conv()
    nodes += [constant_node("k", np.float32(1.7)), helper.make_node("Mul", ["c", "k"], ["y"])]
    model = make_model(nodes, [info("x", [1, 4, 5, 5])], [info("y", [1, 6, 5, 5])], inits)
    out = apply(FoldConvAffinePass(), model)
    assert "Mul" not in op_types(out)
    assert_equivalent(model, out, rtol=1e-5)


@pytest.mark.parametrize(("op", "first", "shape", "why"), [
    ("Sub", True, (), "the constant is the first operand"),  # c - conv: a negation, left alone
    ("Div", True, (), "the constant is the first operand"),
    ("Mul", False, (6,), "not one value per output channel"),  # broadcasts along the width
    ("Add", False, (1, 6, 6, 1), "not one value per output channel"),
])
def test_what_is_not_an_affine_per_channel_stays(op: str, first: bool, shape: tuple, why: str) -> None:
    nodes, inits = _conv()
    nodes += [helper.make_node(op, ["k", "c"] if first else ["c", "k"], ["y"])]
    inits += [const("k", RNG.uniform(0.5, 2.0, size=shape))]
    model = make_model(nodes, [info("x", [1, 4, 6, 6])], [info("y", [1, 6, 6, 6])], inits)
    pass_ = FoldConvAffinePass()
    out = apply(pass_, model)
    assert op_types(out) == ["Conv", op]
    assert any(why in note for note in pass_.notes)


def test_a_conv_read_twice_or_a_graph_output_is_kept() -> None:
    nodes, inits = _conv()
    nodes += [helper.make_node("Mul", ["c", "k"], ["y"]), helper.make_node("Relu", ["c"], ["z"])]
    inits += [const("k", 2.0)]
    model = make_model(nodes, [info("x", [1, 4, 5, 5])], [info("y", [1, 6, 5, 5]), info("z", [1, 6, 5, 5])], inits)
    assert op_types(apply(FoldConvAffinePass(), model)) == ["Conv", "Mul", "Relu"]


def test_a_shared_weight_is_not_modified() -> None:
    inits = [const("w", RNG.normal(size=(6, 4, 1, 1))), const("k", 3.0)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], name="a"), helper.make_node("Mul", ["c1", "k"], ["y1"]),
             helper.make_node("Conv", ["x", "w"], ["y2"], name="b")]
    model = make_model(nodes, [info("x", [1, 4, 5, 5])], [info("y1", [1, 6, 5, 5]), info("y2", [1, 6, 5, 5])],
                       inits)
    out = apply(FoldConvAffinePass(), model)
    assert op_types(out) == ["Conv", "Conv"]
    assert {n.name: n.input[1] for n in out.graph.node}["b"] == "w"
    assert_equivalent(model, out, rtol=1e-5)


def test_a_conv_left_alone_is_noted_once_whatever_the_sweeps() -> None:
    """A fold elsewhere makes the pass sweep again; the note on a conv it cannot fold is not repeated."""
    nodes, inits = _conv()
    nodes += [helper.make_node("Div", ["k", "c"], ["q"]),  # c / conv: left alone, noted
              helper.make_node("Conv", ["q", "w2"], ["c2"], name="second"), helper.make_node("Mul", ["c2", "s"], ["y"])]
    inits += [const("k", 2.0), const("w2", RNG.normal(size=(6, 6, 1, 1))), const("s", 0.5)]
    model = make_model(nodes, [info("x", [1, 4, 5, 5])], [info("y", [1, 6, 5, 5])], inits)
    pass_ = FoldConvAffinePass()
    out = apply(pass_, model)
    assert op_types(out) == ["Conv", "Div", "Conv"] and len(pass_.notes) == 1


@pytest.mark.parametrize("group", [1, 2])
def test_a_conv_transpose_takes_its_scale_and_shift_per_output_channel(group: int) -> None:
    """ConvTranspose's output channels are axis 1 of its weight, per group."""
    inits = [const("w", RNG.normal(size=(4, 6 // group, 2, 2))), const("b", RNG.normal(size=6)),
             const("k", RNG.uniform(0.5, 2.0, size=(1, 6, 1, 1))), const("d", RNG.normal(size=(6, 1, 1)))]
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], name="up", strides=[2, 2], group=group),
             helper.make_node("Mul", ["c", "k"], ["m"]), helper.make_node("Sub", ["m", "d"], ["y"])]
    model = make_model(nodes, [info("x", [1, 4, 5, 5])], [info("y", [1, 6, 10, 10])], inits)
    out = apply(FoldConvAffinePass(), model)
    assert op_types(out) == ["ConvTranspose"]
    assert_equivalent(model, out, rtol=1e-5)
    assert op_types(apply(FoldConvAffinePass(producers=("Conv",)), model)) == ["ConvTranspose", "Mul", "Sub"]
