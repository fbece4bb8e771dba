"""ONNX Runtime's optimized graph kept on disk, so a later start skips the graph optimizations.

The first session of a model writes the graph ORT optimized (fusions, QDQ to integer kernels, layout transforms) to
``cache_dir``; later sessions load that file with ORT's optimizations off. The key covers the model, ORT's version
and this CPU's model name, because the optimized graph may hold kernels chosen for this CPU (ORT says so when it
writes one with its NCHWc layout). A model given as bytes is keyed by their hash; a model file by its path, size and
modification time, as Python keys its bytecode cache, so a start from the cache reads and hashes nothing of a large
model (hashing MobileNetV2's 14 MB took 8-14 ms of a 24 ms cold start on an AMD EPYC): a file rewritten in place
gets a new key, and the external-data files it names are listed with their sizes and times beside the entry and
checked on every start. A file is written whole or not at all (renamed into place).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnxruntime as ort

from npukit.runtime.ort import make_session


def cache_key(model: bytes | str | os.PathLike[str]) -> str:
    from npukit.runtime.devices import read_cpu_info

    cpu = read_cpu_info("/proc/cpuinfo").model or ""  # "" where the file does not say
    if isinstance(model, bytes):
        digest = hashlib.sha256(model)
    else:
        digest = hashlib.sha256(f"file {os.path.realpath(model)}|{_stamp(model)}".encode())
    digest.update(f"|ort {ort.__version__}|cpu {cpu}".encode())
    return digest.hexdigest()[:24]


def cached_session(model: bytes | str | os.PathLike[str], *, threads: int, cache_dir: str | os.PathLike[str],
                   log_level: int = 3) -> tuple[ort.InferenceSession, str, Path]:
    """A CPU session of ``model`` (serialized ONNX, or an ONNX file) and whether the optimized graph came from the
    cache ("hit") or was made and stored now ("miss"), with the cached file's path; ``log_level``: ORT's."""
    from npukit.errors import InputError

    folder = Path(cache_dir)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"cache_dir {folder} is a file, not a folder", hint="name a folder (it is made if missing)")
    key = cache_key(model)
    path, listed = folder / f"{key}.optimized.onnx", folder / f"{key}.external.json"
    if path.is_file() and (isinstance(model, bytes) or _unchanged(listed)):
        try:
            return make_session(path, threads=threads, optimization="disable", log_level=log_level), "hit", path
        except InputError:  # a damaged entry (cut short, overwritten): the cache's fault, not the model's; made again
            path.unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".npukit-cache-", dir=folder) as tmp:
        written = Path(tmp) / "optimized.onnx"
        session = make_session(model, threads=threads, optimized_model_path=str(written), log_level=log_level)
        if not isinstance(model, bytes):
            (Path(tmp) / "external.json").write_text(json.dumps(_external_stamps(model)))
            os.replace(Path(tmp) / "external.json", listed)
        os.replace(written, path)
    return session, "miss", path


def _stamp(path: str | os.PathLike[str]) -> str:
    """A file's size and modification time (ns), "" for a missing file."""
    try:
        stat = os.stat(path)
    except OSError:
        return ""
    return f"{stat.st_size}|{stat.st_mtime_ns}"


def _external_stamps(model: str | os.PathLike[str]) -> dict[str, str]:
    """The external-data files the ONNX file ``model`` names (absolute paths) and their stamps."""
    import onnx

    proto = onnx.load(os.fspath(model), load_external_data=False)
    base = Path(os.path.realpath(model)).parent
    files = {str(base / entry.value) for tensor in _tensors(proto.graph) for entry in tensor.external_data
             if tensor.data_location == onnx.TensorProto.EXTERNAL and entry.key == "location"}
    return {name: _stamp(name) for name in sorted(files)}


def _tensors(graph: Any) -> Iterator[Any]:
    """Every TensorProto of ``graph`` and its subgraphs: initializers and node attributes."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _tensors(sub)


def _unchanged(listed: Path) -> bool:
    """Whether the external-data files listed beside a file-keyed entry are as they were when it was made."""
    try:
        stamps = json.loads(listed.read_text())
    except (OSError, ValueError):
        return False  # not listed (an entry cut short): made again
    return isinstance(stamps, dict) and all(_stamp(name) == stamp for name, stamp in stamps.items())
