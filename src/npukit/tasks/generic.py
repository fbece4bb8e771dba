"""Generic: no decoding; every output is compared by SQNR and cosine (the gate holds each to the SQNR floor)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from npukit.tasks.base import OutputStats, TaskResult


class GenericMeter:
    task = "generic"

    def __init__(self, output_names: Sequence[str]) -> None:
        self.names = list(output_names)
        self._stats = OutputStats(self.names)
        self._samples = 0

    def update(self, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], labels: Any = None) -> None:
        self._stats.update(reference, candidate)
        self._samples += 1

    def result(self) -> TaskResult:
        outputs = self._stats.result()
        cosines = [o.cosine for o in outputs if np.isfinite(o.cosine)]
        return TaskResult(task=self.task, samples=self._samples, metric="min_cosine", value=None,
                          metrics={"min_cosine": min(cosines) if cosines else None}, outputs=outputs, decoded=(),
                          note="no decoding: every output is held to the SQNR floor")
