"""Configuration: frozen dataclasses that validate themselves and are written, resolved, into every report."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from npukit.errors import InputError

T = TypeVar("T")

Exporter = Literal["auto", "dynamo", "torchscript"]


def _require(cond: bool, message: str, hint: str = "") -> None:
    if not cond:
        raise InputError(message, hint=hint)


def parse_shape(text: str | tuple[int, ...] | list[int] | None) -> tuple[int, ...] | None:
    """'1,3,224,224' (or 1x3x224x224) -> (1, 3, 224, 224)."""
    if text is None:
        return None
    if isinstance(text, (tuple, list)):
        parts = list(text)
    else:
        parts = [p for p in text.replace("x", ",").replace(" ", "").split(",") if p]
    try:
        shape = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise InputError(f"input shape {text!r} is not a list of integers", hint="write it like 1,3,224,224") from None
    _require(len(shape) > 0 and all(d > 0 for d in shape), f"input shape {text!r} must have positive dimensions",
             "write it like 1,3,224,224")
    values = math.prod(shape)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    _require(4 * values <= memory // 8, f"input shape {text!r} is {values:.3g} values ({4 * values / 1e9:.3g} GB as "
             f"float32): more than this machine's memory ({memory / 1e9:.3g} GB) can run a model on",
             "give the size the model is meant to run at, e.g. 1,3,224,224")
    return shape


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """How a model is turned into ONNX and how the export is verified against torch."""

    input_shape: tuple[int, ...] | None = None  # None: the model's known default
    dynamic_batch: bool = False
    opset: int | None = None  # None: 18 for a torch model, an .onnx file keeps its own; a number: that opset (an
    # .onnx file converted up to it, verified)
    exporter: Exporter = "auto"  # auto: dynamo, falling back to the TorchScript exporter
    rtol: float = 1e-4  # max |onnx - torch| / max |torch|, per output
    verify_samples: int = 2
    seed: int = 0
    input_name: str = "input"  # the ONNX input's name for a torch model (``--input-shape NAME=...`` sets it)
    output_names: tuple[str, ...] = ()  # the ONNX outputs' names for a torch model, one per output; (): output, or
    # output_0, output_1, ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", parse_shape(self.input_shape))
        object.__setattr__(self, "output_names", tuple(self.output_names))
        _require(len(set(self.output_names)) == len(self.output_names) and all(self.output_names),
                 f"output names {self.output_names} must be distinct and non-empty", "name each output once")
        _require(bool(self.input_name) and self.input_name.strip() == self.input_name,
                 f"input name {self.input_name!r} must be non-empty without surrounding spaces", "e.g. input")
        _require(self.opset is None or 17 <= self.opset <= 23, f"opset {self.opset} is not supported",
                 "use an opset from 17 to 23")
        _require(self.exporter in typing.get_args(Exporter), f"unknown exporter {self.exporter!r}",
                 "use auto, dynamo or torchscript")
        _require(self.rtol > 0, "rtol must be positive")
        _require(self.verify_samples >= 1, "verify_samples must be at least 1")


@dataclasses.dataclass(frozen=True)
class OptimizeConfig:
    """Which graph passes run, and how their result is verified against the unmodified model."""

    skip_passes: tuple[str, ...] = ()
    verify: bool = True
    rtol: float = 1e-4  # max |after - before| / max |before|, per output
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "skip_passes", tuple(self.skip_passes))
        _require(self.rtol > 0, "rtol must be positive")


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    """ImageNet-style preprocessing: resize the short side, center-crop, scale to [0,1], normalize, NCHW float32.
    ``width``: the crop's width where it is not square (a text line's 48 x 192): the crop is ``size`` tall."""

    size: int = 224
    resize: int | None = None  # the short side before the crop; None: size / 0.875 (ImageNet's 256 for 224)
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    channels: Literal[1, 3] = 3
    width: int | None = None  # None: as tall as wide

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        _require(self.size > 0 and (self.resize is None or self.resize >= self.size), "resize must be >= size > 0")
        _require(len(self.mean) == self.channels == len(self.std), "mean and std need one value per channel")
        _require(all(s > 0 for s in self.std), "std values must be positive")
        _require(self.width is None or self.width > 0, "width must be positive")

    @property
    def crop(self) -> tuple[int, int]:
        """The crop's (height, width)."""
        return self.size, self.width or self.size

    @property
    def short_side(self) -> int:
        """What the short side is resized to: ``resize``, or the crop's size / 0.875 (a 32-pixel model's crop is
        then most of the image, as a 224-pixel model's is of 256, not a 32-pixel patch of a 256-pixel image)."""
        return self.resize if self.resize is not None else round(self.size * 256 / 224)


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """How latency is measured with ONNX Runtime on the CPU."""

    threads: int = 1
    warmup: int = 10
    runs: int = 50
    max_samples: int | None = None  # cap on data samples used for agreement/accuracy
    batch_size: int = 1

    def __post_init__(self) -> None:
        _require(self.threads >= 1, f"--threads {self.threads}: threads must be at least 1",
                 hint="pass --threads 1 (one core, the phone-like figure) or the cores to use")
        _require(self.warmup >= 0 and self.runs >= 1, "runs must be at least 1 and warmup non-negative")
        _require(self.max_samples is None or self.max_samples >= 1, "max_samples (--max-samples) must be at least 1")
        _require(self.batch_size >= 1, "batch_size must be at least 1")


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def from_mapping(cls: type[T], mapping: Mapping[str, Any]) -> T:
    """Build a config dataclass from a mapping, rejecting unknown keys by name."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(mapping) - names)
    _require(not unknown, f"unknown {cls.__name__} keys: {', '.join(unknown)}", f"valid keys: {', '.join(sorted(names))}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in mapping.items()}
    return cls(**values)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or YAML config file into a dict of sections ({"export": {...}, "bench": {...}})."""
    path = Path(path)
    _require(path.is_file(), f"config file {path} does not exist", "pass the path of a .json or .yaml file")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise InputError("reading YAML configs needs PyYAML", hint="pip install pyyaml, or use a .json file") from None
        data = yaml.safe_load(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"config file {path} is not valid JSON: {exc}") from None
    _require(isinstance(data, dict), f"config file {path} must hold a mapping of sections")
    return data
