from __future__ import annotations

import time

import onnx

from npukit.memory.lifetimes import analyze_lifetimes, lifetimes_of
from npukit.memory.order import search_order
from npukit.memory.plan import plan_memory
from npukit.memory.runtime_view import build_view

from .tiny import chain, two_branches


def _respects_dependencies(graph, order) -> bool:
    position = {name: i for i, name in enumerate(order)}
    producer = graph.producers()
    return all(position[graph.nodes[producer[t]].name] < position[node.name]
               for node in graph.nodes for t in node.inputs if t in producer)


def test_reordering_two_branches_lowers_the_peak_exactly_and_greedily():
    graph = build_view(two_branches(), view="unfused")
    assert lifetimes_of(graph).peak_bytes == 256 + 4096 + 4096  # a1 and b1 live together
    for exact_limit, exact, heuristic in ((12, 1, 0), (2, 0, 1)):
        result = search_order(graph, exact_limit=exact_limit)
        assert (result.exact_regions, result.heuristic_regions) == (exact, heuristic)
        assert result.improved
        assert result.original_peak_bytes == 8448
        assert result.peak_bytes == 256 + 4096 + 256 == lifetimes_of(graph, order=result.order).peak_bytes
        assert _respects_dependencies(graph, result.order)
        position = result.order.index
        assert position("a2") < position("b1") or position("b2") < position("a1")


def test_an_order_that_cannot_improve_is_kept():
    graph = build_view(chain(20), view="unfused")
    result = search_order(graph)
    assert not result.improved
    assert result.order == tuple(n.name for n in graph.nodes)


def test_a_thousand_node_chain_plans_quickly(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(chain(1000), str(path))
    start = time.perf_counter()
    result = plan_memory(path, target="unfused")
    seconds = time.perf_counter() - start
    assert seconds < 5.0  # about 0.3 s here; benchmarks/memory.py reports the figure
    assert result.lower_bound == 2 * 8 * 16 * 16 * 4
    assert result.best.arena_bytes == result.lower_bound
    assert len(analyze_lifetimes(chain(1000)).steps) == 1000
