"""Classification: the candidate's top-1 class against the reference's (and against labels where given).

The headline is top-1 agreement where the reference is confident (softmax top-1 probability >= 0.5 and at least
halfway from chance to certainty: ``measure.fidelity.confident_threshold``, 0.75 for two classes) once at least
``MIN_CONFIDENT`` samples are, else top-1 agreement over every sample: on real photos many crops are ambiguous even
to the float model, and a flip between two near-equal classes there says little about the artifact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from npukit.measure.fidelity import AgreementMeter
from npukit.tasks.base import OutputStats, TaskResult

MIN_CONFIDENT = 10


def is_class_scores(shape: Sequence[int | str | None]) -> bool:
    """(N, C) or (N, C, 1, 1) with at least two classes."""
    dims = list(shape)
    while len(dims) > 2 and dims[-1] == 1:
        dims.pop()
    return len(dims) == 2 and isinstance(dims[1], int) and dims[1] >= 2


class ClassifyMeter:
    task = "classify"

    def __init__(self, output_names: Sequence[str], scores: int = 0) -> None:
        self.names = list(output_names)
        self.scores = scores  # index of the class-score output
        self._stats = OutputStats(self.names)
        self._agreement = AgreementMeter()

    def update(self, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], labels: Any = None) -> None:
        self._stats.update(reference, candidate)
        ref, cand = np.asarray(reference[self.scores]), np.asarray(candidate[self.scores])
        self._agreement.update(ref.reshape(ref.shape[0] if ref.ndim > 1 else 1, -1),
                               cand.reshape(cand.shape[0] if cand.ndim > 1 else 1, -1), labels)

    def result(self) -> TaskResult:
        agreement = self._agreement.result()
        confident = agreement.confident_samples >= MIN_CONFIDENT
        metric = "top1_agreement_confident" if confident else "top1_agreement"
        value = agreement.top1_agreement_confident if confident else agreement.top1_agreement
        return TaskResult(task=self.task, samples=agreement.samples, metric=metric, value=value,
                          metrics=agreement.as_dict(), outputs=self._stats.result(),
                          decoded=(self.names[self.scores],))
