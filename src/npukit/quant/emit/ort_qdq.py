"""Emit a quantization plan as an ONNX QDQ model through ONNX Runtime's quantizer, and read back the grids it wrote.

``emit_qdq`` hands the plan to ``onnxruntime.quantization.quantize_static``: the scheme as its arguments, every
activation's range (and 16-bit type) and every weight grid the plan fixes as ``TensorQuantOverrides``, the float nodes
as ``nodes_to_exclude``. ORT then does the mechanical Q/DQ placement; its own calibration pass (given one sample,
because it insists on one) decides nothing. The float convs ORT would quantize on its own when it loads the model are
then given inputs it leaves alone (``emit.ort_float``). ``resolve_grids`` reads the emitted model's Q/DQ initializers back into
the plan (scales, zero points, axes, dtypes, also for the weights and biases ORT gridded by its defaults) and lists
every tensor whose emitted dtype is not the planned one.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader

from npukit._logging import quiet_root_logger
from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex, own_copy
from npukit.quant.emit.ort_float import keep_float_convs
from npukit.quant.emit.ort_memo import remembered
from npukit.quant.plan import Decision, QuantPlan, TensorSpec

_QUANT_TYPES = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16"}
EMITTED = Decision("ort_quantizer", "ONNX Runtime's quantizer gridded it under the plan's scheme")
NOT_EMITTED = Decision("ort_quantizer", "no Q/DQ of its own in the emitted model (read and written only by float "
                                        "nodes, or fused into the grid of the tensor after it)")


class FeedsReader(CalibrationDataReader):
    """ORT's CalibrationDataReader over a sequence of feed dicts, each given once."""

    def __init__(self, feeds: Iterable[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _quant_type(dtype: str):
    from onnxruntime.quantization import QuantType

    if dtype not in _QUANT_TYPES:
        raise InputError(f"ONNX Runtime's QDQ emitter takes {', '.join(_QUANT_TYPES)} tensors, not {dtype}",
                         hint="keep the tensor in float or use an 8/16-bit spec")
    return getattr(QuantType, _QUANT_TYPES[dtype])


def ort_overrides(model: onnx.ModelProto, plan: QuantPlan) -> dict[str, list[dict]]:
    """The plan's tensors as ORT ``TensorQuantOverrides``: an activation's rmin/rmax (its quant_type when it is not
    the scheme's activation dtype), a weight's fixed scales and zero points (per channel with its axis), or, under
    ``reduce_range``, ``reduce_range: False`` for a full-range weight."""
    weights = {i.name for i in model.graph.initializer}
    out: dict[str, list[dict]] = {}
    for name, spec in plan.tensors.items():
        if spec.is_float:
            continue
        if name not in weights:
            if spec.range is None:
                continue
            entry: dict = {"rmin": np.float32(spec.range[0]), "rmax": np.float32(spec.range[1])}
            if spec.dtype != plan.activation_dtype:
                entry["quant_type"] = _quant_type(spec.dtype)
            out[name] = [entry]
        elif spec.scale is not None:
            zero = np.int8 if spec.dtype == "int8" else np.uint8
            if spec.axis is None:
                out[name] = [{"scale": np.float32(spec.scale[0]), "zero_point": zero(spec.zero_point[0])}]
            else:
                out[name] = [{"axis": spec.axis, "scale": np.float32(s), "zero_point": zero(z)}
                             for s, z in zip(spec.scale, spec.zero_point)]
        elif plan.reduce_range and spec.full_range:
            out[name] = [{"reduce_range": False, **({"axis": spec.axis} if spec.axis is not None else {})}]
    if plan.per_channel:
        for weight in grouped_transposed_weights(model, plan.float_nodes) - set(out):
            out[weight] = [{"symmetric": plan.symmetric_weights}]  # no axis: per tensor
    return out


def grouped_transposed_weights(model: onnx.ModelProto, float_nodes: Iterable[str] = ()) -> set[str]:
    """The weights of grouped ConvTransposes with a bias (outside ``float_nodes``), which per-channel quantization
    would take along axis 1 (the output channels of one group): ORT's quantizer divides the bias (every output
    channel) by those fewer scales and crashes (a grouped upsampling: "operands could not be broadcast together with
    shapes (8,) (2,)"). Their emitters take them per tensor, where the bias's scale is one number."""
    skip = set(float_nodes)
    return {node.input[1] for node in model.graph.node
            if node.op_type == "ConvTranspose" and node.name not in skip and len(node.input) > 2
            and node.input[2] and any(a.name == "group" and a.i > 1 for a in node.attribute)}


BIAS_OPS = ("Conv", "ConvTranspose", "Gemm", "InstanceNormalization", "LayerNormalization", "BatchNormalization")


def own_biases(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every float bias (input 2 of ``BIAS_OPS``) that several nodes read copied, one copy per node
    after the first, under a name no tensor of the graph has. ORT's quantizer gives each reader of a shared bias its
    own copy too (each int32 grid is its reader's input scale times weight scale), but names it the bias's name
    followed by a number, which another tensor may already have: the six InstanceNormalizations torch exports for a
    GroupNorm net share one bias ``val_11``, ORT's copy ``val_111`` collided with the output of ``node_Reshape_111``,
    and its quantizer failed ("Quantization parameter shared mode is not supported for weight yet"). A model whose
    biases are each read once comes back unchanged (the same object)."""
    graph = model.graph
    floats = {t.name for t in graph.initializer if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)}
    readers: dict[str, list[int]] = {}  # bias -> the indices of the nodes reading it
    for i, node in enumerate(graph.node):
        if node.op_type in BIAS_OPS and len(node.input) > 2 and node.input[2] in floats:
            readers.setdefault(node.input[2], []).append(i)
    shared = {name: nodes for name, nodes in readers.items() if len(nodes) > 1}
    if not shared:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out_index = GraphIndex(out.graph)  # the copies are appended below: it is read for the original biases only
    inits = out_index.initializers
    taken = set(inits) | out_index.inputs | set(out_index.producer) | {v.name for v in out.graph.value_info}
    for name, owners in shared.items():
        for k, index in enumerate(owners[1:], start=1):
            own_copy(out.graph, out.graph.node[index], 2, (f"{name}_copy{i}" for i in itertools.count(k)), taken, inits)
    return out


def emit_qdq(model: onnx.ModelProto, first: dict[str, np.ndarray], plan: QuantPlan) -> onnx.ModelProto:
    """The QDQ model of ``plan`` on the float ``model`` (``first``: one sample, which ORT's quantizer insists on)."""
    from onnxruntime.quantization import QuantFormat, quantize_static

    if plan.weight_dtype != "int8":
        raise InputError(f"ONNX Runtime's QDQ emitter writes int8 weights here, not {plan.weight_dtype}",
                         hint="use weight_dtype='int8'")
    with tempfile.TemporaryDirectory(prefix="npukit-quant-") as tmp, quiet_root_logger(), remembered():
        out = Path(tmp) / "qdq.onnx"
        source = Path(tmp) / "float.onnx"  # a path: given a ModelProto, quantize_static rewrites it in place
        onnx.save(own_biases(model), str(source))
        quantize_static(
            str(source), str(out), FeedsReader([first]), quant_format=QuantFormat.QDQ,
            per_channel=plan.per_channel, activation_type=_quant_type(plan.activation_dtype),
            weight_type=_quant_type(plan.weight_dtype), reduce_range=plan.reduce_range,
            nodes_to_exclude=list(plan.float_nodes),
            extra_options={"ActivationSymmetric": plan.symmetric_activations,
                           "WeightSymmetric": plan.symmetric_weights,
                           "TensorQuantOverrides": ort_overrides(model, plan)},
        )
        # the float convs ORT's weight quantizer would take as int8 at load: each reads its input on its own
        return keep_float_convs(onnx.load(str(out)), plan.float_nodes).model


_ONNX_DTYPES = {onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT16: "int16",
                onnx.TensorProto.UINT16: "uint16", onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT4: "int4",
                onnx.TensorProto.UINT4: "uint4"}


def _grid(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> tuple[str, np.ndarray, np.ndarray, int | None]:
    scale = numpy_helper.to_array(inits[node.input[1]])
    if len(node.input) > 2 and node.input[2] in inits:
        zp_proto = inits[node.input[2]]
        dtype, zero = _ONNX_DTYPES.get(zp_proto.data_type, "?"), numpy_helper.to_array(zp_proto)
    elif node.input[0] in inits:  # a DequantizeLinear of an initializer without a zero point: its own type
        dtype, zero = _ONNX_DTYPES.get(inits[node.input[0]].data_type, "?"), np.zeros_like(scale, dtype=np.int64)
    else:
        dtype, zero = "uint8", np.zeros_like(scale, dtype=np.int64)  # ONNX's default output type
    axis = None
    if scale.size > 1:
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
    return dtype, scale, zero, axis


def resolve_grids(float_model: onnx.ModelProto, qdq: onnx.ModelProto, plan: QuantPlan
                  ) -> tuple[QuantPlan, list[str]]:
    """``plan`` with the grids ``qdq`` (emitted from it on ``float_model``) actually has: each quantized tensor's
    dtype, scales, zero points and axis; weights and biases the plan left to the emitter's defaults are added with
    ``EMITTED`` as their decision; planned tensors without a Q/DQ of their own become float32 (``NOT_EMITTED``).
    Also: the tensors whose emitted dtype is not the planned one ("name: planned ->
    emitted")."""
    inits = GraphIndex(qdq.graph).initializers
    float_nodes = {n.name: n for n in float_model.graph.node if n.name}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in qdq.graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, i))
    float_tensors = {t for n in float_model.graph.node for t in (*n.input, *n.output)} \
        | {i.name for i in float_model.graph.input}
    found: dict[str, tuple[str, np.ndarray, np.ndarray, int | None]] = {}
    for node in qdq.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] in float_tensors and node.input[0] not in found:
            found[node.input[0]] = _grid(node, inits)
        elif node.op_type == "DequantizeLinear" and node.input[0] in inits:
            for reader, index in readers.get(node.output[0], []):
                twin = float_nodes.get(reader.name)
                if twin is not None and index < len(twin.input) and twin.input[index]:
                    found.setdefault(twin.input[index], _grid(node, inits))
    specs: dict[str, TensorSpec] = {}
    added: dict[str, TensorSpec] = {}
    mismatched: list[str] = []
    for name, (dtype, scale, zero, axis) in found.items():
        if dtype not in _ONNX_DTYPES.values() or not np.all(scale > 0):
            continue
        grid = {"axis": axis, "scale": tuple(scale.reshape(-1)), "zero_point": tuple(int(z) for z in zero.reshape(-1))}
        planned = plan.spec(name)
        if planned is None:
            added[name] = TensorSpec(dtype=dtype, symmetric=bool(np.all(zero == 0)) and dtype.startswith("int"),
                                     **grid)
        elif planned.dtype != dtype:
            mismatched.append(f"{name}: {planned.dtype} -> {dtype}")
            specs[name] = dataclasses.replace(planned.as_dtype(dtype), **grid)
        else:
            specs[name] = dataclasses.replace(planned, **grid)
    resolved = plan
    if specs:
        resolved = dataclasses.replace(resolved, tensors={**resolved.tensors, **specs})
    if added:
        resolved = resolved.with_specs(added, EMITTED)
    absent = {t: TensorSpec("float32", range=s.range) for t, s in plan.tensors.items()
              if not s.is_float and t not in found}
    if absent:
        resolved = resolved.with_specs(absent, NOT_EMITTED)
    return resolved, mismatched
