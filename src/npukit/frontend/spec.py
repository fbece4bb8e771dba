"""Resolve a model spec (torchvision name, module:factory, .pt2 or .onnx file) into a ModelSource ready to export."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import torch

from npukit.errors import InputError
from npukit.frontend._messages import first_line

SourceKind = Literal["torch", "onnx"]

_SPEC_FORMS = "torchvision:NAME, package.module:factory, a .pt2 file or an .onnx file"
_FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_VIDEO_FRAMES = 16  # torchvision's video models are trained on 16-frame clips
_FALLBACK_IMAGE_SIZE = 224


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A resolved model: a torch module (``kind == "torch"``) or an ONNX file (``kind == "onnx"``)."""

    kind: SourceKind
    spec: str
    module: torch.nn.Module | None
    onnx_path: Path | None
    default_input_shape: tuple[int, ...] | None
    description: str


def resolve_model(spec: str, *, weights: str | None = None) -> ModelSource:
    """Turn ``spec`` into a ModelSource; ``weights`` is a state-dict file for torchvision and factory specs."""
    spec = spec.strip()
    if spec.startswith("torchvision:"):
        return _from_torchvision(spec, spec.split(":", 1)[1], weights)
    path = Path(spec)
    suffix = path.suffix.lower()
    if suffix in (".pt2", ".onnx"):
        if weights is not None:
            raise InputError(f"--weights does not apply to a {suffix} file",
                             hint="weights go with torchvision:NAME or module:factory specs")
        return _from_pt2(path) if suffix == ".pt2" else _from_onnx(path)
    if suffix in (".pt", ".pth", ".bin", ".safetensors", ".ckpt"):
        raise InputError(f"{spec} holds weights, not a model",
                         hint=f"pass a model spec and give this file with --weights, e.g. torchvision:resnet18 "
                              f"--weights {spec}")
    if _FACTORY_RE.match(spec):
        return _from_factory(spec, weights)
    raise InputError(f"cannot tell what model {spec!r} is", hint=f"use one of: {_SPEC_FORMS}")


# ----------------------------------------------------------------------------------------------------- torchvision


def _torchvision_families() -> dict[str, str]:
    """Builder name -> family ("classification", "segmentation", "video", "quantization", ...)."""
    import torchvision.models as tvm

    families = {
        "segmentation": tvm.segmentation,
        "video": tvm.video,
        "quantization": tvm.quantization,
        "detection": tvm.detection,
        "optical_flow": tvm.optical_flow,
    }
    found = {name: "classification" for name in tvm.list_models(module=tvm)}
    for family, module in families.items():
        found.update({name: family for name in tvm.list_models(module=module)})
    return found


def _from_torchvision(spec: str, name: str, weights: str | None) -> ModelSource:
    import torchvision.models as tvm

    families = _torchvision_families()
    if name not in families:
        close = difflib.get_close_matches(name, list(families), n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "list them with torchvision.models.list_models()"
        raise InputError(f"torchvision has no model named {name!r}", hint=hint)
    family = families[name]
    if family in ("detection", "optical_flow"):
        raise InputError(f"torchvision:{name} is a {family.replace('_', ' ')} model, which takes lists of images "
                         "and is not supported", hint="wrap it in a module:factory that takes one tensor")
    builder = tvm.get_model_builder(name)
    kwargs: dict[str, object] = {"weights": None}
    if "weights_backbone" in inspect.signature(builder).parameters:
        kwargs["weights_backbone"] = None  # the default would download ImageNet weights for the backbone
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # random weights are the same on every run
        module = builder(**kwargs)
    if weights is not None:
        load_weights(module, weights)
    module.eval()
    shape = _torchvision_input_shape(name, family, module)
    state = f"weights from {weights}" if weights else "random weights"
    return ModelSource(kind="torch", spec=spec, module=module, onnx_path=None, default_input_shape=shape,
                       description=f"torchvision {family} model {name} ({state})")


def _torchvision_input_shape(name: str, family: str, module: torch.nn.Module) -> tuple[int, ...]:
    """The input size the architecture needs (ViT's image_size) or the size its default weights were made for."""
    import torchvision.models as tvm

    crop: list[int] | None = None
    try:
        default = tvm.get_model_weights(name).DEFAULT
    except (ValueError, AttributeError):
        default = None
    if default is not None:
        transforms = default.transforms()
        crop = getattr(transforms, "crop_size", None) or getattr(transforms, "resize_size", None)
    image_size = getattr(module, "image_size", None)  # ViTs fix their input size in the architecture
    if isinstance(image_size, int):
        height = width = image_size
    elif crop:
        height, width = (crop[0], crop[0]) if len(crop) == 1 else (crop[0], crop[1])
    else:
        height = width = _FALLBACK_IMAGE_SIZE
    if family == "video":
        return (1, 3, _VIDEO_FRAMES, height, width)
    return (1, 3, height, width)


# ------------------------------------------------------------------------------------------------ module:factory


def _from_factory(spec: str, weights: str | None) -> ModelSource:
    module_name, factory_name = spec.split(":", 1)
    try:
        py_module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises while importing
        raise InputError(f"cannot import {module_name!r}: {first_line(exc)}",
                         hint="check the module path and that its package is on PYTHONPATH") from exc
    factory = getattr(py_module, factory_name, None)
    if factory is None or not callable(factory):
        names = [n for n in dir(py_module) if not n.startswith("_") and callable(getattr(py_module, n))]
        close = difflib.get_close_matches(factory_name, names, n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "name a function or class that builds the model"
        raise InputError(f"{module_name} has no callable {factory_name!r}", hint=hint)
    try:
        module = factory()
    except Exception as exc:
        raise InputError(f"{spec}() raised {type(exc).__name__}: {first_line(exc)}",
                         hint="the factory must build the model when called with no arguments") from exc
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{spec}() returned {type(module).__name__}, not a torch.nn.Module",
                         hint="return the model itself from the factory")
    if weights is not None:
        load_weights(module, weights)
    module.eval()
    state = f"weights from {weights}" if weights else "weights as built"
    return ModelSource(kind="torch", spec=spec, module=module, onnx_path=None,
                       default_input_shape=_declared_shape(module),
                       description=f"{type(module).__name__} from {spec} ({state})")


def _declared_shape(module: torch.nn.Module) -> tuple[int, ...] | None:
    """A factory's model may declare its input with an ``example_input_shape`` attribute."""
    shape = getattr(module, "example_input_shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise InputError(f"example_input_shape {shape!r} of {type(module).__name__} is not a tuple of ints",
                         hint="set it like (1, 3, 224, 224)") from None


# ------------------------------------------------------------------------------------------------------- files


def _from_pt2(path: Path) -> ModelSource:
    _require_file(path, "an ExportedProgram saved with torch.export.save")
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise InputError(f"{path} is not a loadable torch.export program: {first_line(exc)}",
                         hint="save it with torch.export.save(torch.export.export(model, args), path)") from exc
    args, _ = program.example_inputs or ((), {})
    shape = tuple(args[0].shape) if args and isinstance(args[0], torch.Tensor) else None
    return ModelSource(kind="torch", spec=str(path), module=program.module(), onnx_path=None,
                       default_input_shape=shape, description=f"torch.export program {path.name}")


def _from_onnx(path: Path) -> ModelSource:
    from npukit.frontend.onnx_io import load_onnx, static_input_shape

    model = load_onnx(path)
    return ModelSource(kind="onnx", spec=str(path), module=None, onnx_path=path,
                       default_input_shape=static_input_shape(model),
                       description=f"ONNX model {path.name} (opset {_onnx_opset(model)}, {len(model.graph.node)} nodes)")


def _onnx_opset(model) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _require_file(path: Path, what: str) -> None:
    if not path.exists():
        raise InputError(f"{path} does not exist", hint=f"pass the path of {what}")
    if path.is_dir():
        raise InputError(f"{path} is a directory", hint=f"pass the path of {what}")


# ----------------------------------------------------------------------------------------------------- weights


def load_weights(module: torch.nn.Module, path: str | Path) -> None:
    """Load a state dict file (plain, or under a "state_dict"/"model" key) into ``module``; mismatches are errors."""
    path = Path(path)
    _require_file(path, "a state dict saved with torch.save(model.state_dict(), path)")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise InputError(f"cannot read weights from {path}: {first_line(exc)}",
                         hint="save them with torch.save(model.state_dict(), path)") from exc
    if isinstance(data, Mapping):
        for key in ("state_dict", "model"):
            if isinstance(data.get(key), Mapping):
                data = data[key]
                break
    if not isinstance(data, Mapping) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise InputError(f"{path} does not hold a state dict of tensors",
                         hint="save them with torch.save(model.state_dict(), path)")
    state = dict(data)
    expected = set(module.state_dict())
    if state and all(k.startswith("module.") for k in state) and not any(k.startswith("module.") for k in expected):
        state = {k[len("module."):]: v for k, v in state.items()}  # saved from DataParallel / DDP
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        raise InputError(f"weights in {path} do not match the model: {'; '.join(parts)} keys",
                         hint="check that the weights were saved from this architecture")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        detail = next((ln.strip() for ln in str(exc).splitlines() if "size mismatch" in ln), first_line(exc))
        raise InputError(f"weights in {path} do not match the model: {detail}",
                         hint="check that the weights were saved from this architecture") from exc
