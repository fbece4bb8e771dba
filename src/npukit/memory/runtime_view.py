"""Execution views: the graph as a target really runs it, so that plans count the buffers the device allocates.

A view is data (:class:`ExecutionModel`), read by one generic rewrite (:func:`apply_view`):

- fusion rules fold a node into the producer of its input when that input has no other reader (Conv+Relu is one
  kernel writing one buffer); a rule may let the folded node bring its other input along (Conv + Add(·, Z) becomes
  ORT's FusedConv with the Z input, which may then write into Z's buffer);
- in-place ops write their output into an input buffer of the same size that dies at that step (ORT CPU's
  allocation planner reuses such inputs for element-wise kernels that declare MayInplace);
- alias ops produce a view of their input (Reshape, Flatten, Squeeze, Unsqueeze, Identity): no buffer of their own;
- ``activation_bytes`` gives float activations of a float model the width they get after quantization (1 byte for
  int8/uint8, 2 for fp16/uint16). A QDQ model already states its widths: there DequantizeLinear is read directly by
  the next (quantized) kernel and QuantizeLinear folds into its producer, so the QuantizeLinear outputs
  (uint8/int8/uint16) are the buffers that exist.

Views: "unfused" (the exported graph as is), "cpu" (ORT CPU, fp32: fusions, in-place, aliasing), "cpu-int8" (the same
with 8-bit activations), "qnn-htp" (Qualcomm HTP: 8-bit activations, 16 where a QDQ model says so, every activation
fused into its producer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import onnx

from npukit.errors import InputError
from npukit.memory.graph import OpNode, TensorGraph, load_tensor_graph

ANY = "*"


@dataclasses.dataclass(frozen=True)
class FuseRule:
    """``op`` folds into the node producing its input when that node's op (as joined by "+") is in ``producers``
    (``*``: any). ``extra_input``: the folded node may have one more activation input, which the fused node takes.
    ``keeps_alias``: a view stays a view after the fold (QuantizeLinear after Reshape)."""

    op: str
    producers: frozenset[str]
    extra_input: bool = False
    keeps_alias: bool = False


@dataclasses.dataclass(frozen=True)
class ExecutionModel:
    """How one target executes a graph, as far as memory goes (see the module docstring)."""

    name: str
    description: str
    fusions: tuple[FuseRule, ...] = ()
    inplace_ops: frozenset[str] = frozenset()
    alias_ops: frozenset[str] = frozenset()
    activation_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.activation_bytes is not None and self.activation_bytes not in (1, 2, 4):
            raise InputError(f"activation_bytes must be 1, 2 or 4, not {self.activation_bytes}",
                             hint="1 for int8/uint8, 2 for fp16/uint16, 4 for fp32")
        ops = [rule.op for rule in self.fusions]
        if len(set(ops)) != len(ops):
            raise InputError(f"view {self.name!r} has two fusion rules for one op", hint="give one rule per op")


_ORT_ACTIVATIONS = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "LeakyRelu")
_HTP_ACTIVATIONS = (*_ORT_ACTIVATIONS, "Tanh", "HardSwish", "Elu", "PRelu", "Gelu")
_INPLACE = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "LeakyRelu", "Tanh", "HardSwish", "Add", "Sub",
                      "Mul", "Div", "Neg", "Abs", "Exp", "Sqrt", "Elu", "Gelu"})
_ALIASES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})
_QDQ_RULE = FuseRule("QuantizeLinear", frozenset({ANY}), keeps_alias=True)


def _ort_cpu(name: str, description: str, activation_bytes: int | None) -> ExecutionModel:
    conv_like = frozenset({"Conv", "Gemm", "Conv+Add"})
    return ExecutionModel(
        name=name, description=description,
        fusions=(
            *(FuseRule(op, conv_like) for op in _ORT_ACTIVATIONS),
            FuseRule("BatchNormalization", frozenset({"Conv"})),
            FuseRule("Add", frozenset({"Conv"}), extra_input=True),
            _QDQ_RULE,
        ),
        inplace_ops=_INPLACE,
        alias_ops=_ALIASES | {"DequantizeLinear"},
        activation_bytes=activation_bytes,
    )


VIEWS: dict[str, ExecutionModel] = {
    "unfused": ExecutionModel("unfused", "the exported graph as is: every node writes a new buffer"),
    "cpu": _ort_cpu("cpu", "ORT CPU, fp32: activations fused into Conv/Gemm, Conv+Add as FusedConv, element-wise "
                           "ops in place, reshapes as views", None),
    "cpu-int8": _ort_cpu("cpu-int8", "ORT CPU running an 8-bit quantized model: as 'cpu' with 1-byte activations; "
                                     "for a float model every activation at 1 byte, a lower bound: npukit quantize "
                                     "keeps some layers float on the CPU (its float head, scale joins), so plan the "
                                     "model it writes for that model's own widths", 1),
    "qnn-htp": ExecutionModel(
        "qnn-htp", "Qualcomm HTP: a float model's activations at 8 bits (npukit compile builds 16-bit ones for the "
                   "HTP: npukit.api.quantize_for_htp gives that QDQ model to plan), a QDQ model's at the widths it "
                   "states, activations fused into any producer, element-wise ops in place, reshapes as views",
        fusions=(
            *(FuseRule(op, frozenset({ANY})) for op in _HTP_ACTIVATIONS),
            FuseRule("BatchNormalization", frozenset({"Conv"})),
            FuseRule("Add", frozenset({"Conv"}), extra_input=True),
            _QDQ_RULE,
        ),
        inplace_ops=_INPLACE,
        alias_ops=_ALIASES | {"DequantizeLinear"},
        activation_bytes=1,
    ),
}


def get_view(view: str | ExecutionModel) -> ExecutionModel:
    if isinstance(view, ExecutionModel):
        return view
    if view not in VIEWS:
        raise InputError(f"unknown execution view {view!r}", hint=f"choose one of {', '.join(VIEWS)}")
    return VIEWS[view]


def build_view(
    model: onnx.ModelProto,
    *,
    view: str | ExecutionModel = "cpu",
    input_shape: Sequence[int] | None = None,
) -> TensorGraph:
    """``model``'s activation graph as ``view`` executes it."""
    execution = get_view(view)
    return apply_view(load_tensor_graph(model, input_shape=input_shape), execution)


def apply_view(graph: TensorGraph, execution: ExecutionModel) -> TensorGraph:
    """Rewrite an exported graph (from :func:`npukit.memory.graph.load_tensor_graph`) into ``execution``'s."""
    sizes = dict(graph.sizes)
    if execution.activation_bytes is not None and not graph.quantized:
        for name, itemsize in graph.float_itemsize.items():
            sizes[name] = sizes[name] // itemsize * execution.activation_bytes
    nodes: list[OpNode | None] = [
        dataclasses.replace(node, alias=node.op in execution.alias_ops,
                            inplace_inputs=node.inputs if node.op in execution.inplace_ops else ())
        for node in graph.nodes
    ]
    rules = {rule.op: rule for rule in execution.fusions}
    producer = graph.producers()
    readers = {name: len(found) for name, found in graph.consumers().items()}
    outputs = set(graph.outputs)
    for index, node in enumerate(nodes):
        rule = rules.get(node.op) if node is not None else None
        if node is None or rule is None:
            continue
        for name in node.inputs:
            source = producer.get(name)
            head = nodes[source] if source is not None else None
            others = tuple(x for x in node.inputs if x != name)
            if (head is None or head.outputs != (name,) or readers.get(name) != 1 or name in outputs
                    or (ANY not in rule.producers and head.op not in rule.producers)
                    or len(others) > (1 if rule.extra_input else 0)):
                continue
            nodes[index] = OpNode(
                name=head.name, op=f"{head.op}+{node.op}",
                inputs=head.inputs + tuple(x for x in others if x not in head.inputs),
                outputs=node.outputs,
                alias=head.alias and rule.keeps_alias,
                inplace_inputs=head.inplace_inputs + (others if node.op in execution.inplace_ops else ()),
            )
            nodes[source] = None
            for out in node.outputs:
                producer[out] = index
            break
    kept = tuple(node for node in nodes if node is not None)
    return dataclasses.replace(graph, nodes=kept, sizes=sizes)
