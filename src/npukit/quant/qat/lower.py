"""Lowering the training twin's weights below 8 bits: each weight quantizer (but the ones kept at 8 bits) moves to
the narrower clipped grid (``WeightQuant.set_bits``: per channel, the edge with the least rounding error), and the
weights of every 2-D Conv, Gemm and MatMul reading one are re-rounded on that grid by GPTQ
(``npukit.quant.algorithms.gptq``) against their layer's input as the twin computes it on calibration samples (8-bit
activations, the earlier weights as they were before this lowering). A layer keeps the GPTQ integers only where they
reconstruct its output better than nearest rounding on those inputs. A pruned weight (``sparse``: its zeros must
stay zero) keeps nearest rounding: GPTQ would spread rounding errors onto its zeros.

Why both. MobileNetV2 (official weights), every weight at 4 bits but the depthwise convs, 8-bit activations, 208
held-out crops: nearest rounding on max|w| / 7 grids 13.5% top-1 agreement / 1.1 dB logits SQNR; on the clipped
grids 25.5% / 3.5 dB; with GPTQ on them 56.7% / 8.7 dB (64 calibration crops, one pass, 51 s on 2 cores). With
every weight at 4 bits: 13.9% / -0.2 dB, 28.4% / 2.1 dB, 47.1% / 7.0 dB. The lowered weights are where training
starts from (and the PTQ model of the same bits that QAT is compared with).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from npukit.quant.algorithms.gptq import input_rows, reround, row_limit
from npukit.quant.qat.fake_quant import WeightQuant, set_weight_bits
from npukit.quant.qat.ops import _spatial_pads
from npukit.quant.qat.program import OnnxProgram


@dataclasses.dataclass(frozen=True)
class Lowering:
    """One lowering: the bits, the samples the Hessians were measured on, its wall time, and per re-rounded layer
    the gain in its output error over nearest rounding (dB, on those samples); ``nearest``: the lowered weights
    that kept nearest rounding (GPTQ did not reconstruct better, too few input rows, or an op it does not lay
    out)."""

    bits: int
    samples: int
    seconds: float
    gains_db: Mapping[str, float]
    nearest: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"bits": self.bits, "samples": self.samples, "seconds": round(self.seconds, 1),
                "gains_db": {k: round(v, 2) for k, v in self.gains_db.items()}, "nearest": list(self.nearest)}


@dataclasses.dataclass(frozen=True)
class _Site:
    key: str  # the weight quantizer
    weight: str  # the weight's initializer
    node: Any  # the reading node (program ``_Node``)


def lower_weights(program: OnnxProgram, bits: int, samples: Sequence[Mapping[str, np.ndarray]], *,
                  keep: frozenset[str] = frozenset(), sparse: frozenset[str] = frozenset(), seed: int = 0
                  ) -> Lowering:
    """Lower ``program``'s weights to ``bits`` (see the module docstring), in place; ``samples``: feeds of one
    sample each; ``keep``: quantizer keys that keep 8 bits; ``sparse``: initializers whose zeros stay zero."""
    start = time.perf_counter()
    set_weight_bits(program, bits, keep=keep)
    sites, other = _sites(program, keep, sparse)
    hessians, counts = _hessians(program, sites, samples, np.random.default_rng(seed))
    weights = program.trained_initializers()
    gains: dict[str, float] = {}
    nearest = list(other)
    for site in sites:
        module = program.quant[site.key]
        w = weights[site.weight].detach()
        rows, layout = _rows_of(site.node, w)
        scale = np.broadcast_to(module.scale(w).detach().double().numpy().reshape(-1),
                                (rows.shape[0] * rows.shape[1],)).reshape(rows.shape[:2])
        found = (reround(rows, hessians[site.key], counts[site.key], scale, module.qmin, module.qmax)
                 if site.key in counts else None)
        if found is None:
            nearest.append(site.node.name or site.weight)
            continue
        ints, gains[site.node.name or site.weight] = found
        with torch.no_grad():
            w.copy_(torch.from_numpy(layout(ints * scale[:, :, None])).to(w.dtype))
    return Lowering(bits, len(samples), time.perf_counter() - start, gains, tuple(nearest))


def _sites(program: OnnxProgram, keep: frozenset[str], sparse: frozenset[str]) -> tuple[list[_Site], list[str]]:
    """The lowered weights GPTQ lays out (their reader a 2-D Conv, a Gemm or a 2-D MatMul weight; not pruned), and
    the names of the others."""
    readers: dict[str, Any] = {}
    for node in program.nodes:
        for name in node.inputs:
            readers.setdefault(name, node)
    weights = program.trained_initializers()
    sites, other = [], []
    for node in program.nodes:
        if node.op_type != "FakeQuant" or node.attrs.get("kind") != "weight" or node.attrs["key"] in keep:
            continue
        module = program.quant[node.attrs["key"]]
        if not isinstance(module, WeightQuant) or module.rule != "clipped":
            continue
        reader = readers.get(node.outputs[0])
        weight = weights.get(node.inputs[0])
        if reader is None or weight is None or node.inputs[0] in sparse or reader.inputs[1:2] != (
                node.outputs[0],) or not _laid_out(reader, weight, module):
            other.append(node.inputs[0] if reader is None else reader.name or node.inputs[0])
            continue
        sites.append(_Site(node.attrs["key"], node.inputs[0], reader))
    return sites, other


def _laid_out(node: Any, w: torch.Tensor, module: WeightQuant) -> bool:
    """Whether the weight's rows line up with its per-channel scales: output channels of a 2-D Conv (axis 0), the
    output columns of a Gemm or MatMul."""
    axis = None if module.fixed_scale.numel() == 1 else module.axis
    if node.op_type == "Conv":
        return w.dim() == 4 and axis in (None, 0)
    if node.op_type == "Gemm":
        return w.dim() == 2 and not node.attrs.get("transA", 0) and axis in (None, 0 if node.attrs.get(
            "transB", 0) else 1)
    return node.op_type == "MatMul" and w.dim() == 2 and axis in (None, 1)


def _rows_of(node: Any, w: torch.Tensor) -> tuple[np.ndarray, Any]:
    """The weight as (groups, rows, K) float64 rows, one per output channel, and the function that lays such rows
    back out in the weight's shape."""
    value = w.detach().double().numpy()
    if node.op_type == "Conv":
        groups = int(node.attrs.get("group", 1))
        return value.reshape(groups, value.shape[0] // groups, -1), lambda r: r.reshape(value.shape)
    if node.op_type == "Gemm" and node.attrs.get("transB", 0):
        return value[None], lambda r: r[0]
    return value.T[None], lambda r: r[0].T


def _hessians(program: OnnxProgram, sites: list[_Site], samples: Sequence[Mapping[str, np.ndarray]],
              rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Per site, the sum over the samples' input rows of x^T x (groups, K, K), and the number of rows."""
    hessians: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    training = program.training
    program.eval()
    with torch.no_grad():
        for sample in samples:
            env = program.run({k: torch.as_tensor(v) for k, v in sample.items()})
            for site in sites:
                rows = _input_rows(site.node, env[site.node.inputs[0]], env[site.node.inputs[1]], rng)
                if rows is None:
                    continue
                t = torch.from_numpy(np.ascontiguousarray(rows, np.float64))
                hessians[site.key] = hessians.get(site.key, 0.0) + torch.bmm(t.transpose(1, 2), t).numpy()
                counts[site.key] = counts.get(site.key, 0) + rows.shape[1]
    program.train(training)
    return hessians, counts


def _input_rows(node: Any, x: torch.Tensor, w: torch.Tensor, rng: np.random.Generator) -> np.ndarray | None:
    """The node's input as (groups, rows, K), K in the order of ``_rows_of``; None for a layout it does not have."""
    if node.op_type != "Conv":
        k = w.shape[1] if node.op_type == "Gemm" and node.attrs.get("transB", 0) else w.shape[0]
        return x.reshape(-1, k).numpy()[None] if x.numel() % k == 0 else None
    if x.dim() != 4:
        return None
    groups = int(node.attrs.get("group", 1))
    kernel = list(node.attrs.get("kernel_shape", w.shape[2:]))
    strides = list(node.attrs.get("strides", [1, 1]))
    dilations = list(node.attrs.get("dilations", [1, 1]))
    pads = _spatial_pads(node.attrs, x, kernel, strides, dilations)
    k = w.shape[1] * kernel[0] * kernel[1]
    return input_rows(x.numpy(), kernel=kernel, pads=pads, strides=strides, dilations=dilations, groups=groups,
                      rng=rng, limit=row_limit(groups, k))
