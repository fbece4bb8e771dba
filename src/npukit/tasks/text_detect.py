"""Text detection: the probability map of a DB-style text detector ((N, 1, H, W), text where the map is at least
``THRESHOLD``, DBNet's binarization threshold), the candidate's text pixels against the reference's: F1 (the
headline; Dice) and IoU, counted over every pixel of every sample."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from npukit.tasks.base import OutputStats, TaskResult

THRESHOLD = 0.3


class TextDetectMeter:
    task = "text-detect"

    def __init__(self, output_names: Sequence[str], probability_map: int = 0) -> None:
        self.names = list(output_names)
        self.map = probability_map
        self._stats = OutputStats(self.names)
        self._tp = self._fp = self._fn = self._samples = 0

    def update(self, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], labels: Any = None) -> None:
        self._stats.update(reference, candidate)
        ref = np.asarray(reference[self.map]) >= THRESHOLD
        cand = np.asarray(candidate[self.map]) >= THRESHOLD
        self._samples += ref.shape[0]
        self._tp += int(np.sum(ref & cand))
        self._fp += int(np.sum(~ref & cand))
        self._fn += int(np.sum(ref & ~cand))

    def result(self) -> TaskResult:
        positives = self._tp + self._fn
        f1 = 2 * self._tp / (2 * self._tp + self._fp + self._fn) if positives else None
        iou = self._tp / (self._tp + self._fp + self._fn) if positives else None
        metrics = {"f1": f1, "iou": iou, "reference_text_pixels": positives,
                   "candidate_text_pixels": self._tp + self._fp, "threshold": THRESHOLD}
        note = "" if positives else f"the reference's map reaches {THRESHOLD} nowhere on these inputs"
        return TaskResult(task=self.task, samples=self._samples, metric="f1", value=f1, metrics=metrics,
                          outputs=self._stats.result(), decoded=(self.names[self.map],), note=note)
