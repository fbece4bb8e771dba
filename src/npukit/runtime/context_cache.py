"""The QNN HTP's compiled graph kept on disk, so a later start loads a context binary instead of compiling again.

Creating an HTP session from a QDQ model composes and finalizes the QNN graph: most of the start-up. The first
session of a model made with a ``cache_dir`` also writes what it compiled (ORT's EPContext model, the context binary
embedded, any nodes left to the CPU beside it) there, with the placement the runtime chose; later starts load that
file and skip the compiler. The key covers the model's bytes, ORT's and the QNN EP's versions and the SoC, because a
context binary is built for one HTP architecture by one QNN version. Both files are written whole or not at all
(renamed into place), the placement last, so an entry is complete when its placement is there.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort

PLACEMENT_KEYS = frozenset({"device", "reason", "cpu_nodes", "npu_nodes"})  # what the runtime reads back


def context_key(model: bytes, soc: str) -> str:
    """The cache entry's name for ``model`` (serialized ONNX) compiled as ``soc`` ("" : the EP's default SoC)."""
    from npukit.runtime.qnn import qnn_versions

    digest = hashlib.sha256(model)
    plugin, sdk = qnn_versions()
    digest.update(f"|ort {ort.__version__}|qnn {plugin} sdk {sdk}|soc {soc or 'default'}".encode())
    return f"{digest.hexdigest()[:24]}.qnn-{soc or 'default'}"


def load_context(cache_dir: str | os.PathLike[str], model: bytes, soc: str
                 ) -> tuple[ort.InferenceSession, dict[str, Any]] | None:
    """The HTP session from the cached context of ``model`` and the placement stored with it, or None when there is
    no complete entry or the HTP does not load it (the caller compiles again and the entry is rewritten)."""
    from npukit.runtime.qnn import make_qnn_session

    folder, key = Path(cache_dir), context_key(model, soc)
    context, placement = folder / f"{key}.ctx.onnx", folder / f"{key}.json"
    if not (context.is_file() and placement.is_file()):
        return None
    try:
        stored = json.loads(placement.read_text())
        if not isinstance(stored, dict) or not PLACEMENT_KEYS <= set(stored):
            return None
        session = make_qnn_session(context, allow_cpu_fallback=True, provider_options=_options(soc))
    except Exception:  # noqa: BLE001 - a cache entry that does not load, whatever the reason, is compiled again
        return None
    return session, stored


def compile_into_cache(cache_dir: str | os.PathLike[str], model: bytes, soc: str,
                       placement: Callable[[ort.InferenceSession], Mapping[str, Any]], *,
                       served: onnx.ModelProto | None = None) -> ort.InferenceSession:
    """The HTP session of ``model`` (CPU fallback allowed; ``served``: the graph to make it from when not ``model``
    itself, the same graph with its nodes named), its compiled graph written to ``cache_dir`` as it is made, with
    ``placement(session)`` (JSON-serializable: where the session runs each node) beside it; the cache key is
    ``model``'s."""
    from npukit.runtime.qnn import make_qnn_session

    folder, key = Path(cache_dir), context_key(model, soc)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".npukit-ctx-", dir=folder) as tmp:
        staged = Path(tmp) / "model_ctx.onnx"
        dump = {"ep.context_enable": "1", "ep.context_file_path": str(staged), "ep.context_embed_mode": "1"}
        session = make_qnn_session(served if served is not None else onnx.load_from_string(model),
                                   allow_cpu_fallback=True, provider_options=_options(soc), session_config=dump)
        where = placement(session)
        if staged.is_file():  # the EP writes it when it took part of the graph
            os.replace(staged, folder / f"{key}.ctx.onnx")
            written = Path(tmp) / "placement.json"
            written.write_text(json.dumps(dict(where), indent=2) + "\n")
            os.replace(written, folder / f"{key}.json")
    return session


def _options(soc: str) -> dict[str, str] | None:
    from npukit.runtime.compile import soc_provider_options

    return soc_provider_options(soc) if soc else None
