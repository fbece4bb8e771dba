"""A mean over H and W without keepdim, for ExecuTorch's XNNPACK delegate: ``mean(x, [2, 3])`` of a 4-D ``x``
becomes ``view(mean(x, [2, 3], keepdim=True), (N, C))``, the same values.

XNNPACK lowers ``aten.mean.dim`` as a global average pooling, which its partitioner (``MeanDimConfig``, executorch
1.5.1) takes only on a 4-D input, over dims [2, 3] (or [-2, -1]) and with keepdim: ``x.mean([2, 3])`` before a
classifier's Linear (torchvision's MnasNet, ShuffleNetV2) ran on ExecuTorch's portable kernels and split the
delegated graph in two there. Dropping the two trailing dimensions of size 1 is a view: the rewrite is exact.

In a quantized program (``dq -> mean -> q``) the view goes between a copy of that q (and its dq) and the q:
``dq -> mean -> q' -> dq' -> view -> q``, the pattern XNNPACK's own Conv1dUnsqueezePass writes, so the mean and the
view are each a quantized op (``dq -> op -> q``) and stay int8; ``q(dq(q(v))) == q(v)``: still exact. A view
straight before the q would leave the mean out of XNNPACK's quantized pattern (the q no longer its only user): one
delegate call still, but the mean an fp32 global average pooling between two converts (measured).
An edge-dialect pass (``ExportPass``), run by ``to_edge_transform_and_lower`` before partitioning
(``npukit.runtime.executorch_passes``).
"""

from __future__ import annotations

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult

from npukit.runtime.executorch_grid import Q, call_after, grid, pair_after, static_shape

RANK = 4  # the rank of the mean XNNPACK takes, over its last two dims


def why_not(node: torch.fx.Node) -> str | None:
    """Why this pass leaves ``node`` (an edge op) as it is, or None where it rewrites it."""
    if node.op != "call_function" or node.target is not exir_ops.edge.aten.mean.dim:
        return "not an edge aten.mean.dim"
    source = node.args[0]
    shape = source.meta["val"].shape if isinstance(source, torch.fx.Node) and "val" in source.meta else ()
    if len(shape) != RANK:
        return f"a mean of a rank-{len(shape)} tensor, not {RANK}-D"
    if len(node.args) > 2 and node.args[2] or node.kwargs.get("keepdim"):
        return "keepdim already (XNNPACK takes it as it is)"
    if node.kwargs.get("dtype") is not None:
        return "a dtype given (XNNPACK's global average pooling takes none)"
    dims = node.args[1] if len(node.args) > 1 else None
    if not dims or sorted(int(d) % RANK for d in dims) != [2, 3]:
        return f"over dims {dims}, not the last two (H and W)"
    if static_shape(node) is None:
        return "a symbolic output shape"
    return None


class KeepMeanDimsPass(ExportPass):
    """Every edge ``aten.mean.dim`` over H and W of a 4-D tensor without keepdim, computed with keepdim and viewed
    to its reduced shape (between a copy of its quantize-dequantize pair and its quantize where one follows)."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        modified = False
        for node in list(graph_module.graph.nodes):
            if node.target is not exir_ops.edge.aten.mean.dim or why_not(node):
                continue
            shape = [int(d) for d in node.meta["val"].shape]
            node.args = (node.args[0], node.args[1], True)
            _view_after(graph_module.graph, node, shape)
            modified = True
        if not modified:
            return PassResult(graph_module, False)
        graph_module.recompile()
        return super().call(graph_module)  # traced again: every node's meta (values, shapes) computed anew


def _view_after(graph: torch.fx.Graph, mean: torch.fx.Node, shape: list[int]) -> None:
    """``mean``'s users reading ``view(mean, shape)``; where its only user is a quantize (``dq -> mean -> q``), that
    q reads ``view(dq'(q'(mean)))``, q' and dq' on its grid."""
    users = list(mean.users)
    source = mean
    if len(users) == 1 and users[0].target is Q:
        source = pair_after(graph, mean, grid(users[0]))
    view = call_after(graph, source, exir_ops.edge.aten.view_copy.default, (source, shape))
    for user in list(source.users):
        if user is not view:
            user.replace_input_with(source, view)
