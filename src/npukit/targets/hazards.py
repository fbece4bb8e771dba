"""Patterns a target takes but computes wrongly (``TargetProfile.hazards``): where they are in a model, and the
rewrites after which the target computes them right.

Matching looks through activation Q/DQ pairs (``DQ(Q(t))`` is ``t``), so one hazard is found alike in a float model
and in its QDQ model. Rewrites apply to QDQ models: the values they insert get Q/DQ pairs with the quantization
parameters of the value they copy, so the rewritten model computes exactly what the original did on ORT CPU. In a
float model a hazard is reported (it appears once the model is quantized the way npukit quantizes for the target)
but not rewritten: ONNX Runtime's basic optimizations would remove the neutral ``Mul(x, 1)`` again, while inside a
QDQ unit it stays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from npukit.frontend.graph_index import GraphIndex
from npukit.passes._rewrite import add_initializer
from npukit.passes.base import NpukitPass
from npukit.targets.graph_match import step_matches, tensor_infos
from npukit.targets.profile import Hazard, HazardSite, PatternStep, TargetProfile, TensorInfo

_QDQ = ("QuantizeLinear", "DequantizeLinear")


@dataclasses.dataclass(frozen=True)
class HazardMatch:
    """One place a hazard hits: the nodes of the pattern (original graph names), its input tensor and what the
    condition saw there."""

    hazard: Hazard
    nodes: tuple[str, ...]
    input: str
    site: HazardSite
    indices: tuple[int, ...] = ()  # positions of the pattern's nodes in the graph

    @property
    def where(self) -> str:
        """The input's shape and producer, e.g. "1x256x10x10 after Conv"."""
        shape = "x".join(str(d) for d in self.site.input.shape) if self.site.input.shape else "?"
        return shape + (f" after {self.site.producer}" if self.site.producer else "")

    @property
    def quantized(self) -> bool:
        """Whether the match is in a QDQ model (a float model's hazard appears once it is quantized)."""
        return self.site.activation_dtype is not None

    @property
    def reason(self) -> str:
        after = ""
        if not self.quantized and self.hazard.float_as:
            after = (f" (once quantized to {self.hazard.float_as} activations, as npukit quantizes for this target; "
                     f"npukit compile then rewrites it{f': {self.hazard.fix}' if self.hazard.fix else ''})")
        return f"{self.hazard.reason}{after} [{self.where}]"

    def as_dict(self) -> dict[str, Any]:
        return {"hazard": self.hazard.name, "nodes": list(self.nodes), "input": self.input, "where": self.where,
                "reason": self.reason, "fix": self.hazard.fix}


class _View:
    """A graph (its ``GraphIndex``) read through activation Q/DQ pairs: every tensor maps to its float source."""

    def __init__(self, index: GraphIndex) -> None:
        self.index = index
        self.graph = index.graph
        self.constants = index.constants

    def source(self, name: str) -> str:
        """``name`` with DQ(Q(.)) pairs peeled off."""
        while True:
            dq = self.index.producer_node(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                return name
            q = self.index.producer_node(dq.input[0])
            if q is None or q.op_type != "QuantizeLinear":
                return name
            name = q.input[0]

    def op_producer(self, name: str) -> onnx.NodeProto | None:
        node = self.index.producer_node(self.source(name))
        return None if node is None or node.op_type in _QDQ or node.op_type == "Constant" else node

    def quantized_dtype(self, name: str) -> str | None:
        """The dtype ``name`` (a float source) is quantized to, from the zero point of a Q reading it."""
        for q in self.index.consumer_nodes(name):
            if q.op_type != "QuantizeLinear":
                continue
            if len(q.input) > 2 and q.input[2]:
                zp = next((t for t in self.graph.initializer if t.name == q.input[2]), None)
                if zp is not None:
                    return helper.tensor_dtype_to_np_dtype(zp.data_type).name
            return "uint8"  # ONNX's default when there is no zero point
        return None

    def is_constant(self, name: str) -> bool:
        source = self.source(name)
        if source in self.constants:
            return True
        dq = self.index.producer_node(source)
        return dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in self.constants


def _match(view: _View, pattern: tuple[PatternStep, ...], first: onnx.NodeProto, root: str
           ) -> list[onnx.NodeProto] | None:
    members: list[onnx.NodeProto] = []
    for step in pattern:
        if not members:
            candidates = [first]
        else:
            near = [root, *(o for m in members for o in m.output)]
            reach: list[onnx.NodeProto] = []
            for name in near:  # consumers of the value, and of its Q/DQ copies
                for c in view.index.consumer_nodes(name):
                    if c.op_type == "QuantizeLinear":
                        for dq in view.index.consumer_nodes(c.output[0]):
                            if dq.op_type == "DequantizeLinear":
                                reach.extend(view.index.consumer_nodes(dq.output[0]))
                    else:
                        reach.append(c)
            candidates = list({id(c): c for c in reach}.values())
        outputs = [m.output[0] for m in members]
        pick = next((c for c in candidates if all(c is not m for m in members)
                     and step_matches(c, step, root, outputs, [view.source(x) for x in c.input])), None)
        if pick is None:
            return None
        members.append(pick)
    return members


def _producer(view: _View, root: str, transparent: tuple[str, ...]) -> str | None:
    """The op type producing ``root``, looking through Q/DQ and through ``transparent`` ops whose other inputs are
    constant (an activation or a scale a backend folds into the op before it)."""
    node = view.op_producer(root)
    seen = 0
    while node is not None and node.op_type in transparent and seen < 8:
        others = [x for x in node.input[1:] if x]
        if not node.input or not all(view.is_constant(x) for x in others):
            break
        node, seen = view.op_producer(node.input[0]), seen + 1
    return None if node is None else node.op_type


def find_hazards(model: onnx.ModelProto, target: TargetProfile, *, infos: dict[str, TensorInfo] | None = None,
                 index: GraphIndex | None = None) -> list[HazardMatch]:
    """Every place one of ``target``'s hazards hits in ``model`` (shapes from ``infos`` or ONNX shape inference;
    ``index``: the graph's, when the caller has it)."""
    if not target.hazards:
        return []
    if infos is None:

        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        infos = tensor_infos(inferred.graph)
    view = _View(index or GraphIndex(model.graph))
    position = {id(n): i for i, n in enumerate(view.index.nodes)}
    found: list[HazardMatch] = []
    taken: set[int] = set()
    for node in view.index.nodes:
        if node.op_type in _QDQ:
            continue
        for hazard in target.hazards:
            for pattern in hazard.patterns:
                if id(node) in taken or node.op_type != pattern[0].op_type:
                    continue
                for root in dict.fromkeys(view.source(x) for x in node.input if x):
                    members = _match(view, pattern, node, root)
                    if members is None or any(id(m) in taken for m in members):
                        continue
                    site = HazardSite(input=infos.get(root, TensorInfo(None, None)),
                                      producer=_producer(view, root, hazard.transparent),
                                      activation_dtype=view.quantized_dtype(root))
                    if not hazard.check(site):
                        continue
                    taken.update(id(m) for m in members)
                    found.append(HazardMatch(hazard, tuple(m.name or f"{m.op_type}_{position[id(m)]}"
                                                           for m in members), root, site,
                                             tuple(position[id(m)] for m in members)))
                    break
    return found


# ----------------------------------------------------------------------------------------------------------------
# Rewrites


def _source(value: ir.Value) -> ir.Value:
    """``value`` with DQ(Q(.)) pairs peeled off (``_View.source`` on the IR)."""
    while True:
        dq = value.producer()
        q = dq.inputs[0].producer() if dq is not None and dq.op_type == "DequantizeLinear" and dq.inputs[0] else None
        if q is None or q.op_type != "QuantizeLinear" or q.inputs[0] is None:
            return value
        value = q.inputs[0]


def _copy_value(graph: ir.Graph, value: ir.Value, before: ir.Node, base: str) -> ir.Value:
    """A second tensor equal to ``value`` made by ``Mul(value, 1)`` before ``before``; in a QDQ model (``value`` is
    the output of DQ(Q(source))) the copy is quantized with the same parameters, so it holds the same numbers."""
    taken = {n.name for n in graph if n.name}

    def node(op_type: str, inputs: list[ir.Value | None], name: str, **attributes: Any) -> ir.Value:
        fresh, k = name, 1
        while fresh in taken:
            fresh, k = f"{name}_{k}", k + 1
        taken.add(fresh)
        made = ir.node(op_type, inputs, attributes, name=fresh)
        made.outputs[0].name = f"{fresh}_output"
        graph.insert_before(before, made)
        return made.outputs[0]

    dq = value.producer()
    q = dq.inputs[0].producer() if dq is not None and dq.op_type == "DequantizeLinear" and dq.inputs[0] else None
    if q is None or q.op_type != "QuantizeLinear":
        return node("Mul", [value, add_initializer(graph, np.array(1.0, np.float32), name_hint=f"{base}_one")], base)
    point = dq.inputs[2] if len(dq.inputs) > 2 else None
    zp_dtype = np.dtype(point.const_value.numpy().dtype) if point is not None and point.const_value is not None \
        else np.dtype(np.uint8)
    # 1.0 exactly: quantized value 1 with scale 1 and zero point 0 (fits every Q/DQ integer type)
    one = node("DequantizeLinear", [add_initializer(graph, np.array(1, zp_dtype), name_hint=f"{base}_one_quantized"),
                                    add_initializer(graph, np.array(1.0, np.float32), name_hint=f"{base}_one_scale"),
                                    add_initializer(graph, np.array(0, zp_dtype), name_hint=f"{base}_one_zero_point")],
               f"{base}_one_DequantizeLinear")
    product = node("Mul", [value, one], base)
    params = list(dq.inputs[1:])
    axis = {name: attr.value for name, attr in dq.attributes.items()}
    quantized = node("QuantizeLinear", [product, *params], f"{base}_QuantizeLinear", **axis)
    return node("DequantizeLinear", [quantized, *params], f"{base}_DequantizeLinear", **axis)


def _silu_split_input(graph: ir.Graph, nodes: list[ir.Node], match: HazardMatch) -> str | None:
    """x * Sigmoid(x) -> Mul(x, 1) * Sigmoid(x): the product no longer reads the Sigmoid's own input tensor, so the
    backend does not fuse the pair into its Swish kernel; exact (times one, same quantization)."""
    mul = nodes[match.indices[-1]] if match.indices else None
    if mul is None or mul.op_type != "Mul":
        return "the Mul of the pattern is not in the model"
    index = next((i for i, x in enumerate(mul.inputs) if x is not None and _source(x).name == match.input), None)
    if index is None:
        return "the Mul does not read the pattern input"
    mul.replace_input_with(index, _copy_value(graph, mul.inputs[index], mul, f"{mul.name or 'Mul'}/npukit_unfuse"))
    return None


REWRITES: dict[str, Callable[[ir.Graph, list[ir.Node], HazardMatch], str | None]] = {
    "silu_split_input": _silu_split_input,
}


class GuardHazardsPass(NpukitPass):
    """Every hazard of ``target`` found in the model rewritten by its fix (``REWRITES``); ``rewritten`` and ``left``
    (with why) say what was done. The hazards are found on the model as a proto (``find_hazards``; ``matches``:
    those already found on the proto the IR model was read from), the rewrites made on the IR at the matched
    nodes' positions."""

    def __init__(self, target: TargetProfile, matches: list[HazardMatch] | None = None) -> None:
        super().__init__()
        self.target, self.matches = target, matches
        self.rewritten: list[HazardMatch] = []
        self.left: list[tuple[HazardMatch, str]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        nodes = list(model.graph)
        matches = self.matches if self.matches is not None else find_hazards(ir.serde.serialize_model(model),
                                                                             self.target)
        for match in matches:
            rewrite = REWRITES.get(match.hazard.fix or "")
            if not match.quantized:  # ONNX Runtime's basic optimizations drop Mul(x, 1) from a float graph
                why = "a float model: the rewrite applies to its QDQ model (npukit compile does it after quantizing)"
            else:
                why = "no rewrite is known" if rewrite is None else rewrite(model.graph, nodes, match)
            if why is None:
                self.rewritten.append(match)
            else:
                self.left.append((match, why))
                self.note(f"{', '.join(match.nodes)} kept: {why}")
        self.rewrites = len(self.rewritten)
        return ir.passes.PassResult(model, modified=bool(self.rewritten))


@dataclasses.dataclass(frozen=True)
class GuardResult:
    """The rewritten model, what was rewritten, and the hazards left (no fix, or the fix declined, with why)."""

    model: onnx.ModelProto
    rewritten: tuple[HazardMatch, ...]
    left: tuple[tuple[HazardMatch, str], ...]

    def as_dict(self) -> dict[str, Any]:
        return {"rewritten": [m.as_dict() for m in self.rewritten],
                "left": [m.as_dict() | {"why": why} for m, why in self.left]}


def guard_hazards(model: onnx.ModelProto, target: TargetProfile) -> GuardResult:
    """Apply the fix of every hazard of ``target`` found in ``model`` (``GuardHazardsPass``); the model is copied,
    never changed."""
    matches = find_hazards(model, target)
    if not matches:
        return GuardResult(model, (), ())
    guard = GuardHazardsPass(target, matches)
    result = guard(ir.serde.deserialize_model(model))
    guarded = ir.serde.serialize_model(result.model) if result.modified else model
    return GuardResult(guarded, tuple(guard.rewritten), tuple(guard.left))
