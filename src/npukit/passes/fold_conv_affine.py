"""Conv -> Mul / Add / Sub / Div by a constant per output channel (or one scalar) -> the Conv alone, the constant folded
into its weights and bias.

Exporters leave such affine steps after convolutions where the training framework had a learnable scale and shift of
its own (PP-LCNetV3's "learnable affine block" in PaddleOCR's PP-OCRv4 models: Conv, then Mul by a scalar, then Add of
a scalar, exported by paddle2onnx as three nodes) or an un-fused normalization written out by hand. ORT's own
ConvMulFusion / ConvAddFusion do not take them when the constant is the first operand (Mul(c, x)), and a quantizer then
puts a separate 8-bit grid on each intermediate tensor. Folded, the block is one Conv with one output grid: on
PP-OCRv4's recognizer, quantized with npukit's defaults, character agreement with the float model went from 0.884 to
0.945 and the logits' SQNR from 7.5 to 13.3 dB on 30 real text lines (AMD EPYC with AVX-512 VNNI, 2026-12-06,
benchmarks/results/third_party_zoo_quantize_1206_fold.md).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npukit.passes._rewrite import constant_array, onnx_nodes, per_channel, sole_consumer
from npukit.passes.base import NpukitPass
from npukit.passes.fold_batch_norm import fold_channel_affine

AFFINE_OPS = ("Mul", "Add", "Sub", "Div")


class FoldConvAffinePass(NpukitPass):
    """Fold ``Conv(x, W, b) op c`` into ``Conv(x, W', b')`` for op in Mul, Add, Sub, Div and a constant ``c`` that
    is one scalar or one value per output channel ((C, 1, ..., 1) or (1, C, 1, ..., 1) against the Conv output's
    rank; a (C,) constant broadcasts along the last axis and is left alone); a ConvTranspose the same (its output
    channels are axis 1 of its weight, per group). Mul: W' = W c, b' = b c; Div: the same with 1 / c; Add:
    b' = b + c; Sub (Conv output first only): b' = b - c (``fold_batch_norm.fold_channel_affine``, as a
    BatchNormalization folds). Repeats, so Conv -> Mul -> Add folds whole. New initializers, so weights shared with
    other nodes stay as they were. The folded Conv keeps its name; the affine node's output keeps its name (a
    graph output stays one). Affine nodes named in ``keep`` stay; ``producers``: the op types folded into.
    ``folded``: (affine node, conv) of each fold, in order."""

    def __init__(self, keep: frozenset[str] = frozenset(),
                 producers: tuple[str, ...] = ("Conv", "ConvTranspose")) -> None:
        super().__init__()
        self.keep = keep
        self.producers = producers
        self.folded: list[tuple[str, str]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.rewrites = 0
        self.folded = []
        changed = True
        while changed:
            changed = False
            for conv in onnx_nodes(model, self.producers):
                if conv.graph is None:  # removed by a fold earlier in this sweep
                    continue
                why = self._try_fold(conv)
                if why is None:
                    self.rewrites += 1
                    changed = True
                elif why and f"Conv {conv.name!r} keeps its {why}" not in self.notes:  # once, whatever the sweeps
                    self.note(f"Conv {conv.name!r} keeps its {why}")
        return ir.passes.PassResult(model, modified=self.rewrites > 0)

    def _try_fold(self, conv: ir.Node) -> str | None:
        """None when folded; "" when there is nothing to fold (no note); else why the affine node stays."""
        output = conv.outputs[0]
        node = sole_consumer(output)
        if node is None or node.op_type not in AFFINE_OPS or node.domain not in ("", "ai.onnx"):
            return ""
        if node.name in self.keep:
            return f"{node.op_type} {node.name!r}: asked to keep it"
        first = node.inputs[0] is output
        other = node.inputs[1] if first else node.inputs[0]
        if other is output:
            return ""  # x op x
        operand = constant_array(other)
        if operand is None:
            return ""
        if node.op_type in ("Sub", "Div") and not first:
            return f"{node.op_type} {node.name!r}: the constant is the first operand"
        weight = constant_array(conv.inputs[1]) if len(conv.inputs) > 1 else None
        if weight is None or weight.dtype.kind != "f" or weight.ndim < 3:
            return f"{node.op_type} {node.name!r}: the {conv.op_type} weight is not a constant float tensor"
        group = conv.attributes.get_int("group", 1)
        channels = weight.shape[0] if conv.op_type == "Conv" else weight.shape[1] * group
        vector = per_channel(operand, channels, weight.ndim)
        if vector is None:
            return f"{node.op_type} {node.name!r}: its constant {operand.shape} is not one value per output channel"
        if operand.dtype.kind != "f":
            return f"{node.op_type} {node.name!r}: its constant is {operand.dtype}, not floating point"
        if node.op_type == "Div" and not np.all(vector):
            return f"Div {node.name!r}: a divisor is zero"
        factor, offset = np.ones(channels), np.zeros(channels)
        if node.op_type in ("Mul", "Div"):
            factor = vector if node.op_type == "Mul" else 1.0 / vector
        else:
            offset = vector if node.op_type == "Add" else -vector
        names = (node.name or node.op_type, conv.name or conv.op_type)
        why = fold_channel_affine(conv, node, weight, factor, offset, tag="affine")
        if why is None:
            self.folded.append(names)
        return why

