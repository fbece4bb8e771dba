"""A split into pieces as slices, for ExecuTorch's XNNPACK delegate: each piece ``split_with_sizes(x, sizes,
dim)[i]`` becomes ``slice(x, dim, start_i, start_i + sizes[i])``, the same values.

ExecuTorch's XNNPACK partitioner (executorch 1.5.1) has no config for ``aten.split_with_sizes_copy`` (what
``torch.split`` and ``torch.chunk`` become in the edge dialect), so each split ran on ExecuTorch's portable kernels
and split the delegated graph there: ShuffleNetV2's channel split, 13 of them, made 15 delegate calls, and in an
int8 program every block crossed them in float. ``SliceCopyConfig`` takes a slice with step 1 of a static shape,
fp32 or quantized (``dq -> slice -> q`` on one grid: a piece on another grid, a concatenation's in npukit's plan,
gets a q-dq pair on its input's grid first, so that the slice stays int8). A piece no one reads gets no slice.
An edge-dialect pass (``ExportPass``), run by ``to_edge_transform_and_lower`` before partitioning
(``npukit.runtime.executorch_passes``).
"""

from __future__ import annotations

import operator

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult

from npukit.runtime.executorch_grid import DQ, Q, call_after, grid, static_shape

# torch.split (sizes or one size) and torch.chunk all reach the edge dialect as this op (torch 2.14, executorch 1.5.1)
SPLIT = exir_ops.edge.aten.split_with_sizes_copy.default


def _sizes(node: torch.fx.Node) -> tuple[list[int], int] | None:
    """The sizes of ``node``'s pieces (an edge split) and the dim it splits, normalized; None where a size or the
    input's shape is not a plain int, or a piece is empty (XNNPACK's slice takes no zero-size dim)."""
    shape = static_shape(node.args[0])
    if not shape:
        return None
    dim = int(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % len(shape)
    sizes = node.args[1]
    if not all(isinstance(s, int) and s > 0 for s in sizes) or sum(sizes) != shape[dim]:
        return None
    return list(sizes), dim


class SliceSplitPass(ExportPass):
    """Every edge split whose pieces are all read by ``getitem``: each piece read, a ``slice_copy`` of the split's
    input with step 1."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        modified = False
        for node in list(graph_module.graph.nodes):
            if node.op != "call_function" or node.target is not SPLIT:
                continue
            found = _sizes(node)
            if found is None or any(u.target is not operator.getitem for u in node.users):
                continue
            _slice_pieces(graph_module.graph, node, *found)
            modified = True
        if not modified:
            return PassResult(graph_module, False)
        graph_module.recompile()
        return super().call(graph_module)  # traced again: every node's meta (values, shapes) computed anew


def _slice_pieces(graph: torch.fx.Graph, split: torch.fx.Node, sizes: list[int], dim: int) -> None:
    """Each ``getitem(split, i)`` replaced by a slice of the split's input, placed where the split was, with the
    split's provenance (its ``from_node``) so that a placement counts the slices as the split's; in a quantized
    program, each slice then read by one quantize on its input's grid (``_on_its_grid``)."""
    source = split.args[0]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    anchor, slices = split, []
    for piece in sorted(split.users, key=lambda p: int(p.args[1])):
        index = int(piece.args[1])
        anchor = call_after(graph, anchor, exir_ops.edge.aten.slice_copy.Tensor,
                            (source, dim, starts[index], starts[index] + sizes[index], 1), like=split)
        piece.replace_all_uses_with(anchor)
        graph.erase_node(piece)
        slices.append(anchor)
    if source.target is DQ:
        _on_its_grid(graph, slices, grid(source))
    graph.erase_node(split)


def _on_its_grid(graph: torch.fx.Graph, slices: list[torch.fx.Node], on: tuple) -> None:
    """Each of ``slices`` (of one ``dq``, in graph order) read by one quantize on dq's grid, the only quantized slice
    XNNPACK takes (``SliceCopyConfig``: it refuses a slice whose q requantizes): one read by anything else, a
    requantizing q (npukit's plan puts the piece a concatenation reads on that concatenation's grid) or a float op,
    gets ``slice -> q -> dq`` on dq's grid first, its readers reading the new dq. The values stay (``q(dq(v)) ==
    v``); the requantization after it becomes XNNPACK's converts, the slice stays int8.

    Order matters to XNNPACK's partitioner (``GroupBasedPartitioner`` merges its groups greedily, from the graph's
    end): the slices and their quantizes, one group, come first, then the new dequantizes; a dequantize between
    them, which the group feeds and which feeds the rest, would keep the group out of the delegate call after it
    (two delegate calls, measured)."""
    anchor, pairs = slices[-1], []
    for sliced in slices:
        users = list(sliced.users)
        if len(users) == 1 and users[0].target is Q and grid(users[0]) == on:
            anchor.append(users[0])  # moved up to the group, its only input the slice
            anchor = users[0]
            continue
        anchor = call_after(graph, anchor, Q, (sliced, *on), like=sliced)
        pairs.append((sliced, users, anchor))
    for sliced, users, quantized in pairs:
        anchor = call_after(graph, anchor, DQ, (quantized, *on), like=sliced)
        for user in users:
            user.replace_input_with(sliced, anchor)
