"""Activation equalization of linear streams: give every channel of a per-tensor-quantized activation the same range.

An activation is quantized per tensor (one scale for all its channels: that is what ONNX Runtime's QLinearConv,
QLinearAdd and the NPUs take), so a channel whose values span a tenth of the tensor's range gets a tenth of its
levels. Where the function between the producers and the consumers of a channel is positively homogeneous, the
channel can be scaled up by s_c >= 1 and the consumers' weights for it down by 1 / s_c without changing the model:

- producers: Conv (any group) and Gemm, whose output channel c (weight rows and bias) is multiplied by s_c;
- pass-through, per channel: Add of two such streams (the residual streams of MobileNetV2's linear bottlenecks and
  of ResNets), Relu, MaxPool, AveragePool and GlobalAveragePool (s_c > 0 commutes with each);
- consumers: Conv with group 1 (input channel c of the weight divided by s_c), depthwise Conv (channel c), Gemm with
  the stream as its first input (row c of the weight, or column with transB).

One group is the closure of those rules from a Conv/Gemm output; a group that reaches anything else (a Clip, whose
bound is a scalar; a Concat; a graph output) is left alone, with the reason. Cross-layer equalization (``equalize``)
balances two weights' ranges; this balances an activation's channels, where CLE cannot reach: across the Add of a
residual stream and its several consumers.

With r_c the channel's largest magnitude on the calibration data (over every tensor of the group) and R = max_c r_c,
s_c = (R / r_c) ** alpha, capped at ``max_scale``. alpha = 1 gives every channel the full range; the cost is on the
consumer side, whose weight columns for small channels shrink against their per-output-channel grid, so 0 < alpha < 1
trades activation levels against weight levels (0.5 measured best on MobileNetV2; see benchmarks/quant_vs_anchors.py).
The tensor's own range does not grow (s_c r_c <= R), and the float model's outputs are unchanged up to rounding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from npukit.frontend.graph_index import GraphIndex
from npukit.quant.calibration.calibrate import channel_statistics
from npukit.quant.cpu.schemes import is_depthwise
from npukit.quant.nodes import node_attr

PASS_THROUGH = ("Add", "Relu", "MaxPool", "AveragePool", "GlobalAveragePool")


@dataclasses.dataclass(frozen=True)
class StreamGroup:
    tensors: tuple[str, ...]
    producers: tuple[str, ...]  # node names
    consumers: tuple[str, ...]
    channelwise: tuple[str, ...] = ()  # depthwise Convs the group runs through (``permutation`` groups only)


@dataclasses.dataclass(frozen=True)
class StreamEqualizeResult:
    model: onnx.ModelProto
    groups: list[dict]  # per equalized group: tensors, producers, consumers, channels, median / max scale
    skipped: list[dict]  # {"seed": producer node, "reason"}

    def summary(self) -> dict:
        return {"groups": len(self.groups), "tensors": sum(len(g["tensors"]) for g in self.groups),
                "skipped": len(self.skipped),
                "median_scale": float(np.median([g["median_scale"] for g in self.groups])) if self.groups else 1.0}


def find_stream_groups(model: onnx.ModelProto, *, permutation: bool = False
                       ) -> tuple[list[StreamGroup], list[dict]]:
    """Every group of activations that can be scaled per channel without changing the model (module docstring).

    ``permutation``: the groups whose channels can be reordered instead. A reordering also commutes with Clip
    (scalar bounds) and with depthwise Convs (channel c of the input makes channel c of the output, once the
    depthwise weights and bias are reordered too), so both run through such a group; those Convs are its
    ``channelwise`` nodes."""
    index = GraphIndex(model.graph)
    seen: set[str] = set()
    groups: list[StreamGroup] = []
    skipped: list[dict] = []
    for seed in index.nodes:
        if seed.op_type not in ("Conv", "Gemm") or not seed.output or seed.output[0] in seen:
            continue
        tensors: set[str] = set()
        prods: dict[str, None] = {}
        cons: dict[str, None] = {}
        through: dict[str, None] = {}
        todo = [seed.output[0]]
        reason = ""
        while todo and not reason:
            t = todo.pop()
            if t in tensors:
                continue
            tensors.add(t)
            reason = _check_producer(t, index, prods, todo, through if permutation else None)
            for c in index.consumer_nodes(t) if not reason else ():
                reason = _check_consumer(t, c, index, cons, todo, through if permutation else None)
                if reason:
                    break
        seen |= tensors
        if not reason and not cons:
            reason = "no consumer to take the inverse scale"
        if reason:
            skipped.append({"seed": seed.name, "reason": reason})
        else:
            groups.append(StreamGroup(tuple(sorted(tensors)), tuple(prods), tuple(cons), tuple(through)))
    return groups, skipped


def _channelwise(node: onnx.NodeProto, t: str, inits: dict, through: dict | None) -> str:
    """For a ``permutation`` group (``through`` given): "clip" for a Clip of ``t`` with constant bounds, "depthwise"
    for a depthwise Conv of ``t`` with constant weights; "" otherwise."""
    if through is None or not node.input or node.input[0] != t:
        return ""
    if node.op_type == "Clip" and all(not i or i in inits for i in node.input[1:]):
        return "clip"
    if node.op_type == "Conv" and len(node.input) > 1 and node.input[1] in inits \
            and is_depthwise(node, inits[node.input[1]].dims):
        return "depthwise"
    return ""


def _check_producer(t: str, index: GraphIndex, prods: dict, todo: list[str], through: dict | None = None) -> str:
    if t in index.outputs:
        return f"{t} is a graph output"
    inits = index.initializers
    node = index.producer_node(t)
    if node is None:
        return f"{t} is a graph input or an initializer"
    kind = _channelwise(node, node.input[0] if node.input else "", inits, through)
    if kind:
        if kind == "depthwise":
            through[node.name] = None
        todo.append(node.input[0])
    elif node.op_type == "Conv" and node.input[1] in inits:
        prods[node.name] = None
    elif node.op_type == "Gemm" and node.input[1] in inits and not node_attr(node, "transA", 0):
        prods[node.name] = None
    elif node.op_type in ("Flatten", "Reshape") and _is_channel_flatten(node, index):
        todo.append(node.input[0])
    elif node.op_type in PASS_THROUGH:
        ins = [i for i in node.input if i]
        if any(i in inits for i in ins):
            return f"{node.op_type} {node.name} has a constant input"
        if node.op_type == "Add" and len(ins) != 2:
            return f"Add {node.name} has {len(ins)} inputs"
        todo.extend(ins)
    else:
        return f"{t} comes from {node.op_type} {node.name}"
    return ""


def _is_channel_flatten(node: onnx.NodeProto, index: GraphIndex) -> bool:
    """A Flatten/Reshape of a GlobalAveragePool's (N, C, 1, 1) output to (N, C): channel c stays feature c."""
    source = index.producer_node(node.input[0])
    if source is None or source.op_type != "GlobalAveragePool":
        return False
    if node.op_type == "Flatten":
        return node_attr(node, "axis", 1) == 1
    shape = index.initializers.get(node.input[1]) if len(node.input) > 1 else None
    return shape is not None and len(numpy_helper.to_array(shape).reshape(-1)) == 2


def _check_consumer(t: str, node: onnx.NodeProto, index: GraphIndex, cons: dict, todo: list[str],
                    through: dict | None = None) -> str:
    inits = index.initializers
    kind = _channelwise(node, t, inits, through)
    if kind:
        if kind == "depthwise":
            through[node.name] = None
        todo.extend(node.output)
        return ""
    if node.op_type in ("Flatten", "Reshape") and _is_channel_flatten(node, index):
        todo.extend(node.output)
        return ""
    if node.op_type in PASS_THROUGH:
        if any(i in inits for i in node.input):
            return f"{node.op_type} {node.name} has a constant input"
        todo.extend([i for i in node.input if i] + list(node.output))
        return ""
    if node.op_type == "Conv" and node.input[0] == t and node.input[1] in inits:
        group = node_attr(node, "group", 1)
        if group == 1 or is_depthwise(node, inits[node.input[1]].dims):
            cons[node.name] = None
            return ""
        return f"grouped Conv {node.name} (group {group})"
    if node.op_type == "Gemm" and node.input[0] == t and node.input[1] in inits and not node_attr(node, "transA", 0):
        cons[node.name] = None
        return ""
    return f"{t} feeds {node.op_type} {node.name}"


def channel_axis(node: onnx.NodeProto, *, output: bool) -> int:
    """The axis of a Conv's or Gemm's weight that holds a group's channel c: of the node's output (a producer, or a
    depthwise Conv a permutation group runs through) or of its input (a consumer)."""
    if node.op_type == "Gemm":
        return int(bool(node_attr(node, "transB", 0)) != output)  # (K, N) weight, or (N, K) with transB
    return 0 if output or node_attr(node, "group", 1) != 1 else 1  # depthwise: channel c is row c either way


def along(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """``values`` shaped to broadcast along ``axis`` of an ``ndim``-dimensional array."""
    shape = [1] * ndim
    shape[axis] = -1
    return values.reshape(shape)


def equalize_streams(model: onnx.ModelProto, samples: Iterable[object], *, alpha: float = 0.5,
                     max_scale: float = 100.0, limit: int | None = None) -> StreamEqualizeResult:
    """Scale every stream group's channels towards equal ranges (a copy is returned; see the module docstring)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha {alpha} must be in [0, 1]")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    groups, skipped = find_stream_groups(out)
    if not groups:
        return StreamEqualizeResult(model=out, groups=[], skipped=skipped)
    stats = channel_statistics(out, sorted({t for g in groups for t in g.tensors}), samples, limit=limit)
    index = GraphIndex(out.graph)
    nodes = {n.name: n for n in index.nodes}
    inits = index.initializers

    def get(name: str) -> np.ndarray:
        return numpy_helper.to_array(inits[name]).astype(np.float64)

    def put(name: str, value: np.ndarray) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))

    rows = []
    for g in groups:
        peaks = [np.maximum(np.abs(stats[t].min), np.abs(stats[t].max)) for t in g.tensors if t in stats]
        if not peaks or len({p.shape for p in peaks}) != 1:
            skipped.append({"seed": g.producers[0], "reason": "channel statistics unavailable or inconsistent"})
            continue
        r = np.max(peaks, axis=0)
        top = float(r.max())
        if top <= 0.0:
            skipped.append({"seed": g.producers[0], "reason": "the stream is zero on the calibration data"})
            continue
        s = np.ones_like(r)
        s[r > 0] = np.minimum((top / r[r > 0]) ** alpha, max_scale)  # a channel that is always zero keeps 1
        for name in g.producers:
            node = nodes[name]
            w = get(node.input[1])
            put(node.input[1], w * along(s, channel_axis(node, output=True), w.ndim))
            if len(node.input) > 2 and node.input[2]:
                put(node.input[2], get(node.input[2]) * s)
        for name in g.consumers:
            node = nodes[name]
            w = get(node.input[1])
            put(node.input[1], w / along(s, channel_axis(node, output=False), w.ndim))
        rows.append({"tensors": list(g.tensors), "producers": list(g.producers), "consumers": list(g.consumers),
                     "channels": int(r.size), "median_scale": float(np.median(s)), "max_scale": float(s.max())})
    return StreamEqualizeResult(model=out, groups=rows, skipped=skipped)
