"""RemoveDeadCodePass: unused nodes, initializers, functions and opsets go; the signature stays."""

from __future__ import annotations

import onnx_ir as ir
from onnx import TensorProto, helper

from npukit.passes.remove_dead_code import RemoveDeadCodePass

from .tiny import apply, assert_equivalent, const, info, make_model, op_types


def test_unused_nodes_initializers_functions_opsets_removed() -> None:
    unused_function = helper.make_function(
        "local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])], [helper.make_opsetid("", 17)]
    )
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["y"]),
            helper.make_node("Sigmoid", ["x"], ["dead1"]),
            helper.make_node("Mul", ["dead1", "w_dead"], ["dead2"]),
        ],
        [info("x", [3])],
        [info("y", [3])],
        [const("w_dead", [1.0, 2.0, 3.0]), const("w_unused", [4.0])],
        extra_opsets=[("local", 1), ("com.microsoft", 1)],
        functions=[unused_function],
    )
    pass_ = RemoveDeadCodePass()
    out = apply(pass_, model)
    assert op_types(out) == ["Relu"]
    assert not out.graph.initializer
    assert not out.functions
    assert [o.domain for o in out.opset_import] == [""]
    assert pass_.rewrites == 2 + 2 + 1 + 2
    assert_equivalent(model, out, rtol=0.0)


def test_initializer_that_is_graph_input_is_kept_with_note() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [info("x", [3]), info("bias", [3])],
        [info("y", [3])],
        [const("bias", [1.0, 2.0, 3.0])],
    )
    pass_ = RemoveDeadCodePass()
    out = apply(pass_, model)
    assert [i.name for i in out.graph.input] == ["x", "bias"]
    assert [t.name for t in out.graph.initializer] == ["bias"]
    assert not pass_.rewrites
    assert any("bias" in n and "graph input" in n for n in pass_.notes)


def test_weights_only_the_branch_not_taken_read_are_removed_after_folding() -> None:
    """The If of a constant condition folded to its then-branch: onnx-ir still counts the dropped else-branch's nodes
    as users of the outer weight they read, which was kept in the file (silero VAD grew by 36%)."""
    import numpy as np

    from npukit.passes.fold_constants import FoldConstantsPass

    then_branch = helper.make_graph([helper.make_node("Add", ["x", "w_then"], ["t"])], "then", [],
                                    [info("t", [3])])
    else_branch = helper.make_graph([helper.make_node("Mul", ["x", "w_else"], ["e"])], "else", [],
                                    [info("e", [3])])
    model = make_model(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        [info("x", [3])],
        [info("y", [3])],
        [const("w_then", [1.0, 2.0, 3.0]), const("w_else", np.arange(3.0)),
         const("cond", np.array(True), dtype=np.bool_)],
    )
    assert model.graph.initializer[2].data_type == TensorProto.BOOL
    ir_model = ir.serde.deserialize_model(model)  # one in-memory model through both passes, as the pipeline runs
    FoldConstantsPass()(ir_model)
    assert "If" not in [n.op_type for n in ir_model.graph]
    RemoveDeadCodePass()(ir_model)
    out = ir.serde.serialize_model(ir_model)
    assert sorted(t.name for t in out.graph.initializer) == ["w_then"]
    assert_equivalent(model, out, rtol=0.0)


def test_a_branch_s_own_unused_initializers_are_removed() -> None:
    """An If on a runtime condition keeps both branches; the weights a branch holds but no node of it reads (left
    by folding inside it: silero VAD's LSTM constants, 2.2 -> 3.2 MiB, ORT warning of each) are removed, the
    ones it reads (also from a nested branch) kept."""
    import numpy as np

    inner = helper.make_graph([helper.make_node("Mul", ["x", "w_nested"], ["n"])], "inner", [], [info("n", [3])])
    then_branch = helper.make_graph(
        [helper.make_node("If", ["c2"], ["t"], then_branch=inner, else_branch=inner)], "then", [], [info("t", [3])],
        [const("w_nested", [1.0, 2.0, 3.0]), const("w_stale", np.arange(3.0)),
         const("c2", np.array(True), dtype=np.bool_)])
    else_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [info("e", [3])],
                                    [const("w_unread", np.arange(3.0))])
    model = make_model([helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)],
                       [info("x", [3]), info("cond", [], dtype=TensorProto.BOOL)], [info("y", [3])])
    pass_ = RemoveDeadCodePass()
    out = apply(pass_, model)
    branches = {a.name: a.g for a in out.graph.node[0].attribute}
    assert sorted(t.name for t in branches["then_branch"].initializer) == ["c2", "w_nested"]
    assert list(branches["else_branch"].initializer) == [] and pass_.rewrites == 2
    import onnxruntime as ort

    x = np.array([1.0, -2.0, 3.0], np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
                     for m in (model, out))
        np.testing.assert_array_equal(want[0], got[0])
