"""Tell a file by its content (TorchScript, torch.export, torch.save pickle, safetensors, ONNX, other) and load weights.

A state dict keeps its ``_metadata`` (the per-layer versions ``load_state_dict`` hands to each layer's loader)
through every unwrapping and key change here: without it a layer such as torchvision's MNASNet refuses the weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import re
import struct
import sys
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from npukit.errors import InputError
from npukit.frontend._messages import first_line

FileKind = Literal["torchscript", "exported_program", "torch_pickle", "safetensors", "onnx", "other"]

# Keys under which training scripts commonly nest a model's state dict, tried in this order.
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")
# Key prefixes added by wrappers around a model: DataParallel / DistributedDataParallel, torch.compile.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_MAX_UNWRAP = 3
_SAFETENSORS_MAX_HEADER = 100 * 2**20

_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", "a JPEG image"),
    (0, b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (0, b"GIF8", "a GIF image"),
    (0, b"%PDF", "a PDF document"),
    (0, b"\x1f\x8b", "a gzip archive"),
    (0, b"\x93NUMPY", "a NumPy array (.npy)"),
    (0, b"\x89HDF\r\n\x1a\n", "an HDF5 file (a Keras .h5 model?)"),
    (4, b"TFL3", "a TensorFlow Lite model"),
    (0, b"GGUF", "a GGUF model (llama.cpp)"),
)
_SAVE_HINT = "save it with torch.save(model.state_dict(), path)"


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """What a file holds, judged from its bytes alone (nothing is unpickled or run)."""

    kind: FileKind
    what: str  # "a TorchScript module", "a JPEG image", ...


def sniff(path: Path) -> FileInfo:
    """The kind of ``path`` from its first bytes and, for zip archives, the names of its records."""
    with path.open("rb") as f:
        head = f.read(4096)
    if not head:
        return FileInfo("other", "an empty file")
    if head.startswith(b"PK\x03\x04"):
        return _sniff_zip(path)
    if len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5:  # pickle protocol 2-5: legacy torch.save
        return FileInfo("torch_pickle", "a PyTorch (pickle) file")
    if _is_safetensors(path, head):
        return FileInfo("safetensors", "a safetensors file")
    if head[:1] == b"\x08" and _is_onnx(path):
        return FileInfo("onnx", "an ONNX model")
    for offset, signature, what in _SIGNATURES:
        if head[offset:offset + len(signature)] == signature:
            return FileInfo("other", what)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return FileInfo("other", "a binary file of no format npukit knows")
    if re.search(r"^\s*(import |from \S+ import |def |class )", text, re.MULTILINE):
        return FileInfo("other", "Python source code")
    return FileInfo("other", "a text file")


def _sniff_zip(path: Path) -> FileInfo:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return FileInfo("other", "a damaged zip archive (truncated?)")
    # torch writes every record under one top-level folder named after the file.
    records = {name.split("/", 1)[1] if "/" in name else name for name in names}
    if "constants.pkl" in records or any(r.startswith("code/") for r in records):
        return FileInfo("torchscript", "a TorchScript module")
    if "archive_format" in records or any(r.startswith("models/") for r in records):
        return FileInfo("exported_program", "a torch.export program")
    if "data.pkl" in records:
        return FileInfo("torch_pickle", "a PyTorch (pickle) file")
    return FileInfo("other", "a zip archive that is not a PyTorch file")


def _is_safetensors(path: Path, head: bytes) -> bool:
    """safetensors: an 8-byte little-endian header length, then that many bytes of JSON starting with '{'."""
    if len(head) < 10 or head[8:9] != b"{":
        return False
    (length,) = struct.unpack("<Q", head[:8])
    return length <= min(_SAFETENSORS_MAX_HEADER, path.stat().st_size - 8)


def safetensors_count(path: Path) -> int:
    """The number of tensors a safetensors file holds, read from its header."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return sum(1 for key in header if key != "__metadata__")


def _is_onnx(path: Path) -> bool:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError):
        return False
    return model.ir_version > 0 and len(model.graph.node) > 0


# ---------------------------------------------------------------------------------------------- state dicts


def is_state_dict(obj: Any) -> bool:
    """A non-empty mapping of names to tensors (``*._extra_state`` entries may hold anything)."""
    return (isinstance(obj, Mapping) and len(obj) > 0
            and all(isinstance(k, str) for k in obj)
            and all(isinstance(v, torch.Tensor) or k.endswith("_extra_state") for k, v in obj.items()))


def is_optimizer_state(obj: Any) -> bool:
    return isinstance(obj, Mapping) and "state" in obj and "param_groups" in obj


def find_state_dict(obj: Any, depth: int = _MAX_UNWRAP) -> tuple[Mapping[str, Any], tuple[str, ...]] | None:
    """The state dict in ``obj`` and the keys leading to it: ``obj`` itself (no keys), or nested under WRAPPER_KEYS
    (tried in order, at most ``depth`` levels deep); None when there is none."""
    if is_state_dict(obj):
        return obj, ()
    if depth == 0 or not isinstance(obj, Mapping):
        return None
    for key in WRAPPER_KEYS:
        found = find_state_dict(obj.get(key), depth - 1) if isinstance(obj.get(key), Mapping) else None
        if found is not None:
            return found[0], (key, *found[1])
    return None


def unwrap_state_dict(obj: Any) -> tuple[Mapping[str, Any], tuple[str, ...]] | None:
    """The state dict in ``obj`` (see find_state_dict) and notes saying what was unwrapped; None when there is none.

    The mapping found is returned as is, so its ``_metadata`` stays with it.
    """
    found = find_state_dict(obj)
    if found is None:
        return None
    state, path = found
    notes: list[str] = []
    level = obj
    for key in path:
        others = [str(k) for k in level if k != key]
        left_out = f" (left out: {', '.join(others[:5])}{', ...' if len(others) > 5 else ''})" if others else ""
        notes.append(f"took the weights under the checkpoint's {key!r} key{left_out}")
        level = level[key]
    return state, tuple(notes)


def strip_prefix(state: Mapping[str, Any], prefix: str) -> OrderedDict[str, Any]:
    """``state`` with ``prefix`` removed from every key, and its ``_metadata`` re-keyed the same way.

    Metadata keys are module paths without the trailing dot: ``module.layers`` becomes ``layers`` and the wrapper
    itself (``module``) becomes the root (``""``); the wrapper's own root entry is dropped.
    """
    assert prefix.endswith("."), prefix
    stripped: OrderedDict[str, Any] = OrderedDict(
        (k[len(prefix):] if k.startswith(prefix) else k, v) for k, v in state.items())
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:
        rekeyed: OrderedDict[str, Any] = OrderedDict()
        for key, value in metadata.items():
            if key == prefix[:-1]:
                rekeyed[""] = value
            elif key.startswith(prefix):
                rekeyed[key[len(prefix):]] = value
        stripped._metadata = rekeyed  # type: ignore[attr-defined]
    return stripped


def match_prefixes(state: Mapping[str, Any], expected: set[str]) -> tuple[Mapping[str, Any], tuple[str, ...]]:
    """Strip key prefixes the model does not have: WRAPPER_PREFIXES always, any other one shared by every key
    (e.g. a Lightning module's ``model.``) when stripping it makes the keys exactly the model's."""
    notes: list[str] = []
    for _ in range(_MAX_UNWRAP + 1):
        keys = set(state)
        if keys == expected or not keys:
            break
        heads = {k.split(".", 1)[0] for k in keys}
        if len(heads) != 1 or not all("." in k for k in keys):
            break
        prefix = heads.pop() + "."
        if any(k.startswith(prefix) for k in expected):
            break
        candidate = strip_prefix(state, prefix)
        if prefix not in WRAPPER_PREFIXES and set(candidate) != expected:
            break
        state = candidate
        why = {"module.": " (saved from DataParallel / DistributedDataParallel)",
               "_orig_mod.": " (saved from a torch.compile'd model)"}.get(prefix, "")
        notes.append(f"stripped the {prefix!r} prefix from every key{why}")
    return state, tuple(notes)


# ------------------------------------------------------------------------------------------------- reading


@contextlib.contextmanager
def cwd_on_path() -> Iterator[None]:
    """The current directory on sys.path for the duration (imports of the user's own modules), then as it was."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


class NeedsCode(Exception):
    """The file holds pickled Python objects that only a full (code-running) unpickling can rebuild."""

    def __init__(self, global_name: str | None) -> None:
        super().__init__(global_name or "objects the weights-only loader does not allow")
        self.global_name = global_name


def load_tensors_only(path: Path) -> Any:
    """torch.load with weights_only=True (runs no code); NeedsCode when the file holds more than tensors and
    containers, InputError when it is not a readable torch file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+) was not an allowed global", str(exc))
        raise NeedsCode(found.group(1) if found else None) from exc
    except Exception as exc:
        raise InputError(f"{path} is not a readable PyTorch file (truncated or corrupt?): {first_line(exc)}",
                         hint="save it again with torch.save") from exc


def describe(obj: Any) -> str:
    """What a loaded torch file holds, for error messages: "holds weights (12 tensors)", ..."""
    if is_state_dict(obj):
        return f"holds weights ({len(obj)} tensors)"
    found = find_state_dict(obj)
    if found is not None:
        where = "".join(f"[{k!r}]" for k in found[1])
        return f"holds a training checkpoint with weights ({len(found[0])} tensors) under {where}"
    if is_optimizer_state(obj):
        return "holds an optimizer's state (optimizer.state_dict())"
    if isinstance(obj, torch.Tensor):
        return f"holds a single tensor of shape {tuple(obj.shape)}"
    if isinstance(obj, Mapping):
        keys = ", ".join(repr(k) for k in list(obj)[:5])
        return f"holds a dict with keys {keys}{', ...' if len(obj) > 5 else ''} and no state dict of tensors"
    return f"holds a {type(obj).__name__}"


def load_weights(module: torch.nn.Module, path: str | Path) -> tuple[str, ...]:
    """Load a state dict file into ``module``: plain, nested under a WRAPPER_KEYS key, with a DDP ``module.`` (or
    torch.compile ``_orig_mod.``) prefix, or safetensors. Runs no code from the file. Returns notes saying what was
    unwrapped or stripped; any mismatch with the model is an InputError."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path} does not exist", hint="pass a state dict saved with torch.save(model.state_dict())")
    if path.is_dir():
        raise InputError(f"{path} is a directory", hint="pass a state dict saved with torch.save(model.state_dict())")
    info = sniff(path)
    if info.kind in ("torchscript", "exported_program", "onnx"):
        raise InputError(f"--weights {path} is {info.what}, not weights",
                         hint=f"pass it as the model instead: npukit export {path} -o OUT.onnx")
    if info.kind == "other":
        raise InputError(f"cannot read weights from {path}: it is {info.what}", hint=_SAVE_HINT)
    if info.kind == "safetensors":
        data: Any = _load_safetensors(path)
    else:
        try:
            data = load_tensors_only(path)
        except NeedsCode as exc:
            held = f" ({exc.global_name})" if exc.global_name else ""
            raise InputError(f"--weights {path} holds pickled Python objects{held}, not just tensors",
                             hint="if it is a whole model saved with torch.save(model), pass it as the model "
                                  "(npukit export FILE); weights files are read without running code") from None
    unwrapped = unwrap_state_dict(data)
    if unwrapped is None:
        raise InputError(f"{path} {describe(data)}, not a state dict of tensors", hint=_SAVE_HINT)
    state, notes = unwrapped
    state, stripped = match_prefixes(state, set(module.state_dict()))
    notes += stripped
    try:
        result = module.load_state_dict(state, strict=False)
    except Exception as exc:  # size mismatches, and any error a layer's own loader raises
        size = next((ln.strip() for ln in str(exc).splitlines() if "size mismatch" in ln), None)
        detail = size or first_line(exc)
        hint = _head_hint(state, module.state_dict()) or "check that the weights were saved from this architecture"
        if size is None and getattr(state, "_metadata", None) is None:
            hint += ("; this state dict has no _metadata (per-layer versions): save it with "
                     "torch.save(model.state_dict(), path), not a copy of the dict")
        raise InputError(f"weights in {path} do not match the model: {detail}", hint=hint) from exc
    missing, unexpected = sorted(result.missing_keys), sorted(result.unexpected_keys)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        raise InputError(f"weights in {path} do not match the model: {'; '.join(parts)} keys",
                         hint="check that the weights were saved from this architecture")
    return notes


def _head_hint(state: Mapping[str, Any], own: Mapping[str, Any]) -> str | None:
    """When the only mismatch is one layer's output count (a classifier head trained for another number of
    classes), how to build the model to match; else None."""
    mismatched = [(key, tuple(value.shape), tuple(own[key].shape)) for key, value in state.items()
                  if key in own and hasattr(value, "shape") and tuple(value.shape) != tuple(own[key].shape)]
    layers = {key.rsplit(".", 1)[0] for key, _, _ in mismatched}
    if not mismatched or len(layers) != 1 or not all(a and b and a[0] != b[0] and a[1:] == b[1:]
                                                     for _, a, b in mismatched):
        return None
    layer = next(iter(layers))
    if len(mismatched) != sum(1 for key in state if key in own and key.rsplit(".", 1)[0] == layer):
        return None  # the layer's other tensors (its bias) match: not a head for other classes
    _, theirs, ours = mismatched[0]
    return (f"the weights' {layer} has {theirs[0]} outputs where this model has {ours[0]}: build the model "
            f"for {theirs[0]} classes, e.g. the spec 'torchvision.models:NAME(num_classes={theirs[0]})'")


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise InputError(f"reading {path} needs the safetensors package",
                         hint="pip install safetensors, or save the weights with torch.save") from None
    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:
        raise InputError(f"cannot read weights from {path}: {first_line(exc)}",
                         hint="save them again with safetensors.torch.save_file or torch.save") from exc

