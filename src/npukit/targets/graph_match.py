"""Graph reading shared by the target analyses (partition, hazards, fixes), beside the shared
``frontend.graph_index.GraphIndex``: tensor dtypes and shapes as a target profile sees them, node attributes, and one
step of a node pattern (``profile.PatternStep``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import onnx
import onnx.numpy_helper

from npukit.frontend.graph_index import GraphIndex
from npukit.targets.profile import SMALL_CONSTANT, PatternStep, TensorInfo


def dtype_name(elem_type: int) -> str | None:
    if not elem_type:
        return None
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def overridable_initializers(model: onnx.ModelProto) -> frozenset[str]:
    """The initializers ONNX Runtime lets a caller override, so not constants to it: those the main graph also lists
    as inputs, from IR version 4 on (before it every initializer had to be listed, and none is overridable)."""
    if model.ir_version < 4:
        return frozenset()
    return frozenset(i.name for i in model.graph.input) & frozenset(t.name for t in model.graph.initializer)


def tensor_infos(graph: onnx.GraphProto, overridable: frozenset[str] = frozenset()) -> dict[str, TensorInfo]:
    """Tensor name -> ``TensorInfo``; the ``overridable`` initializers (``overridable_initializers``, where the
    runtime is ONNX Runtime) are not constants."""
    infos: dict[str, TensorInfo] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if not value.type.HasField("tensor_type"):
            continue
        tt = value.type.tensor_type
        shape = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        infos[value.name] = TensorInfo(dtype_name(tt.elem_type), shape)
    for t in graph.initializer:
        infos[t.name] = TensorInfo(dtype_name(t.data_type), tuple(t.dims), constant=True, values=_small_values(t)) \
            if t.name not in overridable else TensorInfo(dtype_name(t.data_type), tuple(t.dims), overridable=True)
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            tensor = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                          None)
            old = infos.get(node.output[0])
            infos[node.output[0]] = TensorInfo(
                dtype_name(tensor.data_type) if tensor is not None else (old.dtype if old else None),
                tuple(tensor.dims) if tensor is not None else (old.shape if old else None), constant=True,
                values=_small_values(tensor) if tensor is not None else None)
    for node in graph.node:  # an Identity of a constant is that constant: ORT removes it before any EP partitions
        source = infos.get(node.input[0]) if node.op_type == "Identity" and node.input and node.output else None
        # (RetinaFace's exporter shares its SSH weights through them)
        if source is not None and (source.constant or source.overridable):
            infos[node.output[0]] = source
    index = GraphIndex(graph)
    for name in index.shifted_dequantized:  # int8 weights dequantized per channel, some off zero (ORT's GEMM path)
        infos[name] = dataclasses.replace(infos.get(name, TensorInfo(None, None)), shifted_zero_points=True)
    for name in index.shape_computed - index.folded:  # sizes computed from shapes: constants once those are folded
        info = infos.get(name)
        if info is not None and not info.constant:
            infos[name] = dataclasses.replace(info, from_shapes=True)
    return infos


def _small_values(tensor: onnx.TensorProto) -> tuple[float, ...] | None:
    """The values of a constant of at most SMALL_CONSTANT elements stored in the model, flattened; else None."""
    if math.prod(tensor.dims) > SMALL_CONSTANT or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    try:
        return tuple(onnx.numpy_helper.to_array(tensor).ravel().tolist())
    except (TypeError, ValueError):
        return None


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def step_matches(node: onnx.NodeProto, step: PatternStep, root: str, outputs: list[str],
                  inputs: list[str] | None = None) -> bool:
    """Whether ``node`` is ``step`` of a pattern rooted at ``root``; ``inputs``: the node's inputs as the matcher
    should see them (e.g. through Q/DQ pairs), its own by default."""
    if node.op_type != step.op_type or len(node.input) != len(step.inputs) or not node.output:
        return False
    free = list(node.input if inputs is None else inputs)
    for ref in step.inputs:
        if ref == "*":
            continue
        name = root if ref == "x" else outputs[int(ref)]
        if name not in free:
            return False
        free.remove(name)
    attrs = node_attrs(node)
    return all(isinstance(attrs.get(k), (int, float)) and abs(attrs[k] - v) <= 1e-4 * max(1.0, abs(v))
               for k, v in step.attributes.items())
