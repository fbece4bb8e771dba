"""Which arithmetic the steps that compare candidate QDQ models score them on (``Recipe.score_on``).

A step that chooses between models by their outputs (the calibration method under ``method="auto"``, the recipe
under ``Recipe.choose``, range search) must run them as the artifact will run:

- ``"ort-cpu"``: ONNX Runtime on this CPU with its graph optimizations, i.e. its fused integer kernels, the model
  as ``quantize`` ships it. On x86 CPUs without VNNI those kernels add pairs of 8-bit products in saturating 16-bit
  lanes (``npukit.quant.cpu.schemes``), so a model whose weights use the full int8 range computes something else
  there than its Q/DQ graph says.
- ``"reference"``: the Q/DQ graph's own arithmetic (ONNX Runtime with no graph optimizations: every DequantizeLinear
  runs, the compute in float on the grid's values), which is what a runtime with 32-bit accumulators computes up
  to its requantization rounding: XNNPACK in ExecuTorch and LiteRT, Core ML. The plans npukit carries to those
  runtimes are scored on it. Measured on MobileNetV2 (XNNPACK scheme, int8 activations, full-range per-channel
  weights; AMD EPYC without VNNI, 64 held-out crops): the same QDQ model 18.6 dB on the reference arithmetic (as the
  .pte and .tflite measure), 9.7 dB on ORT's integer kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import onnx

ScoreOn = Literal["ort-cpu", "reference"]
OPTIMIZATION: dict[str, str] = {"ort-cpu": "all", "reference": "disable"}  # make_session's level for each


def session_for(score_on: ScoreOn, *, threads: int = 1) -> Callable[[onnx.ModelProto | bytes | str], Any]:
    """A function model -> ORT session that runs the model on ``score_on``'s arithmetic."""
    from npukit.runtime.ort import make_session

    return functools.partial(make_session, threads=threads, optimization=OPTIMIZATION[score_on])
