"""Nodes, initializers, functions and opset imports nothing uses -> removed."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common  # noqa: F401 - ir.passes.common is not imported by onnx_ir itself

from npukit.passes.base import NpukitPass


class RemoveDeadCodePass(NpukitPass):
    """Remove what no graph output depends on; ``rewrites`` counts removed nodes, initializers, functions and
    model opset imports.

    Graph inputs and outputs are never touched, so the model keeps its signature; an initializer that is also a
    graph input stays (the caller may feed it).
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        common = ir.passes.common
        nodes = sum(1 for _ in model.graph.all_nodes())
        initializers = _initializers(model)
        functions = len(model.functions)
        opsets = len(model.opset_imports)
        results = [
            common.RemoveUnusedNodesPass()(model),
            common.RemoveUnusedFunctionsPass()(model),
            common.RemoveUnusedOpsetsPass()(model),
        ]
        detached = _remove_initializers_used_only_by_detached_nodes(model)
        self.rewrites = (
            nodes - sum(1 for _ in model.graph.all_nodes())
            + initializers - _initializers(model)
            + functions - len(model.functions)
            + opsets - len(model.opset_imports)
        )
        for value in model.graph.inputs:
            if value.is_initializer() and not value.uses() and not value.is_graph_output():
                self.note(f"initializer {value.name!r} is unused but kept: it is also a graph input")
        return ir.passes.PassResult(model, modified=detached or any(r.modified for r in results))


def _initializers(model: ir.Model) -> int:
    return sum(len(graph.initializers) for graph in (model.graph, *model.graph.subgraphs()))


def _remove_initializers_used_only_by_detached_nodes(model: ir.Model) -> bool:
    """Remove the initializers of the main graph and of every subgraph (an If's branches, a Loop's body) that no
    node left in the model uses: onnx-ir keeps the uses of nodes in a subgraph that was dropped, e.g. the branch of
    an If the constant folder did not take, so onnx-ir's pass counts them as used and the file kept their weights
    (silero VAD grew by 36%); and its pass cleans the main graph's initializers only, so the weights a subgraph's
    folded nodes no longer read stayed in the branches (silero VAD again: 2.2 -> 3.2 MiB, and ORT warned of each)."""
    live = {id(node) for node in model.graph.all_nodes()}
    for function in model.functions.values():
        live.update(id(node) for node in function.all_nodes())
    removed = False
    for graph in (model.graph, *model.graph.subgraphs()):
        dead = [name for name, value in graph.initializers.items()
                if not value.is_graph_input() and not value.is_graph_output()
                and (graph is not model.graph or value.uses())  # the main graph's unused: onnx-ir's pass
                and not any(id(node) in live for node, _ in value.uses())]
        for name in dead:
            del graph.initializers[name]
        removed = removed or bool(dead)
    return removed
