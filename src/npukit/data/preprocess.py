"""Image preprocessing as torchvision does it for ImageNet: resize the short side (bilinear), center-crop, /255,
normalize, float32 CHW. Grayscale, palette, RGBA and 16-bit images become RGB (or L when channels=1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from npukit.config import PreprocessConfig
from npukit.errors import InputError


def load_image(path: str | Path) -> Image.Image:
    """Open and fully decode one image file; a missing, unreadable or corrupt file raises InputError naming it."""
    path = Path(path)
    try:
        with Image.open(path) as img:
            img.load()
            return img.copy()
    except FileNotFoundError:
        raise InputError(f"image {path} does not exist", hint="check the data folder") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:  # PIL reports damage in all of these
        raise InputError(f"cannot decode image {path}: {exc}",
                         hint="remove or replace the damaged file, or convert it to PNG/JPEG") from None


def preprocess_image(image: Image.Image, config: PreprocessConfig) -> np.ndarray:
    """PIL image -> float32 array (channels, height, width) of ``config.crop``, resized, center-cropped and
    normalized per ``config``."""
    image = _to_mode(image, "L" if config.channels == 1 else "RGB")
    width, height = image.size
    crop_h, crop_w = config.crop
    short = config.short_side
    if crop_w == crop_h:  # as torchvision.transforms.Resize(int): short side -> resize, long side in proportion
        if width <= height:
            new_w, new_h = short, int(short * height / width)
        else:
            new_w, new_h = int(short * width / height), short
    else:  # the smallest resize that covers the crop grown as the short side grows a square crop
        scale = max(short / height, short * crop_w / crop_h / width)
        new_w, new_h = max(crop_w, int(width * scale)), max(crop_h, int(height * scale))
    image = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    top = int(round((new_h - crop_h) / 2.0))
    left = int(round((new_w - crop_w) / 2.0))
    image = image.crop((left, top, left + crop_w, top + crop_h))
    return normalize(np.asarray(image), mean=config.mean, std=config.std)


def normalize(pixels: np.ndarray, *, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """uint8 pixels (H, W) or (H, W, C) -> float32 (C, H, W): /255, minus mean, over std, per channel."""
    arr = np.asarray(pixels, dtype=np.float32) / 255.0
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.shape[2] != len(mean):
        raise ValueError(f"{arr.shape[2]} channels but {len(mean)} mean values")
    arr = (arr - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(arr.transpose(2, 0, 1), dtype=np.float32)


def _to_mode(image: Image.Image, mode: str) -> Image.Image:
    if image.mode == mode:
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        # 16-bit/int/float grayscale: PIL's own conversion clips at 255, so scale to 8 bits first.
        arr = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or arr.max(initial=0) > 255 else 255.0
        image = Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
    elif image.mode == "P":
        image = image.convert("RGBA")
    return image.convert(mode)
