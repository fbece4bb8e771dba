"""Model size: bytes on disk (with external data files), serialized protobuf bytes, and stored tensor bytes by dtype."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import onnx

from npukit.errors import InputError


@dataclasses.dataclass(frozen=True)
class SizeResult:
    """``file_bytes``: the .onnx file plus its external data files (None for a model held in memory).
    ``serialized_bytes``: the protobuf itself (external data not included). ``weights_bytes_by_dtype``: every
    constant tensor the model stores (initializers and Constant nodes, external ones too), packed size
    (elements x itemsize; 4-bit types take half a byte), by numpy dtype name."""

    file_bytes: int | None
    serialized_bytes: int
    external_data_bytes: int
    weights_bytes: int
    weights_bytes_by_dtype: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def model_size(model: str | os.PathLike[str] | bytes | onnx.ModelProto) -> SizeResult:
    """Sizes of an .onnx path, serialized bytes, or an in-memory ModelProto (external data stays on disk)."""
    file_bytes: int | None = None
    base_dir: Path | None = None
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes):
        proto = _parse(model, "the given bytes")
    else:
        path = Path(model)
        if not path.is_file():
            raise InputError(f"model file {path} does not exist", hint="pass the path of an .onnx file")
        proto = _parse(path.read_bytes(), str(path))
        base_dir = path.parent
        file_bytes = path.stat().st_size

    external_files: dict[str, int] = {}
    by_dtype: dict[str, int] = {}
    for tensor in _stored_tensors(proto.graph):
        name = _dtype_name(tensor.data_type)
        by_dtype[name] = by_dtype.get(name, 0) + _packed_bytes(tensor)
        if tensor.data_location == onnx.TensorProto.EXTERNAL and base_dir is not None:
            location = next((e.value for e in tensor.external_data if e.key == "location"), None)
            if location and location not in external_files:
                ext = base_dir / location
                external_files[location] = ext.stat().st_size if ext.is_file() else 0
    external = sum(external_files.values())
    return SizeResult(
        file_bytes=None if file_bytes is None else file_bytes + external,
        serialized_bytes=proto.ByteSize(),
        external_data_bytes=external,
        weights_bytes=sum(by_dtype.values()),
        weights_bytes_by_dtype=dict(sorted(by_dtype.items(), key=lambda kv: -kv[1])),
    )


def compressed_bytes(model: str | os.PathLike[str] | onnx.ModelProto) -> int:
    """The model's bytes deflated (zlib level 9: what a zip or an APK stores), external data files included: the
    size in which a sparse model's runs of zero weights show."""
    import zlib

    if isinstance(model, onnx.ModelProto):
        return len(zlib.compress(model.SerializeToString(), 9))
    path = Path(model)
    data = path.read_bytes()
    total = len(zlib.compress(data, 9))
    proto = _parse(data, str(path))
    seen = set()
    for tensor in _stored_tensors(proto.graph):
        location = next((e.value for e in tensor.external_data if e.key == "location"), None)
        if tensor.data_location == onnx.TensorProto.EXTERNAL and location and location not in seen:
            seen.add(location)
            ext = path.parent / location
            if ext.is_file():
                total += len(zlib.compress(ext.read_bytes(), 9))
    return total


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    try:
        return onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise InputError(f"{where} is not an ONNX model ({type(exc).__name__})",
                         hint="pass an .onnx file written by torch.onnx.export or npukit export") from None


def _stored_tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    tensors = list(graph.initializer)
    for node in graph.node:
        if node.op_type == "Constant":
            tensors.extend(a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR)
    return tensors


def _packed_bytes(tensor: onnx.TensorProto) -> int:
    count = math.prod(tensor.dims)
    if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return (count + 1) // 2
    try:
        return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):  # strings and types numpy cannot hold
        return len(tensor.raw_data)


def _dtype_name(dtype: int) -> str:
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(dtype).lower()
