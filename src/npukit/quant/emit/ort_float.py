"""Keep the plan's float convolutions in float on ONNX Runtime: each one reads its quantized input through a
DequantizeLinear of its own that ORT's weight quantizer does not take.

ONNX Runtime (1.20 and later, graph optimization level 1 and above: every default session) runs a transformer,
``WeightBiasQuantization``, over every Conv, ConvTranspose and Gemm whose first input comes from a DequantizeLinear
with a per-tensor scale and whose weight is a float initializer: it quantizes that weight to int8 itself, per tensor
(one scale for all output channels), and the bias to int32, after which its QDQ fusions run the node on an integer
kernel. A conv the plan leaves in float (the user's exclusions, the float head's chain, the layers a precision search
lifts) but whose input is quantized for another reader is therefore run by ORT on a per-tensor int8 grid nobody
chose. Measured on RetinaFace-MobileNet0.25 (the first depthwise conv after its float stem, LeakyRelu between them):
ORT's per-tensor weights (one scale 0.43 for eight channels) put its output 9 steps off the planned model's, 13.0 dB
where the float conv gives 20.0 dB.

The transformer requires the input's DequantizeLinear to have a scalar scale. ``keep_float_convs`` gives each such
node a DequantizeLinear of its own along the channel axis (axis 1) whose scales and zero points are the per-tensor
ones repeated: the same values, so the model computes exactly what it did, and ORT leaves the weight in float. A
per-axis DequantizeLinear needs opset 13; below it the node is listed as not kept (npukit's per-channel scheme
upgrades models to 13 first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npukit.frontend.graph_index import GraphIndex
from npukit.frontend.opset import onnx_opset
from npukit.quant.nodes import node_attr

TAKEN_OPS = ("Conv", "ConvTranspose", "Gemm")  # the ops ORT's WeightBiasQuantization quantizes
PER_AXIS_OPSET = 13
FLOAT_INPUT = "_float_input"  # suffix of the input a kept float node reads


@dataclasses.dataclass(frozen=True)
class FloatConvs:
    """The model and the float nodes it gave a DequantizeLinear of their own (``kept``), and those it could not
    (``not_kept``: node -> why)."""

    model: onnx.ModelProto
    kept: tuple[str, ...]
    not_kept: dict[str, str]

    def summary(self) -> dict:
        return {"kept_in_float": list(self.kept), "not_kept": dict(self.not_kept)}


def _input_channels(node: onnx.NodeProto, weight: onnx.TensorProto) -> int | None:
    """The size of axis 1 of ``node``'s first input, from its weight's shape (None where the weight does not say)."""
    dims = list(weight.dims)
    if node.op_type == "Conv" and len(dims) >= 3:
        return dims[1] * int(node_attr(node, "group", 1))
    if node.op_type == "ConvTranspose" and len(dims) >= 3:
        return dims[0]
    if node.op_type == "Gemm" and len(dims) == 2 and not node_attr(node, "transA", 0):
        return dims[1] if node_attr(node, "transB", 0) else dims[0]
    return None


def _taken(node: onnx.NodeProto, index: GraphIndex) -> onnx.NodeProto | None:
    """The per-tensor DequantizeLinear through which ORT's weight quantizer would take ``node`` (of the graph
    ``index`` indexes), or None."""
    if node.op_type not in TAKEN_OPS or len(node.input) < 2:
        return None
    inits = index.initializers
    dq = index.producer_node(node.input[0])
    weight = inits.get(node.input[1])
    if dq is None or dq.op_type != "DequantizeLinear" or weight is None or weight.data_type != onnx.TensorProto.FLOAT:
        return None  # its input is float, or its weight is not a float initializer
    scale = inits.get(dq.input[1])
    if scale is None or numpy_helper.to_array(scale).size != 1:
        return None  # a per-axis grid: ORT leaves it alone
    return dq


def taken_by_ort(model: onnx.ModelProto, float_nodes: Iterable[str]) -> list[str]:
    """The nodes of ``float_nodes`` that ORT's ``WeightBiasQuantization`` would quantize in ``model``."""
    wanted = set(float_nodes)
    index = GraphIndex(model.graph)
    return [n.name for n in index.nodes if n.name in wanted and _taken(n, index) is not None]


def keep_float_convs(model: onnx.ModelProto, float_nodes: Iterable[str]) -> FloatConvs:
    """``model`` (a QDQ model) with every node of ``float_nodes`` that ORT would quantize on its own
    (``taken_by_ort``) fed by a per-axis DequantizeLinear of its own with the same grid."""
    wanted = set(float_nodes)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    lookup = GraphIndex(graph)
    inits = lookup.initializers
    kept: list[str] = []
    not_kept: dict[str, str] = {}
    new_nodes: dict[int, onnx.NodeProto] = {}  # index of the float node -> its own DequantizeLinear, put before it
    for index, node in enumerate(graph.node):
        dq = _taken(node, lookup) if node.name in wanted else None
        if dq is None:
            continue
        channels = _input_channels(node, inits[node.input[1]])
        if onnx_opset(out) < PER_AXIS_OPSET:
            not_kept[node.name] = f"opset {onnx_opset(out)} has no per-axis DequantizeLinear (needs {PER_AXIS_OPSET})"
            continue
        if channels is None:
            not_kept[node.name] = "its input's channel count is not known from its weight"
            continue
        stem = f"{node.name}{FLOAT_INPUT}"
        scale = numpy_helper.to_array(inits[dq.input[1]]).reshape(())
        graph.initializer.append(numpy_helper.from_array(np.full(channels, scale, np.float32), f"{stem}_scale"))
        inputs = [dq.input[0], f"{stem}_scale"]
        if len(dq.input) > 2 and dq.input[2] in inits:
            zero = numpy_helper.to_array(inits[dq.input[2]]).reshape(())
            graph.initializer.append(numpy_helper.from_array(np.full(channels, zero, zero.dtype), f"{stem}_zero"))
            inputs.append(f"{stem}_zero")
        new_nodes[index] = helper.make_node("DequantizeLinear", inputs, [stem], name=f"{stem}_DequantizeLinear",
                                            axis=1)
        node.input[0] = stem
        kept.append(node.name)
    if new_nodes:
        nodes = []
        for index, node in enumerate(graph.node):
            if index in new_nodes:
                nodes.append(new_nodes[index])
            nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
    return FloatConvs(model=out, kept=tuple(kept), not_kept=not_kept)
