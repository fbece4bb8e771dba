"""Initializers holding the same tensor (dtype, shape and bytes) -> one, read by every node that read a copy.

A model's exporter may share one weight between two layers through an Identity (RetinaFace's SSH convs: three
16x64x3x3 weights each read by two convs); constant folding evaluates the Identity into a second initializer, and
optimize-graph then wrote RetinaFace 6.5% larger than it came (423,264 -> 450,960 parameters). Tensors under
``min_elements`` are left as they are: sharing a scalar saves nothing and puts a Clip's bound and a Mul's constant on
one tensor. Graph inputs and outputs are never merged (a caller may feed or read them), as onnx-ir's own
deduplication skips them.
"""

from __future__ import annotations

import hashlib

import onnx_ir as ir

from npukit.passes.base import NpukitPass


class ShareInitializersPass(NpukitPass):
    """``rewrites`` counts the copies removed."""

    def __init__(self, *, min_elements: int = 64) -> None:
        super().__init__()
        self.min_elements = min_elements

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.rewrites = 0
        for graph in model.graphs():
            kept: dict[tuple[ir.DataType, tuple[int, ...], str], ir.Value] = {}
            for value in tuple(graph.initializers.values()):
                tensor = value.const_value
                if tensor is None or value.is_graph_input() or value.is_graph_output() \
                        or tensor.size < self.min_elements:
                    continue
                data = tensor.tobytes()
                key = (tensor.dtype, tuple(tensor.shape.numpy()), hashlib.sha256(data).hexdigest())
                first = kept.setdefault(key, value)
                if first is value or first.const_value.tobytes() != data:
                    continue
                value.replace_all_uses_with(first)
                graph.initializers.pop(value.name)
                self.rewrites += 1
        return ir.passes.PassResult(model, modified=self.rewrites > 0)
