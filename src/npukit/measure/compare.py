"""Numerical agreement of two sets of outputs: max absolute error and max error relative to the reference's range."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

# The absolute error every output is allowed whatever its range: float32 rounding of the O(1) intermediates of a
# network (eps 1.2e-7 each) reaches 1e-7..1e-6 at its outputs when an optimizer reorders sums. An output whose whole
# range is tiny (a probability map near 0 on noise inputs: 3e-6) would otherwise fail rtol on that rounding alone.
ABS_FLOOR = 1e-6


@dataclasses.dataclass(frozen=True)
class OutputErrors:
    """``max_rel`` is max |got - ref| / max |ref| per output (the worst output wins); robust near zeros.
    ``scales`` holds max |ref| per output: an output passes when its max abs error <= rtol * scale + atol."""

    max_abs: float
    max_rel: float
    per_output: tuple[tuple[float, float], ...]  # (max_abs, max_rel) per output
    scales: tuple[float, ...] = ()  # max |ref| per output
    # per output, abs error allowed on top for the runtime's own deviation on the unmodified model, when measured
    # (``npukit.passes.pipeline.verify_equivalent``); () when not
    runtime_allowance: tuple[float, ...] = ()

    def within(self, rtol: float, atol: float = ABS_FLOOR) -> bool:
        return not self.failing(rtol, atol)

    def failing(self, rtol: float, atol: float = ABS_FLOOR) -> list[int]:
        """Indices of the outputs whose max abs error exceeds rtol * max |ref| + atol (worst relative first)."""
        if not self.scales:  # built without scales: relative errors alone
            bad = [k for k, (_, rel) in enumerate(self.per_output) if not rel <= rtol]
        else:
            bad = [k for k, (err, _) in enumerate(self.per_output) if not err <= self.allowed(k, rtol, atol)]
        return sorted(bad, key=lambda k: -self.per_output[k][1])

    def allowed(self, index: int, rtol: float, atol: float = ABS_FLOOR) -> float:
        """The max abs error output ``index`` may have."""
        extra = self.runtime_allowance[index] if self.runtime_allowance else 0.0
        return rtol * self.scales[index] + atol + extra if self.scales else float("nan")

    def as_dict(self) -> dict:
        return {"max_abs": self.max_abs, "max_rel": self.max_rel,
                "per_output": [{"max_abs": a, "max_rel": r, **({"max_ref": self.scales[k]} if self.scales else {}),
                                **({"runtime_allowance": self.runtime_allowance[k]}
                                   if self.runtime_allowance else {})}
                               for k, (a, r) in enumerate(self.per_output)]}


def stacked_runs(runs: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """Each output's values over every run (a run: one input's outputs, in order), flattened into one array: what
    ``compare_outputs`` compares to judge several inputs at once."""
    return [np.concatenate([np.asarray(run[k]).reshape(-1) for run in runs]) for k in range(len(runs[0]))]


def compare_outputs(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]) -> OutputErrors:
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference outputs but {len(candidate)} candidate outputs")
    per: list[tuple[float, float]] = []
    scales: list[float] = []
    for ref, got in zip(reference, candidate):
        ref = np.asarray(ref, dtype=np.float64)
        got = np.asarray(got, dtype=np.float64)
        if ref.shape != got.shape:
            raise ValueError(f"output shapes differ: {ref.shape} vs {got.shape}")
        if ref.size == 0:
            per.append((0.0, 0.0))
            scales.append(0.0)
            continue
        if not (np.isfinite(ref).all() and np.isfinite(got).all()):
            same = np.array_equal(ref, got, equal_nan=True)
            per.append((0.0, 0.0) if same else (float("inf"), float("inf")))
            scales.append(0.0)
            continue
        max_abs = float(np.max(np.abs(got - ref)))
        scale = float(np.max(np.abs(ref)))
        max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
        per.append((max_abs, max_rel))
        scales.append(scale)
    return OutputErrors(
        max_abs=max((a for a, _ in per), default=0.0),
        max_rel=max((r for _, r in per), default=0.0),
        per_output=tuple(per),
        scales=tuple(scales),
    )
