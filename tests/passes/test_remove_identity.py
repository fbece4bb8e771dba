"""RemoveIdentityPass: Identity, inference Dropout and no-op Reshape/Flatten disappear; graph outputs keep their names."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from npukit.passes.remove_identity import RemoveIdentityPass

from .tiny import apply, assert_equivalent, const, info, make_model, op_types


def test_identity_inside_graph_is_removed() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["i"]),
         helper.make_node("Sigmoid", ["i"], ["y"])],
        [info("x", [2, 3])],
        [info("y", [2, 3])],
    )
    pass_ = RemoveIdentityPass()
    out = apply(pass_, model)
    assert op_types(out) == ["Relu", "Sigmoid"]
    assert pass_.rewrites == 1
    assert_equivalent(model, out, rtol=0.0)


def test_identity_producing_graph_output_keeps_output_name() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"]),
         helper.make_node("Neg", ["r"], ["z"])],
        [info("x", [2, 3])],
        [info("y", [2, 3]), info("z", [2, 3])],
    )
    out = apply(RemoveIdentityPass(), model)
    assert op_types(out) == ["Relu", "Neg"]
    assert [o.name for o in out.graph.output] == ["y", "z"]
    assert out.graph.node[0].output[0] == "y"
    assert_equivalent(model, out, rtol=0.0)


def test_identity_that_cannot_go_is_kept_with_note() -> None:
    model = make_model(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("Identity", ["r"], ["r_copy"])],
        [info("x", [2])],
        [info("y", [2]), info("r", [2]), info("r_copy", [2])],
    )
    pass_ = RemoveIdentityPass()
    out = apply(pass_, model)
    assert op_types(out) == ["Identity", "Relu", "Identity"]
    assert pass_.rewrites == 0
    assert len(pass_.notes) == 2
    assert "graph input" in pass_.notes[0] and "already a graph output" in pass_.notes[1]


def test_inference_dropout_is_removed() -> None:
    model = make_model(
        [helper.make_node("Dropout", ["x", "ratio"], ["d1"]),
         helper.make_node("Dropout", ["d1", "ratio", "train"], ["d2", "unused_mask"]),
         helper.make_node("Relu", ["d2"], ["y"])],
        [info("x", [4, 5])],
        [info("y", [4, 5])],
        [const("ratio", 0.5), const("train", False, np.bool_)],
    )
    pass_ = RemoveIdentityPass()
    out = apply(pass_, model)
    assert op_types(out) == ["Relu"]
    assert pass_.rewrites == 2
    assert_equivalent(model, out, rtol=0.0)


def test_dropout_kept_when_mask_used_or_training() -> None:
    model = make_model(
        [helper.make_node("Dropout", ["x"], ["d", "mask"]),
         helper.make_node("Dropout", ["x", "ratio", "train"], ["t"])],
        [info("x", [4, 5])],
        [info("d", [4, 5]), info("mask", [4, 5], TensorProto.BOOL), info("t", [4, 5])],
        [const("ratio", 0.5), const("train", True, np.bool_)],
    )
    pass_ = RemoveIdentityPass()
    out = apply(pass_, model)
    assert op_types(out) == ["Dropout", "Dropout"]
    assert any("mask output is used" in n for n in pass_.notes)
    assert any("training_mode is true" in n for n in pass_.notes)


def test_noop_reshape_and_flatten_removed_real_ones_kept() -> None:
    model = make_model(
        [helper.make_node("Reshape", ["x", "same"], ["a"]),
         helper.make_node("Flatten", ["a"], ["b"], axis=1),
         helper.make_node("Reshape", ["b", "other"], ["y"])],
        [info("x", ["n", 6])],
        [info("y", ["n", 3, 2])],
        [const("same", [0, -1], np.int64), const("other", [0, 3, 2], np.int64)],
    )
    out = apply(RemoveIdentityPass(), model)
    assert op_types(out) == ["Reshape"]
    assert list(out.graph.node[0].input) == ["x", "other"]
    assert_equivalent(model, out, rtol=0.0)


def test_identities_in_subgraphs() -> None:
    then_branch = helper.make_graph(
        [helper.make_node("Neg", ["r"], ["n"]), helper.make_node("Identity", ["n"], ["then_out"])],
        "then", [], [info("then_out", [2])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["r"], ["else_out"])], "else", [], [info("else_out", [2])],
    )
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        [info("x", [2]), info("flag", [], TensorProto.BOOL)],
        [info("y", [2])],
    )
    pass_ = RemoveIdentityPass()
    out = apply(pass_, model)
    branches = {a.name: [n.op_type for n in a.g.node] for a in out.graph.node[1].attribute}
    assert branches == {"then_branch": ["Neg"], "else_branch": ["Identity"]}
    assert any("outer scope" in n for n in pass_.notes)
    assert_equivalent(model, out, rtol=0.0)
