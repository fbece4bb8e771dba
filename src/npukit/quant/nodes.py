"""Reading ONNX nodes, shared by the quantization steps."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper


def node_attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    """The value of ``node``'s attribute ``name``, or ``default`` where the node does not set it."""
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Tensor name -> the nodes that read it, once per input slot that names it, in graph order."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers
