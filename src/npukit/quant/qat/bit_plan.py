"""Which weights stay at 8 bits when the others go to 4: each weight's sensitivity is measured alone (the start,
with that one weight rounded to the narrower grid, against the float model on the same samples: SQNR over the
outputs), and the most sensitive weights keep 8 bits, most sensitive first, while the weights kept stay within
``share`` of all quantized weights. A 4-bit depthwise conv has few weights and can ruin a model on its own
(MobileNetV2: one of them takes the logits to 2 dB); keeping such layers costs little size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from npukit.quant.qat.fake_quant import WeightQuant
from npukit.quant.qat.program import OnnxProgram
from npukit.quant.qat.train import Batched


@dataclasses.dataclass(frozen=True)
class LayerBits:
    """One weight: its quantizer key, its tensor, the node reading it, how many weights it holds, the outputs' SQNR
    with it alone at the narrower bits, and the bits it trains at."""

    key: str
    tensor: str
    node: str
    weights: int
    sqnr_db: float
    bits: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BitPlan:
    """The weight bits of every quantized weight; ``share``: the fraction of the weights allowed at 8 bits."""

    bits: int
    share: float
    samples: int
    layers: tuple[LayerBits, ...]

    @property
    def eight_bit(self) -> frozenset[str]:
        """The quantizer keys that keep 8 bits."""
        return frozenset(layer.key for layer in self.layers if layer.bits == 8)

    @property
    def kept_share(self) -> float:
        total = sum(layer.weights for layer in self.layers)
        return sum(layer.weights for layer in self.layers if layer.bits == 8) / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"bits": self.bits, "share": self.share, "samples": self.samples, "kept_share": self.kept_share,
                "layers": [layer.as_dict() for layer in self.layers]}


def plan_bits(student: OnnxProgram, teacher: OnnxProgram, feeds: Mapping[str, np.ndarray], *, bits: int,
              share: float) -> BitPlan:
    """The plan for ``student`` (the twin at its start, 8-bit weights) lowered to ``bits``: see the module
    docstring. ``feeds``: input name -> samples on axis 0."""
    inputs = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}
    weights = student.trained_initializers()
    readers = {name: node.name or node.op_type for node in student.nodes for name in node.inputs}
    quantizers = [(node.attrs["key"], node.inputs[0], readers.get(node.outputs[0], "")) for node in student.nodes
                  if node.op_type == "FakeQuant" and node.attrs.get("kind") == "weight"
                  and isinstance(student.quant[node.attrs["key"]], WeightQuant)
                  and student.quant[node.attrs["key"]].rule != "fixed"]
    with torch.no_grad():
        reference = Batched(teacher)(inputs)
        measured = []
        for key, tensor, node in quantizers:
            module = student.quant[key]
            saved = module.grid_state()
            module.set_bits(bits, weights[tensor])
            try:
                sqnr = _sqnr(Batched(student)(inputs), reference)
            finally:
                module.restore_grid(saved)
            measured.append((key, tensor, node, int(weights[tensor].numel()), sqnr))
    budget = share * sum(m[3] for m in measured)
    kept, used = set(), 0
    for key, _, _, count, _ in sorted(measured, key=lambda m: m[4]):
        if used + count <= budget:
            kept.add(key)
            used += count
    layers = tuple(LayerBits(key, tensor, node, count, sqnr, 8 if key in kept else bits)
                   for key, tensor, node, count, sqnr in measured)
    return BitPlan(bits, share, len(next(iter(feeds.values()))), layers)


def _sqnr(student: list[torch.Tensor], teacher: list[torch.Tensor]) -> float:
    pairs = [(s.double(), t.double()) for s, t in zip(student, teacher) if t.is_floating_point()]
    signal = sum(float(t.square().sum()) for _, t in pairs)
    noise = sum(float((s - t).square().sum()) for s, t in pairs)
    return 10 * math.log10(signal / noise) if noise > 0 and signal > 0 else math.inf
