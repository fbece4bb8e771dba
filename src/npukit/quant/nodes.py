"""Reading ONNX nodes, shared by the quantization steps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper


def node_attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    """The value of ``node``'s attribute ``name``, or ``default`` where the node does not set it."""
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def dequantized(dq: onnx.NodeProto, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """What DequantizeLinear ``dq`` computes from its inputs in ``arrays`` (integers, scales, zero points; per
    tensor or along its ``axis``), as float32."""
    q = arrays[dq.input[0]].astype(np.float64)
    scale = arrays[dq.input[1]].astype(np.float64)
    zero = arrays[dq.input[2]].astype(np.float64) if len(dq.input) > 2 and dq.input[2] in arrays \
        else np.zeros_like(scale)
    if scale.size > 1:
        shape = [1] * q.ndim
        shape[int(node_attr(dq, "axis", 1)) % q.ndim] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((q - zero) * scale).astype(np.float32)
