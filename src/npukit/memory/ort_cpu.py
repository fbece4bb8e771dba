"""The graph ONNX Runtime CPU really executes, and the memory its own allocation planner gives it.

Why. The rule-based "cpu" view (:mod:`npukit.memory.runtime_view`) fuses what ORT fuses at its extended level, but
at its default level ORT on x86 also rewrites convolutions, pooling and resizes into the NCHWc blocked layout: channel
counts padded to the SIMD block, reorder nodes at the layout boundaries, BatchNormalization turned into depthwise
convolutions. And ORT does not place buffers with an offset planner: it hands a dead buffer to a later tensor of the
same shape. Measured (arena off, one thread): DenseNet-121 peaks at 10.1 MB where the best offset plan of ORT's own
graph needs 8.4 MB; LR-ASPP at 512x512 at 47 MB where the rule-based view says 22 MB. Reading both facts from ORT
itself predicts the measurement within a few percent.

How.

1. :func:`ort_executed_graph` lets ORT optimize the model (``optimized_model_filepath``, weights written apart), then
   runs ORT's optimized graph once with every node output added as a graph output, which gives the exact shape and
   dtype of every tensor, the NCHWc ones included (ONNX shape inference does not know the NCHWc operators).
   The nodes are put in the order ORT executes them, made deterministic (:func:`ort_execution_order`): ORT runs a
   reverse depth-first order from the graph's leaf nodes, visiting a node's inputs by ORT's node index, and the
   NCHWc transformer creates its ReorderOutput nodes while iterating a hash map keyed by pointers, so their indices,
   hence the order of independent branches (the tiles of a tiled stage) and the peak, change from process to
   process. The indices are read from the same graph saved in ORT's own format (which keeps them), the
   ReorderOutput nodes are renumbered in a stable order, and ORT's traversal is replayed with them.
2. :data:`ORT_CPU_KERNELS` states, as data, which ORT CPU kernels declare an output that aliases an input (Reshape
   and friends) or may reuse an input in place (unary activations; the fused "sum" input of Conv).
3. :func:`ort_allocation` replays ORT's sequential allocation planner on that graph: in execution order, an output
   that is a graph output gets its own buffer; else an aliasing kernel shares its input's buffer; else an in-place
   kernel takes the input buffer whose last use this is when the shapes agree; else the most recently freed buffer of
   the same shape and element size is reused; else a new buffer. A buffer is freed after its last reader, and when
   it is reused it stays allocated from its first producer to the last reader of its last tenant. The result is a
   :class:`~npukit.memory.lifetimes.Lifetimes` of ORT's buffers: its peak is what ORT allocates while it runs (the
   caller's input buffers left out, as ORT does not allocate them).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.memory.graph import OpNode, TensorGraph
from npukit.memory.lifetimes import GRAPH_INPUT, Lifetimes, StepInfo, TensorLife
from npukit.memory.measure import ORT_LEVELS
from npukit.runtime.ort import every_output, make_session, random_feeds

NCHWC = "com.microsoft.nchwc"
MICROSOFT = "com.microsoft"


@dataclasses.dataclass(frozen=True)
class OrtKernelTraits:
    """What ORT CPU kernels declare to its allocation planner. Keys are ``(domain, op_type)`` ("" for ONNX).
    ``aliases``: output 0 is always a view of input 0. ``may_inplace``: output 0 may take the buffer of the listed
    input index when that input dies here and has the same shape."""

    aliases: frozenset[tuple[str, str]]
    may_inplace: Mapping[tuple[str, str], int]


_UNARY_INPLACE = ("Elu", "HardSigmoid", "LeakyRelu", "Relu", "Selu", "Sigmoid", "Softplus", "Softsign", "Tanh",
                  "ThresholdedRelu")

ORT_CPU_KERNELS = OrtKernelTraits(
    aliases=frozenset(("", op) for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")),
    may_inplace={**{("", op): 0 for op in _UNARY_INPLACE}, (NCHWC, "Conv"): 3, (MICROSOFT, "FusedConv"): 3},
)

@dataclasses.dataclass(frozen=True)
class OrtExecutedGraph:
    """ORT's optimized graph as a :class:`TensorGraph` (nodes in ORT's order; ``op`` is "domain:op" outside the ONNX
    domain, e.g. "nchwc:Conv"), with every tensor's shape and element size, and ORT's op counts."""

    graph: TensorGraph
    shapes: Mapping[str, tuple[int, ...]]
    itemsizes: Mapping[str, int]
    optimization: str
    layout_ops: int  # nodes in ORT's NCHWc domain

    def same_layout(self, a: str, b: str) -> bool:
        return self.shapes[a] == self.shapes[b] and self.itemsizes[a] == self.itemsizes[b]


def _op_name(node: onnx.NodeProto) -> str:
    if node.domain in ("", "ai.onnx"):
        return node.op_type
    return f"{node.domain.rsplit('.', 1)[-1]}:{node.op_type}"


def ort_executed_graph(
    model: str | Path,
    *,
    input_shape: Sequence[int] | None = None,
    optimization: str = "all",
    kernels: OrtKernelTraits = ORT_CPU_KERNELS,
) -> OrtExecutedGraph:
    """The graph ORT CPU executes for the model at ``model`` (one intra-op thread), read back from ORT.

    ``input_shape`` fixes the first input's shape; symbolic dimensions of other inputs become 1."""
    if optimization not in ORT_LEVELS:
        raise InputError(f"unknown ORT optimization level {optimization!r}",
                         hint=f"choose one of {', '.join(ORT_LEVELS)}")
    path = Path(model)
    if not path.is_file():
        raise InputError(f"model file {path} does not exist", hint="give the path of an .onnx file")
    with tempfile.TemporaryDirectory(prefix="npukit-ortgraph-") as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        session = make_session(path, optimization=optimization, optimized_model_path=str(optimized), session_config={
            "session.optimized_model_external_initializers_file_name": "weights.bin",
            "session.optimized_model_external_initializers_min_size_in_bytes": "1024"})
        feeds = _feeds(session, input_shape)
        del session
        proto = onnx.load(str(optimized), load_external_data=False)
        indices = _ort_node_indices(path, optimization, Path(tmp) / "optimized.ort")
        order = None if indices is None else ort_execution_order(proto.graph.node, indices)
        if order is not None:  # else ORT's order as saved, which may differ from one process to the next
            _stable_reorder_names(order, indices)
            del proto.graph.node[:]
            proto.graph.node.extend(order)
        shapes, itemsizes = _run_for_shapes(proto, optimized, feeds)
    return OrtExecutedGraph(
        graph=_tensor_graph(proto, shapes, itemsizes, kernels), shapes=shapes, itemsizes=itemsizes,
        optimization=optimization, layout_ops=sum(1 for n in proto.graph.node if n.domain == NCHWC),
    )


REORDER_OUTPUT = (NCHWC, "ReorderOutput")


def _ort_node_indices(model: Path, optimization: str, saved: Path) -> dict[str, int] | None:
    """ORT's index of every node of its optimized graph, keyed by the node's first output (node names may be empty),
    read from the graph saved in ORT's own format at ``saved``, which keeps the indices, with the ReorderOutput nodes
    renumbered stably (:func:`_stable_reorder_outputs`); None when ORT cannot save or read that format."""
    try:
        from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs.InferenceSession import InferenceSession

        make_session(model, optimization=optimization, optimized_model_path=str(saved),
                     session_config={"session.save_model_format": "ORT"})
        graph = InferenceSession.GetRootAsInferenceSession(saved.read_bytes(), 0).Model().Graph()
        nodes = []
        for position in range(graph.NodesLength()):
            node = graph.Nodes(position)
            outputs = [node.Outputs(i).decode() for i in range(node.OutputsLength())]
            inputs = [node.Inputs(i).decode() for i in range(node.InputsLength())]
            nodes.append((node.Index(), (node.Domain() or b"").decode(), node.OpType().decode(), inputs,
                          next((o for o in outputs if o), "")))
    except Exception:  # noqa: BLE001 - no ORT-format copy (an op, a build without it): ORT's order as saved
        return None
    if any(not output for *_, output in nodes):
        return None
    return _stable_reorder_outputs(nodes)


def _stable_reorder_outputs(nodes: Sequence[tuple[int, str, str, Sequence[str], str]]) -> dict[str, int]:
    """First output -> index for ``nodes`` given as (ORT index, domain, op type, inputs, first output).

    The tie-break: ORT creates all ReorderOutput nodes last (``NchwcTransformerImpl::Finalize``), in the order of a
    hash map keyed by NodeArg pointers, i.e. by chance. They keep the indices ORT gave them as a set, but take them in
    the order of the index of the node producing their input (the NCHWc node, created in ORT's deterministic
    topological sweep), then of their output name; every other node keeps ORT's index."""
    index = {output: idx for idx, _, _, _, output in nodes}
    reorders = [(index.get(inputs[0], -1) if inputs else -1, output, idx)
                for idx, domain, op, inputs, output in nodes if (domain, op) == REORDER_OUTPUT]
    for (_, output, _), idx in zip(sorted(reorders), sorted(idx for *_, idx in reorders)):
        index[output] = idx
    return index


def _stable_reorder_names(nodes: Sequence[onnx.NodeProto], indices: Mapping[str, int]) -> None:
    """Rename the ReorderOutput nodes as ORT would have named them in the stable order: ORT names them in creation
    (index) order, "ReorderOutput", then "ReorderOutput_token_<n>" with n rising, so the names sorted by length, then
    text, go to the nodes sorted by their renumbered index."""
    reorders = sorted((n for n in nodes if (n.domain, n.op_type) == REORDER_OUTPUT),
                      key=lambda n: indices[next(o for o in n.output if o)])
    names = sorted((n.name for n in reorders), key=lambda name: (len(name), name))
    for node, name in zip(reorders, names):
        node.name = name


def ort_execution_order(nodes: Sequence[onnx.NodeProto], indices: Mapping[str, int]) -> list[onnx.NodeProto] | None:
    """``nodes`` in the order ORT's GraphViewer gives them (``Graph::ReverseDFSFrom`` with ``NodeCompare``): a
    depth-first walk from the leaf nodes (no consumer) taken in index order, each node's producers pushed in
    ascending index order (so the highest index runs first), a node emitted once all its producers are. ``indices``
    maps each node's first output to its index; None when a node is missing from it (a graph that is not the one
    indexed) or holds a subgraph."""
    keyed = []
    for node in nodes:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None  # a subgraph's outer-scope reads are edges too: not followed here
        output = next((o for o in node.output if o), "")
        if output not in indices:
            return None
        keyed.append(indices[output])
    if len(set(keyed)) != len(keyed):
        return None
    by_index = dict(zip(keyed, nodes))
    producer = {o: idx for idx, node in by_index.items() for o in node.output if o}
    inputs = {idx: [producer[i] for i in node.input if i in producer] for idx, node in by_index.items()}
    read = {p for found in inputs.values() for p in found}
    stack = [(idx, False) for idx in sorted(by_index) if idx not in read]
    visited: set[int] = set()
    order: list[onnx.NodeProto] = []
    while stack:
        idx, leave = stack.pop()
        if leave:
            order.append(by_index[idx])
            continue
        if idx in visited:
            continue
        visited.add(idx)
        stack.append((idx, True))
        stack.extend((p, False) for p in sorted(inputs[idx]) if p not in visited)
    return order if len(order) == len(nodes) else None


def _feeds(session, input_shape: Sequence[int] | None) -> dict[str, np.ndarray]:
    """Seeded inputs, the first of ``input_shape`` when given."""
    first = session.get_inputs()[0]
    if input_shape is not None and len(input_shape) != len(first.shape):
        raise InputError(f"--input-shape has {len(input_shape)} dimensions but input {first.name!r} has "
                         f"{len(first.shape)}", hint="give one size per dimension, e.g. --input-shape 1,3,224,224")
    return random_feeds(session, seed=0, shapes=None if input_shape is None else {first.name: input_shape})


def _run_for_shapes(proto: onnx.ModelProto, optimized: Path, feeds: Mapping[str, np.ndarray]):
    # the probe goes next to weights.bin, which its initializers point to
    found = every_output(proto, feeds, save_to=optimized.with_name("probe.onnx"))
    return ({name: shape for name, (shape, _) in found.items()},
            {name: dtype.itemsize for name, (_, dtype) in found.items()})


def _tensor_graph(proto: onnx.ModelProto, shapes, itemsizes, kernels: OrtKernelTraits) -> TensorGraph:
    graph, lookups = proto.graph, GraphIndex(proto.graph)
    constant = lookups.folded
    nodes = []
    for index, node in enumerate(lookups.nodes):
        if lookups.is_folded(node):
            continue
        key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
        inputs = tuple(dict.fromkeys(name for name in node.input if name and name not in constant))
        inplace = kernels.may_inplace.get(key)
        inplace_name = node.input[inplace] if inplace is not None and inplace < len(node.input) else ""
        nodes.append(OpNode(
            name=node.name or f"{node.op_type}_{index}", op=_op_name(node), inputs=inputs,
            outputs=tuple(o for o in node.output if o), alias=key in kernels.aliases,
            inplace_inputs=(inplace_name,) if inplace_name and inplace_name not in constant else ()))
    inputs = tuple(i.name for i in graph.input if i.name not in constant)
    names = [*inputs, *(o for n in nodes for o in n.outputs)]
    sizes = {name: int(np.prod(shapes[name], dtype=np.int64)) * itemsizes[name] for name in names}
    outputs = tuple(o.name for o in graph.output if o.name in sizes)
    return TensorGraph(nodes=tuple(nodes), sizes=sizes, inputs=inputs, outputs=outputs,
                       quantized=any(n.op == "QuantizeLinear" for n in nodes))


def ort_allocation(executed: OrtExecutedGraph) -> Lifetimes:
    """ORT's own buffers for ``executed`` (see the module docstring, step 3): one :class:`TensorLife` per buffer with
    every tensor it holds; graph inputs (the caller's memory) are not in it, so its peak is what ORT allocates."""
    graph = executed.graph
    outputs = set(graph.outputs)
    last = len(graph.nodes) - 1
    uses: dict[str, int] = {name: 1 for name in graph.inputs}  # the caller holds the inputs: never reused
    for node in graph.nodes:
        for name in node.inputs:
            uses[name] = uses.get(name, 0) + 1
        for name in node.outputs:
            uses[name] = uses.get(name, 0) + 1
    for name in outputs:
        uses[name] = uses.get(name, 0) + 1
    buffer_of = {name: name for name in graph.inputs}
    members: dict[str, list[str]] = {}
    start: dict[str, int] = {}
    producer: dict[str, str] = {}
    freed: list[str] = []  # most recently freed first, as ORT's freelist
    for step, node in enumerate(graph.nodes):
        for position, out in enumerate(node.outputs):
            root = None
            if out not in outputs and position == 0:
                if node.alias and node.inputs:
                    root = buffer_of[node.inputs[0]]
                elif node.inplace_inputs:
                    source = node.inplace_inputs[0]
                    candidate = buffer_of.get(source)
                    if (candidate is not None and candidate not in graph.inputs and uses[candidate] == 1
                            and executed.same_layout(source, out)):
                        root = candidate
            if root is None and out not in outputs:
                for position_free, candidate in enumerate(freed):
                    if executed.same_layout(candidate, out):
                        root = freed.pop(position_free)
                        break
            if root is None:
                root = out
                members[root], start[root], producer[root] = [], step, node.name
            if root != out:
                uses[root] += uses[out]
            members[root].append(out)
            buffer_of[out] = root
        for name in (*node.inputs, *node.outputs):
            root = buffer_of[name]
            uses[root] -= 1
            if uses[root] == 0:
                freed.insert(0, root)
    end = {root: start[root] for root in members}
    for step, node in enumerate(graph.nodes):
        for name in (*node.inputs, *node.outputs):
            root = buffer_of[name]
            if root in end:
                end[root] = max(end[root], step)
    for name in outputs:
        if buffer_of.get(name) in end:
            end[buffer_of[name]] = max(last, 0)
    tensors = tuple(TensorLife(name=root, size=graph.sizes[root], start=start[root], end=end[root],
                               producer=producer[root], tensors=tuple(found)) for root, found in members.items())
    lifetimes = Lifetimes(tensors, order=tuple(n.name for n in graph.nodes), view="cpu (ORT's allocation)")
    live = lifetimes.live_bytes()
    new_bytes = [0] * len(graph.nodes)
    for t in tensors:
        new_bytes[t.start] += t.size
    steps = tuple(StepInfo(step, node.name, node.op, live[step] if step < len(live) else 0, new_bytes[step])
                  for step, node in enumerate(graph.nodes))
    return dataclasses.replace(lifetimes, steps=steps)


def without_graph_inputs(lifetimes: Lifetimes) -> Lifetimes:
    """``lifetimes`` less the graph inputs' buffers (the caller's memory, not the runtime's)."""
    kept = tuple(t for t in lifetimes.tensors if t.producer != GRAPH_INPUT)
    return dataclasses.replace(lifetimes, tensors=kept)

