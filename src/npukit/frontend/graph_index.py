"""One index of an ONNX graph's producers, consumers, initializers and constants, built once per graph and shared by
the steps of quant/, memory/, targets/ and runtime/ that read protos (instead of a map of their own each); and
``own_copy``, which gives one reader of an initializer that several nodes share a copy of its own."""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterable, Mapping

import onnx
import onnx.numpy_helper


class GraphIndex:
    """One graph's lookups: the node (index) writing each tensor, the nodes (indices, in graph order, once per input
    slot) reading it, the initializers by name, the constants (initializers and Constant outputs), and the graph's
    input and output names. Empty names (an omitted optional input or output) are not indexed.

    The node references are taken when the index is built (protobuf makes a new wrapper per access otherwise, so
    ids would change): a step that rewrites the graph builds a new index afterwards."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.nodes = list(graph.node)
        self.producer: dict[str, int] = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self.consumers: dict[str, list[int]] = collections.defaultdict(list)
        for i, n in enumerate(self.nodes):
            for name in n.input:
                if name:
                    self.consumers[name].append(i)
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
        self.constants = set(self.initializers) | {o for n in self.nodes if n.op_type == "Constant" for o in n.output}
        self.inputs = {i.name for i in graph.input}
        self.outputs = {o.name for o in graph.output}

    @classmethod
    def of(cls, model: onnx.ModelProto) -> GraphIndex:
        return cls(model.graph)

    def producer_node(self, name: str) -> onnx.NodeProto | None:
        """The node writing ``name``; None for a graph input, an initializer or an unknown name."""
        index = self.producer.get(name)
        return None if index is None else self.nodes[index]

    def producer_op(self, name: str) -> str | None:
        """The op type of the node writing ``name`` (None where no node writes it)."""
        node = self.producer_node(name)
        return None if node is None else node.op_type

    def consumer_nodes(self, name: str) -> list[onnx.NodeProto]:
        """The nodes reading ``name``, in graph order, once per input slot that names it."""
        return [self.nodes[i] for i in self.consumers.get(name, ())]

    @functools.cached_property
    def constant_tensors(self) -> dict[str, onnx.TensorProto]:
        """The constants' tensors by name: the initializers, and each Constant node's ``value`` tensor (a copy,
        named after the node's output); a Constant written with another attribute (``value_float``, ...) has none."""
        tensors = dict(self.initializers)
        for node in self.nodes:
            value = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                         None) if node.op_type == "Constant" and node.output else None
            if value is not None:
                tensors[node.output[0]] = tensor = onnx.TensorProto()
                tensor.CopyFrom(value)
                tensor.name = node.output[0]
        return tensors

    @functools.cached_property
    def folded(self) -> frozenset[str]:
        """The tensors known before the graph runs: the initializers, and the outputs of Constant nodes and of nodes
        whose every input is one of them (ONNX Runtime folds those at load: weights, not activations). Nodes are
        taken in graph order (topological)."""
        known = set(self.initializers)
        for node in self.nodes:
            if self._folds(node, known):
                known.update(o for o in node.output if o)
        return frozenset(known)

    @functools.cached_property
    def shape_computed(self) -> frozenset[str]:
        """The tensors known once every input shape is static: ``folded``, the outputs of Shape and Size nodes, and
        of nodes computing only from those (what ONNX Runtime folds away when the model's shapes are fixed)."""
        known = set(self.folded)
        for node in self.nodes:
            if node.op_type in ("Shape", "Size") or self._folds(node, known):
                known.update(o for o in node.output if o)
        return frozenset(known)

    @functools.cached_property
    def shifted_dequantized(self) -> frozenset[str]:
        """The outputs of DequantizeLinear nodes reading int8 per channel (a zero point of more than one element)
        with a zero point off zero: weights ``npukit quantize`` moved by one onto ORT's integer GEMM path on a CPU
        with VNNI (``quant.cpu.conv_kernel``). Qualcomm's HTP takes symmetric per-channel weights only: its EP
        claims a Conv reading one, then fails to add it. The one test analyze's HTP profile and the QNN session's
        error both use."""
        found = set()
        for node in self.nodes:
            zero = self.initializers.get(node.input[2]) if node.op_type == "DequantizeLinear" \
                and len(node.input) > 2 and node.output else None
            if zero is not None and zero.data_type == onnx.TensorProto.INT8 and len(zero.dims) == 1 \
                    and zero.dims[0] > 1 and onnx.numpy_helper.to_array(zero).any():
                found.add(node.output[0])
        return frozenset(found)

    def is_folded(self, node: onnx.NodeProto) -> bool:
        """Whether ``node`` computes only from constants (see ``folded``): it runs at load, not per inference."""
        return self._folds(node, self.folded)

    @staticmethod
    def _folds(node: onnx.NodeProto, known: set[str] | frozenset[str]) -> bool:
        return node.op_type == "Constant" or all(not name or name in known for name in node.input)


def own_copy(graph: onnx.GraphProto, node: onnx.NodeProto, slot: int, names: Iterable[str], taken: set[str],
             initializers: Mapping[str, onnx.TensorProto]) -> str:
    """Give ``node`` its own copy of the initializer its input ``slot`` reads (by name in ``initializers``): the copy
    is appended to ``graph``'s initializers under the first of ``names`` not in ``taken`` (which the name joins), and
    the slot reads it. The copy's name."""
    fresh = next(name for name in names if name not in taken)
    taken.add(fresh)
    copy = graph.initializer.add()
    copy.CopyFrom(initializers[node.input[slot]])
    copy.name = fresh
    node.input[slot] = fresh
    return fresh
