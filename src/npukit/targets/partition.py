"""Which nodes of a model a target takes, and why not; the partition into delegated subgraphs and CPU fallbacks.

Nodes are checked against the target profile after ONNX shape inference (with ``input_shape`` fixing the first
input). A profile whose runtime optimizes the graph before partitioning (``graph_optimizations="ort-basic"``) is
analysed on the graph the execution provider will see: ONNX Runtime's basic optimizations are applied first, and
the nodes they remove are listed in ``Analysis.removed``. Node patterns the backend fuses (``profile.fusions``) are
one unit checked as the fused op. With ``qdq_units`` a DQ -> op -> Q group counts as one quantized op and is
assigned as a whole. Supported
units are grouped the way ONNX Runtime's ``CreateSupportedPartitionNodeGroups`` does: walk the graph in topological
order, keep adding ready supported units to the open group, and defer unsupported units that consume the group's
outputs to after the group closes; a group therefore need not be connected. Transitions are the graph edges whose
two ends land in different places (CPU or different delegated partitions). Only the main graph is analysed.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import os
import tempfile
from typing import Any

import onnx
import onnxruntime as ort

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.measure.summary import summarize
from npukit.targets.fix import fix_for, fix_for_refusal
from npukit.targets.graph_match import node_attrs, overridable_initializers, step_matches, tensor_infos
from npukit.targets.profile import (
    FLOAT_DTYPES,
    OPEN_SHAPES,
    OVERRIDABLE,
    Fusion,
    NodeInfo,
    PatternStep,
    TargetProfile,
    TensorInfo,
)

_QDQ = ("QuantizeLinear", "DequantizeLinear")
_QUANT_MARKERS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
                  "MatMulInteger", "DynamicQuantizeLinear"}


@dataclasses.dataclass(frozen=True)
class NodeVerdict:
    index: int
    name: str
    op_type: str
    supported: bool
    reasons: tuple[str, ...]
    fix: str | None
    partition: int | None  # index into Analysis.partitions; None: CPU
    macs: int | None
    warnings: tuple[str, ...] = ()  # the target takes the node but computes it wrongly (profile hazards), and why

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"reasons": list(self.reasons), "warnings": list(self.warnings)}


@dataclasses.dataclass(frozen=True)
class Partition:
    index: int
    nodes: tuple[str, ...]
    ops: dict[str, int]
    macs: int

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "nodes": list(self.nodes), "ops": dict(self.ops), "macs": self.macs}


@dataclasses.dataclass(frozen=True)
class Analysis:
    target: str
    display_name: str
    nodes: tuple[NodeVerdict, ...]
    partitions: tuple[Partition, ...]
    transitions: int
    macs_total: int
    macs_delegated: int
    needs_quantization: bool
    symbolic_inputs: tuple[str, ...]
    notes: tuple[str, ...]
    removed: tuple[str, ...] = ()  # nodes of the given model the runtime's graph optimizations remove first
    macs_unknown: int = 0  # MAC nodes (Conv, MatMul, ...) whose shapes are not known here: no MAC share

    @property
    def delegated_nodes(self) -> int:
        return sum(1 for n in self.nodes if n.partition is not None)

    @property
    def mac_share(self) -> float | None:
        return self.macs_delegated / self.macs_total if self.macs_total and not self.macs_unknown else None

    @property
    def unsupported(self) -> tuple[NodeVerdict, ...]:
        return tuple(n for n in self.nodes if n.partition is None)

    @property
    def inaccurate(self) -> tuple[NodeVerdict, ...]:
        """Nodes the target takes but computes wrongly (the profile's hazards), with the fix that avoids it."""
        return tuple(n for n in self.nodes if n.warnings)

    def unsupported_ops(self) -> dict[str, int]:
        return dict(collections.Counter(n.op_type for n in self.unsupported).most_common())

    def problem(self) -> str | None:
        """A one-line description when the target takes nothing of the model; None otherwise."""
        if self.delegated_nodes or not self.nodes:
            return None
        ops = ", ".join(f"{op} x{k}" for op, k in self.unsupported_ops().items())
        return f"{self.display_name} takes none of the model's {len(self.nodes)} nodes ({ops})"

    def hint(self) -> str:
        if self.symbolic_inputs:
            return f"fix the input shape with --input-shape (symbolic: {', '.join(self.symbolic_inputs)})"
        if self.needs_quantization:
            return "quantize the model to QDQ first (npukit quantize)"
        fixes = sorted({n.fix for n in self.nodes if n.fix and "(inexact" not in n.fix})
        if fixes:
            return f"run analyze with --fix (applies {', '.join(fixes)})"
        inexact = sorted({n.fix.split()[0] for n in self.nodes if n.fix})
        if inexact:
            return (f"no exact substitution: npukit substitute --rule {' --rule '.join(inexact)} --data DIR changes "
                    "the function and recovers it by fine-tuning")
        first = next((n.reasons[0] for n in self.nodes if n.reasons), "")
        return f"replace the unsupported ops or pick another target ({first})" if first else "pick another target"

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target, "display_name": self.display_name,
            "nodes_total": len(self.nodes), "nodes_delegated": self.delegated_nodes,
            "nodes_inaccurate": len(self.inaccurate),
            "partitions": [p.as_dict() for p in self.partitions], "transitions": self.transitions,
            "macs_total": self.macs_total, "macs_delegated": self.macs_delegated, "mac_share": self.mac_share,
            "macs_unknown_nodes": self.macs_unknown,
            "needs_quantization": self.needs_quantization, "symbolic_inputs": list(self.symbolic_inputs),
            "unsupported_ops": self.unsupported_ops(), "notes": list(self.notes), "removed": list(self.removed),
            "nodes": [n.as_dict() for n in self.nodes],
        }



def _infer(model: onnx.ModelProto, input_shape: tuple[int, ...] | None) -> onnx.ModelProto:
    from npukit.frontend.shapes import fix_input_shape

    if input_shape is not None:
        return fix_input_shape(model, tuple(int(d) for d in input_shape), dynamic_batch=False)
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        raise InputError(f"ONNX shape inference failed: {str(exc).strip().splitlines()[0]}",
                         hint="check the model with onnx.checker, or give --input-shape") from None


def _function_op(node: onnx.NodeProto, opset: int) -> bool:
    """Whether ``node`` is an ONNX op defined by a function body (ONNX Runtime inlines it when no EP claims it)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def _kept_whole(node: onnx.NodeProto, target: TargetProfile, opset: int) -> bool:
    """Whether the analysis keeps function op ``node`` whole: the target takes it, or a fix replaces it where the
    target would not take the body ORT inlines either."""
    if target.rule_for(node.op_type, node.domain) is not None:
        return True
    if fix_for(node.op_type, target) is None and fix_for(node.op_type, target, exact=False) is None:
        return False
    schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    body = [n.op_type for n in schema.function_body.node] if schema.has_function else []
    return not body or any(target.rule_for(op) is None for op in body)


def _ort_basic(model: onnx.ModelProto, target: TargetProfile) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """``model`` after ONNX Runtime's basic graph optimizations (constant folding, Shape folding with static
    shapes, Identity/Dropout elimination, Conv+BatchNorm folding, unique DQ per QDQ unit, ...) as ORT applies them
    before any execution provider partitions the graph; and the names of the nodes those optimizations removed.

    ORT runs here on its CPU EP, which inlines function ops it has no kernel for (HardSwish, ...; not Relu, which
    opset 14 defines by a function too: a first pass finds the op types it inlined). Behind a target that takes such
    an op ORT would not inline it, so nodes of function ops the target has a rule for are taken out of the graph
    while ORT optimizes it (their outputs become graph inputs, their inputs graph outputs) and put back
    afterwards. So are those the target lacks, whose inlined body it would not take whole either, but a fix
    replaces: the analysis names the op the model has and the fix that serves it (``--fix`` rewrites the model as
    given), not the parts of ORT's inlined body. (HardSwish behind Core ML: inlined, its HardSigmoid and Mul are
    taken; behind NNAPI, which lacks HardSigmoid, it stays HardSwish, with hardswish_to_clip.)
    """
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    kept = [n for n in graph.node if _function_op(n, opset) and _kept_whole(n, target, opset)]
    first = _basic_pass(model) if kept else None
    if first is not None:  # only the op types ORT's CPU EP inlined need keeping out of its way
        inlined = {n.op_type for n in kept} - {n.op_type for n in first.graph.node}
        kept = [n for n in kept if n.op_type in inlined]
    kept_names = {id(n) for n in kept}
    values = {v.name: v for v in [*graph.input, *graph.value_info, *graph.output]}
    constants = GraphIndex(graph).constant_tensors
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    cut.graph.ClearField("node")
    cut.graph.node.extend(n for n in graph.node if id(n) not in kept_names)
    produced = {o for n in cut.graph.node for o in n.output} | {i.name for i in graph.input}
    cut_inputs = [o for n in kept for o in n.output if o]
    cut_outputs = [x for n in kept for x in n.input if x and x in produced and x not in constants]
    if any(name not in values for name in [*cut_inputs, *cut_outputs]):
        return model, ()  # a cut without known types would not load; rare enough to analyze the model as given
    cut.graph.input.extend(values[name] for name in dict.fromkeys(cut_inputs))
    outputs = {o.name for o in graph.output}
    cut.graph.output.extend(values[name] for name in dict.fromkeys(cut_outputs) if name not in outputs)
    optimized = first if first is not None and not kept else _basic_pass(cut)
    og = optimized.graph
    inputs_kept = [i for i in og.input if i.name not in set(cut_inputs)]
    og.ClearField("input")
    og.input.extend(inputs_kept)
    outputs_kept = [o for o in og.output if o.name in outputs]
    og.ClearField("output")
    og.output.extend(outputs_kept)
    present = {t.name for t in og.initializer} | {o for n in og.node for o in n.output} | {i.name for i in og.input}
    for n in kept:
        og.initializer.extend(constants[x] for x in n.input if x and x not in present and x in constants)
        present.update(n.input)
    position = {n.name: i for i, n in enumerate(graph.node) if n.name}
    priority, last = [], -1.0
    for n in og.node:  # nodes ORT made sit right after the original node before them
        last = position.get(n.name, last + 1e-6)
        priority.append(last)
    nodes = _toposort([*og.node, *kept], [*priority, *(position.get(n.name, 0) for n in kept)])
    og.ClearField("node")
    og.node.extend(nodes)
    og.ClearField("value_info")
    names = {n.name for n in nodes}
    removed = tuple(n.name for n in graph.node if n.op_type != "Constant" and n.name and n.name not in names)
    return onnx.shape_inference.infer_shapes(optimized, strict_mode=False, data_prop=True), removed


def _basic_pass(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as ONNX Runtime's CPU EP saves it after its basic graph optimizations."""
    with tempfile.TemporaryDirectory(prefix="npukit_ort_basic_") as work:
        source, path = os.path.join(work, "cut.onnx"), os.path.join(work, "optimized.onnx")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = path
        so.log_severity_level = 3
        try:
            onnx.save_model(model, source)
            ort.InferenceSession(source, sess_options=so, providers=["CPUExecutionProvider"])
            return onnx.load_model(path)
        except Exception as exc:  # protobuf's 2 GB limit, or any of ORT's error types
            text = str(exc).strip()
            raise InputError(f"ONNX Runtime cannot optimize the model: "
                             f"{text.splitlines()[0] if text else type(exc).__name__}") from exc


def _toposort(nodes: list[onnx.NodeProto], priority: list[float]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where every node comes after the producers of its inputs, by ``priority`` otherwise."""
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    waiting = [sum(1 for x in set(n.input) if x in producer) for n in nodes]
    users: dict[int, list[int]] = collections.defaultdict(list)
    for i, n in enumerate(nodes):
        for x in set(n.input):
            if x in producer:
                users[producer[x]].append(i)
    ready = [(priority[i], i) for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[onnx.NodeProto] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(nodes[i])
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (priority[u], u))
    return order




def _is_float_model(graph: onnx.GraphProto) -> bool:
    return not any(n.op_type in _QUANT_MARKERS for n in graph.node)


def _node_units(index: GraphIndex, fused: list[list[int]], *, qdq: bool) -> tuple[list[list[int]], dict[int, int]]:
    """Units of node indices and node index -> unit index: first the ``fused`` groups, then (with ``qdq``)
    DQ... -> op -> Q... groups with the op first, then every other node alone."""
    graph, producer, consumers = index.graph, index.producer, index.consumers
    graph_outputs, constant = index.outputs, index.constants
    owner: dict[int, int] = {}
    units: list[list[int]] = []
    for members in fused:
        for member in members:
            owner[member] = len(units)
        units.append(list(members))
    for i, n in enumerate(graph.node):
        if not qdq or i in owner or n.op_type in _QDQ or n.op_type == "Constant":
            continue
        # A DQ of a constant shared by several ops is one DQ per op for ORT (EnsureUniqueDQForNodeUnit); the
        # original goes with its first consumer.
        dqs = [producer[x] for x in n.input if x and x in producer and graph.node[producer[x]].op_type ==
               "DequantizeLinear" and x not in graph_outputs
               and (consumers[x] == [i] or (consumers[x][0] == i and graph.node[producer[x]].input[0] in constant))]
        shared = [x for x in n.input if x and x in producer and graph.node[producer[x]].op_type ==
                  "DequantizeLinear" and len(consumers[x]) > 1 and graph.node[producer[x]].input[0] in constant]
        qs: list[int] = []
        out = n.output[0] if n.output else ""
        if out and out not in graph_outputs and consumers[out] and all(
                graph.node[c].op_type == "QuantizeLinear" for c in consumers[out]):
            qs = consumers[out]
        if (dqs or shared) and qs and all(d not in owner for d in dqs) and all(q not in owner for q in qs):
            unit = [i, *dqs, *qs]
            for member in unit:
                owner[member] = len(units)
            units.append(unit)
    for i in range(len(graph.node)):
        if i not in owner:
            owner[i] = len(units)
            units.append([i])
    return units, owner


# Ops ORT's transpose optimizer moves a Transpose through, towards the graph output.
_TRANSPOSE_TRANSPARENT = frozenset({"QuantizeLinear", "DequantizeLinear", "Relu", "Clip", "Sigmoid", "Tanh",
                                    "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Abs", "Neg", "Exp", "Sqrt"})


def _from_layout_op(index: GraphIndex, at: int, layout_ops: frozenset[str]) -> bool:
    """Whether node ``at`` computes, through ops a Transpose passes, on the output of one of ``layout_ops``."""
    graph, producer = index.graph, index.producer
    node = graph.node[at]
    while node.input and node.input[0] in producer:
        node = graph.node[producer[node.input[0]]]
        if node.op_type in layout_ops:
            return True
        if node.op_type not in _TRANSPOSE_TRANSPARENT:
            return False
    return False


def _layout_cancelled(index: GraphIndex, infos: dict[str, TensorInfo], target: TargetProfile) -> set[int]:
    """Transposes (with the Q/DQ around them) that ORT's layout transform cancels for an NHWC backend.

    Behind a layout op the transform leaves an NHWC -> NCHW Transpose; a Transpose to NHWC right after it
    (perm 0,2,3,1), or a flattening Reshape N,C,H,W -> N,C,H*W followed by perm 0,2,1, cancels against it.
    """
    if target.layout != "NHWC" or not target.layout_ops:
        return set()
    graph, producer, consumers = index.graph, index.producer, index.consumers

    def source(index: int) -> int | None:  # the first node upstream of ``index`` that is not a Q or DQ
        node = graph.node[index]
        while node.input and node.input[0] in producer:
            index = producer[node.input[0]]
            node = graph.node[index]
            if node.op_type not in _QDQ:
                return index
        return None

    cancelled: set[int] = set()
    for i, node in enumerate(graph.node):
        if node.op_type != "Transpose":
            continue
        perm = list(node_attrs(node).get("perm") or ())
        up = source(i)
        if up is not None and perm == [0, 2, 1] and graph.node[up].op_type == "Reshape":
            before = infos.get(graph.node[up].input[0])
            after = infos.get(graph.node[up].output[0])
            flattens = (before is not None and after is not None and before.static and after.static
                        and len(before.shape) == 4 and tuple(after.shape) == (  # type: ignore[arg-type]
                            before.shape[0], before.shape[1], before.shape[2] * before.shape[3]))  # type: ignore
            up = source(up) if flattens else None
        elif perm != [0, 2, 3, 1]:
            up = None
        if up is None or graph.node[up].op_type not in target.layout_ops:
            continue
        cancelled.add(i)
        dq = producer.get(node.input[0])
        if dq is not None and graph.node[dq].op_type == "DequantizeLinear" and consumers[node.input[0]] == [i]:
            cancelled.add(dq)
        qs = consumers.get(node.output[0], [])
        if len(qs) == 1 and graph.node[qs[0]].op_type == "QuantizeLinear":
            cancelled.add(qs[0])
    return cancelled


def _fusion_groups(index: GraphIndex, fusions: tuple[Fusion, ...],
                   infos: dict[str, TensorInfo] | None = None) -> list[tuple[Fusion, list[int], str]]:
    """Every non-overlapping match of ``fusions`` in the graph: (fusion, node indices in pattern order, input);
    ``infos`` (``tensor_infos``, read here where not given) for the input ranks a fusion is limited to."""
    if not fusions:
        return []
    graph, consumers, graph_outputs = index.graph, index.consumers, index.outputs
    if infos is None and any(f.input_ranks for f in fusions):
        infos = tensor_infos(graph)
    taken: set[int] = set()
    found = []
    for i, node in enumerate(graph.node):
        for fusion in fusions:
            for pattern in fusion.patterns:
                if i in taken or node.op_type != pattern[0].op_type:
                    continue
                for root in dict.fromkeys(x for x in node.input if x):
                    members = _match(graph, pattern, i, root, consumers, taken)
                    if members is None:
                        continue
                    if fusion.input_ranks and (infos or {}).get(root, TensorInfo(None, None)).rank \
                            not in fusion.input_ranks:
                        break  # the input it matched on has a rank the backend does not fuse at
                    inner = {o for m in members[:-1] for o in graph.node[m].output}
                    if inner & graph_outputs or any(c not in members for o in inner for c in consumers[o]):
                        continue
                    taken.update(members)
                    found.append((fusion, members, root))
                    break
    return found


def _match(graph: onnx.GraphProto, pattern: tuple[PatternStep, ...], start: int, root: str,
           consumers: dict[str, list[int]], taken: set[int]) -> list[int] | None:
    """Node indices matching ``pattern`` step by step from node ``start`` with input ``root``, or None."""
    members: list[int] = []
    for step in pattern:
        if not members:
            candidates = [start]
        else:
            near = [root, *(o for m in members for o in graph.node[m].output)]
            candidates = list(dict.fromkeys(c for name in near for c in consumers.get(name, [])))
        pick = next((c for c in candidates if c not in members and c not in taken
                     and step_matches(graph.node[c], step, root, [graph.node[m].output[0] for m in members])),
                    None)
        if pick is None:
            return None
        members.append(pick)
    return members



def _constant_dqs(index: GraphIndex) -> dict[str, onnx.NodeProto]:
    """Output name -> DequantizeLinear node, for every DQ of a constant (weights, biases)."""
    return {n.output[0]: n for n in index.nodes if n.op_type == "DequantizeLinear" and n.input[0] in index.constants}


def _unit_info(graph: onnx.GraphProto, unit: list[int], infos: dict[str, TensorInfo],
               as_quantized: str | None, constant_dqs: dict[str, onnx.NodeProto]) -> NodeInfo:
    node = graph.node[unit[0]]
    members = [graph.node[i] for i in unit[1:]]
    dq_by_output = {m.output[0]: m for m in members if m.op_type == "DequantizeLinear"}
    if len(unit) > 1:  # a shared weight DQ belongs to every quantized unit that reads it
        dq_by_output |= {x: constant_dqs[x] for x in node.input if x in constant_dqs}
    q_by_input = {m.input[0]: m for m in members if m.op_type == "QuantizeLinear"}

    def info(name: str, *, is_input: bool) -> TensorInfo | None:
        if not name:
            return None
        base = infos.get(name, TensorInfo(None, None))
        if is_input and name in dq_by_output:
            src = infos.get(dq_by_output[name].input[0], base)
            return dataclasses.replace(base, dtype=src.dtype, constant=src.constant, overridable=src.overridable)
        if not is_input and name in q_by_input:
            q_out = infos.get(q_by_input[name].output[0], base)
            return dataclasses.replace(base, dtype=q_out.dtype)
        if as_quantized and base.dtype in FLOAT_DTYPES:
            return dataclasses.replace(base, dtype=as_quantized)
        return base

    return NodeInfo(
        op_type=node.op_type, domain=node.domain, attributes=node_attrs(node),
        inputs=tuple(info(x, is_input=True) for x in node.input),
        outputs=tuple(info(o, is_input=False) or TensorInfo(None, None) for o in node.output),
        quantized=len(unit) > 1,
    )


def _static_shape_reason(node: NodeInfo, names: list[str]) -> str | None:
    for name, tensor in zip(names, (*node.inputs, *node.outputs)):
        if tensor is None or tensor.constant:
            continue
        if tensor.shape is None:
            return f"{node.op_type}: {OPEN_SHAPES} (shape of {name!r} is unknown)"
        if not tensor.static:
            dims = "x".join(str(d) for d in tensor.shape)
            return f"{node.op_type}: {OPEN_SHAPES} ({name!r} is {dims})"
    return None


def _group(index: GraphIndex, units: list[list[int]], owner: dict[int, int],
           supported: list[bool]) -> list[list[int]]:
    """ORT-style partition groups of supported units (lists of unit indices); Constant nodes are initializers."""
    graph = index.graph
    producer = {out: i for out, i in index.producer.items() if graph.node[i].op_type != "Constant"}
    in_degree = [0] * len(units)
    downstream: list[list[int]] = [[] for _ in units]
    for u, members in enumerate(units):
        member_set = set(members)
        for m in members:
            for name in graph.node[m].input:
                p = producer.get(name)
                if p is None or p in member_set:
                    continue
                in_degree[u] += 1
                downstream[owner[p]].append(u)
    ready = collections.deque(u for u in range(len(units)) if in_degree[u] == 0)
    later: collections.deque[int] = collections.deque()
    groups: list[list[int]] = []
    current: list[int] = []
    border: set[int] = set()
    while ready or later:
        if not ready:
            if current:
                groups.append(current)
            current, border = [], set()
            ready, later = later, collections.deque()
            continue
        u = ready.popleft()
        if not supported[u] and u in border:
            later.append(u)
            continue
        if supported[u]:
            current.append(u)
            border.discard(u)
        for d in downstream[u]:
            if supported[u]:
                border.add(d)
            in_degree[d] -= 1
            if in_degree[d] == 0:
                ready.append(d)
    if current:
        groups.append(current)
    return groups


def analyze(
    model: onnx.ModelProto,
    target: TargetProfile,
    *,
    input_shape: tuple[int, ...] | None = None,
) -> Analysis:
    """Check every node of ``model`` against ``target`` and partition the graph (see the module docstring)."""
    notes: list[str] = []
    inferred, removed = _as_the_runtime_sees_it(model, target, input_shape, notes)
    graph = inferred.graph
    index = GraphIndex(graph)
    overridable = _overridable(model, target, notes)
    infos = tensor_infos(graph, overridable)
    symbolic, needs_quant = _model_notes(index, infos, target, notes)
    as_quantized = target.quantization.activations[0] if needs_quant else None
    fused = _fusion_groups(index, target.fusions, infos)
    units, owner = _node_units(index, [members for _, members, _ in fused], qdq=target.qdq_units)
    reasons = _unit_reasons(index, target, infos, units, fused, as_quantized)
    groups = _delegated_groups(index, target, units, owner, reasons)
    hazard_at = _hazards(inferred, index, target, infos, notes)
    cancelled = _layout_cancelled(index, infos, target)
    removed = (*removed, *(graph.node[i].name for i in sorted(cancelled) if graph.node[i].name))
    if cancelled:
        notes.append(f"the {target.layout} layout transform cancels {len(cancelled)} Transpose/Q/DQ nodes")
    node_macs = [row.macs for row in summarize(inferred).layers]
    unknown = sum(1 for m in node_macs if m is None)
    if unknown:  # a share of the MACs that are known would read as the model's (100% of PP-OCRv4 det's 0.02%)
        notes.append(f"the MACs of {unknown} node(s) are unknown (symbolic shapes), so the share of MACs delegated "
                     "is not given: pass --input-shape")
    partitions, node_partition = _partitions(graph, groups, units, cancelled, node_macs)
    verdicts = []
    for i, node in enumerate(graph.node):
        if node.op_type == "Constant" or i in cancelled:
            continue
        unit_reasons = tuple(reasons[owner[i]])
        fix = _fix(node, unit_reasons, target, symbolic=bool(symbolic),
                   shape_folded=_from_shapes(index, node)) if unit_reasons else None
        warnings: tuple[str, ...] = ()
        if i in hazard_at and i in node_partition:
            warnings = (hazard_at[i][0],)
            fix = fix or hazard_at[i][1]
        verdicts.append(NodeVerdict(
            index=i, name=node.name or f"{node.op_type}_{i}", op_type=node.op_type,
            supported=i in node_partition, reasons=unit_reasons, fix=fix, partition=node_partition.get(i),
            macs=node_macs[i], warnings=warnings))
    return Analysis(
        target=target.name, display_name=target.display_name, nodes=tuple(verdicts), partitions=tuple(partitions),
        transitions=_transitions(index, node_partition, cancelled), macs_total=sum(m or 0 for m in node_macs),
        macs_delegated=sum(p.macs for p in partitions), needs_quantization=needs_quant,
        symbolic_inputs=symbolic, notes=tuple(notes), removed=removed, macs_unknown=unknown,
    )


def _as_the_runtime_sees_it(model: onnx.ModelProto, target: TargetProfile, input_shape: tuple[int, ...] | None,
                            notes: list[str]) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """The model with shapes inferred (``input_shape`` fixed in), after ONNX Runtime's basic graph optimizations
    where the target's runtime applies them first; and the nodes those removed."""
    inferred = _infer(model, input_shape)
    if target.graph_optimizations != "ort-basic":
        return inferred, ()
    try:
        optimized, removed = _ort_basic(inferred, target)
    except InputError as exc:
        notes.append(f"analysed as given: ONNX Runtime's basic graph optimizations failed ({exc.message})")
        return inferred, ()
    if removed:
        notes.append(f"ONNX Runtime's basic graph optimizations remove {len(removed)} nodes before "
                     f"{target.display_name} partitions the model (constant folding, fusions)")
    return optimized, removed


def _overridable(model: onnx.ModelProto, target: TargetProfile, notes: list[str]) -> frozenset[str]:
    """The initializers ``model`` also lists as graph inputs where the target's runtime (ONNX Runtime) lets a
    caller override them: not constants to it (no folding, no Conv+BatchNorm fusion, no constant-only operand); a
    note when there are any."""
    overridable = overridable_initializers(model) if target.graph_optimizations == "ort-basic" else frozenset()
    if overridable:
        notes.append(f"{len(overridable)} initializers are also graph inputs (IR version {model.ir_version}): ONNX "
                     "Runtime lets a caller override them, so it neither folds them nor gives them to "
                     f"{target.display_name} as constants; `npukit optimize-graph` (or --fix) makes them constants")
    return overridable


def _model_notes(index: GraphIndex, infos: dict[str, TensorInfo], target: TargetProfile,
                 notes: list[str]) -> tuple[tuple[str, ...], bool]:
    """The inputs with symbolic dimensions, and whether the target needs the float model quantized first; each
    said in ``notes`` where it matters to the target."""
    graph = index.graph
    symbolic = tuple(i.name for i in graph.input if i.name not in index.initializers
                     and not infos.get(i.name, TensorInfo(None, None)).static)
    needs_quant = _is_float_model(graph) and not target.quantization.accepts_float
    if needs_quant:
        notes.append(f"{target.display_name} does not run float models: quantize first "
                     f"({target.quantization.float_note or target.quantization.weights}); "
                     "support below assumes the quantized model")
    if symbolic and target.requires_static_shapes:
        notes.append(f"{target.display_name} needs static shapes; inputs {', '.join(symbolic)} have symbolic dims: "
                     "pass --input-shape")
    return symbolic, needs_quant


def _unit_reasons(index: GraphIndex, target: TargetProfile, infos: dict[str, TensorInfo],
                  units: list[list[int]], fused: list[tuple[Fusion, list[int], str]],
                  as_quantized: str | None) -> list[list[str]]:
    """Per unit (``_node_units``; the first ``len(fused)`` are fusions checked as the op they fuse into), why the
    target does not take it; an empty list where it does."""
    graph = index.graph
    constant_dqs = _constant_dqs(index)
    reasons: list[list[str]] = []
    for u, unit in enumerate(units):
        node = graph.node[unit[0]]
        if node.op_type == "Constant":
            reasons.append([])
            continue
        if u < len(fused):
            fusion, members, root = fused[u]
            last = graph.node[members[-1]].output[0]
            info = NodeInfo(op_type=fusion.into, domain="", attributes=node_attrs(graph.node[members[-1]]),
                            inputs=(infos.get(root, TensorInfo(None, None)),),
                            outputs=(infos.get(last, TensorInfo(None, None)),))
            op_type, domain, names = fusion.into, "", [root, last]
        else:
            info = _unit_info(graph, unit, infos, as_quantized, constant_dqs)
            op_type, domain, names = node.op_type, node.domain, [*node.input, *node.output]
        rule = target.rule_for(op_type, domain)
        why: list[str] = []
        if rule is None:
            shown = f" (domain {domain})" if domain not in ("", "ai.onnx") else ""
            why.append(f"{op_type}{shown}: not supported by {target.display_name}")
        else:
            why.extend(rule.failures(info, default_dtypes=target.dtypes, max_rank=target.max_rank))
        if target.requires_static_shapes:
            static_why = _static_shape_reason(info, names)
            if static_why:  # it covers the rules that cannot be checked on the open shapes (profile.unchecked)
                why = [r for r in why if OPEN_SHAPES not in r] + [static_why]
        if target.graph_io_qdq_on_cpu and len(unit) == 1:
            if node.op_type == "QuantizeLinear" and node.input[0] in index.inputs:
                why.append("QuantizeLinear: quantizing a graph input is left to the CPU")
            elif (node.op_type == "DequantizeLinear" and node.output[0] in index.outputs
                  and not _from_layout_op(index, unit[0], target.layout_ops)):
                why.append("DequantizeLinear: dequantizing a graph output is left to the CPU")
        reasons.append(why)
    return reasons


def _delegated_groups(index: GraphIndex, target: TargetProfile, units: list[list[int]], owner: dict[int, int],
                      reasons: list[list[str]]) -> list[list[int]]:
    """The partitions the runtime forms of the supported units (``_group``), less those of a lone Q/DQ node where
    the target leaves them to the CPU (the reason added to ``reasons``)."""
    graph = index.graph
    groups = _group(index, units, owner, [not r for r in reasons])
    if not target.drops_lone_qdq_partitions:
        return groups
    kept = []
    for g in groups:
        members = [m for u in g for m in units[u]]
        if len(members) == 1 and graph.node[members[0]].op_type in _QDQ:
            reasons[g[0]].append(f"{graph.node[members[0]].op_type}: a partition of a single Q/DQ node "
                                 "stays on the CPU")
            continue
        kept.append(g)
    return kept


def _hazards(inferred: onnx.ModelProto, index: GraphIndex, target: TargetProfile, infos: dict[str, TensorInfo],
             notes: list[str]) -> dict[int, tuple[str, str | None]]:
    """Node index -> (why the target computes it wrongly, the fix) for the profile's hazards; a note when any."""
    from npukit.targets.hazards import find_hazards

    hazard_at: dict[int, tuple[str, str | None]] = {}
    hazards = find_hazards(inferred, target, infos=infos, index=index)
    for match in hazards:
        for i in match.indices:  # a float model's hazard is rewritten by compile, after quantizing
            hazard_at[i] = (match.reason, match.hazard.fix if match.quantized else None)
    if hazards:
        notes.append(f"{target.display_name} computes {len(hazards)} node pattern(s) wrongly "
                     f"({', '.join(sorted({m.hazard.name for m in hazards}))}): see the nodes' warnings; "
                     + ("--fix and compile rewrite them" if any(m.quantized for m in hazards) else
                        "they appear once the model is quantized, and npukit compile rewrites them then"))
    return hazard_at


def _partitions(graph: onnx.GraphProto, groups: list[list[int]], units: list[list[int]], cancelled: set[int],
                node_macs: list[int | None]) -> tuple[list[Partition], dict[int, int]]:
    """The partitions (their nodes, ops and MACs, less the nodes the layout transform cancels), and node index ->
    partition index."""
    node_partition: dict[int, int] = {}
    partitions: list[Partition] = []
    for p, g in enumerate(groups):
        members = sorted(m for u in g for m in units[u] if m not in cancelled)
        for m in members:
            node_partition[m] = p
        partitions.append(Partition(
            index=p, nodes=tuple(graph.node[m].name or f"{graph.node[m].op_type}_{m}" for m in members),
            ops=dict(collections.Counter(graph.node[m].op_type for m in members).most_common()),
            macs=sum(node_macs[m] or 0 for m in members)))
    return partitions, node_partition


def _fix(node: onnx.NodeProto, reasons: tuple[str, ...], target: TargetProfile, *, symbolic: bool,
         shape_folded: bool = False) -> str | None:
    """The substitution that would let the target take ``node`` (refused for ``reasons``): an exact rule of
    ``targets.fix``, else an inexact one (said so), else fixing the input shape (``symbolic``: the model has inputs
    with symbolic dimensions) or, where the inputs are static, folding the constants the open sizes are computed
    from; None when there is none. A shape fix is named only where it removes every reason: where open shapes are
    all that is wrong, or, on a model with symbolic inputs, where the node computes from shapes and constants only
    (``shape_folded``: ORT folds it away once the shapes are fixed, whatever its op); fixing the shapes of a node
    that computes on the data with an op the target lacks, or with attributes it refuses, would leave the node
    refused, and a shape node the runtime kept with the shapes static already has no fix here."""
    lacks = target.rule_for(node.op_type, node.domain) is None
    rule = fix_for(node.op_type, target) if lacks else None
    inexact = fix_for(node.op_type, target, exact=False) if lacks and rule is None else None
    if rule is not None:
        return rule.name
    if inexact is not None:  # no exact form the target takes: name the one that changes the function
        return f"{inexact.name} (inexact: npukit substitute --rule {inexact.name} recovers by fine-tuning)"
    if not lacks and reasons and not any(OPEN_SHAPES in r for r in reasons):  # a form a fix rewrites
        refusal = fix_for_refusal(node.op_type, target)
        if refusal is not None:
            return refusal.name
    if not lacks and reasons and all(OVERRIDABLE in r for r in reasons):
        return "initializers_as_constants"
    if "fix_input_shape" not in target.substitutions:
        return None
    if not lacks and reasons and all(OPEN_SHAPES in r for r in reasons):
        return "fix_input_shape" if symbolic else "fold_constants"
    return "fix_input_shape" if shape_folded and symbolic else None  # static already: the runtime kept it anyway


def _from_shapes(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """Whether ``node`` computes from the inputs' shapes and constants alone, and from a shape (a Shape node's
    output somewhere above it): what ORT folds once the input shapes are fixed. A node on constants only (a
    weight's DequantizeLinear) is not: fixing the shapes changes nothing for it."""
    outputs = [o for o in node.output if o]
    return bool(outputs) and all(o in index.shape_computed for o in outputs) and not all(
        o in index.folded for o in outputs)


def _transitions(index: GraphIndex, node_partition: dict[int, int], cancelled: set[int]) -> int:
    """Graph edges whose two ends run in different places (the CPU or different partitions)."""
    graph, producer = index.graph, index.producer
    place = {i: node_partition.get(i, -1) for i in range(len(graph.node))}
    return sum(1 for i, n in enumerate(graph.node) for x in n.input
               if x in producer and place[producer[x]] != place[i] and i not in cancelled
               and producer[x] not in cancelled and graph.node[producer[x]].op_type != "Constant")
