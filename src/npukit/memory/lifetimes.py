"""Tensor lifetimes: for each activation buffer its size, the step that creates it and the last step that reads it,
and the bytes live at every step.

Step ``s`` runs the ``s``-th node of the execution order. A buffer is live over steps ``start..end`` inclusive:
graph inputs from step 0, node outputs from their producer's step, up to the last step that reads them (graph
outputs to the last step; an output nobody reads dies at birth). A buffer can hold several tensors: a view
(Reshape-like ``alias`` node) shares its input's buffer, and an in-place node writes its output into an input buffer
that dies at that step and has the same size. Weights are not activations and are left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import onnx

from npukit.errors import InputError
from npukit.memory.graph import TensorGraph

GRAPH_INPUT = "<input>"


@dataclasses.dataclass(frozen=True)
class TensorLife:
    """One buffer: ``name`` is its first tensor, ``tensors`` every tensor it holds, ``producer`` the node that
    created it (``<input>`` for graph inputs)."""

    name: str
    size: int
    start: int
    end: int
    producer: str = ""
    tensors: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """One step: the node run, the bytes live while it runs and the bytes of the buffers it creates."""

    step: int
    node: str
    op: str
    live_bytes: int
    new_bytes: int


@dataclasses.dataclass(frozen=True)
class Lifetimes:
    """Buffers with their live ranges, the execution order (node names) and per-step figures; ``view`` names the
    execution view the graph was read under."""

    tensors: tuple[TensorLife, ...]
    order: tuple[str, ...] = ()
    steps: tuple[StepInfo, ...] = ()
    view: str = ""

    @classmethod
    def from_intervals(cls, intervals: Iterable[tuple[str, int, int, int]]) -> Lifetimes:
        """Lifetimes from ``(name, size, start, end)`` tuples alone (no graph): for tests and external planners."""
        tensors = []
        for name, size, start, end in intervals:
            if size < 0 or start < 0 or end < start:
                raise InputError(f"lifetime of {name!r} is invalid: size {size}, steps {start}..{end}",
                                 hint="sizes are bytes >= 0 and end >= start >= 0")
            tensors.append(TensorLife(name, size, start, end, tensors=(name,)))
        return cls(tuple(tensors))

    @property
    def num_steps(self) -> int:
        return max(len(self.order), max((t.end + 1 for t in self.tensors), default=0))

    def live_bytes(self) -> list[int]:
        """Bytes live at each step."""
        delta = [0] * (self.num_steps + 1)
        for t in self.tensors:
            delta[t.start] += t.size
            delta[t.end + 1] -= t.size
        live, running = [], 0
        for d in delta[:-1]:
            running += d
            live.append(running)
        return live

    @property
    def peak_bytes(self) -> int:
        """The most bytes live at one step: no placement of these buffers can use less."""
        return max(self.live_bytes(), default=0)

    @property
    def total_bytes(self) -> int:
        return sum(t.size for t in self.tensors)

    def live_at(self, step: int) -> tuple[TensorLife, ...]:
        return tuple(t for t in self.tensors if t.start <= step <= t.end)


def analyze_lifetimes(
    model: onnx.ModelProto | TensorGraph,
    *,
    input_shape: Sequence[int] | None = None,
    order: Sequence[str] | None = None,
    view: str = "unfused",
) -> Lifetimes:
    """Lifetimes of ``model``'s activations under execution view ``view`` (see :mod:`npukit.memory.runtime_view`;
    "unfused" is the graph as exported). ``order`` lists node names in execution order (the graph's order when
    None). A TensorGraph is taken as already viewed."""
    from npukit.memory.runtime_view import build_view  # the view module builds on this one

    if isinstance(model, TensorGraph):
        graph = model
    else:
        graph = build_view(model, view=view, input_shape=input_shape)
    return lifetimes_of(graph, order=order, view=view)


def lifetimes_of(graph: TensorGraph, *, order: Sequence[str] | None = None, view: str = "") -> Lifetimes:
    """Lifetimes of ``graph``'s buffers when its nodes run in ``order`` (node names; graph order when None)."""
    index_order = _resolve_order(graph, order)
    step_of = {node_index: step for step, node_index in enumerate(index_order)}
    last = len(index_order) - 1
    outputs = set(graph.outputs)

    # Last step that needs each tensor (before buffers are merged).
    last_use: dict[str, int] = {name: 0 for name in graph.inputs}
    for node_index in index_order:
        for out in graph.nodes[node_index].outputs:
            last_use[out] = step_of[node_index]
    for node_index in index_order:
        step = step_of[node_index]
        for name in graph.nodes[node_index].inputs:
            last_use[name] = max(last_use.get(name, 0), step)
    for name in outputs:
        last_use[name] = max(last, 0)

    buffer_of: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    start: dict[str, int] = {}
    producer: dict[str, str] = {}
    end: dict[str, int] = {}  # the last step any tensor of the buffer is needed
    for name in graph.inputs:
        buffer_of[name], members[name], start[name], producer[name] = name, [name], 0, GRAPH_INPUT
        end[name] = last_use[name]
    holds_output = {name for name in graph.inputs if name in outputs}

    steps: list[StepInfo] = []
    new_bytes_at = [0] * len(index_order)
    for step, node_index in enumerate(index_order):
        node = graph.nodes[node_index]
        taken: set[str] = set()
        for position, out in enumerate(node.outputs):
            root = None
            if position == 0 and node.alias and node.inputs and node.inputs[0] in buffer_of:
                root = buffer_of[node.inputs[0]]
            elif position == 0:
                for name in node.inputs:
                    candidate = buffer_of.get(name)
                    if (name in node.inplace_inputs and candidate is not None and candidate not in taken
                            and producer[candidate] != GRAPH_INPUT
                            and candidate not in holds_output
                            and graph.sizes[candidate] == graph.sizes[out] and end[candidate] == step):
                        root = candidate
                        break
            if root is None:
                root = out
                members[root], start[root], producer[root], end[root] = [], step, node.name, step
                new_bytes_at[step] += graph.sizes[out]
            members[root].append(out)
            end[root] = max(end[root], last_use[out])
            if out in outputs:
                holds_output.add(root)
            buffer_of[out] = root
            taken.add(root)

    tensors = tuple(
        TensorLife(name=root, size=graph.sizes[root], start=start[root], end=end[root],
                   producer=producer[root], tensors=tuple(members[root]))
        for root in members
    )
    lifetimes = Lifetimes(tensors, order=tuple(graph.nodes[i].name for i in index_order), view=view)
    live = lifetimes.live_bytes()
    steps = [StepInfo(step, graph.nodes[i].name, graph.nodes[i].op, live[step], new_bytes_at[step])
             for step, i in enumerate(index_order)]
    return dataclasses.replace(lifetimes, steps=tuple(steps))


def _resolve_order(graph: TensorGraph, order: Sequence[str] | None) -> list[int]:
    if order is None:
        return list(range(len(graph.nodes)))
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    unknown = [name for name in order if name not in index]
    if unknown or len(set(order)) != len(order) or len(order) != len(graph.nodes):
        detail = f"unknown node {unknown[0]!r}" if unknown else "it must name every node once"
        raise InputError(f"the execution order does not fit the graph: {detail}",
                         hint="list each node name of the (viewed) graph exactly once")
    indices = [index[name] for name in order]
    done: set[int] = set()
    preds = graph.predecessors()
    for i in indices:
        if not preds[i] <= done:
            raise InputError(f"the execution order runs {graph.nodes[i].name!r} before one of its inputs is made",
                             hint="give a topological order")
        done.add(i)
    return indices
