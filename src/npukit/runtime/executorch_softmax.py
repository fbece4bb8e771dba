"""scaled_dot_product_attention's safe softmax on unmasked scores, for ExecuTorch's XNNPACK delegate: the guard
``where(not any(s != -inf, -1), 0, softmax(s, -1))`` that torch (2.14) writes after the softmax of attention's
scores ``s`` (``aten._safe_softmax``: a row of scores that are all -inf, a fully masked query, gives zeros instead
of NaN) is dropped where ``s`` is a ``bmm``'s output (through views): its readers read the softmax.

ExecuTorch's XNNPACK partitioner (executorch 1.5.1) has no config for any op of the guard (``eq.Scalar``,
``logical_not``, ``any.dim``, ``full_like``, ``where.self``: ``ALL_PARTITIONER_CONFIGS`` in
``backends/xnnpack/partition/config/__init__.py``), so each attention ran six ops on the portable kernels between
its two bmms and split the delegated graph there (ViT-B/16: 12). Without a mask, ``s`` is a bmm of q and k: a
row of it is all -inf only where every one of its dot products overflows to -inf (or q or k already holds an
infinity), where the guard's zeros are no more the attention than the softmax's NaN are. On every row that has a
score other than -inf (every finite computation) the guard returns the softmax itself: the rewrite is exact there.
A softmax of anything else (a mask added to the scores: -inf by design) keeps its guard.
An edge-dialect pass (``ExportPass``), run by ``to_edge_transform_and_lower`` before partitioning
(``npukit.runtime.executorch_passes``).
"""

from __future__ import annotations

import math

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult

_ATEN = exir_ops.edge.aten
WHERE, SOFTMAX = _ATEN.where.self, _ATEN._softmax.default
_PASSING = (_ATEN.view_copy.default, _ATEN.permute_copy.default, _ATEN.expand_copy.default)


def _arg(node: object, target: object) -> torch.fx.Node | None:
    """``node``'s first argument where ``node`` is a call of ``target``, or None."""
    if isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target:
        return node.args[0] if isinstance(node.args[0], torch.fx.Node) else None
    return None


def guarded_softmax(where: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """``(softmax, scores)`` where ``where`` is the guard ``where(not(any(not(scores == -inf), -1, keepdim)),
    full_like(softmax, 0), softmax)`` of ``softmax = _softmax(scores, -1)``, or None."""
    if where.op != "call_function" or where.target is not WHERE or len(where.args) != 3:
        return None
    condition, zeros, softmax = where.args
    scores = _arg(softmax, SOFTMAX)
    if scores is None or int(softmax.args[1]) % softmax.meta["val"].dim() != softmax.meta["val"].dim() - 1:
        return None
    if _arg(zeros, _ATEN.full_like.default) is not softmax or zeros.args[1] != 0:
        return None
    reduced = _arg(condition, _ATEN.logical_not.default)  # any(not(scores == -inf), dim, keepdim)
    equal = _arg(_arg(reduced, _ATEN.any.dim), _ATEN.logical_not.default)
    if _arg(equal, _ATEN.eq.Scalar) is not scores or not (isinstance(equal.args[1], float)
                                                          and math.isinf(equal.args[1]) and equal.args[1] < 0):
        return None
    if int(reduced.args[1]) % scores.meta["val"].dim() != scores.meta["val"].dim() - 1:
        return None
    return softmax, scores


def _unmasked(scores: torch.fx.Node) -> bool:
    """Whether ``scores`` is a ``bmm``'s output through views and permutes only (no mask added)."""
    while scores.op == "call_function" and scores.target in _PASSING:
        scores = scores.args[0]
    return scores.op == "call_function" and scores.target is _ATEN.bmm.default


class SafeSoftmaxPass(ExportPass):
    """Every safe-softmax guard of unmasked attention scores dropped: its readers read the softmax."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        modified = False
        graph = graph_module.graph
        for node in list(graph.nodes):
            found = guarded_softmax(node) if node.op == "call_function" and node.target is WHERE else None
            if found is None or not _unmasked(found[1]):
                continue
            node.replace_all_uses_with(found[0])
            graph.erase_node(node)
            modified = True
        if not modified:
            return PassResult(graph_module, False)
        graph.eliminate_dead_code()  # the guard's condition and zeros, read by nothing now
        graph_module.recompile()
        return super().call(graph_module)  # traced again: every node's meta (values, shapes) computed anew
