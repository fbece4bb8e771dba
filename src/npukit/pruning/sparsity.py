"""Unstructured magnitude sparsity: of the Conv, ConvTranspose, Gemm and MatMul weights the given share set to zero,
the smallest in magnitude within each tensor, with the masks that keep them zero while fine-tuning.

How much each tensor loses (``densities``): the Erdos-Renyi-kernel rule of sparse training (Evci et al., RigL):
a tensor's share of kept weights is proportional to the sum of its dimensions over their product, scaled so the model
as a whole keeps ``1 - sparsity`` (tensors the scale would make denser than dense stay dense). Large 1x1 convs and
matrices lose the most; a first conv or a depthwise conv, with few weights each doing much (on the MNIST CNN, half
of the first conv's 288 weights gone cost 75 points of accuracy), loses little.

``zero_masks`` reads the masks back from a model pruned before (a weight tensor at least ``MIN_ZERO_SHARE`` zeros
keeps its zeros), so later training (``npukit qat``) keeps the sparsity that a 4-bit model then stores as long runs
of zero nibbles (``npukit.measure.size.compressed_bytes``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex

WEIGHTED = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
MIN_ZERO_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class Sparsified:
    """The model with its smallest weights zero, the masks (initializer name -> True where a weight stays), and one
    row per weight tensor (its node, size, zeros before and after)."""

    model: onnx.ModelProto
    masks: dict[str, np.ndarray]
    rows: tuple[dict[str, Any], ...]

    @property
    def sparsity(self) -> float:
        total = sum(r["weights"] for r in self.rows)
        return sum(r["zeros"] for r in self.rows) / total if total else 0.0


def weight_tensors(model: onnx.ModelProto) -> dict[str, str]:
    """Float weight initializer -> the node that reads it (the Conv / Gemm / MatMul weights, 2-D and up)."""
    inits = GraphIndex(model.graph).initializers
    found = {}
    for node in model.graph.node:
        if node.op_type in WEIGHTED and node.domain in ("", "ai.onnx") and len(node.input) > 1:
            tensor = inits.get(node.input[1])
            if tensor is not None and tensor.data_type == onnx.TensorProto.FLOAT and len(tensor.dims) >= 2:
                found.setdefault(tensor.name, node.name or node.op_type)
    return found


def densities(shapes: dict[str, tuple[int, ...]], sparsity: float) -> dict[str, float]:
    """The share of weights each tensor keeps so that ``1 - sparsity`` of all of them stay (see the module
    docstring)."""
    sizes = {k: math.prod(v) for k, v in shapes.items()}
    ratio = {k: sum(v) / sizes[k] for k, v in shapes.items()}
    keep = (1 - sparsity) * sum(sizes.values())
    dense: set[str] = set()
    while True:
        rest = [k for k in shapes if k not in dense]
        budget = keep - sum(sizes[k] for k in dense)
        scale = budget / sum(ratio[k] * sizes[k] for k in rest) if rest else 0.0
        over = {k for k in rest if scale * ratio[k] >= 1}
        if not over:
            return {k: 1.0 if k in dense else scale * ratio[k] for k in shapes}
        dense |= over


def sparsify(model: onnx.ModelProto, sparsity: float) -> Sparsified:
    """``model`` with ``sparsity`` of its weights (Conv / Gemm / MatMul), the smallest in magnitude of each tensor,
    set to zero; each tensor's share from ``densities``."""
    if not 0 < sparsity < 1:
        raise InputError(f"sparsity {sparsity} must be between 0 and 1", hint="e.g. --sparsity 0.9")
    tensors = weight_tensors(model)
    if not tensors:
        raise InputError("the model has no Conv, Gemm or MatMul weights to prune", hint="check the model")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    weights = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer if i.name in tensors}
    masks, rows = magnitude_masks(weights, sparsity), []
    for init in out.graph.initializer:
        if init.name not in tensors:
            continue
        weight, mask = weights[init.name], masks[init.name]
        rows.append({"weight": init.name, "node": tensors[init.name], "weights": int(weight.size),
                     "zeros_before": int(np.sum(weight == 0)), "zeros": int(np.sum(~mask | (weight == 0)))})
        init.CopyFrom(numpy_helper.from_array(np.where(mask, weight, 0).astype(weight.dtype), init.name))
    return Sparsified(out, masks, tuple(rows))


def zero_masks(model: onnx.ModelProto, names: set[str] | None = None) -> dict[str, np.ndarray]:
    """The masks of the float weight tensors (``names``, else every float initializer of 2-D and up) that are at
    least ``MIN_ZERO_SHARE`` zeros: True where a weight is not zero."""
    masks = {}
    for init in model.graph.initializer:
        if (names is not None and init.name not in names) or init.data_type != onnx.TensorProto.FLOAT \
                or len(init.dims) < 2:
            continue
        weight = numpy_helper.to_array(init)
        if weight.size and np.mean(weight == 0) >= MIN_ZERO_SHARE:
            masks[init.name] = weight != 0
    return masks


def magnitude_masks(weights: Mapping[str, np.ndarray], sparsity: float) -> dict[str, np.ndarray]:
    """Masks (True: kept) that zero ``sparsity`` of ``weights`` (name -> array), each tensor's share from
    ``densities``, the smallest in magnitude within each tensor."""
    keep = densities({k: tuple(v.shape) for k, v in weights.items()}, sparsity)
    masks = {}
    for name, weight in weights.items():
        order = np.argsort(np.abs(weight).reshape(-1), kind="stable")
        mask = np.ones(weight.size, dtype=bool)
        mask[order[:weight.size - int(keep[name] * weight.size + 1e-9)]] = False
        masks[name] = mask.reshape(weight.shape)
    return masks


@dataclasses.dataclass
class GradualSparsity:
    """Sparsity raised step by step while fine-tuning (Zhu and Gupta's gradual magnitude pruning): over the first
    ``ramp`` of the steps, in ``stages`` equal parts, the target goes from 0 to ``final`` along
    final x (1 - (1 - t)^3) (much early, while the network adapts, little at the end); at each stage the masks are
    recomputed from the weights as trained so far (``magnitude_masks``); the rest of the training runs at ``final``.
    ``stage`` is the last stage whose masks were set (-1: none yet): the trainer's checkpoint keeps it."""

    final: float
    names: tuple[str, ...]
    stages: int = 8
    ramp: float = 0.75
    stage: int = -1

    def target(self, stage: int) -> float:
        return self.final * (1 - (1 - (stage + 1) / self.stages) ** 3)

    def stage_at(self, step: int, total: int) -> int:
        """The stage ``step`` (of ``total``) is in; the last step of the ramp is always the final stage, however
        few the steps: a run of 2 steps (17 samples, batch 8) stopped at stage 5 of 8, 49.2% where 50% was asked."""
        if step >= max(1, math.ceil(self.ramp * total)) - 1:
            return self.stages - 1
        return min(self.stages - 1, int(step * self.stages / max(1.0, self.ramp * total)))

    @property
    def done(self) -> bool:
        return self.stage == self.stages - 1

    def masks_at(self, step: int, total: int, weights: Callable[[], Mapping[str, np.ndarray]]
                 ) -> dict[str, np.ndarray] | None:
        """New masks when ``step`` starts a stage, else None; ``weights`` gives the current weights."""
        stage = self.stage_at(step, total)
        if stage == self.stage:
            return None
        self.stage = stage
        return magnitude_masks(dict(weights()), self.target(stage))
