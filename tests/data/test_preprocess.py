"""Preprocessing matches torchvision's ImageNet transforms and handles grayscale, RGBA, palette and 16-bit images."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from npukit.config import PreprocessConfig
from npukit.data.preprocess import normalize, preprocess_image


def _photo(w: int, h: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("size", [(300, 200), (200, 333), (256, 256)])
def test_matches_torchvision(size: tuple[int, int]) -> None:
    from torchvision import transforms

    image = _photo(*size)
    expected = transforms.Compose([
        transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])(image).numpy()
    got = preprocess_image(image, PreprocessConfig())
    assert got.shape == (3, 224, 224) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("size", [(640, 480), (300, 600), (100, 100)])
def test_a_non_square_crop_covers_the_model_input_centred(size: tuple[int, int]) -> None:
    """A text line's 48 x 192 input from any photo: the resize covers the crop at the short-side rule's margin, and
    the crop is the centre of the resized photo (torchvision's Resize((h, w)) then CenterCrop((48, 192)))."""
    from torchvision import transforms

    image = _photo(*size)
    cfg = PreprocessConfig(size=48, width=192)
    got = preprocess_image(image, cfg)
    assert got.shape == (3, 48, 192) and cfg.crop == (48, 192)
    w, h = size
    scale = max(cfg.short_side / h, cfg.short_side * 192 / 48 / w)
    expected = transforms.Compose([
        transforms.Resize((max(48, int(h * scale)), max(192, int(w * scale)))), transforms.CenterCrop((48, 192)),
        transforms.ToTensor(), transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])(image).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_constant_colour_normalizes_per_channel() -> None:
    image = Image.new("RGB", (40, 30), (255, 0, 128))
    got = preprocess_image(image, PreprocessConfig(size=16, resize=20))
    expected = [(1 - 0.485) / 0.229, (0 - 0.456) / 0.224, (128 / 255 - 0.406) / 0.225]
    np.testing.assert_allclose(got[:, 8, 8], expected, rtol=0, atol=1e-5)


def test_modes_are_converted() -> None:
    cfg = PreprocessConfig(size=8, resize=8)
    gray = Image.new("L", (8, 8), 200)
    rgb = preprocess_image(gray, cfg)
    assert rgb.shape == (3, 8, 8)
    np.testing.assert_allclose(rgb[:, 0, 0], [(200 / 255 - m) / s for m, s in zip(cfg.mean, cfg.std)], atol=1e-5)
    rgba = preprocess_image(Image.new("RGBA", (8, 8), (10, 20, 30, 0)), cfg)
    np.testing.assert_allclose(rgba[:, 0, 0], preprocess_image(Image.new("RGB", (8, 8), (10, 20, 30)), cfg)[:, 0, 0])
    palette = Image.new("RGB", (8, 8), (10, 20, 30)).convert("P")
    assert preprocess_image(palette, cfg).shape == (3, 8, 8)
    wide = Image.fromarray(np.full((8, 8), 65535, dtype=np.uint16))  # 16-bit white stays white
    np.testing.assert_allclose(preprocess_image(wide, cfg)[:, 0, 0], [(1 - m) / s for m, s in zip(cfg.mean, cfg.std)],
                               atol=1e-5)
    mono = PreprocessConfig(size=8, resize=8, channels=1, mean=(0.5,), std=(0.5,))
    out = preprocess_image(Image.new("RGB", (8, 8), (255, 255, 255)), mono)
    assert out.shape == (1, 8, 8)
    np.testing.assert_allclose(out, 1.0, atol=1e-6)


def test_normalize_checks_channels() -> None:
    with pytest.raises(ValueError):
        normalize(np.zeros((4, 4, 3), dtype=np.uint8), mean=(0.5,), std=(0.5,))


def test_the_short_side_follows_the_crop_unless_given() -> None:
    """ImageNet's 256 for a 224 crop; for a 32-pixel model the same share of the image (37), not a 32-pixel patch
    of a 256-pixel image; a given --resize wins."""
    assert PreprocessConfig().short_side == 256
    assert PreprocessConfig(size=32).short_side == 37
    assert PreprocessConfig(size=32, resize=256).short_side == 256
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 400, 3), dtype=np.uint8))
    transforms = pytest.importorskip("torchvision.transforms")
    expected = transforms.Compose([  # torchvision's own: Resize(37), CenterCrop(32)
        transforms.Resize(37), transforms.CenterCrop(32), transforms.ToTensor(),
        transforms.Normalize(PreprocessConfig().mean, PreprocessConfig().std)])(image).numpy()
    np.testing.assert_allclose(preprocess_image(image, PreprocessConfig(size=32)), expected, rtol=0, atol=1e-5)
