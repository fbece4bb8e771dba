"""Layer norm over the last dim, for ExecuTorch's XNNPACK delegate: ``native_layer_norm(x, [C], w, b, eps)[0]``
becomes ``d = x - linear(x, 1/C); d * rsqrt(linear(d * d, 1/C) + eps) * w + b``, its mean and variance each a
linear layer with one output whose weights are all ``1/C``: the same value to float rounding.

ExecuTorch's XNNPACK partitioner (executorch 1.5.1) has no config for ``native_layer_norm``
(``ALL_PARTITIONER_CONFIGS`` in ``backends/xnnpack/partition/config/__init__.py``), so every transformer's layer
norm (ViT-B/16 25, ConvNeXt-T, Swin-T) ran on ExecuTorch's portable kernels and split the delegated graph twice per
encoder block. What it writes instead, XNNPACK takes: ``LinearConfig`` (a constant weight), ``SubConfig``,
``MulConfig``, ``AddConfig`` (broadcasting the ``(..., 1)`` statistics), ``ReciprocalSquareRootConfig``. The mean as a
linear layer rather than ``mean.dim`` (which ``MeanDimConfig`` takes only as a 4-D global average pooling over H and
W, NHWC, with a transpose before it): about the same time on (1, 197, 768) (0.32 vs 0.34 ms, best of 200, 1
thread), and no layout change.

The variance is computed from ``x - mean`` (two passes, as torch's kernel does); the sums in a linear layer are in
float, and ``1/C`` is rounded where C is not a power of two. Measured: the .pte 5.7e-6 at most from a float64 layer
norm on (1, 197, 768), outputs up to 13 (torch's own kernel: 9.5e-7); 7.2e-7 on a ViT block's edge program (outputs
up to 3.6); ViT-B/16's fp32 check 1.53e-6 of the output's range (1.55e-6 before), far inside npukit's 1e-4.
eps, the weight, the bias (each where given) and the normalized shape are the original's. A layer norm normalized
over more than the last dim, of a symbolic shape, or whose mean or rstd (outputs 1 and 2) something reads is left as
it is.

In a quantized program (``dq -> layer_norm -> q``: npukit's plan, as PT2E's, keeps a layer norm float) the
decomposition is float too, between the same dq and q: XNNPACK takes its ops as fp32 ops (its linear layers'
weights are float constants, not dequantized ones) between its converts, the integer ops around them staying int8
(measured on a ViT block carried int8: 9 delegate calls -> 1, FullyConnected fp32 x4 for the two norms, the
block's own linears qint8; the .pte equal to the quantized torch program).
An edge-dialect pass (``ExportPass``), run by ``to_edge_transform_and_lower`` before partitioning
(``npukit.runtime.executorch_passes``).
"""

from __future__ import annotations

import operator

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult

from npukit.runtime.executorch_grid import call_after, static_shape

_ATEN = exir_ops.edge.aten
LAYER_NORM = _ATEN.native_layer_norm.default


def why_not(node: torch.fx.Node) -> str | None:
    """Why this pass leaves ``node`` (an edge op) as it is, or None where it rewrites it."""
    if node.op != "call_function" or node.target is not LAYER_NORM:
        return "not an edge aten.native_layer_norm"
    source, normalized = node.args[0], list(node.args[1])
    if static_shape(source) is None:
        return "a symbolic shape"
    value = source.meta["val"]
    if value.dtype != torch.float32:
        return f"a {value.dtype} input, not float32"
    if len(normalized) != 1 or normalized[0] != value.shape[-1]:
        return f"normalized over {normalized}, not the last dim alone"
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return "its mean or rstd is read"
    return None


class LayerNormPass(ExportPass):
    """Every edge layer norm over the last dim of a float32 tensor of a static shape whose output alone is read, as
    two one-output linear layers of weight 1/C (mean and variance) and XNNPACK's element-wise ops."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        # every layer norm found before any rewrite: the nodes a rewrite writes have no value until the retrace
        found = [(n, int(n.args[0].meta["val"].shape[-1])) for n in graph_module.graph.nodes
                 if n.op == "call_function" and n.target is LAYER_NORM and why_not(n) is None]
        for node, channels in found:
            _decompose(graph_module, node, channels)
        if not found:
            return PassResult(graph_module, False)
        graph_module.recompile()
        return super().call(graph_module)  # traced again: every node's meta (values, shapes) computed anew


def _constant(graph_module: torch.fx.GraphModule, anchor: torch.fx.Node, name: str,
              value: torch.Tensor) -> torch.fx.Node:
    """A ``get_attr`` of ``value`` placed after ``anchor`` (ExecuTorch lifts it into a buffer after the passes;
    XNNPACK takes it as a static tensor), one attribute per ``name``."""
    if not hasattr(graph_module, name):
        graph_module.register_buffer(name, value)
    with graph_module.graph.inserting_after(anchor):
        node = graph_module.graph.get_attr(name)
    node.meta = {k: v for k, v in anchor.meta.items() if k not in ("val", "tensor_meta")}
    return node


def _decompose(graph_module: torch.fx.GraphModule, norm: torch.fx.Node, channels: int) -> None:
    """``norm``'s output (over its last dim, of ``channels``) read as its decomposition (the module doc), placed
    after it with its provenance."""
    source, _, weight, bias, eps = norm.args
    average = _constant(graph_module, norm, f"_npukit_layer_norm_average_{channels}",
                        torch.full((1, channels), 1.0 / channels))
    name = "_npukit_layer_norm_eps_" + "".join(c if c.isalnum() else "_" for c in repr(float(eps)))
    epsilon = _constant(graph_module, average, name, torch.tensor([float(eps)]))
    steps = [(_ATEN.linear.default, (source, average)), (_ATEN.sub.Tensor, (source, -1)),
             (_ATEN.mul.Tensor, (-1, -1)), (_ATEN.linear.default, (-1, average)), (_ATEN.add.Tensor, (-1, epsilon)),
             (_ATEN.rsqrt.default, (-1,)), (_ATEN.mul.Tensor, (1, -1))]
    steps += [(_ATEN.mul.Tensor, (-1, weight))] if weight is not None else []
    steps += [(_ATEN.add.Tensor, (-1, bias))] if bias is not None else []
    anchor, made = epsilon, []
    for target, args in steps:  # an int argument: a node made before, by its index (-1: the last)
        args = tuple(made[a] if isinstance(a, int) else a for a in args)
        anchor = call_after(graph_module.graph, anchor, target, args, like=norm)
        made.append(anchor)
    for piece in list(norm.users):
        piece.replace_all_uses_with(anchor)
        graph_module.graph.erase_node(piece)
    graph_module.graph.erase_node(norm)
