"""Resolve a model spec (torchvision name, module:factory, or a model file of any kind) into a ModelSource."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib
import inspect
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from npukit._atomic import path_exists
from npukit.errors import InputError
from npukit.frontend._messages import first_line
from npukit.frontend.checkpoint import (NeedsCode, cwd_on_path, describe, is_optimizer_state, is_state_dict,
                                        load_tensors_only, load_weights, safetensors_count, sniff,
                                        unwrap_state_dict)

SourceKind = Literal["torch", "onnx"]

_SPEC_FORMS = ("torchvision:NAME, package.module:factory (or factory(key=value, ...)), or a model file: TorchScript, "
               "a pickled nn.Module, a torch.export .pt2, an .onnx")
_FACTORY_FORM = "package.module:factory or package.module:factory(num_classes=5, width=0.5) with literal values"
_FACTORY_HEAD = re.compile(r"^([A-Za-z_][\w.]*):([A-Za-z_]\w*)(.*)$", re.DOTALL)
_MODEL_FILE_SUFFIXES = (".pt", ".pth", ".pt2", ".onnx", ".jit", ".ts", ".torchscript", ".bin", ".ckpt", ".tar",
                        ".pkl", ".safetensors")
_ARCHITECTURE_HINT = "give the architecture as torchvision:NAME or pkg.mod:factory with --weights {path}"
PICKLE_NOTE = "loaded a pickled nn.Module: this executes code from the file"
_VIDEO_FRAMES = 16  # torchvision's video models are trained on 16-frame clips
_FALLBACK_IMAGE_SIZE = 224


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A resolved model: a torch module (``kind == "torch"``) or an ONNX file (``kind == "onnx"``).

    ``notes`` say what loading it took that the user should know (code run from a pickle, a checkpoint unwrapped,
    a key prefix stripped); they go into the report.
    """

    kind: SourceKind
    spec: str
    module: torch.nn.Module | None
    onnx_path: Path | None
    default_input_shape: tuple[int, ...] | None
    description: str
    notes: tuple[str, ...] = ()
    random_weights: bool = False  # a torchvision architecture built without --weights: untrained
    # a torch program built from an ONNX model (``frontend.onnx_torch``): that model's input and output names, which
    # the program's ONNX exports keep (a report names the outputs as the user's model does, not output_0, ...)
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    fixed_batch: int | None = None  # a .pt2 traced without a dynamic batch dimension: the batch it takes


def source_of(model: Any, *, weights: str | None = None) -> ModelSource:
    """A ModelSource for a spec or file (``resolve_model``) or a torch.nn.Module given in Python (evaluated as it is,
    ``weights`` loaded into it first); anything else is an InputError."""
    if isinstance(model, (str, Path)):
        return resolve_model(str(model), weights=weights)
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"cannot take a {type(model).__name__} as a model",
                         hint=f"pass a torch.nn.Module or one of: {_SPEC_FORMS}")
    notes = load_weights(model, weights) if weights else ()
    return ModelSource(kind="torch", spec=type(model).__name__, module=model.eval(), onnx_path=None,
                       default_input_shape=None, description=f"torch module {type(model).__name__}", notes=notes)


def model_label(model: Any) -> str:
    """How messages and reports name ``model``: a spec or path as given, a module by its class."""
    return str(model) if isinstance(model, (str, Path)) else type(model).__name__


def resolve_model(spec: str, *, weights: str | None = None) -> ModelSource:
    """Turn ``spec`` into a ModelSource; ``weights`` is a state-dict file for the architectures built in Python
    (torchvision, factory, pickled nn.Module). A model file is told by its content, whatever its suffix."""
    spec = spec.strip()
    if spec.startswith("torchvision:"):
        return _from_torchvision(spec, spec.split(":", 1)[1], weights)
    path = Path(spec)
    if path_exists(path):
        return _from_file(path, weights)
    if _FACTORY_HEAD.match(spec):
        return _from_factory(spec, weights)
    if path.suffix.lower() in _MODEL_FILE_SUFFIXES or "/" in spec:
        raise InputError(f"{spec} does not exist", hint=f"pass one of: {_SPEC_FORMS}")
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
        # 0.5 offered efficientnet_b7 for nonexistent_net; 0.7 keeps resnet_18 -> resnet18, vit_b16 -> vit_b_16
        close = difflib.get_close_matches(name, list(families), n=5, cutoff=0.7)
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
    notes = load_weights(module, weights) if weights is not None else ()
    module.eval()
    shape = _torchvision_input_shape(name, family, module)
    state = f"weights from {weights}" if weights else "random weights"
    return ModelSource(kind="torch", spec=spec, module=module, onnx_path=None, default_input_shape=shape,
                       description=f"torchvision {family} model {name} ({state})", notes=notes,
                       random_weights=weights is None)


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


def parse_factory_spec(spec: str) -> tuple[str, str, tuple[Any, ...], dict[str, Any]]:
    """``pkg.mod:factory(num_classes=5, width=0.5)`` -> ("pkg.mod", "factory", (), {"num_classes": 5, "width": 0.5}).

    Argument values are parsed with ast.literal_eval (numbers, strings, bytes, booleans, None, tuples, lists,
    dicts, sets): nothing in the spec is run as code.
    """
    match = _FACTORY_HEAD.match(spec.strip())
    if match is None:
        raise InputError(f"{spec!r} is not a factory spec", hint=f"write it as {_FACTORY_FORM}")
    module_name, factory_name, rest = match.group(1), match.group(2), match.group(3).strip()
    if not rest:
        return module_name, factory_name, (), {}
    try:
        call = ast.parse(f"_factory{rest}", mode="eval").body
    except SyntaxError as exc:
        raise InputError(f"cannot parse the arguments in {spec!r}: {exc.msg}", hint=f"write it as {_FACTORY_FORM}") \
            from None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_factory"):
        raise InputError(f"cannot parse the arguments in {spec!r}: expected one (...) after the factory name",
                         hint=f"write it as {_FACTORY_FORM}")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for node in [*call.args, *call.keywords]:
        if isinstance(node, ast.Starred) or (isinstance(node, ast.keyword) and node.arg is None):
            raise InputError(f"cannot use * or ** in {spec!r}", hint=f"write it as {_FACTORY_FORM}")
        value_node = node.value if isinstance(node, ast.keyword) else node
        try:
            value = ast.literal_eval(value_node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            name = f"{node.arg}=" if isinstance(node, ast.keyword) else ""
            raise InputError(f"{name}{ast.unparse(value_node)} in {spec!r} is not a literal value",
                             hint=f"use numbers, strings, True/False/None, tuples, lists or dicts: {_FACTORY_FORM}") \
                from None
        if isinstance(node, ast.keyword):
            kwargs[str(node.arg)] = value
        else:
            args.append(value)
    return module_name, factory_name, tuple(args), kwargs


def _from_factory(spec: str, weights: str | None) -> ModelSource:
    module_name, factory_name, args, kwargs = parse_factory_spec(spec)
    try:
        with cwd_on_path():
            importlib.invalidate_caches()  # files written since the last import (e.g. by a script) are found
            py_module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises while importing
        raise InputError(f"cannot import {module_name!r}: {first_line(exc)}",
                         hint="run npukit from the folder that holds the module, or put its package on PYTHONPATH") \
            from exc
    factory = getattr(py_module, factory_name, None)
    if factory is None or not callable(factory):
        names = [n for n in dir(py_module) if not n.startswith("_") and callable(getattr(py_module, n))]
        close = difflib.get_close_matches(factory_name, names, n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "name a function or class that builds the model"
        raise InputError(f"{module_name} has no callable {factory_name!r}", hint=hint)
    call = f"{module_name}:{factory_name}({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kwargs.items())])})"
    try:
        module = factory(*args, **kwargs)
    except Exception as exc:
        if args or kwargs:
            hint = f"check the arguments against {factory_name}{_signature(factory)}"
        else:
            hint = (f"the factory must build the model when called with no arguments, or give them: "
                    f"{module_name}:{factory_name}(key=value, ...)")
        raise InputError(f"{call} raised {type(exc).__name__}: {first_line(exc)}", hint=hint) from exc
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{call} returned {type(module).__name__}, not a torch.nn.Module",
                         hint="return the model itself from the factory")
    notes = load_weights(module, weights) if weights is not None else ()
    if module.training and any(isinstance(m, _MODE_DEPENDENT) for m in module.modules()):
        notes = (*notes, f"{call} returned the model in training mode; it is used in eval mode (Dropout off, "
                         "BatchNorm on its running statistics), as deployed")
    module.eval()
    state = f"weights from {weights}" if weights else "weights as built"
    return ModelSource(kind="torch", spec=spec, module=module, onnx_path=None,
                       default_input_shape=_declared_shape(module),
                       description=f"{type(module).__name__} from {call} ({state})", notes=notes)


def _signature(factory: Any) -> str:
    try:
        return str(inspect.signature(factory))
    except (TypeError, ValueError):
        return "(...)"


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


def _from_file(path: Path, weights: str | None) -> ModelSource:
    """A model file, told by its content: an .onnx suffix must hold ONNX and ONNX must carry the .onnx suffix;
    any torch file is read as what it holds, whatever its suffix."""
    if path.is_dir():
        raise InputError(f"{path} is a directory", hint=f"pass a model file or spec: {_SPEC_FORMS}")
    info = sniff(path)
    is_onnx_name = path.suffix.lower() == ".onnx"
    if is_onnx_name and info.kind in ("torchscript", "exported_program", "torch_pickle"):
        suffix = ".pt2" if info.kind == "exported_program" else ".pt"
        raise InputError(f"{path} is {info.what}, not an ONNX model",
                         hint=f"rename it to {path.stem}{suffix} and pass that")
    if info.kind == "onnx" and not is_onnx_name:
        raise InputError(f"{path} is an ONNX model but its name does not end in .onnx",
                         hint=f"rename it to {path.stem}.onnx and pass that")
    if info.kind == "safetensors":
        raise InputError(f"{path} holds weights ({safetensors_count(path)} tensors in safetensors format), not a "
                         "model", hint=_ARCHITECTURE_HINT.format(path=path))
    if info.kind == "onnx" or is_onnx_name:  # onnx_io names what else an .onnx file holds
        _no_weights(weights, "an ONNX model")
        return _from_onnx(path)
    if info.kind == "torchscript":
        _no_weights(weights, "a TorchScript module")
        return _from_torchscript(path)
    if info.kind == "exported_program":
        _no_weights(weights, "a torch.export program")
        return _from_pt2(path)
    if info.kind == "torch_pickle":
        return _from_torch_pickle(path, weights)
    hint = ("name the function that builds the model: package.module:factory" if info.what == "Python source code"
            else f"pass one of: {_SPEC_FORMS}")
    raise InputError(f"{path} is {info.what}, not a model", hint=hint)


def _no_weights(weights: str | None, what: str) -> None:
    if weights is not None:
        raise InputError(f"--weights does not apply to {what}, which holds its own weights",
                         hint="weights go with torchvision:NAME, package.module:factory or a pickled nn.Module")


def _from_torchscript(path: Path) -> ModelSource:
    """A TorchScript archive (torch.jit.save of a scripted or traced module). Loading it runs no Python code."""
    module: torch.nn.Module | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.load's deprecation notice
        try:
            # A traced module stores its example inputs; restoring them gives the graph's input shapes.
            module = torch.jit.load(str(path), map_location="cpu", _restore_shapes=True)
        except Exception:  # an older archive, or a torch without the option: load it plainly
            module = None
        if module is None:
            try:
                module = torch.jit.load(str(path), map_location="cpu")
            except Exception as exc:
                raise InputError(f"{path} is a TorchScript archive that torch.jit.load cannot read: "
                                 f"{first_line(exc)}", hint="save it again with torch.jit.save") from exc
    module.eval()
    traced = _traced_input_shape(module)
    shape = traced or _declared_shape(module)
    how = f", traced with input {'x'.join(map(str, traced))}" if traced else ""
    return ModelSource(kind="torch", spec=str(path), module=module, onnx_path=None, default_input_shape=shape,
                       description=f"TorchScript module {path.name}{how}")


def _traced_input_shape(module: torch.nn.Module) -> tuple[int, ...] | None:
    """The static shape of a TorchScript module's only tensor input, where the graph records one."""
    try:
        inputs = list(module.graph.inputs())[1:]  # type: ignore[union-attr]  # the first is self
    except Exception:
        return None
    if len(inputs) != 1 or not isinstance(inputs[0].type(), torch._C.TensorType):
        return None
    sizes = inputs[0].type().sizes()
    return tuple(int(d) for d in sizes) if sizes and all(d is not None for d in sizes) else None


def _from_torch_pickle(path: Path, weights: str | None) -> ModelSource:
    """A torch.save file: weights get their diagnosis without running code; a pickled nn.Module is loaded in full,
    which runs code from the file (the user named it as the model, and the report says so)."""
    try:
        data = load_tensors_only(path)
    except NeedsCode as exc:
        data = _load_pickled_objects(path, exc.global_name)
    else:
        if unwrap_state_dict(data) is not None:
            hint = _ARCHITECTURE_HINT.format(path=path)
        elif is_optimizer_state(data):
            hint = ("an optimizer's state holds no model weights: save model.state_dict() and "
                    + _ARCHITECTURE_HINT.format(path="FILE"))
        else:
            hint = f"pass one of: {_SPEC_FORMS}"
        raise InputError(f"{path} {_weights_diagnosis(data)}, not a model", hint=hint)
    notes = [PICKLE_NOTE]
    if isinstance(data, Mapping) and isinstance(data.get("model"), torch.nn.Module):
        others = [str(k) for k in data if k != "model"]
        notes.append("took the nn.Module under the checkpoint's 'model' key"
                     + (f" (left out: {', '.join(others[:5])})" if others else ""))
        data = data["model"]
    if not isinstance(data, torch.nn.Module):
        raise InputError(f"{path} holds a pickled {type(data).__name__}, not a torch.nn.Module",
                         hint=f"save the model itself with torch.save(model, path), or pass one of: {_SPEC_FORMS}")
    module = data
    if weights is not None:
        notes.extend(load_weights(module, weights))
    module.eval()
    state = f"weights from {weights}" if weights else "weights as saved"
    return ModelSource(kind="torch", spec=str(path), module=module, onnx_path=None,
                       default_input_shape=_declared_shape(module),
                       description=f"pickled {type(module).__name__} from {path.name} ({state})", notes=tuple(notes))


def _weights_diagnosis(data: Any) -> str:
    text = describe(data)
    unwrapped = unwrap_state_dict(data)
    if unwrapped is not None and not is_state_dict(data):
        return f"{text} (npukit unwraps it with --weights)"
    return text


def _load_pickled_objects(path: Path, global_name: str | None) -> Any:
    """torch.load with weights_only=False, the current directory importable (where the model's class usually is)."""
    try:
        with cwd_on_path(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # the class's module cannot be imported, or the pickle is damaged
        what = f"a pickled {global_name}" if global_name else "pickled objects"
        hint = ("torch.save(model) stores a reference to the model's class, not its code: run npukit from the "
                "folder its module is imported from, or save model.state_dict() and pass package.module:factory "
                f"--weights {path}")
        if global_name and global_name.startswith("__main__."):
            hint = (f"{global_name} was defined in a script run as __main__, which cannot be imported here: save "
                    f"model.state_dict() and pass package.module:factory --weights {path}")
        raise InputError(f"{path} holds {what} that cannot be loaded here: {first_line(exc)}", hint=hint) from exc


def _from_pt2(path: Path) -> ModelSource:
    _require_file(path, "an ExportedProgram saved with torch.export.save")
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise InputError(f"{path} is not a loadable torch.export program: {first_line(exc)}",
                         hint="save it with torch.export.save(torch.export.export(model, args), path)") from exc
    args, _ = program.example_inputs or ((), {})
    shape = tuple(args[0].shape) if args and isinstance(args[0], torch.Tensor) else None
    first = next((n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"
                  and n.name in program.graph_signature.user_inputs), None)
    batch = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else None
    return ModelSource(kind="torch", spec=str(path), module=program.module(), onnx_path=None,
                       default_input_shape=shape, description=f"torch.export program {path.name}",
                       fixed_batch=batch if isinstance(batch, int) else None)


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


# layers that compute differently in training mode
_MODE_DEPENDENT = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm,
                   torch.nn.modules.instancenorm._InstanceNorm)


def eval_mode(module: Any) -> Any:
    """``module`` in eval mode. The module of a torch.export program (a .pt2) refuses ``.eval()``: its graph holds
    the mode it was exported in, and only its flag is cleared (what converters read)."""
    try:
        return module.eval()
    except NotImplementedError:
        object.__setattr__(module, "training", False)
        return module
