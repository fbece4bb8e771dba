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
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from npukit.frontend.graph_index import GraphIndex
from npukit.passes._rewrite import add_initializer
from npukit.passes.base import NpukitPass

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


def _input_channels_of(op_type: str, attrs: dict[str, Any], dims: list[int]) -> int | None:
    """The size of axis 1 of a node's first input, from its weight's shape ``dims`` (None where it does not say)."""
    if op_type == "Conv" and len(dims) >= 3:
        return dims[1] * int(attrs.get("group", 1))
    if op_type == "ConvTranspose" and len(dims) >= 3:
        return dims[0]
    if op_type == "Gemm" and len(dims) == 2 and not attrs.get("transA", 0):
        return dims[1] if attrs.get("transB", 0) else dims[0]
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
    (``taken_by_ort``) fed by a per-axis DequantizeLinear of its own with the same grid (``KeepFloatConvsPass``);
    the model is copied, never changed."""
    import onnx_ir as ir

    taken = taken_by_ort(model, float_nodes)
    if not taken:
        return FloatConvs(model=model, kept=(), not_kept={})
    keep = KeepFloatConvsPass(taken)
    result = keep(ir.serde.deserialize_model(model))
    return FloatConvs(model=ir.serde.serialize_model(result.model) if result.modified else model,
                      kept=tuple(keep.kept), not_kept=dict(keep.not_kept))


class KeepFloatConvsPass(NpukitPass):
    """Each node named in ``nodes`` (ones ORT's weight quantizer would take: ``taken_by_ort``) reads its input through
    a DequantizeLinear of its own along axis 1, ``<node>_float_input``, whose scales and zero points are its input
    DequantizeLinear's per-tensor ones repeated per channel: the same values; ``kept`` and ``not_kept`` (why) say
    which."""

    def __init__(self, nodes: Iterable[str]) -> None:
        super().__init__()
        self.nodes = set(nodes)
        self.kept: list[str] = []
        self.not_kept: dict[str, str] = {}

    def call(self, model: Any) -> Any:
        import onnx_ir as ir

        graph = model.graph
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
        for node in [n for n in graph if n.name in self.nodes]:
            dq = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
            weight = node.inputs[1].const_value if len(node.inputs) > 1 and node.inputs[1] is not None else None
            channels = _input_channels_of(node.op_type, {k: a.value for k, a in node.attributes.items()},
                                          list(weight.shape) if weight is not None else [])
            if opset < PER_AXIS_OPSET:
                self.not_kept[node.name] = f"opset {opset} has no per-axis DequantizeLinear (needs {PER_AXIS_OPSET})"
                continue
            if dq is None or dq.op_type != "DequantizeLinear" or channels is None:
                self.not_kept[node.name] = "its input's channel count is not known from its weight"
                continue
            stem = f"{node.name}{FLOAT_INPUT}"
            scale = dq.inputs[1].const_value.numpy().reshape(())
            inputs = [dq.inputs[0], add_initializer(graph, np.full(channels, scale, np.float32),
                                                    name_hint=f"{stem}_scale")]
            point = dq.inputs[2] if len(dq.inputs) > 2 else None
            if point is not None and point.const_value is not None:
                zero = point.const_value.numpy().reshape(())
                inputs.append(add_initializer(graph, np.full(channels, zero, zero.dtype), name_hint=f"{stem}_zero"))
            own = ir.node("DequantizeLinear", inputs, {"axis": 1}, name=f"{stem}_DequantizeLinear")
            own.outputs[0].name = stem
            own.outputs[0].shape, own.outputs[0].type = node.inputs[0].shape, node.inputs[0].type
            graph.insert_before(node, own)
            node.replace_input_with(0, own.outputs[0])
            self.kept.append(node.name)
        self.rewrites = len(self.kept)
        return ir.passes.PassResult(model, modified=bool(self.kept))
