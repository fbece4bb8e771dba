"""Agreement of a candidate classifier with its reference, streamed over batches: top-1/top-5, SQNR, accuracy."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from npukit.errors import InputError

CONFIDENT_PROB = 0.5  # the reference's softmax top-1 probability at which a sample counts as confident


def confident_threshold(classes: int, confident_prob: float = CONFIDENT_PROB) -> float:
    """The top-1 probability at which a sample over ``classes`` classes counts as confident: ``confident_prob``, and
    at least halfway from chance (1 / classes) to certainty, so that with few classes (every top-1 of a two-class
    model is >= 0.5) the confident samples are still those the reference is sure of: 0.75 for two classes, 0.67
    for three, 0.5005 for a thousand."""
    return max(confident_prob, (1.0 + 1.0 / classes) / 2.0)


def sqnr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    """10 log10(sum ref^2 / sum (ref - cand)^2) in dB; inf when identical (NaN when the reference is all zeros too)."""
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if ref.shape != cand.shape:
        raise ValueError(f"shapes differ: {ref.shape} vs {cand.shape}")
    return sqnr_from_sums(float(np.sum(ref * ref)), float(np.sum((ref - cand) ** 2)))


def sqnr_from_sums(signal: float, noise: float) -> float:
    """10 log10(signal / noise) in dB from summed squares: inf for no noise, nan for neither."""
    if noise == 0.0:
        return math.inf if signal > 0 else math.nan
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


@dataclasses.dataclass(frozen=True)
class AgreementResult:
    """Accuracy fields are None when no labels were given; they cover ``labeled_samples`` samples. The top-5 fields
    are None for 5 classes or fewer, where the top 5 hold every class. A sample is confident where the reference's
    top-1 probability (its softmax; the scores themselves where they already are probabilities) reaches
    ``fidelity.confident_threshold`` of the class count."""

    samples: int
    top1_agreement: float
    top5_overlap: float | None  # mean |top5(ref) & top5(cand)| / 5; None with 5 classes or fewer (always 1)
    sqnr_db: float
    confident_samples: int
    top1_agreement_confident: float | None  # None when no sample is confident
    labeled_samples: int
    top1_accuracy_reference: float | None
    top1_accuracy_candidate: float | None
    top5_accuracy_reference: float | None
    top5_accuracy_candidate: float | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def require_class_labels(labels: np.ndarray, classes: int) -> None:
    """Labels must be class indices of the model's ``classes`` scores: one beyond them is an InputError (counted
    wrong, a check passed at 0% accuracy; in training, cross-entropy failed on it)."""
    outside = labels[(labels < 0) | (labels >= classes)]
    if outside.size:
        raise InputError(f"label {int(outside[0])} is not one of the model's {classes} classes (0 to {classes - 1})",
                         hint="give each sample's class as its index in the model's output (class folders sorted "
                              "by name, or numbers in a labels file)")


class AgreementMeter:
    """Feed (reference, candidate[, labels]) logits batch by batch with :meth:`update`; read :meth:`result`.

    Logits are (N, classes); (classes,) is one sample and trailing size-1 axes (N, classes, 1, 1) are dropped.
    """

    def __init__(self, *, confident_prob: float = CONFIDENT_PROB) -> None:
        self.confident_prob = confident_prob
        self._samples = 0
        self._top1_agree = 0
        self._top5_shared = 0
        self._classes = 0
        self._signal = 0.0
        self._noise = 0.0
        self._confident = 0
        self._confident_agree = 0
        self._labeled = 0
        self._ref_top1 = self._cand_top1 = self._ref_top5 = self._cand_top5 = 0

    def update(self, ref_logits: np.ndarray, cand_logits: np.ndarray, labels: np.ndarray | None = None) -> None:
        ref = _as_2d(ref_logits)
        cand = _as_2d(cand_logits)
        if ref.shape != cand.shape:
            raise ValueError(f"reference logits {ref.shape} and candidate logits {cand.shape} differ in shape")
        if self._classes and ref.shape[1] != self._classes:
            raise ValueError(f"{ref.shape[1]} classes in this batch but {self._classes} before")
        self._classes = ref.shape[1]
        k = min(5, self._classes)
        n = ref.shape[0]
        ref_top = _topk(ref, k)
        cand_top = _topk(cand, k)
        self._samples += n
        self._top1_agree += int(np.sum(ref_top[:, 0] == cand_top[:, 0]))
        self._top5_shared += int(sum(len(set(a) & set(b)) for a, b in zip(ref_top.tolist(), cand_top.tolist())))
        self._signal += float(np.sum(ref * ref))
        self._noise += float(np.sum((ref - cand) ** 2))
        if _probabilities(ref):  # the model ends in a softmax (Paddle, Keras exports): its own top-1 probability
            top_prob = ref.max(axis=1)
        else:
            shifted = ref - ref.max(axis=1, keepdims=True)
            top_prob = 1.0 / np.sum(np.exp(shifted), axis=1)  # softmax probability of the arg-max class
        confident = top_prob >= confident_threshold(self._classes, self.confident_prob)
        self._confident += int(confident.sum())
        self._confident_agree += int(np.sum((ref_top[:, 0] == cand_top[:, 0]) & confident))
        if labels is not None:
            lab = np.asarray(labels).reshape(-1)
            if lab.shape[0] != n:
                raise ValueError(f"{lab.shape[0]} labels for {n} samples")
            lab = lab.astype(np.int64)
            require_class_labels(lab, self._classes)
            self._labeled += n
            self._ref_top1 += int(np.sum(ref_top[:, 0] == lab))
            self._cand_top1 += int(np.sum(cand_top[:, 0] == lab))
            self._ref_top5 += int(np.sum(np.any(ref_top == lab[:, None], axis=1)))
            self._cand_top5 += int(np.sum(np.any(cand_top == lab[:, None], axis=1)))

    def result(self) -> AgreementResult:
        if self._samples == 0:
            raise ValueError("no samples were given to the meter")
        n, labeled = self._samples, self._labeled

        def acc(count: int) -> float | None:
            return count / labeled if labeled else None

        top5 = self._classes > 5  # with fewer classes the top 5 hold them all: overlap and accuracy always 1

        return AgreementResult(
            samples=n,
            top1_agreement=self._top1_agree / n,
            top5_overlap=self._top5_shared / (n * 5) if top5 else None,
            sqnr_db=sqnr_from_sums(self._signal, self._noise),
            confident_samples=self._confident,
            top1_agreement_confident=self._confident_agree / self._confident if self._confident else None,
            labeled_samples=labeled,
            top1_accuracy_reference=acc(self._ref_top1),
            top1_accuracy_candidate=acc(self._cand_top1),
            top5_accuracy_reference=acc(self._ref_top5) if top5 else None,
            top5_accuracy_candidate=acc(self._cand_top5) if top5 else None,
        )


def _probabilities(scores: np.ndarray) -> bool:
    """Whether every row of ``scores`` is a probability distribution (non-negative, summing to 1): within 1e-3, plus
    half a step of an 8-bit grid (1/256) per class up to 0.02 in all, for a quantized model's softmax (PP-OCR cls's
    QDQ export: two classes summing to 0.9961, then read as logits and judged confident on none of 45 samples)."""
    atol = min(0.02, 1e-3 + scores.shape[1] * 0.5 / 256) if scores.ndim == 2 else 1e-3
    return bool(np.all(scores >= 0.0) and np.allclose(scores.sum(axis=1), 1.0, atol=atol))


def _as_2d(logits: np.ndarray) -> np.ndarray:
    arr = np.asarray(logits, dtype=np.float64)
    if arr.ndim == 1:
        return arr[None, :]
    while arr.ndim > 2 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"logits must be (samples, classes), got shape {np.shape(logits)}")
    return arr


def _topk(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest logits per row, largest first (ties: lower index first)."""
    order = np.argsort(-logits, axis=1, kind="stable")
    return order[:, :k]
