"""FuseMatMulAddPass: MatMul by a constant weight (+ constant bias) on 2-D input becomes Gemm."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npukit.passes.fuse_matmul_add import FuseMatMulAddPass

from .tiny import apply, assert_equivalent, const, info, make_model, op_types

RNG = np.random.default_rng(3)


@pytest.mark.parametrize(("bias_shape", "bias_first"), [((5,), False), ((1, 5), False), ((5,), True), ((), False)])
def test_matmul_add_becomes_gemm(bias_shape: tuple, bias_first: bool) -> None:
    add_inputs = ["b", "m"] if bias_first else ["m", "b"]
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", add_inputs, ["y"])],
        [info("x", [3, 4])],
        [info("y", [3, 5])],
        [const("w", RNG.normal(size=(4, 5))), const("b", RNG.normal(size=bias_shape))],
    )
    pass_ = FuseMatMulAddPass()
    out = apply(pass_, model)
    assert op_types(out) == ["Gemm"]
    assert pass_.rewrites == 1
    assert out.graph.node[0].output[0] == "y"
    assert_equivalent(model, out, rtol=1e-5)


def test_matmul_without_add_becomes_gemm_without_bias() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        [info("x", ["n", 4])],
        [info("y", ["n", 5])],
        [const("w", RNG.normal(size=(4, 5)))],
    )
    out = apply(FuseMatMulAddPass(), model)
    assert op_types(out) == ["Gemm", "Relu"]
    assert len(out.graph.node[0].input) == 2
    assert_equivalent(model, out, rtol=1e-5)


def test_add_with_variable_operand_stays_after_gemm() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "z"], ["y"])],
        [info("x", [3, 4]), info("z", [3, 5])],
        [info("y", [3, 5])],
        [const("w", RNG.normal(size=(4, 5)))],
    )
    pass_ = FuseMatMulAddPass()
    out = apply(pass_, model)
    assert op_types(out) == ["Gemm", "Add"]
    assert any("not constant" in n for n in pass_.notes)
    assert_equivalent(model, out, rtol=1e-5)


def test_unfusable_matmuls_are_kept_with_notes() -> None:
    model = make_model(
        [
            helper.make_node("MatMul", ["x3", "w"], ["m3"]),
            helper.make_node("Add", ["m3", "b"], ["y3"]),
            helper.make_node("MatMul", ["x", "v"], ["y"]),
        ],
        [info("x3", [2, 3, 4]), info("x", [3, 4]), info("v", [4, 5])],
        [info("y3", [2, 3, 5]), info("y", [3, 5])],
        [const("w", RNG.normal(size=(4, 5))), const("b", RNG.normal(size=5))],
    )
    pass_ = FuseMatMulAddPass()
    out = apply(pass_, model)
    assert op_types(out) == ["MatMul", "Add", "MatMul"]
    assert pass_.rewrites == 0
    assert any("input rank 3: Gemm needs 2-D input" in n for n in pass_.notes)
    assert any("not a constant weight" in n for n in pass_.notes)
