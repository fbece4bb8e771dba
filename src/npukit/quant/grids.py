"""Grid arithmetic shared by the quantization steps: which axis a weight is quantized along, the (scale, zero point)
ONNX Runtime gives an activation range, and the float range an integer grid covers."""

from __future__ import annotations

import numpy as np
import onnx

from npukit.quant.nodes import node_attr

Range = tuple[float, float]


def weight_axis(node: onnx.NodeProto, *, per_channel: bool) -> int | None:
    """The output-channel axis of the node's weight that per-channel quantization uses (None: per tensor)."""
    if not per_channel:
        return None
    if node.op_type == "Gemm":
        return 0 if node_attr(node, "transB", 0) else 1
    return 0


def activation_qparams(lo: float, hi: float, *, signed: bool, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) of an 8-bit activation with range [lo, hi], as ONNX Runtime computes them."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if symmetric:
        absmax = max(-lo, hi)
        qmin, qmax = (-127, 127) if signed else (0, 255)
        scale = 2.0 * absmax / (qmax - qmin)
        zero = 0 if signed else 128
    else:
        qmin, qmax = (-128, 127) if signed else (0, 255)
        scale = (hi - lo) / (qmax - qmin)
        zero = int(np.clip(np.round(qmin - lo / scale), qmin, qmax)) if scale > 0 else 0
    scale = scale if scale > 0 else 1.0
    return np.array(scale, np.float32), np.array(zero, np.int8 if signed else np.uint8)


def grid_range(scale: float, zero_point: np.ndarray) -> Range:
    """The float range a grid covers: the ends of its zero point's integer type, dequantized."""
    info = np.iinfo(np.asarray(zero_point).dtype)
    zero = float(zero_point)
    return ((int(info.min) - zero) * scale, (int(info.max) - zero) * scale)
