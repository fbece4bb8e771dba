"""Grouped convs whose input one 8-bit grid cannot carry: the conv and the node writing its input stay in float.

A depthwise conv computes each output channel from one input channel alone. When the channels of its input span
very different ranges (a folded BatchNorm scales some by 60, others by 0.01), one per-tensor 8-bit activation grid
over the widest channel leaves the narrow ones a level or two, and the depthwise conv, mixing nothing, passes that
error straight on: its output is wrong on those channels, whatever grid its weights get. A pointwise conv reading
the same tensor averages the error over its many inputs and barely notices.

Found on PaddleDetection's PicoDet layout detector (LCNet backbone): with every tensor but one in float, rounding
the input of each of its 37 depthwise convs to its calibrated grid gives that conv's output 8 to 19 dB SQNR on 10 of
them (against 27 dB and up on every conv of MobileNetV2, YOLOv8n and all but one of RetinaFace's), and the INT8
model's F1 at IoU 0.25 against the float model's boxes fell to 0.83. The measure here is that one: each grouped
conv's output with its input alone rounded to the calibrated per-tensor grid, against its float output, on the
calibration samples; one float run of the model with a twin of each such conv, no QDQ model built.

The input tensor is quantized where its producer writes it (the producer's output grid), so leaving the depthwise
conv alone in float keeps the rounding; the conv and the heavy node that writes its input (a pointwise conv) stay in
float, and ``float_neighbours`` closes the region over the activation between them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npukit.frontend.graph_index import GraphIndex
from npukit.quant.grids import activation_qparams
from npukit.quant.nodes import node_attr
from npukit.quant.precision.float_neighbours import ELEMENTWISE, HEAVY

FRAGILE_DB = 20.0  # a grouped conv whose output falls below this with its input alone rounded stays in float


@dataclasses.dataclass(frozen=True)
class FragileConv:
    node: str
    input: str
    sqnr_db: float
    producer: str | None  # the heavy node writing the input (through elementwise nodes), kept in float too

    def summary(self) -> dict:
        return {"node": self.node, "input": self.input, "sqnr_db": round(float(self.sqnr_db), 2),
                "producer": self.producer}


def grouped_convs(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Convs of ``model`` with ``group`` > 1, constant weights and an activation input."""
    constants = {i.name for i in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type == "Conv" and int(node_attr(n, "group", 1)) > 1
            and len(n.input) > 1 and n.input[1] in constants and n.input[0] not in constants]


def input_grid_sqnr(model: onnx.ModelProto, samples: Iterable[Mapping[str, np.ndarray]],
                    ranges: Mapping[str, tuple[float, float]], *, signed: bool = False,
                    symmetric: bool = False, convs: Iterable[onnx.NodeProto] | None = None) -> dict[str, float]:
    """Per grouped conv of ``model`` (or of ``convs``) whose input has a range in ``ranges``: the SQNR (dB) of its
    output with its input alone rounded to the 8-bit grid of that range, against its float output, summed over
    ``samples`` (see the module docstring). One float session of ``model`` with a twin of each conv."""
    from npukit.runtime.ort import make_session

    chosen = [c for c in (grouped_convs(model) if convs is None else convs) if c.input[0] in ranges]
    if not chosen:
        return {}
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    graph = twin.graph
    rounded: dict[str, str] = {}
    outputs: list[tuple[str, str, str]] = []  # (conv, float output, twin output)
    for i, conv in enumerate(chosen):
        tensor = conv.input[0]
        if tensor not in rounded:
            lo, hi = ranges[tensor]
            scale, zero = activation_qparams(float(lo), float(hi), signed=signed, symmetric=symmetric)
            prefix = f"_npukit_fragile{len(rounded)}"
            graph.initializer.extend([numpy_helper.from_array(scale, f"{prefix}_scale"),
                                      numpy_helper.from_array(zero, f"{prefix}_zero")])
            graph.node.extend([
                helper.make_node("QuantizeLinear", [tensor, f"{prefix}_scale", f"{prefix}_zero"], [f"{prefix}_q"]),
                helper.make_node("DequantizeLinear", [f"{prefix}_q", f"{prefix}_scale", f"{prefix}_zero"],
                                 [f"{prefix}_x"])])
            rounded[tensor] = f"{prefix}_x"
        copy = helper.make_node("Conv", [rounded[tensor], *conv.input[1:]], [f"_npukit_fragile_y{i}"],
                                name=f"_npukit_fragile_conv{i}")
        copy.attribute.extend(conv.attribute)
        graph.node.append(copy)
        outputs.append((conv.name, conv.output[0], copy.output[0]))
    del graph.output[:]
    graph.output.extend(helper.make_empty_tensor_value_info(n) for _, y, t in outputs for n in (y, t))
    session = make_session(twin, optimization="disable")
    names = [n for _, y, t in outputs for n in (y, t)]
    signal = dict.fromkeys((c for c, _, _ in outputs), 0.0)
    noise = dict.fromkeys(signal, 0.0)
    for sample in samples:
        got = dict(zip(names, session.run(names, dict(sample))))
        for conv, y, t in outputs:
            ref = got[y].astype(np.float64)
            signal[conv] += float(np.sum(ref * ref))
            noise[conv] += float(np.sum((ref - got[t]) ** 2))
    return {c: float(10.0 * np.log10(signal[c] / noise[c])) if noise[c] > 0 and signal[c] > 0 else float("inf")
            for c in signal}


def fragile_convs(model: onnx.ModelProto, samples: Iterable[Mapping[str, np.ndarray]],
                  ranges: Mapping[str, tuple[float, float]], *, threshold_db: float = FRAGILE_DB,
                  signed: bool = False, symmetric: bool = False,
                  skip: Iterable[str] = ()) -> list[FragileConv]:
    """The grouped convs of ``model`` (less ``skip``) whose ``input_grid_sqnr`` is below ``threshold_db``, each
    with the heavy node that writes its input (None where a graph input or a light node does)."""
    skipped = set(skip)
    convs = [c for c in grouped_convs(model) if c.name not in skipped]
    sqnr = input_grid_sqnr(model, samples, ranges, signed=signed, symmetric=symmetric, convs=convs)
    index = GraphIndex(model.graph)
    found = []
    for conv in convs:
        if conv.name in sqnr and sqnr[conv.name] < threshold_db:
            found.append(FragileConv(conv.name, conv.input[0], sqnr[conv.name],
                                     _heavy_producer(conv.input[0], index)))
    return found


def _heavy_producer(tensor: str, index: GraphIndex) -> str | None:
    """The one heavy node that writes ``tensor`` through elementwise nodes (a conv's activation, a HardSwish written
    out as x * HardSigmoid(x)), at most four deep; None where that region reaches a graph input, another kind of node
    or two heavy nodes."""
    heavy: set[str] = set()
    frontier, seen = [tensor], set()
    for _ in range(4):
        following = []
        for name in frontier:
            if name in seen:
                continue
            seen.add(name)
            node = index.producer_node(name)
            if node is None:  # a graph input
                return None
            if node.op_type in HEAVY:
                heavy.add(node.name)
            elif node.op_type in ELEMENTWISE:  # the ops float_neighbours keeps beside a float conv
                following += [t for t in node.input if t and t not in index.constants]
            else:
                return None
        frontier = following
        if not frontier:
            break
    if frontier:
        return None
    return next(iter(heavy)) if len(heavy) == 1 else None
