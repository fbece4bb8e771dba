"""Shares of a data set are spread over it (``npukit.data.subsets``), not its first or last samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from npukit.config import PreprocessConfig
from npukit.data.readers import open_dataset
from npukit.data.subsets import (Subset, every, in_spread_order, spread, spread_indices, spread_order,
                                 van_der_corput_order)
from npukit.errors import InputError
from npukit.measure.task_fidelity import check_samples

CFG = PreprocessConfig(size=8, resize=10)


@pytest.mark.parametrize("total", [0, 1, 2, 3, 6, 8, 18, 50, 1000])
def test_van_der_corput_order_is_a_permutation_whose_prefixes_cover_the_range(total: int) -> None:
    order = van_der_corput_order(total)
    assert sorted(order) == list(range(total))
    for k in (2, 4, 8):
        if total >= 2 * k:  # any k first indices leave no gap wider than about 2 * total / k uncovered
            edges = [-1, *sorted(order[:k]), total]
            assert max(b - a for a, b in zip(edges, edges[1:])) <= 2 * total / k + 1, (k, order[:k])


@pytest.mark.parametrize("total", [0, 1, 3, 4, 7, 8, 18, 42, 1000])
def test_quantize_reads_every_4th_sample_last_and_the_others_spread(total: int) -> None:
    order = spread_order(total)
    assert sorted(order) == list(range(total))
    held = total // 4
    assert order[len(order) - held:] == list(range(3, total, 4))  # calibration "auto"'s held-out quarter
    assert van_der_corput_order(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    if total >= 18:
        assert max(order[:2]) >= total // 2  # the first two are not both from the first half


def test_spread_indices_every_and_lists() -> None:
    assert spread_indices(5, 9) == [0, 1, 2, 3, 4]
    assert spread_indices(8, 2) == [2, 6] and spread_indices(1000, 4) == [125, 375, 625, 875]
    assert every(9, 4) == ([0, 1, 2, 4, 5, 6, 8], [3, 7])
    assert spread(list("abcdefgh"), 4) == ["b", "d", "f", "h"]
    assert in_spread_order(("a", "b", "c", "d", "e")) == ["a", "c", "b", "e", "d"]
    one_shot = iter([1, 2, 3])
    assert in_spread_order(one_shot) is one_shot  # read once, in its own order


def _class_folder(root: Path, classes: int, per_class: int) -> Path:
    for c in range(classes):
        for i in range(per_class):
            path = root / f"class{c:02d}" / f"{i:03d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((12, 12, 3), 10 * c + i, dtype=np.uint8)).save(path)
    return root


def test_a_check_on_fewer_samples_than_a_class_sorted_folder_holds_reads_every_class(tmp_path: Path) -> None:
    """The task check's ``--max-samples 8`` of 8 classes x 6 images: one image of each class, not the first 8 images
    (one class and a third); the images read are those the labels name."""
    ds = open_dataset(_class_folder(tmp_path, 8, 6), preprocess=CFG, input_name="x")
    assert ds.labels[:8].tolist() == [0] * 6 + [1] * 2  # what the first 8 would have read
    batches = check_samples(ds, 8)
    assert sorted(int(b.labels[0]) for b in batches) == list(range(8))
    for b, j in zip(batches, spread_indices(48, 8), strict=True):
        np.testing.assert_array_equal(b.feeds["x"], ds.sample(j)["x"])
        assert b.labels.tolist() == [ds.labels[j]]
    assert len(check_samples(ds, 100)) == 48


def test_subset_reads_its_samples_and_labels_lazily_and_names_bad_samples_by_their_index(tmp_path: Path) -> None:
    data = np.arange(40, dtype=np.float32).reshape(10, 4)
    data[7, 2] = np.nan
    np.save(tmp_path / "a.npy", data)
    ds = open_dataset(tmp_path / "a.npy", preprocess=CFG)
    sub = Subset(ds, [1, 4, 7])
    assert len(sub) == 3 and sub.input_names == ds.input_names and sub.kind == "npy"
    np.testing.assert_array_equal(sub.sample(1)["input"], data[4:5])
    np.testing.assert_array_equal(next(iter(sub.batches(2))).feeds["input"], data[[1, 4]])
    with pytest.raises(InputError, match="sample 7 .* NaN or Inf"):
        sub.sample(2)
    inner = Subset(sub, [0, 1])  # reads the data set itself
    assert inner.base is ds and inner.indices == [1, 4]
    sub.check_against(("N", 4))
    assert spread(ds, 20) is ds
