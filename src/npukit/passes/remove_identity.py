"""Identity, inference-mode Dropout and no-op Reshape/Flatten -> their input, wired straight to the consumers."""

from __future__ import annotations

import onnx_ir as ir

from npukit.passes._rewrite import bypass, constant_array, rank
from npukit.passes.base import NpukitPass

_OPS = ("Identity", "Dropout", "Reshape", "Flatten")


class RemoveIdentityPass(NpukitPass):
    """Remove nodes that pass their first input through unchanged, in the graph, its subgraphs and functions.

    A graph output produced by a removed node keeps its name: the producer of the input is renamed to it.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.rewrites = 0
        nodes = [n for n in ir.traversal.RecursiveGraphIterator(model.graph)]
        for function in model.functions.values():
            nodes.extend(ir.traversal.RecursiveGraphIterator(function))
        for node in nodes:
            if node.domain not in ("", "ai.onnx") or node.op_type not in _OPS or not node.inputs:
                continue
            source = node.inputs[0]
            if source is None:
                continue
            if node.op_type == "Identity":
                why = None
            elif node.op_type == "Dropout":
                why = self._dropout_kept(node)
            elif node.op_type == "Reshape":
                if not _reshape_is_noop(node):
                    continue
                why = None
            else:
                if not _flatten_is_noop(node):
                    continue
                why = None
            if why is None:
                why = bypass(node, node.outputs[0], source)
            if why is None:
                self.rewrites += 1
            else:
                self.note(f"{node.op_type} {node.name!r} is kept: {why}")
        return ir.passes.PassResult(model, modified=self.rewrites > 0)

    @staticmethod
    def _dropout_kept(node: ir.Node) -> str | None:
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            training = constant_array(node.inputs[2])
            if training is None:
                return "training_mode is not a constant"
            if bool(training.reshape(-1)[0]):
                return "training_mode is true"
        if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
            return "its mask output is used"
        return None


def _reshape_is_noop(node: ir.Node) -> bool:
    """True when the target shape repeats the input's dims: 0 (copy), the same static size, or one -1."""
    source = node.inputs[0]
    target = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if target is None or source is None or source.shape is None or target.ndim != 1:
        return False
    if len(target) != len(source.shape):
        return False
    allow_zero = node.attributes.get_int("allowzero", 0)
    inferred = 0
    for wanted, dim in zip(target.tolist(), source.shape):
        if wanted == 0 and not allow_zero:
            continue
        if wanted == -1:
            inferred += 1
            continue
        if not isinstance(dim, int) or wanted != dim:
            return False
    return inferred <= 1


def _flatten_is_noop(node: ir.Node) -> bool:
    axis = node.attributes.get_int("axis", 1)
    return rank(node.inputs[0]) == 2 and axis in (1, -1)
