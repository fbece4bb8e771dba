"""Helpers the graph passes share: reading constants, single consumers, new initializers, swapping one node for another."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import onnx_ir as ir

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16})


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The contents of an initializer or Constant output; None otherwise (a graph input can be overridden at run time)."""
    if value is None or value.is_graph_input():
        return None
    try:
        tensor = ir.convenience.get_const_tensor(value)
    except ValueError:  # a malformed Constant node
        return None
    return None if tensor is None else tensor.numpy()


def rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def is_float(value: ir.Value | None) -> bool:
    return value is not None and value.dtype in FLOAT_TYPES


def scalar_constant(value: ir.Value | None, *, like: ir.Value | None) -> float | None:
    """A one-element constant whose broadcast cannot change the shape of ``like``, as a float; None otherwise."""
    array = constant_array(value)
    if array is None or array.size != 1 or array.dtype.kind not in "fiu":
        return None
    if array.ndim > 0 and (rank(like) is None or array.ndim > rank(like)):  # type: ignore[operator]
        return None
    return float(array.reshape(()))


def per_channel(value: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``value`` as one float64 value per channel of axis 1 when it broadcasts against a rank-``rank`` NCHW tensor
    along that axis only (a scalar, (C, 1, ..., 1) or (1, C, 1, ..., 1)); None otherwise (a (C,) vector broadcasts
    along the last axis, and a broadcast that would change the tensor's shape is none of these)."""
    if value.ndim > rank:
        return None
    if value.size == 1:
        return np.full(channels, float(value.reshape(())))
    shape = (1,) * (rank - value.ndim) + value.shape
    if shape[1] != channels or shape[0] != 1 or any(d != 1 for d in shape[2:]):
        return None
    return value.astype(np.float64).reshape(-1)


def sole_consumer(value: ir.Value) -> ir.Node | None:
    """The node that is the one and only use of ``value``, when ``value`` is not also a graph output."""
    if value.is_graph_output() or len(value.uses()) != 1:
        return None
    return next(iter(value.uses())).node


def producer_of(value: ir.Value | None, op_type: str) -> ir.Node | None:
    """The ONNX-domain node of type ``op_type`` producing ``value``, or None."""
    node = None if value is None else value.producer()
    if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
        return None
    return node


def onnx_nodes(model: ir.Model, op_types: str | Sequence[str]) -> Iterator[ir.Node]:
    """Snapshot of the ONNX-domain nodes of the given types in the main graph and its subgraphs (not in functions,
    which cannot hold the initializers a rewrite creates)."""
    wanted = {op_types} if isinstance(op_types, str) else set(op_types)
    return iter([
        node
        for node in ir.traversal.RecursiveGraphIterator(model.graph)
        if node.op_type in wanted and node.domain in ("", "ai.onnx")
    ])


def _names_in(graph: ir.Graph) -> set[str]:
    names = {v.name for v in graph.inputs if v.name}
    names.update(graph.initializers)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        names.update(v.name for v in node.outputs if v.name)
    return names


def add_initializer(graph: ir.Graph, array: np.ndarray, *, name_hint: str) -> ir.Value:
    """Register ``array`` as a new initializer of ``graph`` under a fresh name derived from ``name_hint``."""
    taken = _names_in(graph)
    name, i = name_hint, 1
    while name in taken:
        name, i = f"{name_hint}_{i}", i + 1
    tensor = ir.tensor(np.require(array, requirements="C"), name=name)  # ascontiguousarray would make 0-d 1-d
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    graph.register_initializer(value)
    return value


def replace_with_node(
    old_nodes: Sequence[ir.Node],
    old_output: ir.Value,
    op_type: str,
    inputs: Sequence[ir.Value | None],
    attributes: Mapping[str, object] | None = None,
) -> ir.Node:
    """Insert ``op_type(inputs)`` before the last of ``old_nodes``, route ``old_output``'s uses to it, drop ``old_nodes``.

    The new node takes the first old node's name; its output takes ``old_output``'s name, type and shape, so a graph
    output keeps its name.
    """
    last = old_nodes[-1]
    owner = last.graph
    assert owner is not None
    output = ir.Value(name=old_output.name, type=old_output.type, shape=old_output.shape)
    new = ir.node(op_type, list(inputs), dict(attributes or {}), outputs=[output], name=old_nodes[0].name)
    owner.insert_before(last, new)
    old_output.replace_all_uses_with(output, replace_graph_outputs=True)
    for node in reversed(old_nodes):
        node.graph.remove(node, safe=True)  # type: ignore[union-attr]
    return new


def bypass(node: ir.Node, output: ir.Value, source: ir.Value) -> str | None:
    """Make every use of ``output`` read ``source`` and remove ``node``; return why not when that is impossible.

    When ``output`` is a graph output, ``source`` takes its name, which needs ``source`` to be produced inside the
    same graph and to be neither a graph input, an initializer nor already a graph output.
    """
    graph = node.graph
    assert graph is not None
    if output.is_graph_output():
        if source.is_graph_input() or source.is_initializer():
            return "it maps a graph input or initializer straight to a graph output"
        if source.is_graph_output():
            return "its input is already a graph output under another name"
        producer = source.producer()
        if producer is None or producer.graph is not graph:
            return "its input comes from an outer scope and its output is a graph output"
        name = output.name
        if source.type is None:
            source.type = output.type
        if output.shape is not None:
            source.shape = output.shape
        output.replace_all_uses_with(source, replace_graph_outputs=True)
        output.name = None
        source.name = name
    else:
        output.replace_all_uses_with(source)
    for other in node.outputs:
        if other is not output and (other.uses() or other.is_graph_output()):
            raise AssertionError("bypass() called on a node with another live output")
    graph.remove(node, safe=True)
    return None
