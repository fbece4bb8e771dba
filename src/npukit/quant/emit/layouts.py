"""Tensors that are one tensor in another layout: equal after a permutation of their axes.

ONNX Runtime's quantization pre-processing (its transpose optimizer) moves elementwise ops across the Transposes
around them to cancel Transpose pairs: in a ConvNeXt block (``permute`` to NHWC, LayerNorm and the MLP, ``permute``
back, layer scale, residual Add) the layer scale's Mul and the residual Add end up computed in NHWC in the planned
ONNX model, while the torch program computes them in NCHW. The two tensors hold the same values, one a transpose of
the other, and no tensor of the ONNX model has the torch tensor's shape. Values prove the identity here as they do
for an equal shape: the same multiset of dims, and the values equal (to the match tolerance) once the ONNX tensor's
axes are permuted into the torch tensor's order.

What is carried across such a match needs no axis mapped: an activation grid the carry takes is per tensor, the
same grid in either layout (a per-channel activation spec is not carried at all, matched or not), and a weight is
carried by its op (conv, linear) in that op's own layout, its per-channel scales indexed by output channel: a
permutation moves whole axes, so channel ``c`` of the torch tensor is channel ``c`` of its twin.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

Axes = tuple[int, ...]


def axes_onto(source: Sequence[int], target: Sequence[int]) -> Iterator[Axes]:
    """Each order of ``source``'s axes (``np.transpose``'s ``axes``) that gives the shape ``target``, the identity
    left out (an equal shape is matched as it is); built dim by dim, so that equal dims (H = W) give all their
    orders and distinct dims one."""
    source, target = tuple(source), tuple(target)
    if len(source) != len(target) or sorted(source) != sorted(target):
        return

    def orders(position: int, used: frozenset[int]) -> Iterator[Axes]:
        if position == len(target):
            yield ()
            return
        for axis, dim in enumerate(source):
            if axis not in used and dim == target[position]:
                for rest in orders(position + 1, used | {axis}):
                    yield (axis, *rest)

    identity = tuple(range(len(source)))
    yield from (axes for axes in orders(0, frozenset()) if axes != identity)


class PermutedIndex:
    """The ONNX tensors (``values``, in the graph's order ``names``) by their multiset of dims, with their minimum,
    maximum and sum: a permutation keeps all three, so most candidates are ruled out without a transpose."""

    def __init__(self, values: Mapping[str, np.ndarray], names: Sequence[str]) -> None:
        self.values = values
        self.by_dims: dict[Axes, list[str]] = {}
        for name in names:
            self.by_dims.setdefault(tuple(sorted(values[name].shape)), []).append(name)
        self.prints: dict[str, tuple[float, float, float]] = {}

    def _print(self, name: str) -> tuple[float, float, float]:
        if name not in self.prints:
            value = self.values[name]
            self.prints[name] = (float(value.min()), float(value.max()), float(value.sum(dtype=np.float64)))
        return self.prints[name]

    def find(self, value: np.ndarray, tolerance: float) -> list[tuple[str, Axes]]:
        """The ONNX tensors (in the graph's order) whose values, with their axes permuted (the axes returned with
        each), are ``value``'s to ``tolerance``; the identity is not tried (the caller matched equal tensors
        first), other orders of an equal shape are (NCHW against NHWC where C = H = W)."""
        if value.ndim < 2 or value.size == 0:
            return []
        low, high, total = float(value.min()), float(value.max()), float(value.sum(dtype=np.float64))
        found = []
        for name in self.by_dims.get(tuple(sorted(value.shape)), []):
            other = self.values[name]
            other_low, other_high, other_total = self._print(name)
            # each element within ``tolerance`` of its twin: so are the extremes, and the sums within size times it
            if abs(other_low - low) > tolerance or abs(other_high - high) > tolerance \
                    or abs(other_total - total) > tolerance * value.size:
                continue
            axes = next((axes for axes in axes_onto(other.shape, value.shape)
                         if float(np.abs(np.transpose(other, axes) - value).max()) <= tolerance), None)
            if axes is not None:
                found.append((name, axes))
        return found
