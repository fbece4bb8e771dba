"""npukit's edge passes for ExecuTorch's XNNPACK delegate, in the order they run: each rewrites, exactly, an op
XNNPACK's partitioner (executorch 1.5.1) refuses or leaves to the portable kernels as one it takes.

``npukit.runtime.executorch`` hands them to ``to_edge_transform_and_lower``, which runs them on every edge program
(fp32, or the q/dq of a PT2E-converted one) before XNNPACK partitions it. One pass per module:
``executorch_prelu`` (PReLU on fewer than four dims: on a 4-D view), ``executorch_mean`` (a mean over H and W
without keepdim: with keepdim, then a view), ``executorch_split`` (a split's pieces: slices).
"""

from __future__ import annotations

from executorch.exir.pass_base import ExportPass

from npukit.runtime.executorch_mean import KeepMeanDimsPass
from npukit.runtime.executorch_prelu import PreluOn4dPass
from npukit.runtime.executorch_split import SliceSplitPass


def transform_passes() -> list[ExportPass]:
    """The passes ``npukit.runtime.executorch`` runs on every edge program before XNNPACK partitions it, in order
    (independent of one another: each rewrites its own op)."""
    return [PreluOn4dPass(), KeepMeanDimsPass(), SliceSplitPass()]
