"""Compile a QDQ model ahead of time for one Snapdragon SoC: an EPContext ONNX model with the HTP context binary
embedded, loaded back and run to prove it matches the non-compiled HTP session on the same inputs.

Before compiling, the node patterns the HTP takes but computes wrongly (``qnn_htp.HAZARDS``) are rewritten to forms
it computes right (``npukit.targets.hazards``; exact on ORT CPU, checked). The non-compiled HTP session runs twice:
outputs that differ between those two runs are the HTP's own non-determinism and are reported by name, apart from
the compiled-vs-non-compiled check, which then covers the deterministic outputs. The written model carries its
SoC in its metadata (``npukit.qnn.*``), which ``context_soc`` reads back.
"""

from __future__ import annotations

import dataclasses
import os
import re
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
from npukit.frontend.onnx_io import is_context_model
from npukit.runtime.ort import ModelLike, make_session, random_feeds, run
from npukit.runtime.qnn import as_proto, create_session_with_log, qnn_versions, require_static_shapes
from npukit.targets.qnn_htp import SOCS

_QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
_BACKEND_VERSION = re.compile(r"Backend build version: (\S+)")
META_SOC = "npukit.qnn.soc"
META_HTP_ARCH = "npukit.qnn.htp_arch"
META_SOC_MODEL = "npukit.qnn.soc_model"
META_A16 = "npukit.qnn.activations16"  # "1": some activations were 16-bit in the model compiled


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
    max_abs_diff: float  # compiled vs non-compiled HTP session, over the outputs the HTP computes deterministically
    identical: bool
    # output name -> max |difference| between two runs of the non-compiled HTP session on the same inputs
    htp_nondeterministic: dict[str, float] = dataclasses.field(default_factory=dict)
    # patterns rewritten before compiling because the HTP computes them wrongly (npukit.targets.hazards)
    hazard_rewrites: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["output"] = str(self.output)
        return out

    @property
    def match_summary(self) -> str:
        """One cell: how the compiled model compares with the non-compiled HTP run."""
        text = "identical" if self.identical else f"max abs diff {self.max_abs_diff:.3g}"
        if self.htp_nondeterministic:
            shown = ", ".join(f"{k} (up to {v:.3g})" for k, v in self.htp_nondeterministic.items())
            text += f"; the HTP itself differs run to run on {shown}"
        return text


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
    guard: bool = True,
) -> CompileResult:
    """Compile a static-shape QDQ model for ``soc`` into an EPContext model at ``output`` (binary embedded).

    With ``guard`` the patterns the HTP computes wrongly are rewritten first (``guard_for_htp``). The written model
    is loaded back on the HTP and run on ``feeds`` (seeded random inputs when None) beside the non-compiled HTP
    session, which runs twice: outputs that differ between its own two runs are reported in
    ``htp_nondeterministic``; on the others a difference above ``atol`` raises NumericCheckError (the file stays
    written). A model the QNN EP refuses is an InputError naming the nodes and QNN's reasons from its log.
    """
    chip = soc_info(soc)
    proto = _compilable(model, backend=backend)
    options = soc_provider_options(chip.part)
    output = Path(output)
    source, rewrites = _guarded(model, proto, guard=guard, soc=chip.part, feeds=feeds)
    from npukit.quant.precision.tensor_precision import sixteen_bit_activations

    a16 = bool(sixteen_bit_activations(proto))
    compiled, compile_seconds, log = _write_context(source, output, chip, backend=backend, options=options, a16=a16)
    nondeterministic, max_diff = _compare_with_htp(source, output, backend=backend, options=options, feeds=feeds)
    contexts, binary = _context_nodes(compiled)
    ep_version, sdk_version = qnn_versions()
    backend_build = _BACKEND_VERSION.search(log)
    result = CompileResult(
        output=output, soc=chip.part, soc_name=chip.name, htp_arch=chip.htp_arch, soc_model=chip.soc_model,
        backend=backend, context_nodes=contexts, other_nodes=len(compiled.graph.node) - contexts,
        context_binary_bytes=binary, model_bytes=output.stat().st_size, compile_seconds=compile_seconds,
        onnxruntime_version=ort.__version__, qnn_ep_version=ep_version, qnn_sdk_version=sdk_version,
        qnn_backend_build=backend_build.group(1) if backend_build else None,
        device_requirements=_device_requirements(chip, ep_version, sdk_version),
        max_abs_diff=max_diff, identical=max_diff == 0.0, htp_nondeterministic=nondeterministic,
        hazard_rewrites=rewrites,
    )
    if max_diff > atol:
        raise NumericCheckError(f"the compiled {chip.part} model differs from the non-compiled HTP run by up to "
                                f"{max_diff:.3g} (allowed {atol:g}) on outputs the HTP computes the same run to run",
                                hint=f"the file was written to {output}; report this with the model")
    return result


def _compilable(model: ModelLike, *, backend: str) -> onnx.ModelProto:
    """``model`` as a proto, refused (InputError) unless the HTP can compile it: the htp backend, static shapes,
    Q/DQ nodes."""
    if backend != "htp":
        raise InputError(f"compiling a context binary needs the htp backend, not {backend!r}",
                         hint="leave backend at its default 'htp'")
    proto = as_proto(model)
    require_static_shapes(proto)
    if not any(node.op_type in _QDQ_OPS for node in proto.graph.node):
        raise InputError("the model has no QuantizeLinear/DequantizeLinear nodes: the HTP needs a quantized (QDQ) "
                         "model", hint="quantize it first (npukit quantize --target qnn-htp)")
    return proto


def _guarded(model: ModelLike, proto: onnx.ModelProto, *, guard: bool, soc: str,
             feeds: Mapping[str, np.ndarray] | None) -> tuple[ModelLike, list[dict[str, Any]]]:
    """What is compiled, and the rewrites made: ``model`` as given (its file, or ``proto``), or with ``guard`` and
    patterns the HTP computes wrongly found, ``proto`` with them rewritten (``guard_for_htp``)."""
    source: ModelLike = model if not isinstance(model, onnx.ModelProto) else proto
    if not guard:
        return source, []
    guarded, rewrites = guard_for_htp(proto, soc=soc, feeds=feeds)
    return (guarded if rewrites else source), rewrites


def _write_context(source: ModelLike, output: Path, chip: Any, *, backend: str,
                   options: dict[str, str], a16: bool = False) -> tuple[onnx.ModelProto, float, str]:
    """The EPContext model the QNN EP writes for ``source`` (the context binary embedded), tagged with ``chip``
    and ``a16`` (some 16-bit activations; ``_tag_soc``) and written at ``output`` in one step; with the seconds the
    QNN EP took and its verbose log. InputError when the QNN EP writes none."""
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
        compiled = onnx.load_model(str(staged))
        _tag_soc(compiled, chip, a16=a16)
        with atomic_path(output) as tmp:
            onnx.save_model(compiled, str(tmp))
    return compiled, compile_seconds, log


def _tag_soc(compiled: onnx.ModelProto, chip: Any, *, a16: bool = False) -> None:
    """Write the SoC ``compiled`` was compiled for into its metadata (``npukit.qnn.*``), which ``context_soc`` reads
    back, and whether some of its activations are 16-bit (``context_activations16``)."""
    for key, value in ((META_SOC, chip.part), (META_HTP_ARCH, str(chip.htp_arch)),
                       (META_SOC_MODEL, str(chip.soc_model)), (META_A16, "1" if a16 else "0")):
        onnx.helper.set_model_props(compiled, {**{p.key: p.value for p in compiled.metadata_props}, key: value})


def _compare_with_htp(source: ModelLike, output: Path, *, backend: str, options: dict[str, str],
                      feeds: Mapping[str, np.ndarray] | None) -> tuple[dict[str, float], float]:
    """The compiled model at ``output`` loaded back on the HTP and run on ``feeds`` (seeded random when None) beside
    the non-compiled HTP session on ``source``, which runs twice: the outputs that differ between its own two runs
    (name -> max abs difference), and the compiled model's max abs difference from it on the other outputs."""
    reference, _ = create_session_with_log(source, backend=backend, allow_cpu_fallback=False, provider_options=options,
                                           profiling=False)
    loaded, _ = create_session_with_log(output, backend=backend, allow_cpu_fallback=False, provider_options=options,
                                        profiling=False)
    inputs = dict(feeds) if feeds is not None else random_feeds(reference, seed=0)
    names = [o.name for o in reference.get_outputs()]
    expected, again, got = run(reference, inputs), run(reference, inputs), run(loaded, inputs)
    nondeterministic = {name: _max_diff(a, b) for name, a, b in zip(names, expected, again, strict=True)
                        if _max_diff(a, b) > 0.0}
    max_diff = max((_max_diff(e, g) for name, e, g in zip(names, expected, got, strict=True)
                    if name not in nondeterministic), default=0.0)
    return nondeterministic, max_diff


def _context_nodes(compiled: onnx.ModelProto) -> tuple[int, int]:
    """The EPContext nodes of ``compiled`` (one per QNN partition) and the bytes of the context binaries they
    embed."""
    contexts = [n for n in compiled.graph.node if n.op_type == "EPContext"]
    return len(contexts), sum(len(a.s) for n in contexts for a in n.attribute if a.name == "ep_cache_context")


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """The largest absolute difference between ``a`` and ``b``, in float64 (0 for empty arrays)."""
    if not a.size:
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def guard_for_htp(
    model: onnx.ModelProto,
    *,
    soc: str | None = None,
    feeds: Mapping[str, np.ndarray] | None = None,
) -> tuple[onnx.ModelProto, list[dict[str, Any]]]:
    """``model`` with the node patterns the HTP takes but computes wrongly (``qnn_htp.HAZARDS``) rewritten to forms
    it computes right, and what was rewritten. The rewrites are exact: the rewritten model must give the same
    outputs as ``model`` on ORT CPU with graph optimizations off (the QDQ semantics) on ``feeds`` (seeded random
    when None), else NumericCheckError."""
    from npukit.targets.hazards import guard_hazards
    from npukit.targets.qnn_htp import profile

    result = guard_hazards(model, profile(soc_info(soc).part if soc else None))
    if not result.rewritten:
        return model, []
    before, after = make_session(model, optimization="disable"), make_session(result.model, optimization="disable")
    inputs = dict(feeds) if feeds is not None else random_feeds(before, seed=0)
    names = [o.name for o in before.get_outputs()]
    worst = max((_max_diff(a, b) for a, b in zip(run(before, inputs), after.run(names, inputs), strict=True)),
                default=0.0)
    if worst > 0.0:
        raise NumericCheckError(f"rewriting the patterns the HTP computes wrongly changed the model's outputs on ORT "
                                f"CPU by up to {worst:.3g}",
                                hint="report the model; compile with guard=False to skip the rewrite")
    return result.model, [m.as_dict() for m in result.rewritten]


def context_soc(model: onnx.ModelProto) -> str | None:
    """The SoC an EPContext model written by ``compile_qnn_context`` was compiled for (its metadata), or None."""
    props = {p.key: p.value for p in model.metadata_props}
    return props.get(META_SOC) if props.get(META_SOC) in SOCS else None


def context_activations16(model: onnx.ModelProto) -> bool:
    """Whether the model an EPContext model was compiled from had 16-bit activations (its metadata; False when
    not said)."""
    return {p.key: p.value for p in model.metadata_props}.get(META_A16) == "1"


def prepare_graph(
    model: onnx.ModelProto,
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    rtol: float = 1e-4,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """``model`` (static shapes fixed) through npukit's graph passes before it is quantized for the HTP: constants
    folded (with the shapes fixed, Shape/Range subgraphs become constants) and Constant nodes made initializers (so
    the quantizer treats them as weights, not activations), BatchNorm folded into its Conv, dead code removed. A QDQ
    model only gets the folding and the dead-code removal. Verified on ORT CPU against ``model`` (``feeds``, or a
    seeded random input) within ``rtol`` of each output's range; returns the model and a summary."""
    import onnx_ir as ir

    from npukit.passes.base import PassManager
    from npukit.passes.pipeline import default_pipeline, verify_equivalent

    quantized = any(node.op_type in _QDQ_OPS for node in model.graph.node)
    passes = default_pipeline()
    if quantized:  # each once
        kept: dict[str, Any] = {}
        for candidate in passes:
            if type(candidate).__name__ in ("FoldConstantsPass", "RemoveDeadCodePass"):
                kept.setdefault(type(candidate).__name__, candidate)
        passes = list(kept.values())
    result = PassManager(passes)(ir.serde.deserialize_model(model))
    summary: dict[str, Any] = {
        "nodes_before": len(model.graph.node),
        "passes": [{"pass": r.name, "rewrites": r.rewrites} for r in result.records],
    }
    if not result.modified:
        summary["nodes_after"] = len(model.graph.node)
        return model, summary
    prepared = ir.serde.serialize_model(result.model)
    summary["nodes_after"] = len(prepared.graph.node)
    if not quantized:
        errors = verify_equivalent(model, prepared, rtol=rtol, feeds=[feeds] if feeds is not None else None,
                                   what="model after constant folding", hint="report the model")
        summary["max_rel_error"] = errors.max_rel
        return prepared, summary
    # A QDQ model: both runs with ORT's optimizations off, so ORT's fused integer kernels (which round differently
    # from the QDQ graph) do not stand in for the folding under test.
    before, after = make_session(model, optimization="disable"), make_session(prepared, optimization="disable")
    inputs = dict(feeds) if feeds is not None else random_feeds(before, seed=0)
    names = [o.name for o in before.get_outputs()]
    worst = 0.0
    for name, a, b in zip(names, run(before, inputs), after.run(names, inputs), strict=True):
        scale = float(np.max(np.abs(a))) if a.size else 0.0
        error = _max_diff(a, b) / scale if scale else _max_diff(a, b)
        if error > rtol:
            raise NumericCheckError(f"the QDQ model after constant folding differs from the original: output "
                                    f"{name!r} by {error:.3g} of its range (allowed {rtol:g})",
                                    hint="report the model")
        worst = max(worst, error)
    summary["max_rel_error"] = worst
    return prepared, summary


def _device_requirements(chip: Any, ep_version: str | None, sdk_version: str | None) -> str:
    """What a device needs to run the context binary compiled for ``chip`` with these QNN versions, in a sentence."""
    return (f"a {chip.name} ({chip.part}, Hexagon HTP v{chip.htp_arch}) device running ONNX Runtime "
            f"{ort.__version__.rsplit('.', 1)[0]}+ with the QNN execution provider (onnxruntime-qnn "
            f"{ep_version or '?'}), and the QNN SDK {sdk_version or '?'} HTP runtime libraries for that device "
            f"(libQnnHtp.so, libQnnHtpV{chip.htp_arch}Stub.so and the v{chip.htp_arch} skel library); a context "
            f"binary runs only on QNN runtimes of that version or newer")


@dataclasses.dataclass(frozen=True)
class ContextRun:
    """An HTP session on a compiled EPContext model, the SoC it runs as, and a note when that is not the SoC asked
    for (a context binary runs as the SoC it was compiled for)."""

    session: ort.InferenceSession
    soc: Any
    note: str | None


def context_session(model: str | os.PathLike[str], proto: onnx.ModelProto, *, soc: str | None) -> ContextRun:
    """Load the EPContext model ``model`` (``proto``: its graph) on the QNN HTP backend, as the SoC it was compiled
    for when its metadata says (``context_soc``), else as ``soc``. InputError when it is not an EPContext model or
    the HTP does not load it (with QNN's reason)."""
    if not is_context_model(proto):
        raise InputError(f"{model} holds no EPContext node", hint="compile it first with `npukit compile`")
    compiled = context_soc(proto)
    asked = soc_info(soc).part if soc else None
    if compiled and asked and compiled != asked:  # it ran as the SoC it was built for, and the report named both
        raise InputError(f"{Path(os.fspath(model)).name} was compiled for {compiled} ({SOCS[compiled].name}); it "
                         f"cannot run as {asked}", hint=f"leave --soc out (it runs as {compiled}), or compile the "
                                                       f"model again with --soc {asked}")
    chip = soc_info(compiled or asked or "SM8650")
    note = None
    others = sorted({n.op_type for n in proto.graph.node if n.op_type != "EPContext"})
    session, _ = create_session_with_log(model, backend="htp", allow_cpu_fallback=bool(others),
                                         provider_options=soc_provider_options(chip.part), profiling=False)
    return ContextRun(session=session, soc=chip, note=note)
