"""Squeezes, unsqueezes, selects and no-op expands as views, for ExecuTorch's XNNPACK delegate: on static shapes,
``squeeze_copy`` and ``unsqueeze_copy`` become ``view_copy`` to their output's shape, ``select_copy(x, d, i)``
becomes ``view_copy(slice_copy(x, d, i, i + 1))`` and an ``expand_copy`` whose output has its input's shape goes
(its readers read its input). Each computes the same values: bit-exact.

ExecuTorch's XNNPACK partitioner (executorch 1.5.1, ``backends/xnnpack/partition/config/__init__.py``'s
``ALL_PARTITIONER_CONFIGS``) has no config for ``squeeze_copy``, ``select_copy`` or ``expand_copy``, and
``UnsqueezeCopyConfig`` takes an unsqueeze on the trailing dim only: each ran on ExecuTorch's portable kernels and
split the delegated graph there. torch.nn.MultiheadAttention's packed in-projection (``unflatten -> unsqueeze(0) ->
transpose(0, -2) -> squeeze(-2)``, then ``[0]``, ``[1]``, ``[2]``), the class token's ``x[:, 0]`` and the
``expand_copy`` that aten.matmul writes before each ``bmm`` of scaled_dot_product_attention (rank 4, no
broadcasting: same shape) cost ViT-B/16 about 60 splits. ``ViewCopyConfig`` and ``SliceCopyConfig`` (step 1, no
zero-size dim) take what this pass writes, fp32 or quantized.

In a quantized program (``dq -> select -> q``) the slice gets a quantize-dequantize pair on its input's grid
(``dq -> slice -> q' -> dq' -> view -> q``): ``SliceCopyConfig`` takes a quantized slice only with its q on its
dq's grid, and ``q(dq(v)) == v`` there: still exact. A squeeze or an unsqueeze between dq and q becomes a view in
place (``dq -> view -> q``, the quantized view XNNPACK takes); a no-op expand between them goes, its q reading the
dq (a view there instead made XNNPACK's ChannelsLastTaggedReshapePass fail, KeyError 'val', where the dq had
readers outside the partition: measured on a carried int8 program).
An edge-dialect pass (``ExportPass``), run by ``to_edge_transform_and_lower`` before partitioning
(``npukit.runtime.executorch_passes``).
"""

from __future__ import annotations

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult

from npukit.runtime.executorch_grid import DQ, call_after, grid, pair_after, static_shape

_ATEN = exir_ops.edge.aten
SQUEEZES = (_ATEN.squeeze_copy.default, _ATEN.squeeze_copy.dim, _ATEN.squeeze_copy.dims, _ATEN.unsqueeze_copy.default)
SELECT, EXPAND, VIEW, SLICE = (_ATEN.select_copy.int, _ATEN.expand_copy.default, _ATEN.view_copy.default,
                               _ATEN.slice_copy.Tensor)


def why_not(node: torch.fx.Node) -> str | None:
    """Why this pass leaves ``node`` (an edge op) as it is, or None where it rewrites it."""
    if node.op != "call_function" or node.target not in (*SQUEEZES, SELECT, EXPAND):
        return "not an edge squeeze, unsqueeze, select or expand"
    source, out = static_shape(node.args[0]), static_shape(node)
    if source is None or out is None:
        return "a symbolic shape"
    if node.target is EXPAND and source != out:
        return f"a broadcasting expand ({source} -> {out})"
    if node.target is EXPAND and node.args[0].op == "placeholder" and any(u.op == "output" for u in node.users):
        return "an expand of a graph input to a graph output (removed, the output would be the input)"
    if node.target is SELECT and 0 in source:
        return "a zero-size dim (XNNPACK's slice takes none)"
    return None


class StaticViewsPass(ExportPass):
    """Every edge squeeze, unsqueeze and select of a static shape a view (a select: of a one-wide slice), every
    expand to its input's own shape removed."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        # every shape read before any rewrite: the nodes a rewrite writes have no value until the retrace
        found = [(n, static_shape(n.args[0]), static_shape(n)) for n in graph.nodes
                 if n.op == "call_function" and n.target in (*SQUEEZES, SELECT, EXPAND) and why_not(n) is None]
        for node, source, out in found:
            if node.target is SELECT:
                _select_as_slice(graph, node, source, out)
            elif node.target is EXPAND:
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)
            else:  # a squeeze or an unsqueeze: a view to its output's shape, in place
                node.target, node.args, node.kwargs = VIEW, (node.args[0], out), {}
        if not found:
            return PassResult(graph_module, False)
        graph_module.recompile()
        return super().call(graph_module)  # traced again: every node's meta (values, shapes) computed anew


def _select_as_slice(graph: torch.fx.Graph, select: torch.fx.Node, shape: list[int], out: list[int]) -> None:
    """``select(x, d, i)`` (x of ``shape``) replaced by ``view(slice(x, d, i, i + 1, 1), out)``, with the select's
    provenance; the slice followed by a quantize-dequantize pair on x's grid where x is a dequantize."""
    source, dim, index = select.args[0], int(select.args[1]), int(select.args[2])
    dim %= len(shape)
    index %= shape[dim]
    sliced = call_after(graph, select, SLICE, (source, dim, index, index + 1, 1))
    after = pair_after(graph, sliced, grid(source)) if source.target is DQ else sliced
    view = call_after(graph, after, VIEW, (after, out), like=select)
    select.replace_all_uses_with(view)
    graph.erase_node(select)
