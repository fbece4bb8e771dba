"""Model summary: ops by type, parameters, serialized size, MACs per layer and in total, and the largest activations.

Shapes come from ONNX shape inference on a copy of the model whose first input takes ``input_shape`` (when given)
and whose symbolic leading dimensions become 1. Only the main graph is counted (not If/Loop bodies or functions).

Parameters are the elements of the constant tensors a model stores (initializers and Constant nodes) that are
weights: every floating or 8/16-bit integer tensor, and int32 tensors that feed a DequantizeLinear (quantized
biases). int64 and bool tensors (shapes, axes, indices) and the scales and zero points of QuantizeLinear /
DequantizeLinear are not parameters. A weight reached through DequantizeLinear/QuantizeLinear/Cast/Identity (the
QDQ form) is attributed to the layer that consumes it, so a QDQ model reports the same Conv MACs and parameters as
its float original.

MACs (multiply-accumulates, bias excluded) are counted for Conv, ConvTranspose, Gemm, MatMul (batched too) and their
integer forms (ConvInteger, QLinearConv, MatMulInteger, QLinearMatMul). ``other_flops`` is a rough count for the
rest: one per output element of element-wise ops, two per element for BatchNormalization, output elements times the
window for MaxPool/AveragePool/LpPool, and input elements for global pools.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from npukit.errors import InputError

Dim = int | str | None
Shape = tuple[Dim, ...]

# op -> (index of the data input, index of the weight input)
_CONV_OPS = {"Conv": (0, 1), "ConvInteger": (0, 1), "QLinearConv": (0, 3)}
_MATMUL_OPS = {"MatMul": (0, 1), "MatMulInteger": (0, 1), "QLinearMatMul": (0, 3)}
_RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM"})  # X, W, R first
_WEIGHT_PLUMBING = {"DequantizeLinear", "QuantizeLinear", "Cast", "Identity"}
_QDQ = {"DequantizeLinear", "QuantizeLinear"}
_ELEMENTWISE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Abs", "Neg", "Reciprocal", "Min", "Max", "Sum",
    "Mean", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "Sigmoid", "HardSigmoid", "HardSwish",
    "Tanh", "Softplus", "Softsign", "Mish", "Clip", "Erf", "Where",
}
_WINDOW_POOLS = {"MaxPool", "AveragePool", "LpPool"}
_GLOBAL_POOLS = {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}
_PARAM_DTYPES = {
    onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE,
    onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
    onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
    onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ,
}


@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One node. ``output_shape`` (of its first output), ``macs`` and ``output_bytes`` are None when shape
    inference could not tell."""

    name: str
    op: str
    output_shape: Shape | None
    params: int
    macs: int | None
    output_bytes: int | None

    def as_dict(self) -> dict[str, Any]:
        shape = None if self.output_shape is None else list(self.output_shape)
        return {"name": self.name, "op": self.op, "output_shape": shape, "params": self.params, "macs": self.macs,
                "output_bytes": self.output_bytes}


@dataclasses.dataclass(frozen=True)
class Activation:
    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "bytes": self.bytes}


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """What :func:`summarize` found. ``unknown_mac_layers`` counts MAC layers left out of ``macs`` (unknown shapes)."""

    ops: dict[str, int]
    nodes: int
    parameters: int
    serialized_bytes: int
    macs: int
    other_flops: int
    unknown_mac_layers: int
    input_shapes: dict[str, Shape]
    layers: tuple[LayerRow, ...]
    largest_activations: tuple[Activation, ...]
    # what control flow's subgraphs (If branches, Loop and Scan bodies) hold: counted apart, as only one branch runs
    branch_nodes: int = 0
    branch_parameters: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ops": dict(self.ops), "nodes": self.nodes, "parameters": self.parameters,
            "branch_nodes": self.branch_nodes, "branch_parameters": self.branch_parameters,
            "serialized_bytes": self.serialized_bytes, "macs": self.macs, "other_flops": self.other_flops,
            "unknown_mac_layers": self.unknown_mac_layers,
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
            "layers": [row.as_dict() for row in self.layers],
            "largest_activations": [a.as_dict() for a in self.largest_activations],
        }


def summarize(
    model: onnx.ModelProto,
    *,
    input_shape: tuple[int, ...] | None = None,
    top_activations: int = 10,
    feeds: Any = None,
) -> ModelSummary:
    """Summarize ``model`` (not modified). ``input_shape`` fixes the first graph input's shape for shape inference;
    ``feeds``: inputs to run the model on once where shape inference leaves a conv/matmul without shapes (sizes the
    graph computes: Shape -> Reshape chains), taking every tensor's shape from that run."""
    inferred = infer_with_fixed_inputs(model, input_shape)
    graph = inferred.graph
    shapes, dtypes = value_types(graph)
    if feeds is not None and any(_node_macs(n, shapes) is None for n in graph.node):
        shapes, dtypes = run_types(model, feeds, shapes, dtypes)
    consts = _constant_tensors(graph)
    weight_roots = _weight_roots(graph, consts)

    layers: list[LayerRow] = []
    macs_total = other_total = unknown = 0
    for index, node in enumerate(graph.node):
        plumbing = node.op_type == "Constant" or (
            node.op_type in _WEIGHT_PLUMBING and bool(node.input) and node.input[0] in weight_roots)
        roots: set[str] = set()
        if not plumbing:
            for name in node.input:
                roots |= weight_roots.get(name, set())
        params = sum(_elements(consts[r]) for r in roots)
        macs = _node_macs(node, shapes)
        if macs is None:  # a MAC op whose shapes are unknown
            unknown += 1
        macs_total += macs or 0
        other_total += _other_flops(node, shapes) or 0
        out = node.output[0] if node.output else ""
        out_shape = shapes.get(out)
        layers.append(LayerRow(
            name=node.name or f"{node.op_type}_{index}",
            op=node.op_type,
            output_shape=out_shape,
            params=params,
            macs=macs,
            output_bytes=tensor_nbytes(out_shape, dtypes.get(out)),
        ))

    branch_nodes, branch_parameters = _in_branches(graph)
    return ModelSummary(
        branch_nodes=branch_nodes, branch_parameters=branch_parameters,
        ops=dict(Counter(n.op_type for n in graph.node).most_common()),
        nodes=len(graph.node),
        parameters=sum(_elements(consts[r]) for r in _parameter_names(graph, consts)),
        serialized_bytes=model.ByteSize(),
        macs=macs_total,
        other_flops=other_total,
        unknown_mac_layers=unknown,
        input_shapes={i.name: shapes.get(i.name, ()) for i in graph.input if i.name not in consts},
        layers=tuple(layers),
        largest_activations=_largest_activations(graph, shapes, dtypes, set(consts) | set(weight_roots),
                                                 top_activations),
    )


def infer_with_fixed_inputs(model: onnx.ModelProto, input_shape: Sequence[int] | None) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    init_names = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in init_names]
    if input_shape is not None:
        if not inputs:
            raise InputError("the model has no inputs to give a shape to", hint="leave out --input-shape")
        _set_shape(inputs[0], tuple(int(d) for d in input_shape))
    for value in inputs:
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].dim_value = 1
    # Stale value_info / output shapes with symbolic dims would be merged into the fixed ones: let inference redo them.
    del graph.value_info[:]
    for out in graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    try:
        return onnx.shape_inference.infer_shapes(copy, check_type=False, strict_mode=False, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        first = str(exc).strip().splitlines()[0]
        raise InputError(f"ONNX shape inference failed: {first}",
                         hint="check --input-shape against the model's input") from None


def _set_shape(value: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
    dims = value.type.tensor_type.shape.dim
    if value.type.tensor_type.HasField("shape") and len(dims) != len(shape):
        raise InputError(f"input shape {shape} has rank {len(shape)} "
                         f"but model input {value.name!r} has rank {len(dims)}",
                         hint="give one size per dimension of the model's input")
    for i, size in enumerate(shape):
        if i < len(dims) and dims[i].HasField("dim_value") and dims[i].dim_value != size:
            declared = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims)
            raise InputError(f"input shape {shape} does not fit model input {value.name!r} of shape {declared}",
                             hint="only symbolic dimensions can be set")
    value.type.tensor_type.ClearField("shape")
    new_dims = value.type.tensor_type.shape.dim
    for size in shape:
        new_dims.add().dim_value = size


def run_types(model: onnx.ModelProto, feeds: Any, shapes: dict[str, Shape], dtypes: dict[str, int]
              ) -> tuple[dict[str, Shape], dict[str, int]]:
    """``shapes`` and ``dtypes`` (shape inference's) with every tensor's shape as one ORT run on ``feeds`` computes it
    (what inference cannot follow: sizes the graph computes), and the dtypes inference left unknown."""
    from npukit.runtime.ort import every_output

    found = every_output(model, feeds)
    return ({**shapes, **{name: shape for name, (shape, _) in found.items()}},
            {**dtypes, **{name: onnx.helper.np_dtype_to_tensor_dtype(dtype) for name, (_, dtype) in found.items()
                          if not dtypes.get(name)}})


def value_types(graph: onnx.GraphProto) -> tuple[dict[str, Shape], dict[str, int]]:
    shapes: dict[str, Shape] = {}
    dtypes: dict[str, int] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        ttype = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            continue
        dtypes[value.name] = ttype.elem_type
        if ttype.HasField("shape"):
            shapes[value.name] = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in ttype.shape.dim)
    for tensor in graph.initializer:
        shapes[tensor.name] = tuple(tensor.dims)
        dtypes[tensor.name] = tensor.data_type
    for node in graph.node:
        tensor = _constant_value(node)
        if tensor is not None:
            shapes[node.output[0]] = tuple(tensor.dims)
            dtypes[node.output[0]] = tensor.data_type
    return shapes, dtypes


def _constant_value(node: onnx.NodeProto) -> onnx.TensorProto | None:
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return None
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return attr.t
    return None


def _in_branches(graph: onnx.GraphProto) -> tuple[int, int]:
    """The nodes and parameters (``_parameter_names``' rule, per subgraph) inside ``graph``'s control-flow
    subgraphs, nested ones included."""
    nodes = parameters = 0
    for node in graph.node:
        for attribute in node.attribute:
            for sub in (attribute.g,) if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                consts = _constant_tensors(sub)
                inner_nodes, inner_parameters = _in_branches(sub)
                nodes += len(sub.node) + inner_nodes
                parameters += sum(_elements(consts[r]) for r in _parameter_names(sub, consts)) + inner_parameters
    return nodes, parameters


def _constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    consts = {t.name: t for t in graph.initializer}
    for node in graph.node:
        tensor = _constant_value(node)
        if tensor is not None:
            consts[node.output[0]] = tensor
    return consts


def _parameter_names(graph: onnx.GraphProto, consts: dict[str, onnx.TensorProto]) -> set[str]:
    """Constant tensors that count as parameters (see the module docstring)."""
    qdq_params: set[str] = set()
    dq_data: set[str] = set()
    for node in graph.node:
        if node.op_type in _QDQ:
            qdq_params.update(node.input[1:])
            if node.op_type == "DequantizeLinear" and node.input:
                dq_data.add(node.input[0])
    names = set()
    for name, tensor in consts.items():
        if name in qdq_params:
            continue
        if tensor.data_type in _PARAM_DTYPES or (tensor.data_type == onnx.TensorProto.INT32 and name in dq_data):
            names.add(name)
    return names


def _weight_roots(graph: onnx.GraphProto, consts: dict[str, onnx.TensorProto]) -> dict[str, set[str]]:
    """Value name -> the parameters it carries: a parameter itself, or one passed through Q/DQ, Cast or Identity."""
    roots = {name: {name} for name in _parameter_names(graph, consts)}
    for node in graph.node:  # ONNX graphs are topologically sorted
        if node.op_type in _WEIGHT_PLUMBING and node.input and node.input[0] in roots:
            for out in node.output[:1]:
                roots[out] = set(roots[node.input[0]])
    return roots


def _elements(tensor: onnx.TensorProto) -> int:
    return math.prod(tensor.dims)


def static_dims(shape: Shape | None) -> tuple[int, ...] | None:
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)  # type: ignore[arg-type]


def tensor_nbytes(shape: Shape | None, dtype: int | None) -> int | None:
    static = static_dims(shape)
    if static is None or not dtype:
        return None
    if dtype in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return (math.prod(static) + 1) // 2
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(dtype).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return math.prod(static) * itemsize


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def _node_macs(node: onnx.NodeProto, shapes: dict[str, Shape]) -> int | None:
    """Multiply-accumulates of one node; 0 for ops without MACs, None when the shapes needed are unknown."""
    op = node.op_type

    def shape(i: int) -> tuple[int, ...] | None:
        return static_dims(shapes.get(node.input[i])) if i < len(node.input) and node.input[i] else None

    out = static_dims(shapes.get(node.output[0])) if node.output else None
    if op in _CONV_OPS:
        w = shape(_CONV_OPS[op][1])
        if w is None or out is None:
            return None
        # out: (N, M, *spatial); w: (M, C/group, *kernel). Stride and dilation are already in the output shape.
        return math.prod(out) * math.prod(w[1:])
    if op == "ConvTranspose":
        x, w = shape(0), shape(1)
        if x is None or w is None:
            return None
        # Every input element meets (M/group) * prod(kernel) weights; w: (C, M/group, *kernel).
        return math.prod(x) * math.prod(w[1:])
    if op == "Gemm":
        a = shape(0)
        if a is None or out is None or len(a) != 2:
            return None
        k = a[0] if _attr(node, "transA", 0) else a[1]
        return math.prod(out) * k
    if op in _MATMUL_OPS:
        a = shape(_MATMUL_OPS[op][0])
        if a is None or out is None:
            return None
        return math.prod(out) * a[-1]
    if op in _RECURRENT_OPS:
        # every step multiplies the input by W (directions x gates*hidden x input, in whichever order) and the
        # hidden state by R (directions x gates*hidden x hidden): W's and R's elements, per step and batch row
        # (ddddocr's DynamicQuantizeLSTM counted 0 MACs, and 0 energy)
        x, w, r = shape(0), shape(1), shape(2)
        if x is None or w is None or r is None or len(x) != 3:
            return None
        return x[0] * x[1] * (math.prod(w) + math.prod(r))  # (seq, batch) or (batch, seq): the same product
    return 0


def _other_flops(node: onnx.NodeProto, shapes: dict[str, Shape]) -> int | None:
    op = node.op_type
    out = static_dims(shapes.get(node.output[0])) if node.output else None
    if op in _ELEMENTWISE:
        return math.prod(out) if out is not None else None
    if op == "BatchNormalization":
        return 2 * math.prod(out) if out is not None else None
    if op in _WINDOW_POOLS:
        kernel = _attr(node, "kernel_shape", None)
        return math.prod(out) * math.prod(kernel) if out is not None and kernel else None
    if op in _GLOBAL_POOLS:
        x = static_dims(shapes.get(node.input[0])) if node.input else None
        return math.prod(x) if x is not None else None
    return 0


def _largest_activations(
    graph: onnx.GraphProto,
    shapes: dict[str, Shape],
    dtypes: dict[str, int],
    constants: set[str],
    top: int,
) -> tuple[Activation, ...]:
    names = [i.name for i in graph.input] + [o for n in graph.node for o in n.output if o]
    found: dict[str, Activation] = {}
    for name in names:
        if name in constants or name in found:
            continue
        size = tensor_nbytes(shapes.get(name), dtypes.get(name))
        if size is None:
            continue
        dtype = dtypes[name]
        found[name] = Activation(name, static_dims(shapes[name]) or (), _dtype_name(dtype), size)
    ranked = sorted(found.values(), key=lambda a: (-a.bytes, a.name))
    return tuple(ranked[:top])


def _dtype_name(dtype: int) -> str:
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype)))
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(dtype).lower()
