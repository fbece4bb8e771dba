"""npukit's edge passes for ExecuTorch's XNNPACK delegate, in the order they run: each rewrites an op XNNPACK's
partitioner (executorch 1.5.1) refuses or leaves to the portable kernels as ops it takes, exactly (the layer norm: to
float rounding; the safe-softmax guard: exactly wherever a row of scores has a finite one).

``npukit.runtime.executorch`` hands them to ``to_edge_transform_and_lower``, which runs them on every edge program
(fp32, or the q/dq of a PT2E-converted one) before XNNPACK partitions it. One pass per module:
``executorch_prelu`` (PReLU on fewer than four dims: on a 4-D view), ``executorch_mean`` (a mean over H and W
without keepdim: with keepdim, then a view), ``executorch_split`` (a split's pieces: slices), ``executorch_views``
(squeeze, unsqueeze, select and a no-op expand on static shapes: views, a select a slice and a view, the expand
gone), ``executorch_layer_norm`` (a layer norm over the last dim: two one-output linear layers of weight 1/C and
element-wise ops), ``executorch_scalar`` (a float tensor times a Python number: times a constant),
``executorch_softmax`` (scaled_dot_product_attention's safe-softmax guard on unmasked scores: dropped). Together the
last four make a transformer encoder block (torchvision's ViT, nn.TransformerEncoderLayer) one delegate call.
"""

from __future__ import annotations

from executorch.exir.pass_base import ExportPass

from npukit.runtime.executorch_layer_norm import LayerNormPass
from npukit.runtime.executorch_mean import KeepMeanDimsPass
from npukit.runtime.executorch_prelu import PreluOn4dPass
from npukit.runtime.executorch_scalar import ScalarMulPass
from npukit.runtime.executorch_softmax import SafeSoftmaxPass
from npukit.runtime.executorch_split import SliceSplitPass
from npukit.runtime.executorch_views import StaticViewsPass


def transform_passes() -> list[ExportPass]:
    """The passes ``npukit.runtime.executorch`` runs on every edge program before XNNPACK partitions it, in order
    (independent of one another: each rewrites its own op)."""
    return [PreluOn4dPass(), KeepMeanDimsPass(), SliceSplitPass(), StaticViewsPass(), LayerNormPass(),
            ScalarMulPass(), SafeSoftmaxPass()]
