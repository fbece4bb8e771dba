"""Edge-graph helpers for npukit's XNNPACK edge passes (``executorch_mean``, ``executorch_split``,
``executorch_views``, ``executorch_layer_norm``, ...): a node's static shape, a node placed after another with its
provenance, and a quantize-dequantize pair on a given grid after a node.

XNNPACK takes an op of a quantized program as an integer op only in the pattern ``dq -> op -> q`` (its partitioner
configs' ``get_node_and_deps``), and some ops (a slice, a view) only with q on dq's grid. A pair ``q -> dq`` on the
grid the op's input already has changes no value (``q(dq(v)) == v`` for an integer ``v``): the passes add one where a
rewrite needs the pattern back.
"""

from __future__ import annotations

import torch
from executorch.exir.dialects._ops import ops as exir_ops

Q = exir_ops.edge.quantized_decomposed.quantize_per_tensor.default
DQ = exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default


def static_shape(node: object) -> list[int] | None:
    """The shape of ``node``'s value (its ``val`` meta) where every dim is a plain int, or None (no value, or a
    symbolic dim: the passes rewrite static shapes only)."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    shape = getattr(value, "shape", None)
    return None if shape is None or not all(isinstance(d, int) for d in shape) else [int(d) for d in shape]


def call_after(graph: torch.fx.Graph, anchor: torch.fx.Node, target: object, args: tuple, *,
               like: torch.fx.Node | None = None) -> torch.fx.Node:
    """A call of ``target`` placed after ``anchor``, with the provenance (its ``from_node``: a placement counts the
    new node as the op it came from) of ``like`` (default ``anchor``), its value left for the pass's retrace to
    compute."""
    with graph.inserting_after(anchor):
        node = graph.call_function(target, args, {})
    node.meta = {k: v for k, v in (like or anchor).meta.items() if k != "val"}
    return node


def grid(node: torch.fx.Node) -> tuple | None:
    """The grid of a per-tensor quantize or dequantize ``node`` (scale, zero point, min, max, dtype), or None."""
    return tuple(node.args[1:]) if node.target in (Q, DQ) else None


def pair_after(graph: torch.fx.Graph, node: torch.fx.Node, on: tuple) -> torch.fx.Node:
    """``q -> dq`` on the grid ``on`` placed after ``node``, every user of ``node`` reading the dq; the dq."""
    users = list(node.users)
    quantized = call_after(graph, node, Q, (node, *on))
    dequantized = call_after(graph, quantized, DQ, (quantized, *on))
    for user in users:
        user.replace_input_with(node, dequantized)
    return dequantized
