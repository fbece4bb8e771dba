"""Where a model's time goes on ONNX Runtime CPU: every kernel's time from ORT's profiler, grouped into kinds
(pointwise / depthwise / spatial / grouped convolution, matmul, quantize, layout, other) and split into integer and
float kernels.

The profiler times each node of the graph ORT actually runs, after its optimizations (fusions, the QDQ -> QLinearConv
rewrite, NCHWc / NHWC layouts), so a node is classified from that optimized graph: its weight's kernel shape and
``group`` attribute. Several models are profiled interleaved (the same rotation as ``measure_latency_interleaved``),
so comparing an int8 model's kinds with its float model's shows which kernels the integer arithmetic speeds up on
this CPU and which it does not. Each node's time is the median of its timed runs (warm-up runs dropped); a kind's time
is the sum of its nodes' medians. Kernel times leave out the framework's own overhead, so their total is a little
below the wall-clock latency recorded beside them.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from npukit.errors import InputError
from npukit.measure.latency import LatencyResult, time_sessions_interleaved
from npukit.runtime.ort import INTEGER_KERNELS, ModelLike, make_session

KINDS = ("pointwise conv", "depthwise conv", "spatial conv", "grouped conv", "matmul", "quantize", "layout", "other")
_CONV = {"Conv": 1, "FusedConv": 1, "NhwcFusedConv": 1, "QLinearConv": 3, "ConvInteger": 1}  # op -> weight input
_MATMUL = frozenset({"MatMul", "Gemm", "FusedGemm", "FusedMatMul", "QGemm", "QLinearMatMul", "MatMulInteger",
                     "MatMulIntegerToFloat", "DynamicQuantizeMatMul"})
_QUANTIZE = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
_LAYOUT = frozenset({"Transpose", "ReorderInput", "ReorderOutput"})


def conv_kind(weight_shape: Sequence[int], group: int) -> str:
    """The kind of a convolution from its weight (out, in / group, k...) and ``group``."""
    if group > 1:
        return "depthwise conv" if weight_shape[1] == 1 else "grouped conv"
    return "pointwise conv" if all(k == 1 for k in weight_shape[2:]) else "spatial conv"


def node_kind(node: onnx.NodeProto, shapes: Mapping[str, Sequence[int]]) -> str:
    """The kind (one of ``KINDS``) of a node of an ORT-optimized graph; ``shapes``: initializer name -> dims."""
    if node.op_type in _CONV:
        index = _CONV[node.op_type]
        weight = shapes.get(node.input[index]) if len(node.input) > index else None
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if weight is None or len(weight) < 3:
            return "spatial conv" if group == 1 else "grouped conv"
        return conv_kind(weight, group)
    if node.op_type in _MATMUL:
        return "matmul"
    if node.op_type in _QUANTIZE:
        return "quantize"
    if node.op_type in _LAYOUT:
        return "layout"
    return "other"


@dataclasses.dataclass(frozen=True)
class OpTime:
    """One node of the optimized graph: its median kernel time per run, in microseconds."""

    node: str
    op_type: str
    kind: str
    integer: bool
    median_us: float


@dataclasses.dataclass(frozen=True)
class OpProfile:
    """Kernel times of one model (``ops`` in execution order) and its wall-clock ``latency`` over the same runs."""

    ops: tuple[OpTime, ...]
    latency: LatencyResult

    @property
    def kernel_ms(self) -> float:
        return sum(op.median_us for op in self.ops) / 1e3

    def by_kind(self) -> dict[str, dict[str, float | int]]:
        """kind -> {"ms", "nodes", "integer_ms"} for every kind present, in ``KINDS`` order."""
        out: dict[str, dict[str, float | int]] = {}
        for kind in KINDS:
            ops = [op for op in self.ops if op.kind == kind]
            if ops:
                out[kind] = {"ms": sum(op.median_us for op in ops) / 1e3, "nodes": len(ops),
                             "integer_ms": sum(op.median_us for op in ops if op.integer) / 1e3}
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"kernel_ms": self.kernel_ms, "latency_median_ms": self.latency.median_ms, "by_kind": self.by_kind(),
                "ops": [dataclasses.asdict(op) for op in self.ops]}


def compare_kinds(base: OpProfile, other: OpProfile) -> dict[str, dict[str, Any]]:
    """Kind by kind (``KINDS`` order, every kind either has): {"base_ms", "ms", "speedup" (base / other, None where
    either lacks the kind), "nodes", "integer_share" (of ``other``'s time in that kind)}."""
    a, b = base.by_kind(), other.by_kind()
    out = {}
    for kind in KINDS:
        if kind not in a and kind not in b:
            continue
        mine = b.get(kind, {"ms": 0.0, "nodes": 0, "integer_ms": 0.0})
        out[kind] = {"base_ms": a.get(kind, {}).get("ms", 0.0), "ms": mine["ms"],
                     "speedup": a[kind]["ms"] / mine["ms"] if kind in a and mine["ms"] > 0 else None,
                     "nodes": mine["nodes"],
                     "integer_share": mine["integer_ms"] / mine["ms"] if mine["ms"] > 0 else None}
    return out


def profile_ops(
    models: Mapping[str, ModelLike],
    *,
    threads: int = 1,
    warmup: int = 5,
    runs: int = 30,
    rounds: int = 5,
    feeds: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
) -> dict[str, OpProfile]:
    """Profile each model's kernels over ``runs`` interleaved runs (after ``warmup``) on ``feeds`` (seeded random
    inputs per model when None)."""
    if not models:
        raise InputError("no models to profile", hint="give at least one model")
    if warmup < 0 or runs < 1 or rounds < 1 or threads < 1:
        raise InputError(f"cannot profile with threads={threads}, warmup={warmup}, runs={runs}, rounds={rounds}",
                         hint="use threads, runs and rounds >= 1 and warmup >= 0")
    with tempfile.TemporaryDirectory(prefix="npukit-profile-") as tmp:
        sessions, graphs = {}, {}
        for i, (name, model) in enumerate(models.items()):
            optimized = Path(tmp) / f"optimized_{i}.onnx"
            sessions[name] = make_session(model, threads=threads, optimized_model_path=str(optimized),
                                          profile_prefix=str(Path(tmp) / f"profile_{i}"))
            graphs[name] = onnx.load(str(optimized), load_external_data=False).graph
        latency = time_sessions_interleaved(sessions, threads=threads, warmup=warmup, runs=runs, rounds=rounds,
                                            feeds=feeds, seed=seed)
        traces = {name: json.loads(Path(s.end_profiling()).read_text()) for name, s in sessions.items()}
    return {name: _profile(graphs[name], traces[name], warmup=warmup, latency=latency[name]) for name in models}


def _profile(graph: onnx.GraphProto, trace: list[dict], *, warmup: int, latency: LatencyResult) -> OpProfile:
    shapes = {i.name: tuple(i.dims) for i in graph.initializer}
    nodes = {n.name: n for n in graph.node}
    times: dict[str, list[float]] = collections.defaultdict(list)
    op_types: dict[str, str] = {}
    for event in trace:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        node = name[: -len("_kernel_time")]
        times[node].append(float(event["dur"]))
        op_types[node] = event.get("args", {}).get("op_name", "")
    ops = []
    for node, durations in times.items():  # first appearance = execution order
        timed = durations[warmup:] or durations
        proto = nodes.get(node)
        op_type = op_types[node] or (proto.op_type if proto is not None else "")
        kind = node_kind(proto, shapes) if proto is not None else "other"
        ops.append(OpTime(node=node, op_type=op_type, kind=kind, integer=op_type in INTEGER_KERNELS,
                          median_us=float(np.median(timed))))
    return OpProfile(ops=tuple(ops), latency=latency)
