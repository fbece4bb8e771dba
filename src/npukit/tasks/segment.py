"""Segmentation: per-pixel class masks (argmax over the class axis of an (N, C, H, W) or, channels last,
(N, H, W, C) output; with one channel, a binary mask: foreground where a probability map reaches 0.5 or a logit
map exceeds 0) of the candidate against the reference's: pixel agreement and mean IoU over the classes either mask
uses (the headline), with the intersections and unions summed over every sample. Where the reference's masks hold
one class everywhere, the IoU compares nothing and is left undefined (the check says so)."""

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
        self._reference_classes: set[int] = set()
        self.threshold: float | None = None  # a one-channel map's: 0.5 on probabilities, 0 on logits

    def _mask(self, output: np.ndarray) -> np.ndarray:
        """Each pixel's class: the argmax over the class axis; with one channel (argmax: class 0 everywhere, which
        passed any artifact at mIoU 1.0), 1 where the map is at or above the threshold the reference's first map
        sets (0.5 where its values lie in [0, 1], else 0), 0 elsewhere."""
        if output.shape[self.axis] > 1:
            return output.argmax(axis=self.axis)
        if self.threshold is None:
            self.threshold = 0.5 if 0.0 <= float(output.min()) and float(output.max()) <= 1.0 else 0.0
        return (np.squeeze(output, axis=self.axis) >= self.threshold).astype(np.int64)

    def update(self, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], labels: Any = None) -> None:
        self._stats.update(reference, candidate)
        ref = self._mask(np.asarray(reference[self.masks]))
        cand = self._mask(np.asarray(candidate[self.masks]))
        present = np.unique(ref)
        self._reference_classes.update(present.tolist())
        self._samples += ref.shape[0]
        self._pixels += ref.size
        self._agree += int(np.sum(ref == cand))
        for k in np.union1d(present, np.unique(cand)).tolist():
            r, c = ref == k, cand == k
            self._inter[k] = self._inter.get(k, 0) + int(np.sum(r & c))
            self._union[k] = self._union.get(k, 0) + int(np.sum(r | c))

    def result(self) -> TaskResult:
        ious = {k: self._inter[k] / u for k, u in self._union.items() if u}
        one = len(self._reference_classes) < 2  # an untrained LR-ASPP: class 0 at every pixel, mIoU 1.0 passed
        value = float(np.mean(list(ious.values()))) if ious and not one else None
        worst = sorted(ious.items(), key=lambda kv: kv[1])[:5]
        metrics = {"miou": value, "pixel_agreement": self._agree / self._pixels if self._pixels else None,
                   "classes_present": len(ious), "reference_classes": len(self._reference_classes),
                   "worst_classes": {str(k): round(v, 4) for k, v in worst}}
        if self.threshold is not None:
            metrics["binary_threshold"] = self.threshold
        note = (f"the reference's masks are class {min(self._reference_classes)} at every pixel of these inputs"
                if one and self._reference_classes else "")
        return TaskResult(task=self.task, samples=self._samples, metric="miou", value=value, metrics=metrics,
                          outputs=self._stats.result(), decoded=(self.names[self.masks],), note=note)
