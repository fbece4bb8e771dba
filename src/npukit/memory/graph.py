"""The activation graph the memory planner works on: nodes in execution order, the activation tensors between them
and their sizes in bytes. Weights (initializers, Constant nodes and whatever is computed from constants only) are
not activations and do not appear.

:func:`load_tensor_graph` reads an ONNX model as exported: shapes come from ONNX shape inference with the first input
fixed to ``input_shape`` (a symbolic batch dimension becomes 1); any other unresolved dimension is an InputError that
asks for ``--input-shape``. Where ONNX inference leaves sizes open (Slice bounds computed from shapes, as in
ShuffleNet's channel split), ONNX Runtime's symbolic shape inference is tried, then ONNX inference on the model with
its constants folded (a Paddle export's Reshape targets computed from shapes), before giving up.
:mod:`npukit.memory.runtime_view` rewrites this graph into the one a target executes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import onnx

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.measure.summary import infer_with_fixed_inputs, tensor_nbytes, value_types

_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


@dataclasses.dataclass(frozen=True)
class OpNode:
    """One step. ``op`` joins the op types of a fused node with "+" ("Conv+Relu").

    ``alias``: output 0 is a view of ``inputs[0]`` (Reshape and friends): it takes no buffer of its own.
    ``inplace_inputs``: inputs whose buffer output 0 may take over when they die at this step and match its size.
    """

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    alias: bool = False
    inplace_inputs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class TensorGraph:
    """Nodes in a valid topological order; ``sizes`` holds the bytes of every activation tensor (graph inputs and
    node outputs); ``float_itemsize`` maps the floating-point tensors to their bytes per element; ``quantized`` says
    whether the model carries QuantizeLinear nodes on activations (a QDQ model)."""

    nodes: tuple[OpNode, ...]
    sizes: Mapping[str, int]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    float_itemsize: Mapping[str, int] = dataclasses.field(default_factory=dict)
    quantized: bool = False

    def producers(self) -> dict[str, int]:
        """Tensor -> index of the node that writes it."""
        return {out: index for index, node in enumerate(self.nodes) for out in node.outputs}

    def consumers(self) -> dict[str, list[int]]:
        """Tensor -> indices of the nodes that read it (in node order, without repeats)."""
        found: dict[str, list[int]] = {}
        for index, node in enumerate(self.nodes):
            for name in dict.fromkeys(node.inputs):
                found.setdefault(name, []).append(index)
        return found

    def predecessors(self) -> list[set[int]]:
        """For each node, the nodes whose outputs it reads."""
        producer = self.producers()
        return [{producer[t] for t in node.inputs if t in producer} for node in self.nodes]


def load_tensor_graph(model: onnx.ModelProto, *, input_shape: Sequence[int] | None = None) -> TensorGraph:
    """The exported graph as it stands (no fusion, no aliasing), with static activation sizes."""
    inferred = infer_with_fixed_inputs(model, input_shape)
    shapes, dtypes = value_types(inferred.graph)
    folded = False
    for retry in ("symbolic", "folded", "folded, then symbolic"):
        if not any(tensor_nbytes(shapes.get(o), dtypes.get(o)) is None
                   for node in inferred.graph.node for o in node.output if o):
            break
        if retry.endswith("symbolic"):
            inferred = _symbolic_inference(inferred)
        else:  # sizes computed from shapes through a chain neither inference follows (Paddle's Reshape targets)
            bare = onnx.ModelProto()
            bare.CopyFrom(inferred)
            bare.graph.ClearField("value_info")  # the open sizes inferred before would be kept as they are
            bare.graph.ClearField("output")  # as declared: inference left some without a shape, which passes refuse
            bare.graph.output.extend(model.graph.output)
            inferred, folded = infer_with_fixed_inputs(_constants_folded(bare), None), True
        shapes, dtypes = value_types(inferred.graph)
    graph = inferred.graph
    lookups = GraphIndex(graph)
    constant = lookups.folded
    nodes: list[OpNode] = []
    for index, node in enumerate(lookups.nodes):
        if lookups.is_folded(node):  # folded at load time: a weight, not an activation
            continue
        inputs = tuple(dict.fromkeys(name for name in node.input if name and name not in constant))
        outputs = tuple(name for name in node.output if name)
        nodes.append(OpNode(name=node.name or f"{node.op_type}_{index}", op=node.op_type, inputs=inputs,
                            outputs=outputs))
    graph_inputs = tuple(i.name for i in graph.input if i.name not in constant)
    names = [*graph_inputs, *(o for n in nodes for o in n.outputs)]
    sizes: dict[str, int] = {}
    for name in names:
        size = tensor_nbytes(shapes.get(name), dtypes.get(name))
        if size is None:
            shape = shapes.get(name)
            shown = "unknown" if shape is None else "x".join(str(d) if d is not None else "?" for d in shape)
            symbolic = [i.name for i in graph.input if i.name not in constant and any(
                not d.HasField("dim_value") for d in i.type.tensor_type.shape.dim)]
            producer = next((n for n in graph.node if name in n.output), None)
            foreign = producer is not None and producer.domain not in ("", "ai.onnx")
            hint = ("give the input's full shape with --input-shape, e.g. --input-shape 1,3,224,224" if symbolic
                    else f"it is written by {producer.op_type} of domain {producer.domain!r}, whose output sizes "
                         "ONNX shape inference does not know: such a graph has no static memory plan here"
                    if foreign else
                    "every input's shape is fixed, so this size depends on values the model is fed or computes "
                    "(an If on an input's value, NonZero, a loop): such a graph has no static memory plan")
            raise InputError(f"the size of activation {name!r} (shape {shown}) is not known after shape inference"
                             + (" and constant folding" if folded else ""), hint=hint)
        sizes[name] = size
    quantized = any(n.op == "QuantizeLinear" for n in nodes)
    return TensorGraph(
        nodes=tuple(nodes), sizes=sizes, inputs=graph_inputs,
        outputs=tuple(o.name for o in graph.output if o.name in sizes),
        float_itemsize={name: onnx.helper.tensor_dtype_to_np_dtype(dtypes[name]).itemsize
                        for name in names if dtypes.get(name) in _FLOAT_TYPES},
        quantized=quantized,
    )


def _constants_folded(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its constant subgraphs folded (npukit's FoldConstantsPass, as every runtime folds them at load
    time), so that shapes computed from constants become known; folded again after the Identity nodes are removed
    (Silero VAD's padding size is known only then: an If's branch output passes through Identity nodes); the model
    as given when folding fails."""
    import onnx_ir as ir

    from npukit.passes.base import PassManager
    from npukit.passes.fold_constants import FoldConstantsPass
    from npukit.passes.remove_identity import RemoveIdentityPass

    try:
        ir_model = ir.serde.deserialize_model(model)
        PassManager([FoldConstantsPass(), RemoveIdentityPass(), FoldConstantsPass()])(ir_model)
        return ir.serde.serialize_model(ir_model)
    except Exception:  # noqa: BLE001 - any failure leaves the sizes open and the caller says which one
        return model


def _symbolic_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    """ORT's symbolic shape inference, which propagates computed shape values further than ONNX's; the model as
    given when it fails (in a scratch working directory: on failure it saves ``sym_shape_infer_temp.onnx`` there)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from npukit._scratch import scratch_cwd

    try:
        with scratch_cwd(prefix="npukit-shapes-"):
            return SymbolicShapeInference.infer_shapes(model, auto_merge=True) or model
    except Exception:  # noqa: BLE001 - any failure leaves the sizes open and the caller says which one
        return model
