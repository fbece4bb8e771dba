"""FoldBatchNormPass: BatchNormalization after Conv, ConvTranspose and Gemm folds into their weights."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npukit.passes.fold_batch_norm import FoldBatchNormPass

from .tiny import apply, assert_equivalent, const, info, make_model, op_types

RNG = np.random.default_rng(7)


def _bn_inits(channels: int) -> list:
    return [
        const("scale", RNG.uniform(0.5, 2.0, channels)),
        const("shift", RNG.normal(size=channels)),
        const("mean", RNG.normal(size=channels)),
        const("var", RNG.uniform(0.2, 3.0, channels)),
    ]


def _bn(x: str, y: str) -> object:
    return helper.make_node("BatchNormalization", [x, "scale", "shift", "mean", "var"], [y], epsilon=1e-3)


@pytest.mark.parametrize(
    ("op", "group", "bias", "w_shape", "out_channels"),
    [
        ("Conv", 1, True, (6, 4, 3, 3), 6),
        ("Conv", 1, False, (6, 4, 3, 3), 6),
        ("Conv", 2, True, (6, 2, 3, 3), 6),
        ("Conv", 4, False, (4, 1, 3, 3), 4),  # depthwise
        ("ConvTranspose", 1, True, (4, 6, 3, 3), 6),
        ("ConvTranspose", 2, False, (4, 3, 3, 3), 6),
    ],
)
def test_conv_batch_norm_folds(op: str, group: int, bias: bool, w_shape: tuple, out_channels: int) -> None:
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    inits = [const("w", RNG.normal(size=w_shape))] + _bn_inits(out_channels)
    if bias:
        inits.append(const("b", RNG.normal(size=out_channels)))
    out_hw = 3 if op == "Conv" else 7
    model = make_model(
        [helper.make_node(op, inputs, ["c"], group=group, kernel_shape=[3, 3]), _bn("c", "y")],
        [info("x", [1, 4, 5, 5])],
        [info("y", [1, out_channels, out_hw, out_hw])],
        inits,
    )
    pass_ = FoldBatchNormPass()
    out = apply(pass_, model)
    assert op_types(out) == [op]
    assert pass_.rewrites == 1
    assert out.graph.node[0].output[0] == "y"
    assert_equivalent(model, out, rtol=1e-5)


@pytest.mark.parametrize(("trans_b", "with_c", "beta"), [(0, True, 1.0), (1, True, 0.5), (1, False, 1.0)])
def test_gemm_batch_norm_folds(trans_b: int, with_c: bool, beta: float) -> None:
    inits = [const("w", RNG.normal(size=(5, 4) if trans_b else (4, 5)))] + _bn_inits(5)
    inputs = ["x", "w"]
    if with_c:
        inits.append(const("c", RNG.normal(size=5)))
        inputs.append("c")
    model = make_model(
        [helper.make_node("Gemm", inputs, ["g"], transB=trans_b, beta=beta, alpha=0.7), _bn("g", "h"),
         helper.make_node("Relu", ["h"], ["y"])],
        [info("x", [3, 4])],
        [info("y", [3, 5])],
        inits,
    )
    out = apply(FoldBatchNormPass(), model)
    assert op_types(out) == ["Gemm", "Relu"]
    assert_equivalent(model, out, rtol=1e-5)


def test_shared_conv_weight_is_not_modified() -> None:
    inits = [const("w", RNG.normal(size=(4, 4, 1, 1)))] + _bn_inits(4)
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]), _bn("c", "y"), helper.make_node("Conv", ["x", "w"], ["z"])],
        [info("x", [1, 4, 3, 3])],
        [info("y", [1, 4, 3, 3]), info("z", [1, 4, 3, 3])],
        inits,
    )
    out = apply(FoldBatchNormPass(), model)
    assert op_types(out) == ["Conv", "Conv"]
    assert out.graph.node[1].input[1] == "w"
    assert_equivalent(model, out, rtol=1e-5)


def test_unfoldable_batch_norms_are_kept_with_notes() -> None:
    inits = [const("w", RNG.normal(size=(4, 4, 1, 1)))] + _bn_inits(4)
    model = make_model(
        [
            helper.make_node("Conv", ["x", "w"], ["c1"]),  # c1 also feeds Relu
            _bn("c1", "y1"),
            helper.make_node("Relu", ["c1"], ["r"]),
            helper.make_node("BatchNormalization", ["r", "scale", "shift", "mean", "var"], ["y2"]),  # after Relu
            helper.make_node("Conv", ["x", "w_in"], ["c3"]),
            _bn("c3", "y3"),  # weight is a graph input
        ],
        [info("x", [1, 4, 3, 3]), info("w_in", [4, 4, 1, 1])],
        [info("y1", [1, 4, 3, 3]), info("y2", [1, 4, 3, 3]), info("y3", [1, 4, 3, 3])],
        inits,
    )
    pass_ = FoldBatchNormPass()
    out = apply(pass_, model)
    assert op_types(out).count("BatchNormalization") == 3
    assert pass_.rewrites == 0
    text = "\n".join(pass_.notes)
    assert "other consumers" in text and "from Relu" in text and "weight is not constant" in text
