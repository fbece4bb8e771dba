"""A float tensor times a Python number, for ExecuTorch's XNNPACK delegate: ``mul.Scalar(x, s)`` of a float32 ``x``
becomes ``mul.Tensor(x, t)`` with ``t`` the one-element float32 constant ``s``, the same values (bit-exact: torch
and ExecuTorch's portable kernel multiply by ``s`` cast to float32 too).

ExecuTorch's XNNPACK partitioner (executorch 1.5.1) takes ``mul.Tensor`` (``MulConfig``,
``backends/xnnpack/partition/config/generic_node_configs.py``) but has no config for ``mul.Scalar``: the scaling of q
and k by ``sqrt(1 / sqrt(head_dim))`` in scaled_dot_product_attention's decomposition (torch 2.14) ran on the
portable kernels, two per attention, and split the delegated graph there. The constant is a ``get_attr`` that
ExecuTorch lifts into a buffer after the passes; XNNPACK broadcasts it as a static tensor. Float only: a
``mul.Scalar`` that reads a dequantize or is read by a quantize is left as it is (XNNPACK's quantized mul takes
two quantized operands).
An edge-dialect pass (``ExportPass``), run by ``to_edge_transform_and_lower`` before partitioning
(``npukit.runtime.executorch_passes``).
"""

from __future__ import annotations

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult

from npukit.runtime.executorch_grid import DQ, Q

MUL_SCALAR = exir_ops.edge.aten.mul.Scalar


def why_not(node: torch.fx.Node) -> str | None:
    """Why this pass leaves ``node`` (an edge op) as it is, or None where it rewrites it."""
    if node.op != "call_function" or node.target is not MUL_SCALAR:
        return "not an edge aten.mul.Scalar"
    source, factor = node.args[0], node.args[1]
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if value is None or value.dtype != torch.float32 or node.meta["val"].dtype != torch.float32:
        return "not a float32 tensor"
    if not isinstance(factor, (int, float)) or isinstance(factor, bool):
        return "a factor that is not a Python number"
    if source.target is DQ or any(u.target is Q for u in node.users):
        return "a quantized mul (left as it is: float only)"
    return None


class ScalarMulPass(ExportPass):
    """Every edge ``mul.Scalar`` of a float32 tensor a ``mul.Tensor`` by a one-element float32 constant."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        modified = False
        graph = graph_module.graph
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not MUL_SCALAR or why_not(node):
                continue
            factor = float(node.args[1])
            name = "_npukit_scalar_" + "".join(c if c.isalnum() else "_" for c in repr(factor))
            if not hasattr(graph_module, name):
                graph_module.register_buffer(name, torch.tensor([factor], dtype=torch.float32))
            with graph.inserting_before(node):
                constant = graph.get_attr(name)
            constant.meta = {k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")}
            node.target, node.args = exir_ops.edge.aten.mul.Tensor, (node.args[0], constant)
            modified = True
        if not modified:
            return PassResult(graph_module, False)
        graph_module.recompile()
        return super().call(graph_module)  # traced again: every node's meta (values, shapes) computed anew
