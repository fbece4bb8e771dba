"""Execution order search: a topological order with fewer bytes live at the peak step.

The graph splits at sequence points, nodes that every earlier node leads to and that lead to every later node (the
join of a fork, a node on a chain). Between two of them lies a region whose nodes may run in any order that keeps
their dependencies. A region of at most ``exact_limit`` nodes is solved exactly: dynamic programming over the sets
of its nodes already run (the downsets), minimising the largest step cost on the way. A larger region is scheduled
greedily: of the ready nodes, the one whose step costs least, then the one that frees the most bytes. Inside the
search a view shares its input's buffer and in-place reuse is not assumed; the order found is then measured with
:func:`~npukit.memory.lifetimes.lifetimes_of` (views and in-place included) and kept only if it lowers the peak.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from npukit.memory.graph import TensorGraph
from npukit.memory.lifetimes import lifetimes_of


@dataclasses.dataclass(frozen=True)
class OrderResult:
    """The order kept (node names), its peak live bytes, the graph order's, and how the regions were searched."""

    order: tuple[str, ...]
    peak_bytes: int
    original_peak_bytes: int
    exact_regions: int
    heuristic_regions: int

    @property
    def improved(self) -> bool:
        return self.peak_bytes < self.original_peak_bytes


@dataclasses.dataclass(frozen=True)
class _Buffer:
    size: int
    producer: int  # node index, -1 for graph inputs
    consumers: frozenset[int]
    persists: bool  # a graph output: lives to the end


def search_order(graph: TensorGraph, *, exact_limit: int = 12) -> OrderResult:
    """A dependency-respecting order of ``graph``'s nodes whose peak live bytes are at most the graph order's."""
    original = lifetimes_of(graph)
    buffers = _buffers(graph)
    preds = graph.predecessors()
    n = len(graph.nodes)
    order: list[int] = []
    exact = heuristic = 0
    for region in _regions(preds, n):
        if len(region) <= 1:
            order.extend(region)
        elif len(region) <= exact_limit:
            order.extend(_exact(region, preds, buffers))
            exact += 1
        else:
            order.extend(_greedy(region, preds, buffers))
            heuristic += 1
    names = tuple(graph.nodes[i].name for i in order)
    found = lifetimes_of(graph, order=names)
    if found.peak_bytes < original.peak_bytes:
        return OrderResult(names, found.peak_bytes, original.peak_bytes, exact, heuristic)
    return OrderResult(original.order, original.peak_bytes, original.peak_bytes, exact, heuristic)


def _buffers(graph: TensorGraph) -> list[_Buffer]:
    """One entry per buffer: views are merged into the buffer they look at, with their readers."""
    producer = graph.producers()
    root: dict[str, str] = {name: name for name in graph.inputs}
    for node in graph.nodes:
        for position, out in enumerate(node.outputs):
            root[out] = root.get(node.inputs[0], node.inputs[0]) if position == 0 and node.alias and node.inputs \
                else out
    readers: dict[str, set[int]] = {}
    for index, node in enumerate(graph.nodes):
        for name in node.inputs:
            readers.setdefault(root.get(name, name), set()).add(index)
    outputs = {root.get(name, name) for name in graph.outputs}
    return [_Buffer(graph.sizes[name], producer.get(name, -1), frozenset(readers.get(name, ())), name in outputs)
            for name in set(root.values())]


def _regions(preds: list[set[int]], n: int) -> list[list[int]]:
    """Split the node indices (already in topological order) into sequence points and the regions between them."""
    ancestors = [0] * n
    for v in range(n):
        for u in preds[v]:
            ancestors[v] |= ancestors[u] | (1 << u)
    succs: list[set[int]] = [set() for _ in range(n)]
    for v in range(n):
        for u in preds[v]:
            succs[u].add(v)
    descendants = [0] * n
    for v in reversed(range(n)):
        for w in succs[v]:
            descendants[v] |= descendants[w] | (1 << w)
    regions: list[list[int]] = []
    current: list[int] = []
    for v in range(n):
        if ancestors[v].bit_count() == v and descendants[v].bit_count() == n - 1 - v:
            if current:
                regions.append(current)
            regions.append([v])
            current = []
        else:
            current.append(v)
    if current:
        regions.append(current)
    return regions


class _RegionCost:
    """Bytes live inside one region as a function of the set of its nodes already run (a bit mask)."""

    def __init__(self, region: Sequence[int], preds: list[set[int]], buffers: list[_Buffer]) -> None:
        self.local = {node: bit for bit, node in enumerate(region)}
        self.pred_mask = [sum(1 << self.local[u] for u in preds[v] if u in self.local) for v in region]
        self.entries: list[tuple[int, int, int, bool]] = []  # (size, producer bit mask, reader mask, persists)
        self.out_bytes = [0] * len(region)
        self.dead_outputs = [0] * len(region)  # outputs that nobody reads: they die at birth
        for b in buffers:
            inside = b.producer in self.local
            reader_mask = sum(1 << self.local[c] for c in b.consumers if c in self.local)
            if not inside and not reader_mask:
                continue  # not touched by the region: the same bytes at every step
            later = b.persists or any(c not in self.local and c > max(self.local) for c in b.consumers)
            producer_mask = 1 << self.local[b.producer] if inside else 0
            self.entries.append((b.size, producer_mask, reader_mask, later))
            if inside:
                self.out_bytes[self.local[b.producer]] += b.size
                if not reader_mask and not later:
                    self.dead_outputs[self.local[b.producer]] += b.size

    def live(self, done: int) -> int:
        total = 0
        for size, producer_mask, reader_mask, later in self.entries:
            if producer_mask and not done & producer_mask:
                continue
            if later or (reader_mask & done) != reader_mask:
                total += size
        return total

    def ready(self, done: int) -> list[int]:
        return [bit for bit, mask in enumerate(self.pred_mask) if not done >> bit & 1 and mask & done == mask]


def _exact(region: list[int], preds: list[set[int]], buffers: list[_Buffer]) -> list[int]:
    cost = _RegionCost(region, preds, buffers)
    best: dict[int, tuple[int, list[int]]] = {0: (0, [])}
    frontier = [0]
    for _ in region:  # every layer of the search runs one more node
        following: dict[int, tuple[int, list[int]]] = {}
        for done in frontier:
            peak, path = best[done]
            live = cost.live(done)
            for bit in cost.ready(done):
                step_peak = max(peak, live + cost.out_bytes[bit])
                state = done | 1 << bit
                if state not in following or step_peak < following[state][0]:
                    following[state] = (step_peak, [*path, bit])
        best.update(following)
        frontier = list(following)
    (full,) = frontier
    return [region[bit] for bit in best[full][1]]


def _greedy(region: list[int], preds: list[set[int]], buffers: list[_Buffer]) -> list[int]:
    cost = _RegionCost(region, preds, buffers)
    reads: list[list[int]] = [[] for _ in region]
    for index, (_, _, reader_mask, _) in enumerate(cost.entries):
        for bit in range(len(region)):
            if reader_mask >> bit & 1:
                reads[bit].append(index)
    remaining = [reader_mask for _, _, reader_mask, _ in cost.entries]

    def freed(bit: int) -> int:
        """Bytes that die once ``bit`` has run: inputs it reads last, and its outputs nobody reads."""
        total = 0
        for index in reads[bit]:
            size, _, _, later = cost.entries[index]
            if not later and remaining[index] == 1 << bit:
                total += size
        return total + cost.dead_outputs[bit]

    done, live, path = 0, cost.live(0), []
    for _ in region:
        choice = min(cost.ready(done),
                     key=lambda bit: (live + cost.out_bytes[bit], cost.out_bytes[bit] - freed(bit), bit))
        live += cost.out_bytes[choice] - freed(choice)
        for index in reads[choice]:
            remaining[index] &= ~(1 << choice)
        done |= 1 << choice
        path.append(choice)
    return [region[bit] for bit in path]
