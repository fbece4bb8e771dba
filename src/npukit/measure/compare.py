"""Numerical agreement of two sets of outputs: max absolute error and max error relative to the reference's range."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class OutputErrors:
    """``max_rel`` is max |got - ref| / max |ref| per output (the worst output wins); robust near zeros."""

    max_abs: float
    max_rel: float
    per_output: tuple[tuple[float, float], ...]  # (max_abs, max_rel) per output

    def within(self, rtol: float) -> bool:
        return self.max_rel <= rtol

    def as_dict(self) -> dict:
        return {"max_abs": self.max_abs, "max_rel": self.max_rel,
                "per_output": [{"max_abs": a, "max_rel": r} for a, r in self.per_output]}


def compare_outputs(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]) -> OutputErrors:
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference outputs but {len(candidate)} candidate outputs")
    per: list[tuple[float, float]] = []
    for ref, got in zip(reference, candidate):
        ref = np.asarray(ref, dtype=np.float64)
        got = np.asarray(got, dtype=np.float64)
        if ref.shape != got.shape:
            raise ValueError(f"output shapes differ: {ref.shape} vs {got.shape}")
        if ref.size == 0:
            per.append((0.0, 0.0))
            continue
        if not (np.isfinite(ref).all() and np.isfinite(got).all()):
            same = np.array_equal(ref, got, equal_nan=True)
            per.append((0.0, 0.0) if same else (float("inf"), float("inf")))
            continue
        max_abs = float(np.max(np.abs(got - ref)))
        scale = float(np.max(np.abs(ref)))
        max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
        per.append((max_abs, max_rel))
    return OutputErrors(
        max_abs=max((a for a, _ in per), default=0.0),
        max_rel=max((r for _, r in per), default=0.0),
        per_output=tuple(per),
    )
