"""Patch-based inference: rewrite a model's early high-resolution stage into spatial tiles that run one after another,
so that each tile's intermediate maps die before the next tile starts and the peak activation memory falls.

The stage runs from the graph input to a *cut* tensor that dominates it (every tensor of the stage other than the
cut is read only inside the stage). The cut map is split into a grid of ``tiles = (rows, cols)`` boxes along H and W.
For each box the stage is walked backwards: a node producing the output rows ``[lo, hi)`` of a window op (Conv,
MaxPool, AveragePool) with kernel ``k``, stride ``s``, dilation ``d`` and leading pad ``p`` needs the input rows
``[lo*s - p, (hi-1)*s - p + (k-1)*d + 1)``; element-wise ops need the rows they produce; a tensor read by several
nodes is computed over the hull of what they need. Each tile then slices its box of the input (the halo included),
runs a copy of the stage on it, and slices a consumer's part out of a larger computed box where needed. Window ops
get explicit pads per tile: only the part of the needed range that lies outside the real image is padded, so an
interior tile reads its neighbours' real rows where the original read real rows, and a border tile pads exactly as
the original did. Since ``in_len + pads = (hi-lo-1)*s + (k-1)*d + 1`` each tile's window op yields exactly its rows,
with no ceil-mode remainder. The tile outputs are concatenated (along W per row of tiles, then along H) into the cut
tensor under its own name, so the rest of the graph is unchanged.

Execution order. The rewritten graph lists the nodes tile by tile, each row's Concat right after its tiles. ONNX
Runtime (CPU, sequential executor, default execution order) does not run the graph's node order as listed: it runs
a reverse depth-first order from the graph outputs; since the tiles share no node, each tile still runs as one
contiguous block (ORT 1.32's profiler shows the last tile first, then the others in turn; on x86 the order of
the tiles changes from session to session, as ORT numbers its NCHWc ReorderOutput nodes by chance, and the replay
in :mod:`npukit.memory.ort_cpu` fixes one stable order), and the graph optimizers (fusions, the NCHWc layout
transform) only rewrite nodes within a tile. Contiguity is not enough: ORT's
allocation planner lets an output take over a freed buffer of exactly the same shape and keeps that buffer
allocated from its first tensor to its last, so tiles with equal shapes (even tiles, or the two border tiles)
keep one another's buffers alive and the measured peak stays near the untiled one. The tile edges are therefore
chosen uneven, so that no two tiles create a tensor of the same shape (:func:`_choose_bounds`); with that, ORT's
measured peak follows the planner (``benchmarks/memory.py``).

:func:`choose_tiling` picks the cut and the grid from the memory planner (best plan of the target's execution view,
in graph order, as the runtime runs it) so the planned peak fits a budget with the fewest halo MACs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npukit.frontend.graph_index import GraphIndex
from npukit.frontend.opset import onnx_opset
from npukit.errors import InputError, NumericCheckError
from npukit.measure.summary import infer_with_fixed_inputs, static_dims, value_types, summarize

Box = tuple[tuple[int, int], tuple[int, int]]  # ((h_lo, h_hi), (w_lo, w_hi)), half-open
Tiles = tuple[int, int]

_WINDOW_OPS = frozenset({"Conv", "MaxPool", "AveragePool"})
_UNARY_OPS = frozenset({
    "Relu", "LeakyRelu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "Elu", "Selu", "Celu", "Gelu",
    "Softplus", "Softsign", "Mish", "Neg", "Abs", "Exp", "Sqrt", "Erf", "Identity", "BatchNormalization", "PRelu",
})
_BINARY_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sum"})
# Grids tried by choose_tiling, by tile count: near-square grids need the fewest halo rows for a tile count.
TILE_OPTIONS: tuple[Tiles, ...] = ((2, 1), (3, 1), (2, 2), (3, 2), (3, 3), (4, 3), (4, 4), (5, 5), (6, 6), (8, 8))
REL_TOLERANCE = 1e-5


class BudgetUnreachable(InputError):
    """No tiling fits the budget; ``smallest_peak`` is the lowest peak reachable, whatever the budget (the untiled
    peak when no tiling lowers it)."""

    def __init__(self, smallest_peak: int | None, message: str, *, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.smallest_peak = smallest_peak


@dataclasses.dataclass(frozen=True)
class TileResult:
    """The tiled ``model``; ``stage`` names the original nodes that were tiled; ``input_boxes`` the box of the graph
    input each tile reads (halo included), row-major over the grid."""

    model: onnx.ModelProto
    tiles: Tiles
    cut: str
    stage: tuple[str, ...]
    input_boxes: tuple[Box, ...]
    macs_original: int
    macs_tiled: int

    @property
    def mac_overhead(self) -> float:
        """MACs tiled / MACs original - 1: the halo recomputation."""
        return self.macs_tiled / self.macs_original - 1 if self.macs_original else 0.0


@dataclasses.dataclass(frozen=True)
class TilingCandidate:
    """One (cut, tiles) that :func:`choose_tiling` planned."""

    cut: str
    tiles: Tiles
    planned_peak_bytes: int
    mac_overhead: float


@dataclasses.dataclass(frozen=True)
class TilingChoice:
    """The chosen tiling (``result``), the planned peaks before and after on ``target``'s view, and every candidate
    planned on the way."""

    result: TileResult
    target: str
    budget_bytes: int
    planned_peak_before: int
    planned_peak_after: int
    candidates: tuple[TilingCandidate, ...]

    @property
    def tiles(self) -> Tiles:
        return self.result.tiles

    @property
    def cut(self) -> str:
        return self.result.cut

    @property
    def mac_overhead(self) -> float:
        return self.result.mac_overhead

    def as_dict(self) -> dict[str, Any]:
        return {"tiles": list(self.tiles), "cut": self.cut, "target": self.target, "budget_bytes": self.budget_bytes,
                "planned_peak_before": self.planned_peak_before, "planned_peak_after": self.planned_peak_after,
                "macs_original": self.result.macs_original, "macs_tiled": self.result.macs_tiled,
                "mac_overhead": self.mac_overhead, "stage": list(self.result.stage),
                "candidates": [dataclasses.asdict(c) for c in self.candidates]}


# ------------------------------------------------------------------------------------------------------ graph facts

@dataclasses.dataclass(frozen=True)
class _Window:
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    begin: tuple[int, int]  # leading pads along H, W

    def need(self, axis: int, lo: int, hi: int) -> tuple[int, int]:
        """Input range (unclipped: it may reach into the padding) that output range [lo, hi) reads along ``axis``."""
        s, d, k, p = self.strides[axis], self.dilations[axis], self.kernel[axis], self.begin[axis]
        return lo * s - p, (hi - 1) * s - p + (k - 1) * d + 1


class _Graph:
    """The inferred model with what the tiling needs: static shapes, constants (folded ones included), and the
    graph's producers and readers (``frontend.graph_index.GraphIndex``)."""

    def __init__(self, model: onnx.ModelProto, input_shape: Sequence[int] | None) -> None:
        self.model = model
        inferred = infer_with_fixed_inputs(model, input_shape)
        self.shapes, _ = value_types(inferred.graph)
        graph = model.graph
        index = GraphIndex(graph)
        self.nodes = index.nodes
        self.constant = index.folded
        activations = [i.name for i in graph.input if i.name not in self.constant]
        if not activations:
            raise InputError("the model has no activation input to tile", hint="give a model that takes an image")
        self.input = activations[0]
        self.outputs = index.outputs
        self.producer = index.producer
        self.readers = index.consumers
        self._windows: dict[str, _Window] = {}

    def name_of(self, index: int) -> str:
        node = self.nodes[index]
        return node.name or f"{node.op_type}_{index}"

    def activation_inputs(self, node: onnx.NodeProto) -> list[str]:
        return [n for n in node.input if n and n not in self.constant]

    def dims(self, tensor: str) -> tuple[int, int, int, int] | None:
        shape = static_dims(self.shapes.get(tensor))
        return shape if shape is not None and len(shape) == 4 else None  # type: ignore[return-value]

    def extent(self, tensor: str) -> Box:
        dims = self.dims(tensor)
        assert dims is not None
        return (0, dims[2]), (0, dims[3])

    def window(self, node: onnx.NodeProto) -> _Window:
        key = node.output[0]
        if key not in self._windows:
            self._windows[key] = self._read_window(node)
        return self._windows[key]

    def _read_window(self, node: onnx.NodeProto) -> _Window:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            kernel = tuple(attrs.get("kernel_shape") or static_dims(self.shapes.get(node.input[1]))[2:])
        else:
            kernel = tuple(attrs["kernel_shape"])
        strides = tuple(attrs.get("strides") or (1, 1))
        dilations = tuple(attrs.get("dilations") or (1, 1))
        auto_pad = attrs.get("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        in_dims, out_dims = self.dims(node.input[0]), self.dims(node.output[0])
        assert in_dims is not None and out_dims is not None
        begin, end = [0, 0], [0, 0]
        for axis in range(2):
            span = (kernel[axis] - 1) * dilations[axis] + 1
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                total = max(0, (out_dims[2 + axis] - 1) * strides[axis] + span - in_dims[2 + axis])
                begin[axis] = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
                end[axis] = total - begin[axis]
            elif auto_pad == "NOTSET":
                pads = tuple(attrs.get("pads") or (0, 0, 0, 0))
                begin[axis], end[axis] = pads[axis], pads[2 + axis]
        window = _Window(kernel, strides, dilations, tuple(begin))  # type: ignore[arg-type]
        for axis in range(2):
            floor_out = (in_dims[2 + axis] + begin[axis] + end[axis]
                         - ((kernel[axis] - 1) * dilations[axis] + 1)) // strides[axis] + 1
            if floor_out != out_dims[2 + axis]:
                raise InputError(f"{node.op_type} {node.name!r} has a partial last window (ceil_mode)",
                                 hint="cut the stage before it")
        return window

    def why_unsupported(self, index: int) -> str | None:
        """Why node ``index`` cannot be part of a tiled stage; None when it can."""
        node = self.nodes[index]
        label = f"{node.op_type} {self.name_of(index)!r}"
        if node.domain not in ("", "ai.onnx"):
            return f"{label} is from domain {node.domain!r}"
        for name in [*self.activation_inputs(node), *(o for o in node.output[:1])]:
            if self.dims(name) is None:
                return f"{label}: tensor {name!r} is not a static 4-D (N, C, H, W) map"
        extra = [o for o in node.output[1:] if o and (o in self.readers or o in self.outputs)]
        if extra:
            return f"{label}: its extra output {extra[0]!r} is used"
        op = node.op_type
        activation = self.activation_inputs(node)
        if op in _WINDOW_OPS:
            if len(activation) != 1 or activation[0] != node.input[0]:
                return f"{label}: its weights are not constant"
            try:
                self.window(node)
            except InputError as exc:
                return exc.message
            return None
        if op in _UNARY_OPS or op in _BINARY_OPS:
            out = self.dims(node.output[0])
            for name in node.input:
                if not name:
                    continue
                if name in self.constant:
                    shape = static_dims(self.shapes.get(name))
                    if shape is None or any(len(shape) >= -i and shape[i] != 1 for i in (-1, -2)):
                        return f"{label}: constant {name!r} varies along H or W"
                elif self.dims(name) != out:
                    return f"{label}: input {name!r} is broadcast along a spatial axis"
            return None
        return f"{label}: {op} is not supported in a tiled stage (Conv, pooling, element-wise ops and Add only)"

    def stage(self, cut: str) -> list[int]:
        """Indices (graph order) of the non-constant nodes the cut depends on; InputError saying why when the stage
        cannot be tiled."""
        if cut not in self.producer or cut in self.constant:
            raise InputError(f"cut {cut!r} is not the output of a node that computes on activations",
                             hint="name a node output of the early stage (see cut_candidates)")
        members: set[int] = set()
        todo = [self.producer[cut]]
        while todo:
            index = todo.pop()
            if index in members:
                continue
            members.add(index)
            for name in self.activation_inputs(self.nodes[index]):
                if name in self.producer:
                    todo.append(self.producer[name])
                elif name != self.input:
                    raise InputError(f"the stage before {cut!r} reads graph input {name!r}",
                                     hint=f"only the first input {self.input!r} may feed the tiled stage")
        order = sorted(members)
        for index in order:
            why = self.why_unsupported(index)
            if why is not None:
                raise InputError(f"cannot tile up to {cut!r}: {why}", hint="choose an earlier cut")
        for index in order:
            for out in self.nodes[index].output[:1]:
                if out == cut:
                    continue
                if out in self.outputs or any(r not in members for r in self.readers.get(out, ())):
                    raise InputError(f"cut {cut!r} does not dominate the stage: {out!r} is also read after it",
                                     hint="choose a cut that every path from the input passes through")
        if self.input not in {n for i in order for n in self.nodes[i].input}:
            raise InputError(f"cut {cut!r} does not depend on input {self.input!r}", hint="choose another cut")
        return order


def cut_candidates(model: onnx.ModelProto, *, input_shape: Sequence[int] | None = None) -> tuple[str, ...]:
    """Node outputs (graph order) up to which ``model`` can be tiled."""
    graph = _Graph(model, input_shape)
    found = []
    for node in graph.nodes:
        out = node.output[0] if node.output else ""
        if not out or out in graph.constant:
            continue
        try:
            graph.stage(out)
        except InputError:
            continue
        found.append(out)
    return tuple(found)


# -------------------------------------------------------------------------------------------------------- rewriting

def tile_model(
    model: onnx.ModelProto,
    *,
    tiles: int | Sequence[int],
    cut: str | int,
    input_shape: Sequence[int] | None = None,
) -> TileResult:
    """Tile the stage from the first graph input up to ``cut`` (a tensor name, or the index of the node in graph
    order whose first output is the cut) into ``tiles`` (``n``: n rows along H; ``(rows, cols)``: a grid)."""
    grid = _grid(tiles)
    graph = _Graph(model, input_shape)
    if isinstance(cut, int):
        if not 0 <= cut < len(graph.nodes) or not graph.nodes[cut].output:
            raise InputError(f"cut index {cut} is not a node of the graph ({len(graph.nodes)} nodes)",
                             hint="give a node index or a tensor name")
        cut = graph.nodes[cut].output[0]
    return _tile(graph, grid, cut, summarize(model, input_shape=_shape_arg(input_shape)).macs, input_shape)


def _tile(graph: _Graph, grid: Tiles, cut: str, macs_original: int, input_shape: Sequence[int] | None) -> TileResult:
    stage = graph.stage(cut)
    (_, height), (_, width) = graph.extent(cut)
    if grid[0] > height or grid[1] > width:
        raise InputError(f"{grid[0]}x{grid[1]} tiles do not fit the cut map {cut!r} of {height}x{width}",
                         hint="use fewer tiles or an earlier cut")
    rows, cols = _choose_bounds(graph, stage, cut, grid)
    builder = _Builder(graph)
    row_outputs: list[str] = []
    boxes: list[Box] = []
    for r, h_range in enumerate(rows):
        row_pieces = []
        for c, w_range in enumerate(cols):
            out, box = builder.tile(stage, cut, (h_range, w_range), tag=f"t{r}_{c}")
            row_pieces.append(out)
            boxes.append(box)
        if grid[1] == 1:
            row_outputs.append(row_pieces[0])
        else:
            name = cut if grid[0] == 1 else f"{cut}__row{r}"
            builder.add_node("Concat", row_pieces, name, name=f"{cut}__concat_row{r}", axis=3)
            row_outputs.append(name)
    if grid[0] > 1:
        builder.add_node("Concat", row_outputs, cut, name=f"{cut}__concat", axis=2)
    tiled = builder.finish(set(stage))
    return TileResult(model=tiled, tiles=grid, cut=cut, stage=tuple(graph.name_of(i) for i in stage),
                      input_boxes=tuple(boxes), macs_original=macs_original,
                      macs_tiled=summarize(tiled, input_shape=_shape_arg(input_shape)).macs)


def _shape_arg(input_shape: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if input_shape is None else tuple(int(d) for d in input_shape)


def _grid(tiles: int | Sequence[int]) -> Tiles:
    grid = (int(tiles), 1) if isinstance(tiles, (int, np.integer)) else tuple(int(t) for t in tiles)
    if len(grid) != 2 or min(grid) < 1 or grid[0] * grid[1] < 2:
        raise InputError(f"tiles must be n >= 2 or (rows, cols) with at least two tiles, not {tiles!r}",
                         hint="e.g. tiles=4 or tiles=(2, 2)")
    return grid  # type: ignore[return-value]


def _bounds(size: int, parts: int) -> list[tuple[int, int]]:
    edges = [round(i * size / parts) for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _hull(a: Box | None, b: Box) -> Box:
    if a is None:
        return b
    return (min(a[0][0], b[0][0]), max(a[0][1], b[0][1])), (min(a[1][0], b[1][0]), max(a[1][1], b[1][1]))


def _clip(box: Box, extent: Box) -> Box:
    return tuple((max(lo, e_lo), min(hi, e_hi)) for (lo, hi), (e_lo, e_hi) in zip(box, extent))  # type: ignore


def _walk_back(graph: _Graph, stage: list[int], cut: str, out_box: Box
               ) -> tuple[dict[str, Box], dict[int, dict[str, tuple[Box, Box]]]]:
    """The box of every stage tensor a tile computing ``out_box`` of the cut needs, and per node and input the
    box it reads, unclipped (reaching into the padding) and clipped to the map."""
    computed: dict[str, Box] = {cut: out_box}
    needs: dict[int, dict[str, tuple[Box, Box]]] = {}
    for index in reversed(stage):
        node = graph.nodes[index]
        box = computed[node.output[0]]
        needs[index] = {}
        for name in graph.activation_inputs(node):
            if node.op_type in _WINDOW_OPS:
                window = graph.window(node)
                raw = (window.need(0, *box[0]), window.need(1, *box[1]))
            else:
                raw = box
            clipped = _clip(raw, graph.extent(name))
            needs[index][name] = (raw, clipped)
            computed[name] = _hull(computed.get(name), clipped)
    return computed, needs


def _tile_shapes(graph: _Graph, stage: list[int], cut: str, out_box: Box) -> set[tuple[int, int, int]]:
    """(channels, rows, cols) of every tensor one tile creates: its maps and the slices it takes."""
    computed, needs = _walk_back(graph, stage, cut, out_box)
    boxes = [(name, box) for name, box in computed.items()]
    boxes += [(name, clipped) for per_node in needs.values() for name, (_, clipped) in per_node.items()]
    return {(graph.dims(name)[1], h1 - h0, w1 - w0) for name, ((h0, h1), (w0, w1)) in boxes}  # type: ignore[index]


def _length_options(size: int, parts: int) -> list[list[int]]:
    """Ways to split ``size`` into ``parts`` lengths: even first, then pairwise distinct lengths in several
    arrangements (see :func:`_choose_bounds`)."""
    options = [[b - a for a, b in _bounds(size, parts)]]
    if parts == 1:
        return options
    for step in (1, 2, 3):
        base = (size - step * parts * (parts - 1) // 2) // parts
        if base < 1:
            break
        lengths = [base + step * i for i in range(parts)]
        for i in range(size - sum(lengths)):
            lengths[parts - 1 - i] += 1
        for shift in range(parts):
            rotated = lengths[shift:] + lengths[:shift]
            options += [rotated, rotated[::-1]]
    return options


def _edges(lengths: list[int]) -> list[tuple[int, int]]:
    edges = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    return list(zip(edges[:-1], edges[1:]))


def _choose_bounds(graph: _Graph, stage: list[int], cut: str, grid: Tiles,
                   attempts: int = 48) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Tile edges along H and W such that no two tiles create a tensor of the same shape, where such edges exist
    among the options tried (else the ones with the fewest shared shapes).

    Why: ONNX Runtime's allocation planner lets an output take over a freed buffer of exactly the same shape, and a
    buffer taken over stays allocated from its first tensor to its last. A tile whose maps have the shapes of an
    earlier tile's would keep all of that tile's buffers allocated while it runs, undoing the tiling; even tiles
    (and the border tiles at both ends) share shapes, so uneven tiles are preferred.
    """
    (_, height), (_, width) = graph.extent(cut)
    rows_options = _length_options(height, grid[0])
    cols_options = _length_options(width, grid[1])
    rest = {tuple(d[1:]) for i, node in enumerate(graph.nodes) if i not in set(stage)
            for name in node.output if (d := graph.dims(name)) is not None}
    best: tuple[int, list[tuple[int, int]], list[tuple[int, int]]] | None = None
    pairs = [(r, c) for r in rows_options for c in cols_options][:attempts]
    for row_lengths, col_lengths in pairs:
        rows, cols = _edges(row_lengths), _edges(col_lengths)
        seen: dict[tuple[int, int, int], int] = {}
        shared = 0
        for r, h_range in enumerate(rows):
            for c, w_range in enumerate(cols):
                for shape in _tile_shapes(graph, stage, cut, (h_range, w_range)):
                    if shape in seen or shape in rest:
                        shared += 1
                    seen[shape] = r * len(cols) + c
        if best is None or shared < best[0]:
            best = (shared, rows, cols)
        if shared == 0:
            break
    assert best is not None
    return best[1], best[2]


class _Builder:
    """Collects the rewritten graph: the constants first, then the tiles in order, then the rest of the graph."""

    def __init__(self, graph: _Graph) -> None:
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def add_node(self, op: str, inputs: Sequence[str], output: str, *, name: str, **attrs: Any) -> None:
        self.nodes.append(helper.make_node(op, list(inputs), [output], name=name, **attrs))

    def _constant(self, values: Sequence[int], hint: str) -> str:
        self._count += 1
        name = f"{hint}__c{self._count}"
        self.initializers.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def _slice(self, source: str, box: Box, origin: Box, output: str) -> None:
        starts = [box[0][0] - origin[0][0], box[1][0] - origin[1][0]]
        ends = [box[0][1] - origin[0][0], box[1][1] - origin[1][0]]
        if onnx_opset(self.graph.model) < 10:  # Slice-1 takes its bounds as attributes
            self.add_node("Slice", [source], output, name=output + "__slice", starts=starts, ends=ends, axes=[2, 3])
            return
        self.add_node("Slice", [source, self._constant(starts, output + "_starts"),
                                self._constant(ends, output + "_ends"), self._constant([2, 3], output + "_axes")],
                      output, name=output + "__slice")

    def tile(self, stage: list[int], cut: str, out_box: Box, *, tag: str) -> tuple[str, Box]:
        """Append one tile's nodes computing ``out_box`` of ``cut``; returns its output name and its input box."""
        g = self.graph
        computed, needs = _walk_back(g, stage, cut, out_box)
        local: dict[str, str] = {}
        source = g.input
        if computed[source] == g.extent(source):
            local[source] = source
        else:
            local[source] = f"{source}__{tag}"
            self._slice(source, computed[source], g.extent(source), local[source])
        for index in stage:
            node = g.nodes[index]
            inputs = list(node.input)
            attrs = [a for a in node.attribute if a.name not in ("pads", "auto_pad")]
            for position, name in enumerate(node.input):
                if not name or name in g.constant:
                    continue
                raw, clipped = needs[index][name]
                if clipped == computed[name]:
                    inputs[position] = local[name]
                else:
                    part = f"{local[name]}__for_{index}"
                    self._slice(local[name], clipped, computed[name], part)
                    inputs[position] = part
                if node.op_type in _WINDOW_OPS:
                    extent = g.extent(name)
                    pads = [max(0, extent[a][0] - raw[a][0]) for a in range(2)]
                    pads += [max(0, raw[a][1] - extent[a][1]) for a in range(2)]
                    attrs.append(helper.make_attribute("pads", pads))
            out = node.output[0]
            local[out] = f"{out}__{tag}"
            new = helper.make_node(node.op_type, inputs, [local[out]], name=f"{g.name_of(index)}__{tag}",
                                   domain=node.domain)
            new.attribute.extend(attrs)
            self.nodes.append(new)
        return local[cut], computed[source]

    def finish(self, stage: set[int]) -> onnx.ModelProto:
        g = self.graph
        constants = [n for i, n in enumerate(g.nodes) if i not in stage and all(o in g.constant for o in n.output)]
        rest = [n for i, n in enumerate(g.nodes) if i not in stage and n not in constants]
        model = onnx.ModelProto()
        model.CopyFrom(g.model)
        graph = model.graph
        del graph.node[:]
        graph.node.extend([*constants, *self.nodes, *rest])
        graph.initializer.extend(self.initializers)
        kept = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
        value_info = [v for v in graph.value_info if v.name in kept]
        del graph.value_info[:]
        graph.value_info.extend(value_info)
        return model


# ---------------------------------------------------------------------------------------------------------- choice

def planned_peak(model: onnx.ModelProto, *, target: str = "cpu", input_shape: Sequence[int] | None = None,
                 inputs: bool = True) -> int:
    """The best planner's arena for ``model`` on ``target``'s execution view, in graph order (as ORT runs it);
    without ``inputs``, less the graph inputs' buffers (the caller's memory, as ORT CPU's planner counts)."""
    from npukit.memory.lifetimes import lifetimes_of
    from npukit.memory.ort_cpu import without_graph_inputs
    from npukit.memory.planners import best_plan
    from npukit.memory.runtime_view import build_view

    lifetimes = lifetimes_of(build_view(model, view=target, input_shape=input_shape))
    return best_plan(lifetimes if inputs else without_graph_inputs(lifetimes)).arena_bytes


def choose_tiling(
    model: onnx.ModelProto,
    *,
    budget_bytes: int,
    target: str = "cpu",
    input_shape: Sequence[int] | None = None,
    max_cuts: int = 8,
    peak_of: Callable[[onnx.ModelProto], int] | None = None,
) -> TilingChoice:
    """The tiling whose planned peak fits ``budget_bytes`` with the smallest MAC overhead.

    Cuts are the tensors ``target``'s view keeps (not intermediates fused away) where the bytes live after the
    cut in the untiled graph already fit the budget (tiling cannot lower them) and that come at or after the untiled
    peak (an earlier cut leaves the peak untiled); for the first ``max_cuts`` of them in graph order, the grids of
    :data:`TILE_OPTIONS` are planned by tile count until one fits, costs more MACs than the best fit so far, or
    plans no lower a peak than the grid before it. When none fits, BudgetUnreachable states the smallest peak
    reachable, searched independently of the budget (:func:`_smallest_reachable`).
    ``peak_of`` gives a model's peak (default: the best plan of ``target``'s view, see :func:`planned_peak`;
    :func:`optimize_for_memory` passes ORT's replayed allocation for target "cpu").
    """
    from npukit.memory.lifetimes import lifetimes_of
    from npukit.memory.runtime_view import build_view

    if budget_bytes <= 0:
        raise InputError(f"the memory budget must be a positive number of bytes, not {budget_bytes}",
                         hint="e.g. --memory-budget 3000000")
    shape = _shape_arg(input_shape)
    view = build_view(model, view=target, input_shape=shape)
    lifetimes = lifetimes_of(view)
    if peak_of is None:
        def peak_of(candidate: onnx.ModelProto) -> int:
            return planned_peak(candidate, target=target, input_shape=shape)
    before = peak_of(model)
    live = lifetimes.live_bytes()
    step_of = {out: step for step, node in enumerate(view.nodes) for out in node.outputs}
    graph = _Graph(model, shape)
    tails = _tails(model, shape, step_of, live)
    if not tails:
        raise BudgetUnreachable(before, f"the planned peak on {target} is {before} bytes, over the budget of "
                                        f"{budget_bytes} bytes, and no node output of this model can be a tiling cut",
                                hint=f"raise --memory-budget to at least {before} bytes (tiling needs an early stage "
                                     "of only Conv, pooling and element-wise ops)")
    # a cut before the untiled peak leaves the peak's tensors outside the tiles: only cuts at or after it can lower it
    peak_step = live.index(max(live)) if live else 0
    fitting = [cut for cut, tail in tails if tail <= budget_bytes and step_of[cut] >= peak_step][:max_cuts]
    fitting = fitting or [cut for cut, tail in tails if tail <= budget_bytes][:max_cuts]
    planner = _Planner(graph, summarize(model, input_shape=shape).macs, shape, peak_of)
    candidates, best = _search(fitting, planner, budget_bytes)
    if best is None:
        reachable = [(cut, tail) for cut, tail in tails if step_of[cut] >= peak_step][:max_cuts] or tails[:max_cuts]
        raise _unreachable(reachable, tails, before, planner, target=target, budget_bytes=budget_bytes)
    result, peak = best
    return TilingChoice(result=result, target=target, budget_bytes=budget_bytes, planned_peak_before=before,
                        planned_peak_after=peak, candidates=tuple(candidates))


def _tails(model: onnx.ModelProto, shape: Sequence[int] | None, step_of: dict[str, int],
           live: Sequence[int]) -> list[tuple[str, int]]:
    """The cuts the view keeps, in graph order, each with the most bytes live after it in the untiled graph (what
    tiling before it cannot lower)."""
    tails: list[tuple[str, int]] = []
    for cut in cut_candidates(model, input_shape=shape):
        if cut in step_of:
            after = live[step_of[cut] + 1:]
            tails.append((cut, max(after, default=0)))
    return tails


class _Planner:
    """Each (cut, grid) tiled and planned once, for the search and for the smallest reachable peak alike."""

    def __init__(self, graph: _Graph, macs: int, shape: Sequence[int] | None,
                 peak_of: Callable[[onnx.ModelProto], int]) -> None:
        self.graph, self.macs, self.shape, self.peak_of = graph, macs, shape, peak_of
        self.tiled: dict[tuple[str, Tiles], TileResult] = {}
        self.planned: dict[tuple[str, Tiles], TilingCandidate] = {}

    def grids(self, cut: str) -> list[Tiles]:
        """The grids of :data:`TILE_OPTIONS` that fit the cut's extent, by tile count."""
        (_, height), (_, width) = self.graph.extent(cut)
        return [grid for grid in TILE_OPTIONS if grid[0] <= height and grid[1] <= width]

    def tile(self, cut: str, grid: Tiles) -> TileResult:
        """The model tiled at ``cut`` by ``grid`` (built once)."""
        if (cut, grid) not in self.tiled:
            self.tiled[cut, grid] = _tile(self.graph, grid, cut, self.macs, self.shape)
        return self.tiled[cut, grid]

    def plan(self, cut: str, grid: Tiles) -> TilingCandidate:
        """The tiled model's planned peak and MAC overhead (planned once)."""
        if (cut, grid) not in self.planned:
            result = self.tile(cut, grid)
            self.planned[cut, grid] = TilingCandidate(cut, grid, self.peak_of(result.model), result.mac_overhead)
        return self.planned[cut, grid]


def _search(fitting: Sequence[str], planner: _Planner,
            budget_bytes: int) -> tuple[list[TilingCandidate], tuple[TileResult, int] | None]:
    """The candidates planned and the fitting tiling with the least MAC overhead (with its planned peak), if any.

    Per cut the grids are planned by tile count, and no further once a grid's peak is no lower than the grid's
    before it (finer grids add halo and pieces); the search for the smallest reachable peak follows the same rule,
    so a budget of the peak it reports is met."""
    candidates: list[TilingCandidate] = []
    best: tuple[TileResult, int] | None = None
    for cut in fitting:
        previous = None
        for grid in planner.grids(cut):
            result = planner.tile(cut, grid)
            if best is not None and result.mac_overhead >= best[0].mac_overhead:
                break  # the grids that follow cost more halo still
            candidate = planner.plan(cut, grid)
            candidates.append(candidate)
            if candidate.planned_peak_bytes <= budget_bytes:
                if best is None or result.mac_overhead < best[0].mac_overhead:
                    best = (result, candidate.planned_peak_bytes)
                break
            if previous is not None and candidate.planned_peak_bytes >= previous:
                break
            previous = candidate.planned_peak_bytes
    return candidates, best


def _unreachable(reachable: Sequence[tuple[str, int]], tails: Sequence[tuple[str, int]], before: int,
                 planner: _Planner, *, target: str, budget_bytes: int) -> BudgetUnreachable:
    """The refusal when no tiling fits: it states the smallest peak reachable over the ``reachable`` cuts, searched
    independently of the budget (:func:`_smallest_reachable`), and what the graph after any cut alone needs."""
    smallest = _smallest_reachable(reachable, before, planner.grids, planner.plan)
    reach = (f"; the smallest reachable planned peak is {smallest.planned_peak_bytes} bytes "
             f"(cut {smallest.cut!r}, {smallest.tiles[0]}x{smallest.tiles[1]} tiles)" if smallest else
             f"; the smallest reachable planned peak is the untiled {before} bytes: no tiling planned lowers "
             "it")
    lowest_tail = min(tail for _, tail in tails)
    return BudgetUnreachable(
        smallest.planned_peak_bytes if smallest else before,
        f"no tiling fits the budget of {budget_bytes} bytes on {target} (untiled: {before} bytes)" + reach,
        hint=f"raise --memory-budget; the graph after any cut alone needs {lowest_tail} bytes")


def _smallest_reachable(cuts: Sequence[tuple[str, int]], untiled: int, grids: Callable[[str], list[Tiles]],
                        plan: Callable[[str, Tiles], TilingCandidate]) -> TilingCandidate | None:
    """The tiling with the lowest planned peak, whatever the budget asked: over ``cuts`` (the first ``max_cuts``
    cuts at or after the untiled peak, in graph order, with the bytes live after each), each cut's grids by tile
    count while the peak keeps falling; a cut whose tail alone is not below the best peak so far is skipped (tiling
    cannot lower it). Ties go to the earlier cut, then to the grid with fewer tiles. None when nothing planned is
    below the ``untiled`` peak."""
    best: TilingCandidate | None = None
    for cut, tail in cuts:
        if tail >= (untiled if best is None else best.planned_peak_bytes):
            continue
        previous = None
        for grid in grids(cut):
            candidate = plan(cut, grid)
            if candidate.planned_peak_bytes < (untiled if best is None else best.planned_peak_bytes):
                best = candidate
            if previous is not None and candidate.planned_peak_bytes >= previous:
                break
            previous = candidate.planned_peak_bytes
    return best


def max_rel_error(original: onnx.ModelProto, tiled: onnx.ModelProto, *,
                  input_shape: Sequence[int] | None = None, seed: int = 0) -> float:
    """max |tiled - original| / max |original| over the outputs, on ORT CPU with a seeded random input."""
    from npukit.measure.compare import compare_outputs
    from npukit.runtime.ort import make_session, random_feeds, run

    reference = make_session(original)
    shapes = None
    if input_shape is not None:
        shapes = {reference.get_inputs()[0].name: tuple(int(d) for d in input_shape)}
    feeds = random_feeds(reference, seed=seed, shapes=shapes)
    return compare_outputs(run(reference, feeds), run(make_session(tiled), feeds)).max_rel


@dataclasses.dataclass(frozen=True)
class MemoryRestructure:
    """What :func:`optimize_for_memory` did: the layout step (target "cpu": upsamples kept in the plain layout) and
    the tiling, either of which may be None, the rewritten ``model``, and the peaks before and after by the
    predictor used (``predictor``)."""

    model: onnx.ModelProto
    layout: Any  # npukit.memory.layout.LayoutChoice | None
    tiling: TilingChoice | None
    predictor: str
    peak_before: int
    peak_after: int
    budget_bytes: int = 0
    max_rel_error: float = 0.0  # the rewritten model's outputs against the original's, relative

    def as_dict(self) -> dict[str, Any]:
        return {"predictor": self.predictor, "peak_before": self.peak_before, "peak_after": self.peak_after,
                "budget_bytes": self.budget_bytes, "max_rel_error": self.max_rel_error,
                "layout": None if self.layout is None else self.layout.as_dict(),
                "tiling": None if self.tiling is None else self.tiling.as_dict()}


def optimize_for_memory(
    model_path: str | Path,
    output: str | Path,
    *,
    budget_bytes: int,
    input_shape: str | Sequence[int] | None = None,
    target: str = "cpu",
) -> MemoryRestructure:
    """Restructure ``model_path`` so its peak activation memory on ``target`` fits ``budget_bytes``, check the outputs
    against the original (NumericCheckError past 1e-5 relative error) and write the result to ``output`` atomically.

    For target "cpu" the peak is ORT CPU's own, predicted from the graph ORT runs and its allocation planner
    replayed (:mod:`npukit.memory.ort_cpu`); first the upsamples whose NCHWc form raises that peak are kept in the
    plain layout (:mod:`npukit.memory.layout`, no extra MACs), then, if the budget is still not met, the early stage
    is tiled. Other targets: tiling, planned on the target's execution view."""
    from npukit.config import parse_shape
    from npukit.frontend.onnx_io import load_onnx, save_onnx

    if budget_bytes <= 0:
        raise InputError(f"the memory budget must be a positive number of bytes, not {budget_bytes}",
                         hint="e.g. --memory-budget 3000000")
    shape = parse_shape(input_shape)
    original = load_onnx(model_path)
    layout = None
    if target == "cpu":
        from npukit.memory.layout import choose_planar_resizes, ort_predicted_peak

        def peak_of(candidate: onnx.ModelProto) -> int:
            return ort_predicted_peak(candidate, input_shape=shape)

        predictor = "ORT CPU's allocation replayed on the graph ORT runs (arena off, inputs excluded)"
        layout = choose_planar_resizes(original, input_shape=shape)
        before, current, peak = layout.predicted_peak_before, layout.model, layout.predicted_peak_after
        if not layout.planar:
            layout = None
    else:
        def peak_of(candidate: onnx.ModelProto) -> int:
            return planned_peak(candidate, target=target, input_shape=shape)

        predictor = f"best plan of the {target} execution view"
        current = original
        before = peak = peak_of(original)
    tiling = None
    if peak > budget_bytes:
        tiling = choose_tiling(current, budget_bytes=budget_bytes, target=target, input_shape=shape, peak_of=peak_of)
        current, peak = tiling.result.model, tiling.planned_peak_after
    error = max_rel_error(original, current, input_shape=shape)
    done = MemoryRestructure(model=current, layout=layout, tiling=tiling, predictor=predictor, peak_before=before,
                             peak_after=peak, budget_bytes=budget_bytes, max_rel_error=error)
    if not error <= REL_TOLERANCE:
        raise NumericCheckError(f"the restructured model differs from the original by {error:.3g} (relative, "
                                f"tolerance {REL_TOLERANCE}); nothing was written to {output}",
                                hint="report the model; these rewrites are exact")
    save_onnx(current, output)
    return done
