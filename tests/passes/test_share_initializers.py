"""ShareInitializersPass: copies of one weight become one initializer; small constants, graph inputs stay apart."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import helper

from npukit.config import OptimizeConfig
from npukit.passes.pipeline import optimize_model
from npukit.passes.share_initializers import ShareInitializersPass

from .tiny import apply, assert_equivalent, const, info, make_model


def _two_convs(weight_b: np.ndarray | None, *, bias: np.ndarray) -> object:
    weight = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    return make_model(
        [helper.make_node("Conv", ["x", "wa", "ba"], ["a"], pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["x", "wb", "bb"], ["b"], pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["a", "b"], ["y"])],
        [info("x", [1, 3, 8, 8])], [info("y", [1, 4, 8, 8])],
        initializers=[const("wa", weight), const("wb", weight if weight_b is None else weight_b),
                      const("ba", bias), const("bb", bias.copy())])


def test_copies_of_one_weight_become_one_and_the_outputs_are_unchanged() -> None:
    model = _two_convs(None, bias=np.arange(4, dtype=np.float32))
    pass_ = ShareInitializersPass()
    out = apply(pass_, model)
    assert pass_.rewrites == 1  # the weights (108 values); the 4-value biases are left apart
    assert sorted(i.name for i in out.graph.initializer) == ["ba", "bb", "wa"]
    assert [n.input[1] for n in out.graph.node[:2]] == ["wa", "wa"]
    assert_equivalent(model, out, rtol=0.0)


def test_different_weights_and_graph_inputs_are_left_apart() -> None:
    other = np.ones((4, 3, 3, 3), dtype=np.float32)
    model = _two_convs(other, bias=np.zeros(4, dtype=np.float32))
    assert ShareInitializersPass().call(ir.serde.deserialize_model(model)).modified is False
    same = _two_convs(None, bias=np.zeros(4, dtype=np.float32))
    same.graph.input.append(info("wb", [4, 3, 3, 3]))  # a weight the caller may feed
    pass_ = ShareInitializersPass()
    apply(pass_, same)
    assert pass_.rewrites == 0


def test_an_identity_shared_weight_stays_one_through_the_default_pipeline() -> None:
    """RetinaFace's exporter shares a weight through an Identity; folding made it two (6.5% more parameters)."""
    weight = np.random.default_rng(1).standard_normal((3, 3, 3, 3)).astype(np.float32)
    model = make_model(
        [helper.make_node("Identity", ["w"], ["w2"]),
         helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["a"], ["a1"]), helper.make_node("Neg", ["a1"], ["a2"]),
         helper.make_node("Conv", ["a2", "w2"], ["b"], pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["b", "a"], ["y"])],
        [info("x", [1, 3, 8, 8])], [info("y", [1, 3, 8, 8])],
        initializers=[const("w", weight)])
    out = ir.serde.serialize_model(optimize_model(ir.serde.deserialize_model(model), config=OptimizeConfig()).model)
    weights = [i for i in out.graph.initializer if len(i.dims) == 4]
    assert len(weights) == 1
    assert_equivalent(model, out, rtol=1e-6)
