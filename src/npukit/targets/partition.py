"""Which nodes of a model a target takes, and why not; the partition into delegated subgraphs and CPU fallbacks.

Nodes are checked against the target profile after ONNX shape inference (with ``input_shape`` fixing the first
input). With ``qdq_units`` a DQ -> op -> Q group counts as one quantized op and is assigned as a whole. Supported
units are grouped the way ONNX Runtime's ``CreateSupportedPartitionNodeGroups`` does: walk the graph in topological
order, keep adding ready supported units to the open group, and defer unsupported units that consume the group's
outputs to after the group closes; a group therefore need not be connected. Transitions are the graph edges whose
two ends land in different places (CPU or different delegated partitions). Only the main graph is analysed.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import onnx

from npukit.errors import InputError
from npukit.measure.summary import summarize
from npukit.report.core import Table
from npukit.targets.fix import fix_for
from npukit.targets.profile import FLOAT_DTYPES, NodeInfo, TargetProfile, TensorInfo

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

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"reasons": list(self.reasons)}


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

    @property
    def delegated_nodes(self) -> int:
        return sum(1 for n in self.nodes if n.partition is not None)

    @property
    def mac_share(self) -> float | None:
        return self.macs_delegated / self.macs_total if self.macs_total else None

    @property
    def unsupported(self) -> tuple[NodeVerdict, ...]:
        return tuple(n for n in self.nodes if n.partition is None)

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
        fixes = sorted({n.fix for n in self.nodes if n.fix})
        if fixes:
            return f"run analyze with --fix (applies {', '.join(fixes)})"
        first = next((n.reasons[0] for n in self.nodes if n.reasons), "")
        return f"replace the unsupported ops or pick another target ({first})" if first else "pick another target"

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target, "display_name": self.display_name,
            "nodes_total": len(self.nodes), "nodes_delegated": self.delegated_nodes,
            "partitions": [p.as_dict() for p in self.partitions], "transitions": self.transitions,
            "macs_total": self.macs_total, "macs_delegated": self.macs_delegated, "mac_share": self.mac_share,
            "needs_quantization": self.needs_quantization, "symbolic_inputs": list(self.symbolic_inputs),
            "unsupported_ops": self.unsupported_ops(), "notes": list(self.notes),
            "nodes": [n.as_dict() for n in self.nodes],
        }


def _dtype_name(elem_type: int) -> str | None:
    if not elem_type:
        return None
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _infer(model: onnx.ModelProto, input_shape: tuple[int, ...] | None) -> onnx.ModelProto:
    from npukit.frontend.onnx_io import fix_input_shape

    if input_shape is not None:
        return fix_input_shape(model, tuple(int(d) for d in input_shape), dynamic_batch=False)
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        raise InputError(f"ONNX shape inference failed: {str(exc).strip().splitlines()[0]}",
                         hint="check the model with onnx.checker, or give --input-shape") from None


def _tensor_infos(graph: onnx.GraphProto) -> dict[str, TensorInfo]:
    infos: dict[str, TensorInfo] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if not value.type.HasField("tensor_type"):
            continue
        tt = value.type.tensor_type
        shape = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        infos[value.name] = TensorInfo(_dtype_name(tt.elem_type), shape)
    for t in graph.initializer:
        infos[t.name] = TensorInfo(_dtype_name(t.data_type), tuple(t.dims), constant=True)
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            tensor = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                          None)
            old = infos.get(node.output[0])
            infos[node.output[0]] = TensorInfo(
                _dtype_name(tensor.data_type) if tensor is not None else (old.dtype if old else None),
                tuple(tensor.dims) if tensor is not None else (old.shape if old else None), constant=True)
    return infos


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def _is_float_model(graph: onnx.GraphProto) -> bool:
    return not any(n.op_type in _QUANT_MARKERS for n in graph.node)


def _node_units(graph: onnx.GraphProto) -> tuple[list[list[int]], dict[int, int]]:
    """Groups of node indices (DQ... -> op -> Q...) with the op first; and node index -> unit index."""
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output if out}
    consumers: dict[str, list[int]] = collections.defaultdict(list)
    for i, n in enumerate(graph.node):
        for name in n.input:
            if name:
                consumers[name].append(i)
    graph_outputs = {o.name for o in graph.output}
    owner: dict[int, int] = {}
    units: list[list[int]] = []
    for i, n in enumerate(graph.node):
        if n.op_type in _QDQ or n.op_type == "Constant":
            continue
        dqs = [producer[x] for x in n.input if x and x in producer and graph.node[producer[x]].op_type ==
               "DequantizeLinear" and consumers[x] == [i] and x not in graph_outputs]
        qs: list[int] = []
        out = n.output[0] if n.output else ""
        if out and out not in graph_outputs and consumers[out] and all(
                graph.node[c].op_type == "QuantizeLinear" for c in consumers[out]):
            qs = consumers[out]
        if dqs and qs and all(d not in owner for d in dqs) and all(q not in owner for q in qs):
            unit = [i, *dqs, *qs]
            for member in unit:
                owner[member] = len(units)
            units.append(unit)
    for i in range(len(graph.node)):
        if i not in owner:
            owner[i] = len(units)
            units.append([i])
    return units, owner


def _unit_info(graph: onnx.GraphProto, unit: list[int], infos: dict[str, TensorInfo],
               as_quantized: str | None) -> NodeInfo:
    node = graph.node[unit[0]]
    members = [graph.node[i] for i in unit[1:]]
    dq_by_output = {m.output[0]: m for m in members if m.op_type == "DequantizeLinear"}
    q_by_input = {m.input[0]: m for m in members if m.op_type == "QuantizeLinear"}

    def info(name: str, *, is_input: bool) -> TensorInfo | None:
        if not name:
            return None
        base = infos.get(name, TensorInfo(None, None))
        if is_input and name in dq_by_output:
            src = infos.get(dq_by_output[name].input[0], base)
            return dataclasses.replace(base, dtype=src.dtype, constant=src.constant)
        if not is_input and name in q_by_input:
            q_out = infos.get(q_by_input[name].output[0], base)
            return dataclasses.replace(base, dtype=q_out.dtype)
        if as_quantized and base.dtype in FLOAT_DTYPES:
            return dataclasses.replace(base, dtype=as_quantized)
        return base

    return NodeInfo(
        op_type=node.op_type, domain=node.domain, attributes=_attrs(node),
        inputs=tuple(info(x, is_input=True) for x in node.input),
        outputs=tuple(info(o, is_input=False) or TensorInfo(None, None) for o in node.output),
        quantized=len(unit) > 1,
    )


def _static_shape_reason(node: NodeInfo, names: list[str]) -> str | None:
    for name, tensor in zip(names, (*node.inputs, *node.outputs)):
        if tensor is None or tensor.constant:
            continue
        if tensor.shape is None:
            return f"{node.op_type}: needs static shapes (shape of {name!r} is unknown)"
        if not tensor.static:
            dims = "x".join(str(d) for d in tensor.shape)
            return f"{node.op_type}: needs static shapes ({name!r} is {dims})"
    return None


def _group(graph: onnx.GraphProto, units: list[list[int]], owner: dict[int, int],
           supported: list[bool]) -> list[list[int]]:
    """ORT-style partition groups of supported units (lists of unit indices); Constant nodes are initializers."""
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output if out and n.op_type != "Constant"}
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
    inferred = _infer(model, input_shape)
    graph = inferred.graph
    infos = _tensor_infos(graph)
    initializers = {t.name for t in graph.initializer}
    symbolic = tuple(i.name for i in graph.input if i.name not in initializers
                     and not infos.get(i.name, TensorInfo(None, None)).static)
    float_model = _is_float_model(graph)
    needs_quant = float_model and not target.quantization.accepts_float
    as_quantized = target.quantization.activations[0] if needs_quant else None
    notes: list[str] = []
    if needs_quant:
        notes.append(f"{target.display_name} does not run float models: quantize first "
                     f"({target.quantization.float_note or target.quantization.weights}); "
                     "support below assumes the quantized model")
    if symbolic and target.requires_static_shapes:
        notes.append(f"{target.display_name} needs static shapes; inputs {', '.join(symbolic)} have symbolic dims: "
                     "pass --input-shape")

    if target.qdq_units:
        units, owner = _node_units(graph)
    else:
        units = [[i] for i in range(len(graph.node))]
        owner = {i: i for i in range(len(graph.node))}
    reasons: list[list[str]] = []
    for unit in units:
        node = graph.node[unit[0]]
        if node.op_type == "Constant":
            reasons.append([])
            continue
        info = _unit_info(graph, unit, infos, as_quantized)
        rule = target.rule_for(node.op_type, node.domain)
        why: list[str] = []
        if rule is None:
            domain = f" (domain {node.domain})" if node.domain not in ("", "ai.onnx") else ""
            why.append(f"{node.op_type}{domain}: not supported by {target.display_name}")
        else:
            why.extend(rule.failures(info, default_dtypes=target.dtypes, max_rank=target.max_rank))
        if target.requires_static_shapes:
            static_why = _static_shape_reason(info, [*node.input, *node.output])
            if static_why:
                why.append(static_why)
        reasons.append(why)
    supported = [not r for r in reasons]
    groups = _group(graph, units, owner, supported)
    if target.drops_lone_qdq_partitions:
        kept = []
        for g in groups:
            members = [m for u in g for m in units[u]]
            if len(members) == 1 and graph.node[members[0]].op_type in _QDQ:
                reasons[g[0]].append(f"{graph.node[members[0]].op_type}: a partition of a single Q/DQ node "
                                     "stays on the CPU")
                continue
            kept.append(g)
        groups = kept

    summary = summarize(inferred)
    node_macs = [row.macs for row in summary.layers]
    node_partition: dict[int, int] = {}
    partitions: list[Partition] = []
    for p, g in enumerate(groups):
        members = sorted(m for u in g for m in units[u])
        for m in members:
            node_partition[m] = p
        partitions.append(Partition(
            index=p, nodes=tuple(graph.node[m].name or f"{graph.node[m].op_type}_{m}" for m in members),
            ops=dict(collections.Counter(graph.node[m].op_type for m in members).most_common()),
            macs=sum(node_macs[m] or 0 for m in members)))

    verdicts = []
    for i, node in enumerate(graph.node):
        if node.op_type == "Constant":
            continue
        unit_reasons = tuple(reasons[owner[i]])
        fix = None
        if unit_reasons:
            rule = fix_for(node.op_type, target) if target.rule_for(node.op_type, node.domain) is None else None
            if rule is not None:
                fix = rule.name
            elif any("static shapes" in r for r in unit_reasons) and "fix_input_shape" in target.substitutions:
                fix = "fix_input_shape"
        verdicts.append(NodeVerdict(
            index=i, name=node.name or f"{node.op_type}_{i}", op_type=node.op_type,
            supported=i in node_partition, reasons=unit_reasons, fix=fix, partition=node_partition.get(i),
            macs=node_macs[i]))

    place = {i: node_partition.get(i, -1) for i in range(len(graph.node))}
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output if out}
    transitions = sum(1 for i, n in enumerate(graph.node) for x in n.input
                      if x in producer and place[producer[x]] != place[i]
                      and graph.node[producer[x]].op_type != "Constant")
    macs_total = sum(m or 0 for m in node_macs)
    return Analysis(
        target=target.name, display_name=target.display_name, nodes=tuple(verdicts), partitions=tuple(partitions),
        transitions=transitions, macs_total=macs_total,
        macs_delegated=sum(p.macs for p in partitions), needs_quantization=needs_quant,
        symbolic_inputs=symbolic, notes=tuple(notes),
    )


def _cell(verdicts: list[NodeVerdict], needs_quant: bool) -> str:
    taken = sum(1 for v in verdicts if v.partition is not None)
    if taken == len(verdicts):
        text = "yes"
    else:
        first = next((v.reasons[0] for v in verdicts if v.partition is None and v.reasons), "")
        fix = next((v.fix for v in verdicts if v.fix), None)
        text = ("no" if taken == 0 else f"{taken}/{len(verdicts)}") + (f": {first}" if first else "")
        if fix:
            text += f" [fix: {fix}]"
    return text + (" (after quantization)" if needs_quant and taken else "")


def tables(analyses: list[Analysis]) -> list[Table]:
    """Side-by-side tables for analyses of one model: op support per target, and a delegation summary."""
    if not analyses:
        return []
    first = analyses[0]
    by_op: dict[str, list[int]] = collections.defaultdict(list)
    for v in first.nodes:
        by_op[v.op_type].append(v.index)
    op_rows = []
    for op, indices in sorted(by_op.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        row: list[Any] = [op, len(indices)]
        for a in analyses:
            by_index = {v.index: v for v in a.nodes}
            row.append(_cell([by_index[i] for i in indices], a.needs_quantization))
        op_rows.append(row)
    summary_rows = []
    for a in analyses:
        share = a.mac_share
        summary_rows.append([
            a.target, f"{a.delegated_nodes}/{len(a.nodes)}", len(a.partitions), a.transitions,
            "n/a" if share is None else f"{100 * share:.1f}%",
            "yes" if a.needs_quantization else "no",
            ", ".join(sorted({v.fix for v in a.nodes if v.fix})) or "-",
        ])
    return [
        Table("Operator support by target", ["op", "count", *[a.target for a in analyses]], op_rows),
        Table("Delegation by target", ["target", "nodes delegated", "partitions", "CPU<->NPU transitions",
                                       "MACs delegated", "needs quantization", "fixes available"], summary_rows),
    ]


def compare_targets(
    model: onnx.ModelProto,
    targets: list[TargetProfile],
    *,
    input_shape: tuple[int, ...] | None = None,
) -> list[Table]:
    """Analyze ``model`` for each target and return the side-by-side tables (see ``tables``)."""
    return tables([analyze(model, t, input_shape=input_shape) for t in targets])
