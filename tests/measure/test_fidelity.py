"""Agreement meter on constructed logits whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from npukit.measure.fidelity import AgreementMeter, sqnr_db
from npukit.measure import fidelity


def test_identical_logits_agree_fully_with_infinite_sqnr() -> None:
    ref = np.random.default_rng(0).standard_normal((8, 10))
    meter = AgreementMeter()
    meter.update(ref, ref.copy())
    r = meter.result()
    assert (r.samples, r.top1_agreement, r.top5_overlap) == (8, 1.0, 1.0)
    assert math.isinf(r.sqnr_db) and r.sqnr_db > 0
    assert r.top1_accuracy_reference is None and r.labeled_samples == 0


def test_top1_and_top5_on_constructed_rankings() -> None:
    ref = np.tile(np.arange(10, dtype=np.float32), (4, 1))  # top-1 class 9, top-5 {5..9}
    cand = ref.copy()
    cand[0, [9, 8]] = cand[0, [8, 9]]  # top-1 swapped, same top-5
    cand[1] = -ref[1]  # top-1 0, top-5 {0..4}: nothing shared
    cand[2, 4], cand[2, 5] = 5.0, 4.0  # class 4 replaces 5 in the top-5: 4 of 5 shared
    meter = AgreementMeter()
    meter.update(ref[:2], cand[:2])
    meter.update(ref[2:], cand[2:])  # streamed over two batches
    r = meter.result()
    assert r.samples == 4
    assert r.top1_agreement == pytest.approx(2 / 4)
    assert r.top5_overlap == pytest.approx((5 + 0 + 4 + 5) / 20)


def test_sqnr_of_known_noise_and_streaming() -> None:
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((64, 100))
    noise = rng.standard_normal((64, 100))
    noise *= math.sqrt(np.sum(ref**2) / np.sum(noise**2) / 100.0)  # noise power exactly 1/100 of the signal's
    cand = ref + noise
    assert sqnr_db(ref, cand) == pytest.approx(20.0, abs=1e-9)
    meter = AgreementMeter()
    for i in range(0, 64, 10):
        meter.update(ref[i:i + 10], cand[i:i + 10])
    assert meter.result().sqnr_db == pytest.approx(20.0, abs=1e-9)
    assert sqnr_db(ref, ref) == math.inf
    with pytest.raises(ValueError):
        sqnr_db(ref, cand[:3])


def test_confident_subset_and_labels() -> None:
    ref = np.zeros((4, 10))
    ref[0, 3] = ref[1, 3] = 10.0  # softmax top-1 ~1.0: confident
    ref[2, 3] = ref[3, 3] = 0.5  # top-1 ~0.16: not confident
    cand = ref.copy()
    cand[1, 7] = 20.0  # disagrees on a confident sample
    cand[2, 7] = 20.0  # disagrees on an unconfident one
    labels = np.array([3, 7, 3, 1])
    meter = AgreementMeter()
    meter.update(ref, cand, labels)
    r = meter.result()
    assert r.top1_agreement == pytest.approx(0.5)
    assert r.confident_samples == 2
    assert r.top1_agreement_confident == pytest.approx(0.5)
    assert r.labeled_samples == 4
    assert r.top1_accuracy_reference == pytest.approx(2 / 4)  # samples 0, 2
    assert r.top1_accuracy_candidate == pytest.approx(2 / 4)  # samples 0, 1
    # ties rank the lower class first: reference top-5 {3,0,1,2,4} misses only sample 1's label 7
    assert r.top5_accuracy_reference == pytest.approx(3 / 4)
    assert r.top5_accuracy_candidate == pytest.approx(4 / 4)


def test_bad_batches_raise() -> None:
    meter = AgreementMeter()
    with pytest.raises(ValueError, match="no samples"):
        meter.result()
    with pytest.raises(ValueError, match="differ in shape"):
        meter.update(np.zeros((2, 5)), np.zeros((2, 6)))
    meter.update(np.zeros((2, 5, 1, 1)), np.zeros((2, 5, 1, 1)))
    with pytest.raises(ValueError, match="classes"):
        meter.update(np.zeros((2, 6)), np.zeros((2, 6)))
    with pytest.raises(ValueError, match="labels"):
        meter.update(np.zeros((2, 5)), np.zeros((2, 5)), np.array([1]))


def test_few_classes_confidence_and_top5() -> None:
    """A two-class model: every top-1 probability is >= 0.5, so 0.5 would call every sample confident; the top 5
    hold both classes, so top-5 overlap and accuracy say nothing and are left out."""
    from npukit.measure.fidelity import confident_threshold

    assert confident_threshold(2) == pytest.approx(0.75) and confident_threshold(1000) == pytest.approx(0.5005)
    p = np.array([0.55, 0.6, 0.8, 0.95])  # the probability of class 0
    ref = np.log(np.stack([p, 1 - p], axis=1))
    meter = AgreementMeter()
    meter.update(ref, ref.copy(), np.zeros(4))
    r = meter.result()
    assert r.confident_samples == 2  # 0.8 and 0.95
    assert r.top5_overlap is None and r.top5_accuracy_candidate is None and r.top1_accuracy_candidate == 1.0


def test_scores_that_are_already_probabilities_are_not_softmaxed_again() -> None:
    """A model ending in a softmax (PP-OCR's angle classifier): softmax of [1, 0] is 0.73, which would make no
    two-class sample confident."""
    p = np.array([0.55, 0.6, 0.8, 0.99])
    probs = np.stack([p, 1 - p], axis=1)
    meter = AgreementMeter()
    meter.update(probs, probs.copy())
    assert meter.result().confident_samples == 2
    # a quantized model's softmax on an 8-bit grid (scale 1/255): the rows sum to 1 only within a step or so
    grid = np.round(probs / (1 / 255)).astype(np.uint8) * np.float32(1 / 255) - np.float32(0.002)
    quantized = AgreementMeter()
    quantized.update(grid, grid.copy())
    assert quantized.result().confident_samples == 2
    logits = np.array([[0.6, 0.3, 0.05, 0.0]])  # non-negative scores summing to 0.95: logits, not probabilities
    assert not fidelity._probabilities(logits)


def test_labels_beyond_the_model_s_classes_are_refused() -> None:
    # bench counted every such sample wrong and passed with 0% accuracy
    from npukit.errors import InputError

    meter = AgreementMeter()
    logits = np.eye(3, dtype=np.float32)
    with pytest.raises(InputError, match="label 5 is not one of the model's 3 classes \\(0 to 2\\)"):
        meter.update(logits, logits, labels=np.array([0, 5, 1]))
    meter.update(logits, logits, labels=np.array([0, 1, 2]))
    assert meter.result().top1_accuracy_candidate == 1.0
