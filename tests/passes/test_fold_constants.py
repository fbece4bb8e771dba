"""FoldConstantsPass: constant subgraphs and Constant nodes end up as initializers; the rest stays with a note."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from npukit.passes.fold_constants import FoldConstantsPass

from .tiny import apply, assert_equivalent, const, constant_node, info, make_model, op_types


def test_constant_subgraph_becomes_one_initializer() -> None:
    model = make_model(
        [
            constant_node("a", np.arange(3, dtype=np.float32)),
            constant_node("b", np.full(3, 0.5, dtype=np.float32)),
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("Mul", ["s", "w"], ["t"]),
            helper.make_node("Mul", ["x", "t"], ["y"]),
        ],
        [info("x", [2, 3])],
        [info("y", [2, 3])],
        [const("w", [2.0, 3.0, 4.0])],
    )
    pass_ = FoldConstantsPass()
    out = apply(pass_, model)
    assert op_types(out) == ["Mul"]
    assert pass_.rewrites == 4
    (folded,) = [t for t in out.graph.initializer if t.name == out.graph.node[0].input[1]]
    np.testing.assert_array_equal(numpy_helper.to_array(folded), np.array([1.0, 4.5, 10.0], dtype=np.float32))
    assert_equivalent(model, out, rtol=0.0)


def test_constant_node_is_lifted_to_initializer() -> None:
    model = make_model(
        [constant_node("c", np.array([1.0, -2.0], dtype=np.float32)), helper.make_node("Add", ["x", "c"], ["y"])],
        [info("x", [2])],
        [info("y", [2])],
    )
    out = apply(FoldConstantsPass(), model)
    assert op_types(out) == ["Add"]
    assert [t.name for t in out.graph.initializer] == ["c"]
    assert_equivalent(model, out, rtol=0.0)


def test_shape_computation_folds_with_static_input() -> None:
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Gather", ["shape", "index"], ["batch"], axis=0),
            helper.make_node("Unsqueeze", ["batch", "zero"], ["batch1"]),
            helper.make_node("Concat", ["batch1", "minus_one"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["y"]),
        ],
        [info("x", [2, 3, 4])],
        [info("y", [2, 12])],
        [const("index", 0, np.int64), const("zero", [0], np.int64), const("minus_one", [-1], np.int64)],
    )
    out = apply(FoldConstantsPass(), model)
    assert op_types(out) == ["Reshape"]
    assert_equivalent(model, out, rtol=0.0)


def test_kept_nodes_are_explained() -> None:
    model = make_model(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["filled"],
                             value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
            helper.make_node("Add", ["x", "filled"], ["y"]),
            helper.make_node("Add", ["x", "overridable"], ["z"]),
            constant_node("k", np.ones(2, dtype=np.float32)),
        ],
        [info("x", [2]), info("overridable", [2])],
        [info("y", [2]), info("z", [2]), info("k", [2])],
        [const("shape", [2], np.int64), const("overridable", [5.0, 6.0])],
    )
    pass_ = FoldConstantsPass()
    out = apply(pass_, model)
    assert op_types(out) == ["ConstantOfShape", "Add", "Add", "Constant"]
    assert pass_.rewrites == 0
    assert any("ConstantOfShape" in n for n in pass_.notes)
    assert any("Constant" in n and "graph output" in n for n in pass_.notes)
    assert_equivalent(model, out, rtol=0.0)
