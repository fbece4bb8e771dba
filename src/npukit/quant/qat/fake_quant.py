"""Fake quantization on exactly the grids of a QDQ model, for training: round to the grid and back in float, with the
straight-through estimator for the rounding (the gradient passes where the value is inside the grid and stops where
it is clamped).

``ActivationQuant``: a Q -> DQ pair on an activation; its scale and zero point are the model's (fixed), or the scale
is learned (LSQ: Esser et al. 2020, with its gradient scale 1 / sqrt(elements x levels)).

``WeightQuant``: a weight's grid, symmetric, per channel or per tensor, with one of four rules:
``absmax`` (scale = largest |w| of the channel / ``levels``, recomputed from the weights on every step, as the PTQ
rule that made the grid: 127 levels, 64 for ORT's 7-bit ``reduce_range``), ``pair`` (the
pair-bounded grid of ``npukit.quant.cpu.schemes``: each pair of input channels' integers within 128 levels together,
so AVX2 kernels without VNNI do not saturate), ``fixed`` (the model's scales and zero points, e.g. asymmetric
weights) or ``clipped`` (weights lowered below 8 bits: each channel's scale fixed when the bits are lowered, at the
edge with the least rounding error, ``npukit.quant.grids.clipped_weight_scale``); with ``learn_scale`` the scale is
a parameter started from the rule's. The rule's integers are what the
exported model stores, so the ONNX model computes what training simulated.

``BiasQuant``: an int32 bias on the grid of (input scale x weight scale), as ORT's quantizer writes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from npukit.quant.cpu.schemes import pair_bounded_scale


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """Round half to even (as ONNX QuantizeLinear), gradient 1."""
    return x + (torch.round(x) - x).detach()


def grad_scaled(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``x`` in value, its gradient multiplied by ``factor`` (LSQ's step-size gradient scale)."""
    return (x - x * factor).detach() + x * factor


def _shape_for(scale: torch.Tensor, x: torch.Tensor, axis: int | None) -> torch.Tensor:
    if axis is None or scale.numel() == 1:
        return scale.reshape([])
    shape = [1] * x.dim()
    shape[axis % x.dim()] = -1
    return scale.reshape(shape)


def fake_quant(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, qmin: int, qmax: int,
               axis: int | None) -> torch.Tensor:
    s, z = _shape_for(scale, x, axis), _shape_for(zero, x, axis)
    q = torch.clamp(round_ste(x / s) + z, qmin, qmax)
    return (q - z) * s


class ActivationQuant(nn.Module):
    """A Q -> DQ pair on an activation (see the module docstring)."""

    def __init__(self, scale: np.ndarray, zero_point: np.ndarray, qmin: int, qmax: int, *, axis: int | None = None,
                 learn_scale: bool = False) -> None:
        super().__init__()
        value = torch.tensor(np.asarray(scale, np.float32).reshape(-1))
        self.scale_ = nn.Parameter(value) if learn_scale else None
        self.register_buffer("fixed_scale", value)
        self.register_buffer("zero_point", torch.tensor(np.asarray(zero_point, np.float32).reshape(-1)))
        self.qmin, self.qmax, self.axis, self.learn = int(qmin), int(qmax), axis, learn_scale

    def scale(self) -> torch.Tensor:
        if self.scale_ is None:
            return self.fixed_scale
        return self.scale_.abs().clamp_min(1e-9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale()
        if self.learn:
            scale = grad_scaled(scale, 1.0 / math.sqrt(max(1, x[0].numel()) * max(1, self.qmax)))
        return fake_quant(x, scale, self.zero_point, self.qmin, self.qmax, self.axis)

    def exported(self) -> tuple[np.ndarray, np.ndarray]:
        """(scale, zero point) as the model stores them."""
        return self.scale().detach().numpy().astype(np.float32), self.zero_point.numpy()


class WeightQuant(nn.Module):
    """A weight's grid (see the module docstring). ``rows`` turns the weight into (output channels, K) rows in the
    order the integer GEMM pairs them (the pair rule only)."""

    RULES = ("absmax", "pair", "fixed", "clipped")

    def __init__(self, rule: str, *, levels: int, axis: int | None, scale: np.ndarray, zero_point: np.ndarray,
                 qmin: int, qmax: int, transpose_rows: bool = False, learn_scale: bool = False) -> None:
        super().__init__()
        if rule not in self.RULES:
            raise ValueError(f"unknown weight rule {rule!r}")
        self.rule, self.levels, self.axis, self.transpose_rows = rule, int(levels), axis, transpose_rows
        self.qmin, self.qmax = int(qmin), int(qmax)
        value = torch.tensor(np.asarray(scale, np.float32).reshape(-1))
        self.scale_ = nn.Parameter(value) if learn_scale else None
        self.register_buffer("fixed_scale", value)
        self.register_buffer("zero_point", torch.tensor(np.asarray(zero_point, np.float32).reshape(-1)))

    def set_bits(self, bits: int, w: torch.Tensor) -> None:
        """Lower the weights to ``bits`` (< 8) symmetric bits: levels 2^(bits-1) - 1 on the clipped rule, the scales
        searched on ``w`` now (the 8-bit pair and 7-bit rules are what this CPU's int8 kernels need; a narrower grid
        needs neither). A learned scale restarts from the new rule's."""
        from npukit.quant.grids import clipped_weight_scale

        if self.rule == "fixed":
            raise ValueError("a fixed (asymmetric) weight grid has no bit width to lower")
        if bits >= 8:
            raise ValueError(f"weights are lowered below 8 bits, not to {bits}")
        levels = 2 ** (bits - 1) - 1
        self.rule, self.levels = "clipped", levels
        self.qmin, self.qmax = -levels, levels
        scale = clipped_weight_scale(w.detach().numpy(), self.axis, levels)
        self.fixed_scale = torch.from_numpy(scale)
        self.zero_point = torch.zeros_like(self.fixed_scale)
        if self.scale_ is not None:
            self.scale_.data = self.fixed_scale.clone()

    def grid_state(self) -> dict[str, Any]:
        """What a bit change alters (rule, levels, range, scales), to put back with ``restore_grid``."""
        return {"rule": self.rule, "levels": self.levels, "qmin": self.qmin, "qmax": self.qmax,
                "fixed_scale": self.fixed_scale.clone(), "zero_point": self.zero_point.clone(),
                "learned": None if self.scale_ is None else self.scale_.detach().clone()}

    def restore_grid(self, state: Mapping[str, Any]) -> None:
        self.rule, self.levels, self.qmin, self.qmax = state["rule"], state["levels"], state["qmin"], state["qmax"]
        self.fixed_scale, self.zero_point = state["fixed_scale"].clone(), state["zero_point"].clone()
        if state.get("learned") is not None and self.scale_ is not None:
            self.scale_.data = state["learned"].clone()

    def _rule_scale(self, w: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if self.rule == "pair":  # the PTQ rule itself (in float64, as the grid was made)
                rows = w.t() if self.transpose_rows else w.reshape(w.shape[0], -1)
                return torch.from_numpy(pair_bounded_scale(rows.numpy(), per_channel=self.axis is not None)
                                        ).reshape(-1)
            else:
                if self.axis is None:
                    top = w.abs().amax().reshape(1)
                else:
                    dims = [d for d in range(w.dim()) if d != self.axis % w.dim()]
                    top = w.abs().amax(dim=dims) if dims else w.abs()
                scale = top / self.levels
            return torch.where(scale > 0, scale, torch.ones_like(scale))

    def scale(self, w: torch.Tensor) -> torch.Tensor:
        if self.scale_ is not None:
            learned = self.scale_.abs().clamp_min(1e-12)
            if self.rule == "pair":  # never finer than the pair bound: the kernel would saturate
                learned = torch.maximum(learned, self._rule_scale(w.detach()))
            return learned
        if self.rule in ("fixed", "clipped"):
            return self.fixed_scale
        return self._rule_scale(w.detach())

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        scale = self.scale(w)
        if self.scale_ is not None:
            per = w.numel() // max(1, scale.numel())
            scale = grad_scaled(scale, 1.0 / math.sqrt(max(1, per) * max(1, self.qmax)))
        return fake_quant(w, scale, self.zero_point, self.qmin, self.qmax, self.axis)

    def exported(self, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(integers, scale, zero point) as the model stores them."""
        with torch.no_grad():
            scale = self.scale(w)
            s, z = _shape_for(scale, w, self.axis), _shape_for(self.zero_point, w, self.axis)
            q = torch.clamp(torch.round(w / s) + z, self.qmin, self.qmax)
        return q.numpy().astype(np.int64), scale.numpy().astype(np.float32), self.zero_point.numpy()


class BiasQuant(nn.Module):
    """An int32 bias on the grid (input scale x weight scale); ``input_key`` / ``weight_key`` name the quantizers
    of the node's input and weight, ``weight`` the weight tensor."""

    QMIN, QMAX = -2 ** 31, 2 ** 31 - 1

    def __init__(self, input_key: str, weight_key: str, weight: str) -> None:
        super().__init__()
        self.input_key, self.weight_key, self.weight = input_key, weight_key, weight

    @staticmethod
    def grid(input_scale: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
        return (input_scale.detach().reshape(-1) * weight_scale.detach().reshape(-1)).to(torch.float32)

    def forward(self, b: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        q = torch.clamp(round_ste(b / scale), self.QMIN, self.QMAX)
        return q * scale

    @staticmethod
    def exported(b: torch.Tensor, scale: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            q = torch.clamp(torch.round(b / scale), BiasQuant.QMIN, BiasQuant.QMAX)
        return q.numpy().astype(np.int64), scale.numpy().astype(np.float32)


def set_weight_bits(program, bits: int, *, keep: frozenset[str] = frozenset()) -> None:
    """Every weight quantizer of ``program`` (an ``OnnxProgram`` with FakeQuant nodes) but those keyed in ``keep``
    (they stay as they are: ``npukit.quant.qat.bit_plan``) to ``bits``, each grid re-derived from its current
    weights (``WeightQuant.set_bits``). A fixed asymmetric grid (the int8 constant of a Mul or Add, such as a
    GroupNorm's affine after its InstanceNormalization, not a conv or matmul weight) stays at its 8 bits."""
    weights = program.trained_initializers()
    for node in program.nodes:
        if node.op_type == "FakeQuant" and node.attrs.get("kind") == "weight" and node.attrs["key"] not in keep \
                and getattr(program.quant[node.attrs["key"]], "rule", None) != "fixed":
            program.quant[node.attrs["key"]].set_bits(bits, weights[node.inputs[0]])
