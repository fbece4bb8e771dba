"""PReLU on fewer than four dimensions, for ExecuTorch's XNNPACK delegate: ``prelu(x, w)`` with a 2-D or 3-D ``x``
becomes ``view(prelu(view(x, x.shape + [1, ...]), w), x.shape)``, the same values.

XNNPACK's PReLU takes NHWC tensors only, so ExecuTorch's XNNPACK lowering (1.5.1) converts a PReLU's input to NHWC,
which it cannot do for a tensor that is not 4-D: the lowering fails ("ChannelsLastTaggedReshapePass: Attempting to
convert non-NHWC compatible node to NHWC") wherever a PReLU follows a Linear layer, as in MTCNN's RNet and ONet.
PReLU's slope is per channel along dimension 1, which trailing dimensions of size 1 keep: the rewrite is exact.
An edge-dialect pass (``ExportPass``), run by ``to_edge_transform_and_lower`` before partitioning
(``npukit.runtime.executorch_passes``), so that the views and the PReLU are delegated with the rest (one delegate
call on MTCNN ONet, fp32 and INT8; an INT8 artifact is held to compile's task check as any other).
"""

from __future__ import annotations

from typing import Any

from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass

RANK = 4  # the rank XNNPACK's NHWC ops take


class PreluOn4dPass(ExportPass):
    """Every edge ``aten.prelu`` whose input has fewer than ``RANK`` dimensions, computed on a view of it padded
    with trailing dimensions of size 1 and viewed back."""

    def call_operator(self, op: Any, args: Any, kwargs: Any, meta: Any) -> Any:
        if op is not exir_ops.edge.aten.prelu.default:
            return super().call_operator(op, args, kwargs, meta)
        shape = list(args[0].to_tensor().shape)
        if len(shape) >= RANK:
            return super().call_operator(op, args, kwargs, meta)
        view = exir_ops.edge.aten.view_copy.default
        padded = super().call_operator(view, (args[0], shape + [1] * (RANK - len(shape))), {}, meta)
        result = super().call_operator(op, (padded, *args[1:]), kwargs, meta)
        return super().call_operator(view, (result, shape), {}, meta)
