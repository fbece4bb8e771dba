"""Add(MatMul(x, W), b) with 2-D x and constant W, b -> Gemm(x, W, b); a lone such MatMul -> Gemm(x, W)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npukit.passes._rewrite import (
    add_initializer,
    constant_array,
    is_float,
    onnx_nodes,
    rank,
    replace_with_node,
    sole_consumer,
)
from npukit.passes.base import NpukitPass


class FuseMatMulAddPass(NpukitPass):
    """Turn a MatMul by a constant 2-D weight (and the Add of a constant bias after it) into one Gemm.

    Gemm takes only 2-D inputs, so a MatMul whose input rank is not known to be 2 stays, with a note. The bias must
    broadcast to [N] (shapes [], [1], [N], [1, 1], [1, N]); it becomes Gemm's C input of shape [N].
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.rewrites = 0
        for matmul in onnx_nodes(model, "MatMul"):
            why = self._try_fuse(matmul)
            if why is None:
                self.rewrites += 1
            else:
                self.note(f"MatMul {matmul.name!r} is kept: {why}")
        return ir.passes.PassResult(model, modified=self.rewrites > 0)

    def _try_fuse(self, matmul: ir.Node) -> str | None:
        x, w_value = matmul.inputs[0], matmul.inputs[1]
        weight = constant_array(w_value)
        if weight is None:
            return "its second input is not a constant weight"
        if weight.ndim != 2:
            return f"weight rank {weight.ndim}: Gemm needs a 2-D weight"
        if not is_float(x) or weight.dtype.kind != "f":
            return "Gemm is only used for floating-point MatMul"
        x_rank = rank(x)
        if x_rank != 2:
            shown = "unknown" if x_rank is None else str(x_rank)
            return f"input rank {shown}: Gemm needs 2-D input"
        out = matmul.outputs[0]
        add = sole_consumer(out)
        if add is not None and add.op_type == "Add" and add.domain in ("", "ai.onnx"):
            bias_value = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
            bias = self._bias_vector(bias_value, weight.shape[1])
            if isinstance(bias, str):
                self.note(f"Add {add.name!r} stays after the Gemm made of MatMul {matmul.name!r}: {bias}")
            else:
                if bias is not bias_value:
                    graph = matmul.graph
                    assert isinstance(graph, ir.Graph)
                    bias = add_initializer(graph, bias, name_hint=f"{bias_value.name or 'bias'}_gemm")
                replace_with_node([matmul, add], add.outputs[0], "Gemm", [x, w_value, bias])
                return None
        replace_with_node([matmul], out, "Gemm", [x, w_value])
        return None

    @staticmethod
    def _bias_vector(value: ir.Value | None, n: int) -> ir.Value | np.ndarray | str:
        """``value`` itself when it is a constant of shape [N]; a [N] array when it broadcasts to it; else why not."""
        bias = constant_array(value)
        if bias is None:
            return "its other input is not constant"
        if bias.shape == (n,):
            return value  # type: ignore[return-value]
        if bias.ndim > 2:
            return f"bias rank {bias.ndim} would raise the output rank"
        try:
            return np.broadcast_to(bias, (1, n)).reshape(n).copy()
        except ValueError:
            return f"bias shape {list(bias.shape)} does not broadcast to [{n}]"
