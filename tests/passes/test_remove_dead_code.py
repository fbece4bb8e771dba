"""RemoveDeadCodePass: unused nodes, initializers, functions and opsets go; the signature stays."""

from __future__ import annotations

from onnx import helper

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
