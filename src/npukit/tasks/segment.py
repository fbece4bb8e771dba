"""Segmentation: per-pixel class masks (argmax over the class axis of an (N, C, H, W) or, channels last,
(N, H, W, C) output) of the candidate
against the reference's: pixel agreement and mean IoU over the classes either mask uses (the headline), with the
intersections and unions summed over every sample."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from npukit.tasks.base import OutputStats, TaskResult


class SegmentMeter:
    task = "segment"

    def __init__(self, output_names: Sequence[str], masks: int = 0, *, channels_last: bool = False) -> None:
        self.names = list(output_names)
        self.masks = masks
        self.axis = -1 if channels_last else 1  # the class axis
        self._stats = OutputStats(self.names)
        self._inter: dict[int, int] = {}
        self._union: dict[int, int] = {}
        self._pixels = self._agree = self._samples = 0

    def update(self, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], labels: Any = None) -> None:
        self._stats.update(reference, candidate)
        ref = np.asarray(reference[self.masks]).argmax(axis=self.axis)
        cand = np.asarray(candidate[self.masks]).argmax(axis=self.axis)
        self._samples += ref.shape[0]
        self._pixels += ref.size
        self._agree += int(np.sum(ref == cand))
        for k in np.union1d(np.unique(ref), np.unique(cand)).tolist():
            r, c = ref == k, cand == k
            self._inter[k] = self._inter.get(k, 0) + int(np.sum(r & c))
            self._union[k] = self._union.get(k, 0) + int(np.sum(r | c))

    def result(self) -> TaskResult:
        ious = {k: self._inter[k] / u for k, u in self._union.items() if u}
        value = float(np.mean(list(ious.values()))) if ious else None
        worst = sorted(ious.items(), key=lambda kv: kv[1])[:5]
        metrics = {"miou": value, "pixel_agreement": self._agree / self._pixels if self._pixels else None,
                   "classes_present": len(ious), "worst_classes": {str(k): round(v, 4) for k, v in worst}}
        return TaskResult(task=self.task, samples=self._samples, metric="miou", value=value, metrics=metrics,
                          outputs=self._stats.result(), decoded=(self.names[self.masks],))
