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
        initializers = len(model.graph.initializers)
        functions = len(model.functions)
        opsets = len(model.opset_imports)
        results = [
            common.RemoveUnusedNodesPass()(model),
            common.RemoveUnusedFunctionsPass()(model),
            common.RemoveUnusedOpsetsPass()(model),
        ]
        self.rewrites = (
            nodes - sum(1 for _ in model.graph.all_nodes())
            + initializers - len(model.graph.initializers)
            + functions - len(model.functions)
            + opsets - len(model.opset_imports)
        )
        for value in model.graph.inputs:
            if value.is_initializer() and not value.uses() and not value.is_graph_output():
                self.note(f"initializer {value.name!r} is unused but kept: it is also a graph input")
        return ir.passes.PassResult(model, modified=any(r.modified for r in results))
