"""The shared graph index: producers, consumers, initializers and constants of an ONNX graph."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npukit.frontend.graph_index import GraphIndex


def _graph() -> onnx.GraphProto:
    nodes = [
        helper.make_node("Constant", [], ["k"], name="const", value=numpy_helper.from_array(np.float32(2.0))),
        helper.make_node("Mul", ["x", "k"], ["y"], name="mul"),
        helper.make_node("Add", ["y", "y"], ["z"], name="square_sum"),  # reads y in two slots
        helper.make_node("Dropout", ["z"], ["d", ""], name="drop"),  # omitted optional output
        helper.make_node("Clip", ["d", "", "hi"], ["out"], name="clip"),  # omitted optional input
    ]
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                             [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [1])],
                             [numpy_helper.from_array(np.float32(6.0), "hi")])


def test_producers_and_consumers_by_name():
    index = GraphIndex(_graph())
    assert index.producer_node("y").name == "mul"
    assert index.producer_op("out") == "Clip"
    assert index.producer_node("x") is None and index.producer_node("hi") is None  # input, initializer
    assert [n.name for n in index.consumer_nodes("y")] == ["square_sum", "square_sum"]  # once per slot
    assert index.consumer_nodes("out") == [] and index.consumer_nodes("missing") == []


def test_empty_names_are_not_indexed():
    index = GraphIndex(_graph())
    assert "" not in index.producer and index.producer_node("") is None
    assert index.consumer_nodes("") == []


def test_initializers_constants_inputs_outputs():
    index = GraphIndex(_graph())
    assert set(index.initializers) == {"hi"}
    assert numpy_helper.to_array(index.initializers["hi"]) == np.float32(6.0)
    assert index.constants == {"hi", "k"}
    assert index.inputs == {"x"} and index.outputs == {"out"}


def test_node_references_are_stable():
    """A node found through the index is the same object each time (ids hold, so steps may key on them)."""
    index = GraphIndex(_graph())
    assert index.producer_node("z") is index.consumer_nodes("y")[0] is index.nodes[2]


def test_folded_tensors_are_the_ones_computed_from_constants_alone():
    """What ORT folds at load: initializers, Constant outputs, and what nodes compute from those only."""
    graph = _graph()
    graph.node.insert(1, helper.make_node("Neg", ["k"], ["minus_k"], name="neg"))  # from a constant alone
    graph.node.insert(2, helper.make_node("Add", ["minus_k", "hi"], ["sum_k"], name="sum"))
    index = GraphIndex(graph)
    assert index.folded == {"hi", "k", "minus_k", "sum_k"}
    assert [n.name for n in index.nodes if index.is_folded(n)] == ["const", "neg", "sum"]


def test_constant_tensors_hold_initializers_and_constant_values_by_name():
    index = GraphIndex(_graph())
    tensors = index.constant_tensors
    assert set(tensors) == {"hi", "k"} and tensors["k"].name == "k"
    assert numpy_helper.to_array(tensors["k"]) == np.float32(2.0)
    assert index.nodes[0].attribute[0].t.name == ""  # a copy was renamed, not the node's own attribute
