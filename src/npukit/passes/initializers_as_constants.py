"""Initializers listed as graph inputs -> constants: removed from the inputs (the IR version raised to 4 where lower).

ONNX models of IR version 3 and less list every initializer as a graph input too (CenterFace's does), and exporters
sometimes still write them so. ONNX Runtime then treats each as an input a caller may override: it does not fold
them, its quantizer sees activations where weights are, and it warns once per initializer on the terminal. Removing
them from the inputs leaves the computation unchanged; a caller who fed new weights at run time could no longer do
so, which the pass notes. onnx-ir's ``RemoveInitializersFromInputsPass`` does the removal.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import RemoveInitializersFromInputsPass

from npukit.passes.base import NpukitPass


class InitializersAsConstantsPass(NpukitPass):
    """Remove initializers from the main graph's inputs; raise the IR version to 4 (which allows it) where lower."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        listed = [v.name for v in model.graph.inputs if v.name in model.graph.initializers]
        self.rewrites = len(listed)
        if not listed:
            return ir.passes.PassResult(model, modified=False)
        RemoveInitializersFromInputsPass()(model)
        if model.ir_version < 4:
            self.note(f"IR version {model.ir_version} -> 4 (initializers need not be graph inputs from IR 4 on)")
            model.ir_version = 4
        self.note(f"{len(listed)} initializers were also graph inputs; they are constants now (e.g. {listed[0]})")
        return ir.passes.PassResult(model, modified=True)
