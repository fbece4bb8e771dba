"""ONNX Runtime's optimized graph kept on disk, so a later start skips the graph optimizations.

The first session of a model writes the graph ORT optimized (fusions, QDQ to integer kernels, layout transforms) to
``cache_dir``; later sessions load that file with ORT's optimizations off. The key covers the model's bytes, ORT's
version and this CPU's model name, because the optimized graph may hold kernels chosen for this CPU (ORT says so
when it writes one with its NCHWc layout). A file is written whole or not at all (renamed into place).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import onnxruntime as ort

from npukit.runtime.ort import make_session


def cache_key(model: bytes) -> str:
    from npukit.runtime.devices import read_cpu_info

    cpu = read_cpu_info("/proc/cpuinfo").model or ""  # "" where the file does not say
    digest = hashlib.sha256(model)
    digest.update(f"|ort {ort.__version__}|cpu {cpu}".encode())
    return digest.hexdigest()[:24]


def cached_session(model: bytes, *, threads: int, cache_dir: str | os.PathLike[str]
                   ) -> tuple[ort.InferenceSession, str, Path]:
    """A CPU session of ``model`` (serialized ONNX) and whether the optimized graph came from the cache ("hit") or
    was made and stored now ("miss"), with the cached file's path."""
    from npukit.errors import InputError

    folder = Path(cache_dir)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"cache_dir {folder} is a file, not a folder", hint="name a folder (it is made if missing)")
    path = folder / f"{cache_key(model)}.optimized.onnx"
    if path.is_file():
        try:
            return make_session(path, threads=threads, optimization="disable"), "hit", path
        except InputError:  # a damaged entry (cut short, overwritten): the cache's fault, not the model's; made again
            path.unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".npukit-cache-", dir=folder) as tmp:
        written = Path(tmp) / "optimized.onnx"
        session = make_session(model, threads=threads, optimized_model_path=str(written))
        os.replace(written, path)
    return session, "miss", path
