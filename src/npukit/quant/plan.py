"""The quantization plan: what each tensor of a model is quantized to, which nodes stay in float, and which step
decided each of them and why.

``TensorSpec`` is one tensor's quantization, frozen and checked on creation (in the spirit of torch.ao's
``QuantizationSpec``): its dtype (int4 / uint4 / int8 / uint8 / int16 / uint16, int32 for biases, or float16 /
float32 for a tensor kept in floating point), symmetric or not, per tensor, per channel (``axis``) or per block (``axis`` and
``block_size``), its integer range when narrower than the dtype's (ONNX Runtime's 7-bit ``reduce_range`` weights:
[-64, 64]), its real range once calibrated and its scales and zero points once known.

``QuantPlan`` maps tensors to specs and holds the scheme's defaults (for tensors the plan does not name, a weight or
activation gets the scheme's dtype) and the nodes left in float. Every entry carries its provenance: the
``Decision`` s (step, why) that set it, in order. Steps return a new plan (``with_spec``, ``keep_float``); emitters
turn a plan into an artifact (``npukit.quant.emit.ort_qdq``: ONNX QDQ through ONNX Runtime's quantizer), and
``npukit.quant.emit.ort_qdq.resolve_grids`` records the grids an emitted model actually has, so the plan a report shows is
the model's.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import types
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from npukit.errors import InputError

# dtype -> (qmin, qmax) of its integers; None: floating point (not quantized)
DTYPES: dict[str, tuple[int, int] | None] = {
    "int4": (-8, 7), "uint4": (0, 15), "int8": (-128, 127), "uint8": (0, 255),
    "int16": (-32768, 32767), "uint16": (0, 65535), "int32": (-2**31, 2**31 - 1), "float16": None, "float32": None,
}
SIXTEEN_BIT = {"int8": "int16", "uint8": "uint16"}  # an 8-bit type's 16-bit type of the same signedness


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise InputError(message, hint="see npukit.quant.plan.TensorSpec")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor's quantization; see the module docstring. ``quant_min`` / ``quant_max`` default to the dtype's
    range; ``scale`` and ``zero_point`` hold one value per tensor, channel (along ``axis``) or block."""

    dtype: str
    symmetric: bool = False
    axis: int | None = None
    block_size: int | None = None
    quant_min: int | None = None
    quant_max: int | None = None
    range: tuple[float, float] | None = None
    scale: tuple[float, ...] | None = None
    zero_point: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _require(self.dtype in DTYPES, f"unknown dtype {self.dtype!r}: one of {', '.join(DTYPES)}")
        bounds = DTYPES[self.dtype]
        if bounds is None:
            _require(self.axis is None and self.block_size is None and self.scale is None
                     and self.zero_point is None and self.quant_min is None and self.quant_max is None,
                     f"a {self.dtype} tensor has no grid (axis, block size, scale, zero point, integer range)")
        else:
            lo = bounds[0] if self.quant_min is None else int(self.quant_min)
            hi = bounds[1] if self.quant_max is None else int(self.quant_max)
            _require(bounds[0] <= lo < hi <= bounds[1],
                     f"integer range [{lo}, {hi}] is not inside {self.dtype}'s [{bounds[0]}, {bounds[1]}]")
            object.__setattr__(self, "quant_min", lo)
            object.__setattr__(self, "quant_max", hi)
        _require(self.block_size is None or (self.block_size >= 1 and self.axis is not None),
                 f"block size {self.block_size} needs an axis and must be at least 1")
        if self.range is not None:
            lo_r, hi_r = (float(v) for v in self.range)
            _require(lo_r <= hi_r, f"range {self.range} must have min <= max")
            object.__setattr__(self, "range", (lo_r, hi_r))
        if self.scale is not None:
            scale = tuple(float(s) for s in np.asarray(self.scale, dtype=np.float64).reshape(-1))
            _require(len(scale) >= 1 and all(s > 0 and math.isfinite(s) for s in scale),
                     "scales must be positive and finite")
            _require(self.axis is not None or len(scale) == 1, "a per-tensor spec has one scale")
            object.__setattr__(self, "scale", scale)
        if self.zero_point is not None:
            zp = tuple(int(z) for z in np.asarray(self.zero_point).reshape(-1))
            _require(self.scale is not None and len(zp) == len(self.scale),
                     "zero points come with scales, one per scale")
            _require(all(self.quant_min <= z <= self.quant_max for z in zp),
                     f"zero points must lie in [{self.quant_min}, {self.quant_max}]")
            object.__setattr__(self, "zero_point", zp)

    @property
    def is_float(self) -> bool:
        return DTYPES[self.dtype] is None

    @property
    def bits(self) -> int:
        return {"int4": 4, "uint4": 4, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32, "float16": 16,
                "float32": 32}[self.dtype]

    @property
    def granularity(self) -> str:
        if self.is_float:
            return "float"
        if self.block_size is not None:
            return f"per block of {self.block_size} (axis {self.axis})"
        return "per tensor" if self.axis is None else f"per channel (axis {self.axis})"

    @property
    def full_range(self) -> bool:
        """Whether the integers span the dtype's range (symmetric types: all but the most negative level)."""
        bounds = DTYPES[self.dtype]
        if bounds is None:
            return True
        return self.quant_max == bounds[1] and self.quant_min <= bounds[0] + 1

    def as_dtype(self, dtype: str) -> TensorSpec:
        """The same tensor on another dtype: symmetry, granularity and range kept, the integer range the new
        dtype's, no scales (they are the new grid's, once known)."""
        keep_grid = DTYPES.get(dtype) is not None
        return TensorSpec(dtype, symmetric=self.symmetric, axis=self.axis if keep_grid else None,
                          block_size=self.block_size if keep_grid else None, range=self.range)

    @classmethod
    def fixed_weight(cls, scale: np.ndarray, *, axis: int | None, dtype: str = "int8") -> TensorSpec:
        """A symmetric weight grid with these scales (one per channel along ``axis``, or one) and zero points 0."""
        scales = np.asarray(scale, dtype=np.float64).reshape(-1)
        if axis is None:
            scales = scales[:1]
        return cls(dtype=dtype, symmetric=True, axis=axis, scale=tuple(scales),
                   zero_point=(0,) * len(scales))

    def describe(self) -> str:
        parts = [self.dtype, self.granularity]
        if not self.is_float:
            parts.append("symmetric" if self.symmetric else "asymmetric")
            if not self.full_range:
                parts.append(f"levels [{self.quant_min}, {self.quant_max}]")
        if self.range is not None:
            parts.append(f"range [{self.range[0]:.4g}, {self.range[1]:.4g}]")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        out = {"dtype": self.dtype, "symmetric": self.symmetric, "axis": self.axis, "block_size": self.block_size,
               "quant_min": self.quant_min, "quant_max": self.quant_max,
               "range": list(self.range) if self.range is not None else None}
        if self.scale is not None:
            out["scales"] = len(self.scale)
        return out


@dataclasses.dataclass(frozen=True)
class Decision:
    """Which step set a plan entry, and why (one line)."""

    step: str
    why: str = ""

    def __str__(self) -> str:
        return f"{self.step}: {self.why}" if self.why else self.step


def _frozen(mapping: Mapping) -> Mapping:
    return types.MappingProxyType(dict(mapping))


@dataclasses.dataclass(frozen=True, eq=False)
class QuantPlan:
    """Tensors -> specs and the nodes left in float, each with its decisions (see the module docstring).

    The scheme: ``activation_dtype`` / ``weight_dtype`` for tensors the plan does not name, weights ``per_channel``
    or per tensor, ``symmetric_weights`` / ``symmetric_activations``, ``reduce_range`` (weights on 7 bits unless
    their spec says otherwise)."""

    activation_dtype: str = "uint8"
    weight_dtype: str = "int8"
    per_channel: bool = True
    symmetric_weights: bool = True
    symmetric_activations: bool = False
    reduce_range: bool = False
    tensors: Mapping[str, TensorSpec] = dataclasses.field(default_factory=dict)
    float_nodes: Mapping[str, tuple[Decision, ...]] = dataclasses.field(default_factory=dict)
    decisions: Mapping[str, tuple[Decision, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("activation_dtype", "weight_dtype"):
            dtype = getattr(self, name)
            _require(dtype in DTYPES and DTYPES[dtype] is not None, f"{name} {dtype!r} must be an integer dtype")
        object.__setattr__(self, "tensors", _frozen(self.tensors))
        object.__setattr__(self, "float_nodes", _frozen(self.float_nodes))
        object.__setattr__(self, "decisions", _frozen(self.decisions))
        _require(set(self.decisions) <= set(self.tensors), "every decision belongs to a tensor of the plan")

    # ------------------------------------------------------------------------------------------------ steps' API
    def with_spec(self, tensor: str, spec: TensorSpec, decision: Decision) -> QuantPlan:
        """This plan with ``tensor`` quantized as ``spec``, ``decision`` added to its history."""
        return self.with_specs({tensor: spec}, decision)

    def with_specs(self, specs: Mapping[str, TensorSpec], decision: Decision | Mapping[str, Decision]) -> QuantPlan:
        """This plan with every tensor of ``specs`` set, each with ``decision`` (one for all, or one per tensor)."""
        tensors, decisions = dict(self.tensors), dict(self.decisions)
        for name, spec in specs.items():
            tensors[name] = spec
            why = decision if isinstance(decision, Decision) else decision[name]
            decisions[name] = decisions.get(name, ()) + (why,)
        return dataclasses.replace(self, tensors=tensors, decisions=decisions)

    def with_ranges(self, ranges: Mapping[str, tuple[float, float]], decision: Decision) -> QuantPlan:
        """This plan with each tensor's real range set (calibration, range search): on the spec the plan has for
        the tensor (its dtype kept: a 16-bit tensor stays 16-bit), else on an activation spec of the scheme."""
        specs = {t: dataclasses.replace(self.tensors[t], range=tuple(r)) if t in self.tensors
                 else TensorSpec(self.activation_dtype, symmetric=self.symmetric_activations, range=tuple(r))
                 for t, r in ranges.items()}
        return self.with_specs(specs, decision)

    def keep_float(self, nodes: Iterable[str], decision: Decision) -> QuantPlan:
        """This plan with ``nodes`` left in float (their inputs and outputs are not quantized for them)."""
        kept = dict(self.float_nodes)
        for node in nodes:
            kept[node] = kept.get(node, ()) + (decision,)
        return dataclasses.replace(self, float_nodes=kept)

    # ------------------------------------------------------------------------------------------------- reading
    def spec(self, tensor: str) -> TensorSpec | None:
        return self.tensors.get(tensor)

    def weight_spec(self, tensor: str, axis: int | None) -> TensorSpec:
        """The grid of a weight: the plan's spec for it, else the scheme's, on the levels ONNX Runtime's quantizer
        gives the scheme (7 bits [-64, 64] under ``reduce_range``; symmetric: [-127, 127]; else the dtype's),
        per channel along ``axis`` (the caller's: the node knows its output-channel axis) or per tensor."""
        if tensor in self.tensors:
            return self.tensors[tensor]
        lo, hi = DTYPES[self.weight_dtype]
        if self.reduce_range and self.weight_dtype == "int8":
            lo, hi = -64, 64
        elif self.symmetric_weights and lo < 0:
            lo = -hi
        return TensorSpec(self.weight_dtype, symmetric=self.symmetric_weights,
                          axis=axis if self.per_channel else None, quant_min=lo, quant_max=hi)

    def activation_grids(self, bits: int = 8) -> dict[str, TensorSpec]:
        """The quantized activations on ``bits``-bit integers whose range is known, tensor -> spec."""
        return {t: s for t, s in self.tensors.items() if s.range is not None and not s.is_float and s.bits == bits}

    def ranges(self) -> dict[str, tuple[float, float]]:
        """Tensor -> its real range, for every tensor whose range is known."""
        return {t: s.range for t, s in self.tensors.items() if s.range is not None}

    def set_by(self, step: str) -> dict[str, TensorSpec]:
        """The tensors ``step`` set (a decision of that step in their history), with their specs as they are now."""
        return {t: s for t, s in self.tensors.items() if any(d.step == step for d in self.provenance(t))}

    def provenance(self, tensor: str) -> tuple[Decision, ...]:
        return self.decisions.get(tensor, ())

    def last_step(self, tensor: str) -> str:
        history = self.provenance(tensor)
        return history[-1].step if history else ""

    def summary(self) -> dict[str, Any]:
        """Counts for a report: tensors per dtype and granularity, the steps that decided them (last decision per
        tensor), and the float nodes with the step that kept each."""
        dtypes = collections.Counter(s.dtype for s in self.tensors.values())
        granularity = collections.Counter(s.granularity.split(" (")[0] for s in self.tensors.values())
        by_step = collections.Counter(self.last_step(t) for t in self.tensors)
        touched = collections.Counter(d.step for history in self.decisions.values() for d in history)
        return {
            "scheme": {"activations": self.activation_dtype, "weights": self.weight_dtype,
                       "per_channel": self.per_channel, "symmetric_weights": self.symmetric_weights,
                       "symmetric_activations": self.symmetric_activations, "reduce_range": self.reduce_range},
            "tensors": len(self.tensors),
            "dtypes": dict(sorted(dtypes.items())),
            "granularity": dict(sorted(granularity.items())),
            "decided_last_by": dict(by_step.most_common()),
            "decisions_by_step": dict(touched.most_common()),
            "float_nodes": {n: [str(d) for d in history] for n, history in self.float_nodes.items()},
        }

    def as_dict(self) -> dict[str, Any]:
        """Every entry (specs without their scale values) with its decisions."""
        return {**self.summary(),
                "specs": {t: {**s.as_dict(), "decided_by": [str(d) for d in self.provenance(t)]}
                          for t, s in self.tensors.items()}}
