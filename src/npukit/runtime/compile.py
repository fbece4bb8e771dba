"""Compile a QDQ model ahead of time for one Snapdragon SoC: an EPContext ONNX model with the HTP context binary
embedded, loaded back and run to prove it matches the non-compiled HTP session on the same inputs."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from npukit._atomic import atomic_path
from npukit.errors import InputError, NumericCheckError
from npukit.runtime.ort import ModelLike, random_feeds, run
from npukit.runtime.qnn import as_proto, create_session_with_log, qnn_versions, require_static_shapes
from npukit.targets.qnn_htp import SOCS

_QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
_BACKEND_VERSION = re.compile(r"Backend build version: (\S+)")


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """What ``compile_qnn_context`` wrote and how its compiled model compares with the non-compiled HTP run."""

    output: Path
    soc: str
    soc_name: str
    htp_arch: int
    soc_model: int
    backend: str
    context_nodes: int  # EPContext nodes in the output (one per QNN partition)
    other_nodes: int  # nodes left outside the context (run by the CPU EP on the device)
    context_binary_bytes: int
    model_bytes: int
    compile_seconds: float
    onnxruntime_version: str
    qnn_ep_version: str | None
    qnn_sdk_version: str | None
    qnn_backend_build: str | None
    device_requirements: str
    max_abs_diff: float  # compiled vs non-compiled HTP session, over all outputs
    identical: bool

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["output"] = str(self.output)
        return out


def soc_info(soc: str) -> Any:
    """The SoC table entry for ``soc`` (case-insensitive part number, e.g. SM8650); InputError listing valid ones."""
    key = soc.strip().upper()
    if key not in SOCS:
        valid = ", ".join(f"{s.part} ({s.name})" for s in SOCS.values())
        raise InputError(f"unknown Snapdragon SoC {soc!r}", hint=f"choose one of {valid}")
    return SOCS[key]


def soc_provider_options(soc: str) -> dict[str, str]:
    """The QNN EP provider options that make the HTP backend run as ``soc``: its ``htp_arch`` and ``soc_model``."""
    chip = soc_info(soc)
    return {"htp_arch": str(chip.htp_arch), "soc_model": str(chip.soc_model)}


def compile_qnn_context(
    model: onnx.ModelProto | str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    soc: str,
    backend: str = "htp",
    feeds: Mapping[str, np.ndarray] | None = None,
    atol: float = 0.0,
) -> CompileResult:
    """Compile a static-shape QDQ model for ``soc`` into an EPContext model at ``output`` (binary embedded).

    The written model is loaded back on the HTP and run on ``feeds`` (seeded random inputs when None) beside the
    non-compiled HTP session; a difference above ``atol`` raises NumericCheckError (the file stays written).
    """
    chip = soc_info(soc)
    if backend != "htp":
        raise InputError(f"compiling a context binary needs the htp backend, not {backend!r}",
                         hint="leave backend at its default 'htp'")
    proto = as_proto(model)
    require_static_shapes(proto)
    if not any(node.op_type in _QDQ_OPS for node in proto.graph.node):
        raise InputError("the model has no QuantizeLinear/DequantizeLinear nodes: the HTP needs a quantized (QDQ) model",
                         hint="quantize it first (npukit quantize --target qnn-htp)")
    options = soc_provider_options(chip.part)
    output = Path(output)
    source: ModelLike = model if not isinstance(model, onnx.ModelProto) else proto
    with tempfile.TemporaryDirectory(prefix="npukit_qnn_ctx_") as work:
        staged = Path(work) / "model_ctx.onnx"
        config = {"ep.context_enable": "1", "ep.context_file_path": str(staged), "ep.context_embed_mode": "1"}
        start = time.perf_counter()
        _, log = create_session_with_log(source, backend=backend, allow_cpu_fallback=False, provider_options=options,
                                 profiling=False, session_config=config, verbose=True)
        compile_seconds = time.perf_counter() - start
        if not staged.is_file():
            raise InputError("the QNN EP did not write an EPContext model",
                             hint="check that the model runs with `npukit bench --target qnn-htp`")
        with atomic_path(output) as tmp:
            shutil.copyfile(staged, tmp)
    compiled = onnx.load_model(str(output))
    contexts = [n for n in compiled.graph.node if n.op_type == "EPContext"]
    binary = sum(len(a.s) for n in contexts for a in n.attribute if a.name == "ep_cache_context")
    reference, _ = create_session_with_log(source, backend=backend, allow_cpu_fallback=False, provider_options=options,
                                   profiling=False)
    loaded, _ = create_session_with_log(output, backend=backend, allow_cpu_fallback=False, provider_options=options,
                                profiling=False)
    inputs = dict(feeds) if feeds is not None else random_feeds(reference, seed=0)
    expected, got = run(reference, inputs), run(loaded, inputs)
    max_diff = max(float(np.max(np.abs(e.astype(np.float64) - g.astype(np.float64)))) if e.size else 0.0
                   for e, g in zip(expected, got, strict=True))
    ep_version, sdk_version = qnn_versions()
    backend_build = _BACKEND_VERSION.search(log)
    result = CompileResult(
        output=output, soc=chip.part, soc_name=chip.name, htp_arch=chip.htp_arch, soc_model=chip.soc_model,
        backend=backend, context_nodes=len(contexts), other_nodes=len(compiled.graph.node) - len(contexts),
        context_binary_bytes=binary, model_bytes=output.stat().st_size, compile_seconds=compile_seconds,
        onnxruntime_version=ort.__version__, qnn_ep_version=ep_version, qnn_sdk_version=sdk_version,
        qnn_backend_build=backend_build.group(1) if backend_build else None,
        device_requirements=_device_requirements(chip, ep_version, sdk_version),
        max_abs_diff=max_diff, identical=max_diff == 0.0,
    )
    if max_diff > atol:
        raise NumericCheckError(f"the compiled {chip.part} model differs from the non-compiled HTP run by up to "
                                f"{max_diff:.3g} (allowed {atol:g})",
                                hint=f"the file was written to {output}; report this with the model")
    return result


def _device_requirements(chip: Any, ep_version: str | None, sdk_version: str | None) -> str:
    return (f"a {chip.name} ({chip.part}, Hexagon HTP v{chip.htp_arch}) device running ONNX Runtime "
            f"{ort.__version__.rsplit('.', 1)[0]}+ with the QNN execution provider (onnxruntime-qnn "
            f"{ep_version or '?'}), and the QNN SDK {sdk_version or '?'} HTP runtime libraries for that device "
            f"(libQnnHtp.so, libQnnHtpV{chip.htp_arch}Stub.so and the v{chip.htp_arch} skel library); a context "
            f"binary runs only on QNN runtimes of that version or newer")
