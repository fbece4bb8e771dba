"""Where ORT CPU's NCHWc layout should end: keep a high-resolution upsample in the plain layout when that lowers the
peak memory the runtime really needs.

On x86 ORT rewrites convolutions, pooling and Resize into the NCHWc blocked layout (channels padded to the SIMD block)
and converts back with a ReorderOutput where a plain-layout consumer or a graph output needs the tensor. When a model
ends with an upsample to full resolution (segmentation heads: LR-ASPP, DeepLab, FCN), ORT computes the upsample in
NCHWc, with padded channels, and then copies it into the plain output: both full-resolution maps are live at once.
Measured on LR-ASPP MobileNetV3 at 512x512 (21 classes padded to 24): 25 MB of NCHWc upsample plus the 22 MB output,
47 MB at the peak, where the output alone is 22 MB.

The rewrite: a Reshape of the upsample's input to its own static shape (exact, no data moves). ORT's layout
transform does not carry NCHWc through a Reshape, so it reorders the small low-resolution input into the plain layout
there, and the upsample writes the plain output directly. Which upsamples to keep plain is decided by the runtime's
own numbers: :func:`choose_planar_resizes` replays ORT's allocation (:mod:`npukit.memory.ort_cpu`) with and without
each candidate and keeps the ones that lower the predicted peak.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from npukit.errors import InputError
from npukit.passes._rewrite import add_initializer
from npukit.passes.base import NpukitPass
from npukit.measure.summary import infer_with_fixed_inputs, static_dims, value_types

PLANAR_SUFFIX = "_planar"


@dataclasses.dataclass(frozen=True)
class LayoutChoice:
    """The Resize nodes kept in the plain layout (``planar``), the model with them, and the predicted ORT CPU peaks
    (arena off, inputs excluded) before and after; ``candidates`` maps every Resize tried alone to its peak."""

    model: onnx.ModelProto
    planar: tuple[str, ...]
    predicted_peak_before: int
    predicted_peak_after: int
    candidates: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {"planar_resizes": list(self.planar), "predicted_peak_before": self.predicted_peak_before,
                "predicted_peak_after": self.predicted_peak_after, "candidates": dict(self.candidates)}


def keep_resizes_planar(model: onnx.ModelProto, names: Sequence[str], *,
                        input_shape: Sequence[int] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` where each Resize in ``names`` reads its data input through a Reshape to the input's own
    static shape (``KeepResizesPlanarPass``), so ORT CPU's NCHWc layout ends before it. The function computed is
    unchanged (ORT's plain and NCHWc upsample kernels round differently in the last bits)."""
    import onnx_ir as ir

    inferred = infer_with_fixed_inputs(model, input_shape)
    shapes, _ = value_types(inferred.graph)
    nodes = {node.name: node for node in model.graph.node}
    missing = [name for name in names if name not in nodes or nodes[name].op_type != "Resize"]
    if missing:
        raise InputError(f"no Resize node named {missing[0]!r} in the model", hint="name Resize nodes of the graph")
    dims = {name: static_dims(shapes.get(nodes[name].input[0])) for name in names}
    unknown = [name for name, d in dims.items() if d is None]
    if unknown:
        raise InputError(f"the input of Resize {unknown[0]!r} has no static shape",
                         hint="give the input's full shape with --input-shape")
    result = KeepResizesPlanarPass(dims)(ir.serde.deserialize_model(model))
    return ir.serde.serialize_model(result.model)


class KeepResizesPlanarPass(NpukitPass):
    """Each Resize named in ``dims`` (name -> its data input's static shape) reads that input through a Reshape to
    the same shape, named ``<input>_planar`` (``<Resize>_planar`` the node): exact, no data moves."""

    def __init__(self, dims: Mapping[str, Sequence[int]]) -> None:
        super().__init__()
        self.dims = dict(dims)

    def call(self, model: Any) -> Any:
        import onnx_ir as ir

        graph = model.graph
        taken = {v.name for n in graph for v in n.outputs} | set(graph.initializers)
        for node in [n for n in graph if n.name in self.dims and n.op_type == "Resize"]:
            source = node.inputs[0]
            base = f"{source.name}{PLANAR_SUFFIX}"
            planar, k = base, 0
            while planar in taken or f"{planar}_shape" in taken:
                k += 1
                planar = f"{base}{k}"
            taken.update((planar, f"{planar}_shape"))
            shape = add_initializer(graph, np.array(self.dims[node.name], np.int64), name_hint=f"{planar}_shape")
            reshape = ir.node("Reshape", [source, shape], name=f"{node.name}{PLANAR_SUFFIX}")
            reshape.outputs[0].name = planar
            reshape.outputs[0].shape, reshape.outputs[0].type = source.shape, source.type
            graph.insert_before(node, reshape)
            node.replace_input_with(0, reshape.outputs[0])
            self.rewrites += 1
        return ir.passes.PassResult(model, modified=self.rewrites > 0)


def ort_predicted_peak(model: onnx.ModelProto | str | Path, *, input_shape: Sequence[int] | None = None) -> int:
    """ORT CPU's peak activation memory for ``model`` (arena off, inputs excluded), from its own graph and its
    allocation planner replayed (:mod:`npukit.memory.ort_cpu`)."""
    from npukit.memory.ort_cpu import ort_allocation, ort_executed_graph

    if isinstance(model, (str, Path)):
        return ort_allocation(ort_executed_graph(model, input_shape=input_shape)).peak_bytes
    with tempfile.TemporaryDirectory(prefix="npukit-layout-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, str(path))
        return ort_predicted_peak(path, input_shape=input_shape)


def choose_planar_resizes(model: onnx.ModelProto, *, input_shape: Sequence[int] | None = None,
                          min_gain: float = 0.01) -> LayoutChoice:
    """Keep plain every Resize that, kept plain alone, lowers ORT's predicted peak by more than ``min_gain``; the
    combination is checked again and kept only if it is the lowest."""
    before = ort_predicted_peak(model, input_shape=input_shape)
    resizes = [n.name for n in model.graph.node if n.op_type == "Resize" and n.name]
    candidates: dict[str, int] = {}
    for name in resizes:
        try:
            candidates[name] = ort_predicted_peak(keep_resizes_planar(model, [name], input_shape=input_shape),
                                                  input_shape=input_shape)
        except InputError:
            continue  # no static shape: not a candidate
    helping = [name for name, peak in candidates.items() if peak < before * (1 - min_gain)]
    chosen, after, rewritten = (), before, model
    if helping:
        combined = keep_resizes_planar(model, helping, input_shape=input_shape)
        peak = ort_predicted_peak(combined, input_shape=input_shape)
        best_single = min(helping, key=candidates.__getitem__)
        if candidates[best_single] < peak:
            chosen, after = (best_single,), candidates[best_single]
            rewritten = keep_resizes_planar(model, chosen, input_shape=input_shape)
        else:
            chosen, after, rewritten = tuple(helping), peak, combined
    return LayoutChoice(model=rewritten, planar=chosen, predicted_peak_before=before, predicted_peak_after=after,
                        candidates=candidates)
