"""The agreement-noise benchmark's statistics on logits whose answers are known."""

from __future__ import annotations

import numpy as np
import pytest

from ._load import load_benchmark

an = load_benchmark("agreement_noise")


def test_mcnemar_exact() -> None:
    assert an.mcnemar_exact(0, 0) == 1.0
    assert an.mcnemar_exact(6, 0) == pytest.approx(2 / 64)  # six flips all one way: 2 x (1/2)^6
    assert an.mcnemar_exact(3, 3) == 1.0


def test_photo_bootstrap_keeps_photos_together() -> None:
    groups = np.repeat(np.arange(4), 5)
    assert an.photo_bootstrap(np.ones(20), groups, rounds=200) == (1.0, 1.0)
    # one photo all wrong, three all right: the interval spans whole-photo outcomes, far wider than crop-level noise
    values = np.repeat([0.0, 1.0, 1.0, 1.0], 5)
    lo, hi = an.photo_bootstrap(values, groups, rounds=2000)
    assert lo <= 0.5 and hi == 1.0


def test_compare_counts_flips_and_margin_errors() -> None:
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(12, 5))
    reference[:, 0] += 3.0  # class 0 on top with a margin of about 3
    a = reference + 0.01 * rng.normal(size=reference.shape)
    b = reference.copy()
    b[:4, 0] -= 10.0  # B loses the top-1 on the first four crops (photo 0)
    out = an.compare(reference, a, b, np.repeat(np.arange(3), 4), rounds=300)
    assert out["a"]["top1_agreement"] == 1.0 and out["b"]["top1_agreement"] == pytest.approx(8 / 12)
    d = out["difference"]
    assert (d["only_a_agrees"], d["only_b_agrees"]) == (4, 0) and d["top1_agreement"] == pytest.approx(4 / 12)
    assert d["interval"][0] >= 0.0 and d["crops_a_sqnr_higher"] == 4 and d["mcnemar_p"] == pytest.approx(2 / 16)
    assert out["b"]["margin_error_mean"] == pytest.approx(-10.0 * 4 / 12) and out["a"]["margin_error_std"] < 0.05
    assert out["a"]["sqnr_db"] > 30.0 > out["b"]["sqnr_db"]
