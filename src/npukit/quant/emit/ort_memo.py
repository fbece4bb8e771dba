"""ONNX Runtime's quantizer with its pure inner steps remembered (``npukit.quant.memo``) while ``emit_qdq`` runs.

ORT's ``quantize_static`` computes, in Python, every weight's grid (scale and zero point, channel by channel) and
its integers, and first runs its own calibration of the float model on the one sample it insists on; on MobileNetV2
that is 1.0 s of an emit's 1.5. The emits of one float model (each candidate of ``auto``, every trial of a search
that keeps the weights) compute the same again. Three functions of ORT are pure (what they give depends on their
arguments alone, the calibration's on the model's files and the samples), so their results are remembered by their
arguments' bytes:

- ``compute_data_quant_params`` (a weight channel's grid),
- ``quantize_onnx_initializer`` (a weight's integers),
- the calibrator ``create_calibrator`` makes: created and run only where the same model files and samples were not
  calibrated before with the same settings.

A hit gives a copy of what the function gave before, so the QDQ model is the one ORT writes without them, byte for
byte. They are ORT's own functions again outside the block, and left alone where their signatures are not the ones
mirrored here (another ORT version: nothing is remembered, nothing changes).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader

from npukit.quant import memo

# A MobileNetV2 weight set: 17,000 channels' grids (about 700 bytes each, key and arrays: ``_GRID_BYTES``) and
# 3.5 MB of int8 weights
_GRIDS = memo.memo("ORT weight grids", entries=1 << 16, max_bytes=64 << 20)
_GRID_BYTES = 768
_INTEGERS = memo.memo("ORT weight integers", entries=4096, max_bytes=64 << 20)
_CALIBRATIONS = memo.memo("ORT one-sample calibrations", entries=64, max_bytes=16 << 20)
_PATCHING = threading.Lock()  # one emit at a time swaps ORT's functions (a second, on another thread, runs ORT's own)
_GRID_ARGS = ("data", "quant_type", "symmetric", "reduce_range", "min_real_range", "rmin_override", "rmax_override")
_INTEGER_ARGS = ("weight", "quant_type", "zero_point", "scale", "axis", "quant_weight_name", "block_size")
_CALIBRATOR_ARGS = ("model", "op_types_to_calibrate", "augmented_model_path", "calibrate_method",
                    "use_external_data_format", "providers", "extra_options")


def _arg(value: Any) -> Any:
    """An argument as part of a key: an array by its bytes, a scalar with its type (np.float32(0.5) and 0.5 are
    kept apart)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return memo.array_key(value)
    return type(value), value


def _hashable(key: tuple) -> bool:
    """Whether ``key`` can key a memo (an argument of a type these functions are not given here, a list, is not
    remembered)."""
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _bytes_key(data: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    """``memo.array_key`` for the many small channels of one weight (no copy where the channel is contiguous)."""
    if not data.flags.c_contiguous:
        data = np.ascontiguousarray(data)
    return data.dtype.str, data.shape, hashlib.blake2b(data, digest_size=16).digest()


def _remembered_grids(compute: Callable[..., Any]) -> Callable[..., Any]:
    """``quant_utils.compute_data_quant_params`` remembered by its arguments (``_GRIDS``)."""

    def grids(data, quant_type, symmetric, reduce_range=False, min_real_range=None, rmin_override=None,
              rmax_override=None):
        args = (data, quant_type, symmetric, reduce_range, min_real_range, rmin_override, rmax_override)
        if type(data) is not np.ndarray or data.dtype.hasobject:
            return compute(*args)
        key = (_bytes_key(data), _arg(quant_type), _arg(symmetric), _arg(reduce_range), _arg(min_real_range),
               _arg(rmin_override), _arg(rmax_override))
        if not _hashable(key):
            return compute(*args)
        kept = _GRIDS.get(key)
        if kept is None:
            computed = compute(*args)
            if not isinstance(computed, tuple) or not all(isinstance(a, np.ndarray) for a in computed):
                return computed
            kept = tuple(a.copy() for a in computed)
            _GRIDS.put(key, kept, _GRID_BYTES + sum(a.nbytes for a in kept))
        return tuple(a.copy() for a in kept)

    return grids


def _remembered_integers(quantize: Callable[..., Any]) -> Callable[..., Any]:
    """``quant_utils.quantize_onnx_initializer`` remembered by its arguments (``_INTEGERS``)."""

    def integers(weight, quant_type, zero_point, scale, axis=None, quant_weight_name=None, block_size=0):
        args = (weight, quant_type, zero_point, scale, axis, quant_weight_name, block_size)
        if not isinstance(weight, onnx.TensorProto):
            return quantize(*args)
        key = (hashlib.blake2b(weight.SerializeToString(), digest_size=16).digest(), *(_arg(a) for a in args[1:]))
        if not _hashable(key):
            return quantize(*args)
        kept = _INTEGERS.get(key)
        if kept is None:
            kept = onnx.TensorProto()
            kept.CopyFrom(quantize(*args))
            _INTEGERS.put(key, kept, kept.ByteSize())
        out = onnx.TensorProto()
        out.CopyFrom(kept)
        return out

    return integers


def _folder_key(folder: Path) -> str | None:
    """A digest of the files in ``folder`` (names and bytes): the model the calibrator loads and any external data
    beside it. None where the folder holds anything but files (not remembered)."""
    digest = hashlib.sha256()
    for entry in sorted(folder.iterdir()):
        if not entry.is_file() or entry.is_symlink():
            return None
        data = entry.read_bytes()
        digest.update(f"{entry.name}|{len(data)}|".encode())
        digest.update(data)
    return digest.hexdigest()


class _Feeds(CalibrationDataReader):
    """Feed dicts handed to ORT's calibrator again, each once."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


class _Calibrator:
    """Stands in for the calibrator ``create_calibrator`` would make: takes the samples (``collect_data``, as ORT's
    reads them: until an empty one) and gives the tensors' ranges (``compute_data``): those remembered for the same
    model files, settings and samples, else what ORT's calibrator, created and fed the same batches then, computes."""

    def __init__(self, create: Callable[[], Any], settings: str) -> None:
        self._create, self._settings = create, settings
        self._batches: list[list[dict[str, np.ndarray]]] = []

    def collect_data(self, reader: CalibrationDataReader) -> None:
        batch = []
        while inputs := reader.get_next():
            batch.append(inputs)
        self._batches.append(batch)

    def compute_data(self) -> Any:
        key = (self._settings, tuple(tuple(memo.feeds_digest(f) for f in b) for b in self._batches))
        kept = _CALIBRATIONS.get(key)
        if kept is None:
            calibrator = self._create()
            for batch in self._batches:
                calibrator.collect_data(_Feeds(batch))
            kept = copy.deepcopy(calibrator.compute_data())
            _CALIBRATIONS.put(key, kept, 512 * len(getattr(kept, "data", ())))
        return copy.deepcopy(kept)


def _remembered_calibrator(create: Callable[..., Any]) -> Callable[..., Any]:
    """``calibrate.create_calibrator``, whose calibrator runs only where its result was not remembered
    (``_Calibrator``); the augmented model's path is left out of the key (a scratch file)."""
    signature = inspect.signature(create)

    def calibrator(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        model = given["model"]
        folder = _folder_key(Path(model).parent) if isinstance(model, (str, Path)) else None
        if folder is None:
            return create(*args, **kwargs)
        options = given["extra_options"] or {}
        settings = repr((folder, Path(model).name, list(given["op_types_to_calibrate"] or []),
                         given["calibrate_method"], given["use_external_data_format"], given["providers"],
                         sorted(options.items())))
        return _Calibrator(lambda: create(*args, **kwargs), settings)

    return calibrator


def _patchable(function: Any, names: tuple[str, ...]) -> bool:
    return callable(function) and tuple(inspect.signature(function).parameters) == names


@contextlib.contextmanager
def remembered() -> Iterator[None]:
    """ORT's quantizer runs the remembered functions in the block (the module docstring); nothing changes where
    memos are off or ORT's functions are not the ones these mirror."""
    from onnxruntime.quantization import qdq_quantizer

    quantize = importlib.import_module("onnxruntime.quantization.quantize")  # the package's name is a function's
    originals = {(qdq_quantizer, "compute_data_quant_params"): (_GRID_ARGS, _remembered_grids),
                 (qdq_quantizer, "quantize_onnx_initializer"): (_INTEGER_ARGS, _remembered_integers),
                 (quantize, "create_calibrator"): (_CALIBRATOR_ARGS, _remembered_calibrator)}
    if not _PATCHING.acquire(blocking=False):  # another thread's emit holds ORT's functions: this one runs ORT's own
        yield
        return
    try:
        saved = {place: getattr(*place, None) for place in originals}
        if not memo.enabled() or not all(_patchable(saved[p], args) for p, (args, _) in originals.items()):
            yield
            return
        for (module, name), (_, wrap) in originals.items():
            setattr(module, name, wrap(saved[(module, name)]))
        try:
            yield
        finally:
            for (module, name), function in saved.items():
                setattr(module, name, function)
    finally:
        _PATCHING.release()
