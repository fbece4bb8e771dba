"""Nodes whose inputs are all constant -> initializers holding their values; Constant nodes -> initializers."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common  # noqa: F401 - ir.passes.common is not imported by onnx_ir itself

from npukit.passes._rewrite import constant_array
from npukit.passes.base import NpukitPass

# onnxscript's folder keeps these even when their inputs are constant; the note says why.
_KEPT_ON_PURPOSE = {
    "ConstantOfShape": "ConstantOfShape is kept: folding would store a filled tensor instead of its shape",
    "QuantizeLinear": "QuantizeLinear is kept: it carries quantization parameters",
    "DequantizeLinear": "DequantizeLinear is kept: it carries quantization parameters",
    "DynamicQuantizeLinear": "DynamicQuantizeLinear is kept: it carries quantization parameters",
}
_RANDOM_OPS = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial"})


class FoldConstantsPass(NpukitPass):
    """Evaluate constant subgraphs with onnxscript's folder, then lift every remaining Constant node to an initializer.

    ``rewrites`` counts the nodes the pass removed (folded into initializers, forwarded, or lifted).
    ``input_size_limit`` is the largest constant input (elements) the folder evaluates; ``output_size_limit`` the
    largest result it stores when that grows the model.
    """

    def __init__(self, *, input_size_limit: int = 1 << 22, output_size_limit: int = 1 << 18) -> None:
        super().__init__()
        self.input_size_limit = input_size_limit
        self.output_size_limit = output_size_limit

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from onnxscript.optimizer import FOLDED_FROM_KEY, fold_constants  # imported here: onnxscript is slow to import

        nodes_before = sum(1 for _ in model.graph.all_nodes())
        folded = fold_constants(
            model,
            onnx_shape_inference=True,
            input_size_limit=self.input_size_limit,
            output_size_limit=self.output_size_limit,
        )
        lifted = ir.passes.common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
        modified = folded.modified or lifted.modified
        for value in _all_values(model):  # the folder's provenance notes would be saved into the file
            value.metadata_props.pop(FOLDED_FROM_KEY, None)
        self.rewrites = max(0, nodes_before - sum(1 for _ in model.graph.all_nodes()))
        self._explain_leftovers(model)
        return ir.passes.PassResult(model, modified=modified)

    def _explain_leftovers(self, model: ir.Model) -> None:
        for node in model.graph.all_nodes():
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "Constant":
                why = "its output is a graph output" if node.outputs[0].is_graph_output() else "its value is sparse"
                self.note(f"Constant {node.name!r} is kept: {why}")
                continue
            if not node.inputs:
                continue
            if any(v is not None and constant_array(v) is None for v in node.inputs):
                continue
            if node.op_type in _KEPT_ON_PURPOSE:
                self.note(f"{node.op_type} {node.name!r}: {_KEPT_ON_PURPOSE[node.op_type]}")
            elif node.op_type in _RANDOM_OPS:
                self.note(f"{node.op_type} {node.name!r} is kept: it is random")
            elif len(node.outputs) > 1:
                self.note(f"{node.op_type} {node.name!r} is kept: the folder does not fold nodes with several outputs")
            else:
                self.note(
                    f"{node.op_type} {node.name!r} is kept: its inputs or result exceed the folding size limits "
                    f"({self.input_size_limit} / {self.output_size_limit} elements) or it cannot be evaluated"
                )


def _all_values(model: ir.Model) -> list[ir.Value]:
    values = list(model.graph.inputs) + list(model.graph.initializers.values())
    for node in model.graph.all_nodes():
        values.extend(node.outputs)
    return values
