"""Shares of a data set spread over it, never its first or last samples: a folder sorted by class (ImageNet style,
one subfolder per class, read in sorted order) gives its first 100 images from one or two classes, and photos cropped
several times each give their last crops from the last photos; 100 samples spread over it give every class and every
photo its share.

- ``spread(data, count)``: ``count`` samples at even steps over ``data``, each in the middle of its step (a Dataset: a
  lazily read ``Subset``; a sequence: a list), in the data's own order; all of them when there are no more. The
  verbs take ``--max-samples``, ``--calib-samples`` and their checks' shares of the data so.
- ``every(n, k)``: the split of 0..n-1 that holds every k-th index out (k-1, 2k-1, ...), for a check set whose
  samples are never fitted to.
- ``spread_order(n)``: the order ``quantize`` reads its samples in: every ``HELD_OUT_EVERY``-th (4th) sample last,
  the others before them in the order a van der Corput sequence reaches them (0, n/2, n/4, 3n/4, n/8, ...). So the
  last quarter that calibration "auto" and the recipe choice hold out is every 4th sample, and the first k a step
  reads (the precision scans; ``calibration.samples`` in the API) lie spread over the others. ``in_spread_order``
  gives a data set or a list in that order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npukit.data.readers import Dataset

HELD_OUT_EVERY = 4  # quantize's held-out quarter (``calibration.auto.split_samples``): every 4th sample


def every(total: int, k: int) -> tuple[list[int], list[int]]:
    """(kept, held): 0..total-1 with every ``k``-th index (k-1, 2k-1, ...) held out."""
    held = list(range(k - 1, total, k))
    return [i for i in range(total) if (i + 1) % k], held


def spread_indices(total: int, count: int) -> list[int]:
    """``count`` of 0..total-1 at even steps, each in the middle of its step (all of them when ``count`` is ``total``
    or more)."""
    if count >= total:
        return list(range(total))
    return [(2 * i + 1) * total // (2 * count) for i in range(count)]


def van_der_corput_order(total: int) -> list[int]:
    """0..total-1 in the order the van der Corput sequence (0, 1/2, 1/4, 3/4, 1/8, ...) first reaches each of
    ``total`` equal bins of [0, 1): every prefix lies spread over the whole range."""
    if total < 1:
        return []
    bits = max(1, (total - 1).bit_length())
    k = np.arange(1 << bits, dtype=np.int64)
    reversed_bits = np.zeros_like(k)
    for b in range(bits):
        reversed_bits |= ((k >> b) & 1) << (bits - 1 - b)
    bins = reversed_bits * total >> bits  # floor(vdc(k) * total): every bin reached, since 2^bits >= total
    _, first = np.unique(bins, return_index=True)  # first[i]: the first k that reaches bin i
    return np.argsort(first, kind="stable").tolist()


def spread_order(total: int) -> list[int]:
    """0..total-1 as ``quantize`` reads them (see the module docstring); with fewer than ``HELD_OUT_EVERY`` samples,
    the van der Corput order alone."""
    kept, held = every(total, HELD_OUT_EVERY)
    return [kept[i] for i in van_der_corput_order(len(kept))] + held


class Subset(Dataset):
    """The samples of ``base`` at ``indices`` (and their labels), read lazily from it; sample i of the subset is sample
    ``indices[i]`` of ``base`` (an error message about a bad sample names its index in ``base``)."""

    def __init__(self, base: Dataset, indices: Sequence[int]) -> None:
        if isinstance(base, Subset):  # a subset of a subset reads the first data set directly
            indices, base = [base.indices[i] for i in indices], base.base
        self.base = base
        self.indices = list(indices)
        self.kind = base.kind
        self.source = base.source

    @property
    def labels(self) -> np.ndarray | None:  # type: ignore[override]
        return None if self.base.labels is None else self.base.labels[self.indices]

    @property
    def stacked(self) -> frozenset[str]:  # type: ignore[override]
        return self.base.stacked

    @stacked.setter
    def stacked(self, value: frozenset[str]) -> None:
        self.base.stacked = value

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.base.input_names

    @property
    def sample_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.base.sample_shapes

    def __len__(self) -> int:
        return len(self.indices)

    def _read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        parts = [self.base._read(i, i + 1) for i in self.indices[start:stop]]
        if len(parts) == 1:
            return parts[0]
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def _cast_to(self, dtypes: Mapping[str, np.dtype]) -> None:
        self.base._cast_to(dtypes)

    def _shape_hint(self, model_shape: tuple) -> str:
        return self.base._shape_hint(model_shape)


def spread(data: Any, count: int) -> Any:
    """``count`` samples at even steps over ``data`` (see the module docstring)."""
    if isinstance(data, Dataset):
        return data if count >= len(data) else Subset(data, spread_indices(len(data), count))
    items = list(data)
    return [items[i] for i in spread_indices(len(items), count)]


def in_spread_order(data: Any) -> Any:
    """``data``'s samples in ``spread_order``: a Dataset as a lazy ``Subset``, a list or tuple as a list, any other
    iterable (a generator: read once, in its own order) as it is."""
    if isinstance(data, Dataset):
        return Subset(data, spread_order(len(data))) if len(data) > 2 else data
    if isinstance(data, (list, tuple)):
        return [data[i] for i in spread_order(len(data))]
    return data
