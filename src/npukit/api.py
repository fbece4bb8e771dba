"""The npukit verbs as Python functions; the CLI is a thin shell over these.

Every verb that writes an artifact also writes a JSON report beside it (``model.onnx`` -> ``model.report.json``)
and, with ``html=True``, a self-contained HTML report (``model.report.html``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from npukit.config import BenchConfig, ExportConfig, OptimizeConfig, PreprocessConfig, to_dict
from npukit.errors import InputError
from npukit.report.core import Report
from npukit.report.progress import progress, step


@dataclasses.dataclass
class CommandResult:
    """What a verb produced: its report, the artifact and report files it wrote, and its main result object."""

    report: Report
    artifact: Path | None = None
    report_path: Path | None = None
    html_path: Path | None = None
    result: Any = None


def report_path_for(artifact: str | Path, suffix: str = ".report.json") -> Path:
    artifact = Path(artifact)
    stem = artifact.name[: -len(artifact.suffix)] if artifact.suffix else artifact.name
    return artifact.with_name(stem + suffix)


def _finish(report: Report, artifact: Path | None, *, html: bool, json_path: Path | None = None,
            result: Any = None) -> CommandResult:
    from npukit.report.html import write_html

    json_path = json_path or (report_path_for(artifact) if artifact else None)
    html_path = None
    if artifact is not None:
        report.add_artifact("model", artifact)
    if json_path is not None:
        report.add_artifact("report", json_path)
        if html:
            html_path = json_path.with_name(json_path.name.replace(".json", "") + ".html") \
                if json_path.name.endswith(".json") else json_path.with_suffix(".html")
            report.add_artifact("html", html_path)
        report.write_json(json_path)
        if html_path is not None:
            write_html(report, html_path)
    return CommandResult(report=report, artifact=artifact, report_path=json_path, html_path=html_path,
                         result=result)


def _check_output(output: str | Path, *, source: str | Path | None = None) -> Path:
    output = Path(output)
    if output.suffix.lower() != ".onnx":
        raise InputError(f"output {output} must end in .onnx", hint="name the output like model.onnx")
    if output.is_dir():
        raise InputError(f"output {output} is a directory", hint="give a file name ending in .onnx")
    if source is not None and Path(source).exists() and output.exists() and output.resolve() == Path(source).resolve():
        raise InputError(f"output {output} is the input file", hint="write the result to a new file")
    return output


def _summary_figures(summary) -> dict[str, int]:
    return {"nodes": summary.nodes, "parameters": summary.parameters, "MACs": summary.macs,
            "size_bytes": summary.serialized_bytes}


# ------------------------------------------------------------------------------------------------------------ export

def export(
    model: str | Any,
    output: str | Path,
    *,
    weights: str | Path | None = None,
    input_shape: str | Sequence[int] | None = None,
    dynamic_batch: bool = False,
    opset: int = 18,
    exporter: str = "auto",
    rtol: float = 1e-4,
    html: bool = False,
) -> CommandResult:
    """Export MODEL (a spec string or a torch.nn.Module) to a verified single-file ONNX model at ``output``."""
    from npukit.frontend.export import export_model
    from npukit.frontend.spec import ModelSource, resolve_model
    from npukit.measure.summary import summarize

    config = ExportConfig(input_shape=input_shape, dynamic_batch=dynamic_batch, opset=opset, exporter=exporter,
                          rtol=rtol)
    output = _check_output(output, source=model if isinstance(model, (str, Path)) else None)
    if isinstance(model, (str, Path)):
        source = resolve_model(str(model), weights=str(weights) if weights else None)
    else:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise InputError(f"cannot export a {type(model).__name__}", hint="pass a torch.nn.Module or a model spec")
        if config.input_shape is None:
            raise InputError("exporting a torch module needs an input shape", hint="pass input_shape=(1, 3, 224, 224)")
        source = ModelSource(kind="torch", spec=type(model).__name__, module=model.eval(), onnx_path=None,
                             default_input_shape=None, description=f"torch module {type(model).__name__}")
    report = Report("export", config={"export": to_dict(config), "model": str(source.spec),
                                      "weights": str(weights) if weights else None})
    with step(f"exporting {source.description}", timings=report.timings, key="export"):
        result = export_model(source, output, config=config)
    report.add("export", result.as_dict())
    summary = summarize(onnx.load(str(output)), input_shape=result.input_shape)
    report.add("summary", {k: v for k, v in summary.as_dict().items() if k != "layers"})
    report.add_table("Export", ["model", "exporter", "opset", "input shape", "nodes", "max abs err", "max rel err",
                                "verified"],
                     [[source.description, result.exporter, result.opset, "x".join(map(str, result.input_shape or ())),
                       result.node_count, result.max_abs_error, result.max_rel_error, result.passed]])
    if result.fallback_reason:
        report.add_table("Exporter fallback", ["tried", "reason"], [["dynamo", result.fallback_reason]])
    return _finish(report, output, html=html, result=result)


# ---------------------------------------------------------------------------------------------------- optimize-graph

def optimize_graph(
    model: str | Path,
    output: str | Path,
    *,
    skip_passes: Sequence[str] = (),
    verify: bool = True,
    rtol: float = 1e-4,
    input_shape: str | Sequence[int] | None = None,
    memory_budget: int | None = None,
    html: bool = False,
) -> CommandResult:
    """Run the graph passes on an ONNX model, verify the result against the original, write it to ``output``.

    With ``memory_budget`` (bytes) the model is then restructured so that its peak activation memory fits the budget
    (outputs verified): on ORT CPU, upsamples whose NCHWc form raises the peak are kept in the plain layout; then, if
    needed, the early high-resolution stage is split into spatial tiles with the halo their receptive field needs."""
    from npukit.frontend.onnx_io import load_onnx, save_onnx
    from npukit.measure.summary import summarize
    from npukit.passes.pipeline import optimize_model, verify_equivalent
    from npukit.report.terminal import before_after_table

    config = OptimizeConfig(skip_passes=tuple(skip_passes), verify=verify, rtol=rtol)
    output = _check_output(output, source=model)
    original = load_onnx(model)
    shape = tuple(int(d) for d in input_shape.split(",")) if isinstance(input_shape, str) else input_shape
    report = Report("optimize-graph", config={"optimize": to_dict(config), "model": str(model)})
    with step("running graph passes", timings=report.timings, key="passes"):
        ir_model = ir.serde.deserialize_model(original)
        pipeline = optimize_model(ir_model, config=config)
        optimized = ir.serde.serialize_model(pipeline.model)
    errors = None
    if verify:
        with step("verifying against the original", timings=report.timings, key="verify"):
            errors = verify_equivalent(original, optimized, rtol=rtol, seed=config.seed)
    tiling = None
    if memory_budget is None:
        save_onnx(optimized, output)
    else:  # restructure from a staged copy, so a budget nothing reaches leaves no output behind
        import tempfile

        from npukit.memory.tiling import optimize_for_memory

        with tempfile.TemporaryDirectory(prefix=".npukit-", dir=output.parent) as tmp, \
                step(f"restructuring to fit {memory_budget:,} bytes", timings=report.timings, key="tiling"):
            staged = save_onnx(optimized, Path(tmp) / "optimized.onnx")
            _choice, tiling = optimize_for_memory(staged, output, budget_bytes=memory_budget, input_shape=shape)
    before = summarize(original, input_shape=shape)
    after = summarize(optimized, input_shape=shape)
    report.add("passes", [r.as_dict() for r in pipeline.records])
    report.add("before", {k: v for k, v in before.as_dict().items() if k != "layers"})
    report.add("after", {k: v for k, v in after.as_dict().items() if k != "layers"})
    report.add("verification", errors.as_dict() if errors else None)
    report.tables.append(before_after_table(_summary_figures(before), _summary_figures(after), title="Graph"))
    report.tables.append(before_after_table(dict(sorted(before.ops.items())), dict(sorted(after.ops.items())),
                                            title="Ops by type", key_label="op"))
    report.add_table("Passes", ["pass", "rewrites", "nodes before", "nodes after", "ms", "notes"],
                     [[r.name, r.rewrites, r.nodes_before, r.nodes_after, round(r.seconds * 1000, 1),
                       "; ".join(r.notes[:3]) + (f" (+{len(r.notes) - 3} more)" if len(r.notes) > 3 else "")]
                      for r in pipeline.records])
    if errors is not None:
        report.add_table("Verification against the original", ["max abs error", "max rel error", "rtol"],
                         [[errors.max_abs, errors.max_rel, rtol]])
    if tiling is not None:
        report.add("tiling", tiling.sections)
        report.tables.extend(tiling.tables)
        report.config["memory_budget"] = memory_budget
    return _finish(report, output, html=html, result=pipeline)


# ----------------------------------------------------------------------------------------------------------- inspect

def inspect(model: str | Path, *, input_shape: str | Sequence[int] | None = None, top_layers: int = 15) -> CommandResult:
    """Summarize an ONNX model: ops by type, parameters, MACs per layer and in total, the largest tensors."""
    from npukit.config import parse_shape
    from npukit.frontend.onnx_io import load_onnx
    from npukit.measure.summary import summarize

    proto = load_onnx(model)
    summary = summarize(proto, input_shape=parse_shape(input_shape))
    report = Report("inspect", config={"model": str(model), "input_shape": input_shape})
    report.add("summary", summary.as_dict())
    report.add_table("Model", ["inputs", "nodes", "parameters", "MACs", "size_bytes"],
                     [[", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in summary.input_shapes.items()),
                       summary.nodes, summary.parameters, summary.macs, summary.serialized_bytes]])
    report.add_table("Ops by type", ["op", "count"], sorted(([k, v] for k, v in summary.ops.items()),
                                                             key=lambda r: (-r[1], r[0])))
    heavy = sorted((layer for layer in summary.layers if layer.macs), key=lambda layer: -layer.macs)[:top_layers]
    report.add_table(f"Layers by MACs (top {len(heavy)} of {sum(1 for la in summary.layers if la.macs)})",
                     ["layer", "op", "output shape", "params", "MACs", "share", "output_bytes"],
                     [[la.name, la.op, "x".join(map(str, la.output_shape or ())), la.params, la.macs,
                       f"{la.macs / summary.macs:.1%}" if summary.macs else "—", la.output_bytes] for la in heavy])
    report.add_table("Largest activations", ["tensor", "shape", "dtype", "bytes"],
                     [[a.name, "x".join(map(str, a.shape)), a.dtype, a.bytes] for a in summary.largest_activations])
    return CommandResult(report=report, result=summary)


# ---------------------------------------------------------------------------------------------------------- quantize

def cpu_scheme() -> dict:
    """The activation dtype and weight range this machine's CPU runs accurately (npukit.quant.schemes)."""
    from npukit.quant.schemes import cpu_int8_scheme
    from npukit.runtime.devices import read_cpu_info

    return cpu_int8_scheme(read_cpu_info("/proc/cpuinfo"))


def quantize(
    model: str | Path,
    output: str | Path,
    *,
    calib: str | Path | Sequence[dict[str, np.ndarray]],
    per_tensor: bool = False,
    method: str = "auto",
    cle: bool = False,
    bias_correction: bool = False,
    equalize_activations: bool = False,
    exclude: Sequence[str] = (),
    int16_nodes: Sequence[str] = (),
    int16_tensors: Sequence[str] = (),
    int16_budget: float = 0.0,
    activation_dtype: str | None = None,
    reduce_range: bool | None = None,
    float_stem: bool | None = None,
    gemm_convs: bool | None = None,
    adaround: bool = False,
    range_search: bool = False,
    calib_samples: int | None = None,
    data: str | Path | None = None,
    preprocess: PreprocessConfig | None = None,
    threads: int = 1,
    runs: int = 30,
    max_samples: int | None = None,
    html: bool = False,
    extra: dict[str, Any] | None = None,
) -> CommandResult:
    """INT8 post-training quantization to a QDQ model that ORT runs with integer kernels, with a report of what it
    cost: per-layer SQNR, size, latency against the float model, where the time goes (kernel time by kind: which
    kernels the integer arithmetic speeds up on this CPU) and, with ``data``, agreement on held-out data.

    ``calib`` is an image folder / .npy / .npz, or a sequence of feed dicts. ``activation_dtype=None``,
    ``reduce_range=None`` and ``float_stem=None`` take what this CPU runs accurately and fast (e.g. 7-bit weights
    on x86 CPUs without VNNI, where ORT's u8s8 kernels saturate, and a 3x3 RGB stem left in float on x86 CPUs,
    where it runs faster, with the convs chained after it as far as that is timed fastest); ``gemm_convs=None``
    likewise (on where ORT's two int8 conv kernels both accumulate in 32 bits, see ``npukit.quant.conv_kernel``).
    ``extra`` passes further QuantConfig fields.
    """
    from npukit.frontend.onnx_io import load_onnx, save_onnx
    from npukit.measure.latency import measure_latency_interleaved
    from npukit.measure.op_profile import compare_kinds, profile_ops
    from npukit.measure.size import model_size
    from npukit.quant.config import QuantConfig
    from npukit.quant.layer_sqnr import layer_sqnr
    from npukit.quant.qdq import integer_kernel_report
    from npukit.quant.qdq import quantize as _quantize

    output = _check_output(output, source=model)
    preprocess = preprocess or PreprocessConfig()
    proto = load_onnx(model)
    scheme = cpu_scheme()
    reduced = scheme["reduce_range"] if reduce_range is None else reduce_range
    config = QuantConfig(per_channel=not per_tensor, method=method, cle=cle, bias_correction=bias_correction,
                         activation_equalization=equalize_activations, adaround=adaround, range_search=range_search,
                         exclude=tuple(exclude),
                         int16_nodes=tuple(int16_nodes), int16_tensors=tuple(int16_tensors),
                         int16_budget=int16_budget, activation_dtype=activation_dtype or scheme["activation_dtype"],
                         reduce_range=reduced,
                         float_stem=scheme["float_stem"] if float_stem is None else float_stem,
                         # not with reduce_range (its pair-bounded grids must not shift), even on a CPU that takes both
                         gemm_convs=scheme["gemm_convs"] and not reduced if gemm_convs is None else gemm_convs,
                         calib_samples=calib_samples, **(extra or {}))
    samples = _open_data(calib, proto, preprocess) if isinstance(calib, (str, Path)) else list(calib)
    evaluation = _open_data(data, proto, preprocess) if data is not None else None
    report = Report("quantize", config={"quant": config.as_dict(), "cpu_scheme": scheme, "model": str(model),
                                        "calib": str(calib) if isinstance(calib, (str, Path)) else
                                        f"{len(samples)} samples given in memory",
                                        "data": str(data) if data else None, "preprocess": to_dict(preprocess)})
    with step("quantizing (calibrate, equalize, correct, insert Q/DQ)", timings=report.timings, key="quantize"):
        result = _quantize(proto, samples, config=config)
    save_onnx(result.model, output)
    report.add("steps", result.steps)
    plan = result.steps.get("int16_plan")
    if plan:
        added = {c["tensor"]: c["added_ms"] for c in plan["candidates"]}
        report.add_table(f"16-bit activations chosen (int8 model {plan['base_ms']:.2f} ms, with them "
                         f"{plan['plan_ms']:.2f} ms, budget +{plan['budget']:.0%}; output SQNR on "
                         f"{plan['samples']} calibration samples {plan['base_sqnr_db']:.2f} dB all 8-bit, "
                         f"{plan['estimated_sqnr_db']:.2f} dB without their rounding)",
                         ["tensor", "share of the 8-bit output noise", "latency it adds alone (ms)"],
                         [[t, plan["scanned"][t], added[t]] for t in plan["tensors"]])
    moves = result.steps.get("conv_kernels")
    if moves and moves["moved_to_gemm"]:
        report.add_table(f"Convs moved from ORT's symmetric int8 conv kernel to its int8 GEMM (whole model "
                         f"{moves['model_ratio']:.3f}x the time as built; same outputs)",
                         ["node", "GEMM / symmetric-conv time alone"],
                         [[n, moves["gemm_over_convsym_alone"][n]] for n in moves["moved_to_gemm"]])
    kernels = integer_kernel_report(result.model)
    report.add("integer_kernels", kernels)
    with step("per-layer SQNR", timings=report.timings, key="layer_sqnr"):
        probe = samples if not hasattr(samples, "batches") else [samples.sample(i) for i in
                                                                 range(min(4, len(samples)))]
        layers = layer_sqnr(result.reference, result.model, probe[:4] if isinstance(probe, list) else probe, limit=4)
    report.add("layer_sqnr", layers)
    worst = sorted((r for r in layers if np.isfinite(r["sqnr_db"])), key=lambda r: r["sqnr_db"])[:12]
    report.add_table("Layers that hurt most (activation SQNR vs float, dB; higher is better)",
                     ["node", "op", "tensor", "SQNR dB"], [[r["node"], r["op_type"], r["tensor"], r["sqnr_db"]]
                                                          for r in worst])
    report.add_figure("Per-layer activation SQNR (dB), in graph order", "line",
                      {"series": {"SQNR": {"x": list(range(len(layers))),
                                           "y": [r["sqnr_db"] for r in layers]}}},
                      x_label="layer", y_label="dB")
    with step(f"timing float vs int8, {threads} thread(s)", timings=report.timings, key="latency"):
        feeds = samples[0] if isinstance(samples, list) else samples.sample(0)
        latency = measure_latency_interleaved({"float": str(model), "int8": str(output)}, threads=threads,
                                              runs=runs, feeds=feeds)
    sizes = {"float": model_size(model).file_bytes, "int8": model_size(output).file_bytes}
    report.add("latency", {k: v.as_dict() for k, v in latency.items()})
    report.add("size", sizes)
    rows = [[k, sizes[k], latency[k].median_ms, latency[k].median_ms / latency["float"].median_ms] for k in latency]
    report.add_table(f"Size and latency (ORT CPU, {threads} thread(s), interleaved medians of {runs})",
                     ["model", "size_bytes", "median ms", "latency vs float"], rows)
    report.add_table("What ORT runs", ["integer kernels", "float compute fed by DequantizeLinear",
                                       "integer fraction"],
                     [[sum(kernels["integer_ops"].values()), sum(kernels["float_compute_after_dq"].values()),
                       kernels["integer_fraction"]]])
    with step("where the time goes (ORT kernel profile)", timings=report.timings, key="kernel_profile"):
        profiles = profile_ops({"float": str(model), "int8": str(output)}, threads=threads, warmup=3,
                               runs=min(runs, 10), rounds=2, feeds=feeds)
    report.add("kernel_profile", {k: p.as_dict() for k, p in profiles.items()})
    kinds = compare_kinds(profiles["float"], profiles["int8"])
    report.add_table(f"Where the time goes (ORT CPU kernel time by kind, ms, {threads} thread(s); speedup = float / "
                     "int8)",
                     ["kind", "float ms", "int8 ms", "speedup", "int8 nodes", "int8 share on integer kernels"],
                     [[kind, v["base_ms"], v["ms"], v["speedup"], v["nodes"], v["integer_share"]]
                      for kind, v in kinds.items()])
    if evaluation is not None:
        agreement = _evaluate(result.model, proto, evaluation,
                              config=BenchConfig(threads=threads, max_samples=max_samples), threads=threads)
        report.add("agreement", agreement.as_dict())
        fields = [["samples", agreement.samples], ["top-1 agreement with float", agreement.top1_agreement],
                  ["top-5 overlap", agreement.top5_overlap], ["logits SQNR dB", agreement.sqnr_db],
                  ["top-1 agreement where float is confident", agreement.top1_agreement_confident]]
        if agreement.labeled_samples:
            fields += [["top-1 accuracy float", agreement.top1_accuracy_reference],
                       ["top-1 accuracy int8", agreement.top1_accuracy_candidate]]
        report.add_table(f"Agreement with the float model on {Path(str(data)).name}", ["metric", "value"], fields)
    return _finish(report, output, html=html, result=result)


# ----------------------------------------------------------------------------------------------------------- compile

def is_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def quantize_for_htp(model: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """QDQ as the HTP needs it (npukit.runtime.qnn.HTP_QDQ_RULES: int8 symmetric per-channel weights, uint16
    activations), with ONNX Runtime's quantizer doing the mechanics."""
    import logging
    import tempfile

    from onnxruntime.quantization import quantize as ort_quantize

    from npukit.quant.qdq import FeedsReader

    from npukit.runtime.qnn import qnn_quant_config

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # ORT's quantizer warns on the root logger about steps npukit has done
    try:
        with tempfile.TemporaryDirectory(prefix="npukit-htp-") as tmp:
            source, out = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
            onnx.save(model, str(source))
            ort_quantize(str(source), str(out), qnn_quant_config(str(source), FeedsReader(samples)))
            return onnx.load(str(out))
    finally:
        root.setLevel(level)


def compile(  # noqa: A001 - the verb's name
    model: str | Path,
    output: str | Path,
    *,
    soc: str,
    target: str = "qnn-htp",
    calib: str | Path | None = None,
    input_shape: str | Sequence[int] | None = None,
    preprocess: PreprocessConfig | None = None,
    html: bool = False,
) -> CommandResult:
    """Static shapes, QDQ as the HTP needs (unless the model already is QDQ), then an EPContext model with the HTP
    context binary for ``soc`` embedded; loaded back and run to prove it works."""
    from npukit.config import parse_shape
    from npukit.frontend.onnx_io import fix_input_shape, load_onnx, static_input_shape
    from npukit.runtime.compile import compile_qnn_context
    from npukit.targets.registry import get_target

    profile = get_target(target)
    if profile.name != "qnn-htp":
        raise InputError(f"compiling for {profile.name} is not supported yet",
                         hint="use --target qnn-htp; other targets: export the QDQ model from `npukit quantize`")
    output = _check_output(output, source=model)
    proto = load_onnx(model)
    shape = parse_shape(input_shape) or static_input_shape(proto)  # a symbolic batch alone becomes 1
    if shape is None:
        raise InputError("the model has symbolic input dimensions and the HTP needs static shapes",
                         hint="pass --input-shape, e.g. 1,3,224,224")
    proto = fix_input_shape(proto, shape, dynamic_batch=False)
    report = Report("compile", config={"model": str(model), "target": profile.name, "soc": soc,
                                       "calib": str(calib) if calib else None,
                                       "input_shape": list(shape) if shape else None})
    from npukit.runtime.compile import soc_info

    soc_info(soc)  # an unknown SoC fails before any work
    quantized_here = not is_qdq(proto)
    if quantized_here:
        if calib is None:
            raise InputError("the model is float and the HTP runs quantized models",
                             hint="pass --calib DIR (calibration images or .npy) or give a QDQ model from "
                                  "`npukit quantize`")
        samples = _open_data(calib, proto, preprocess or PreprocessConfig())
        with step("quantizing for the HTP (int8 weights, uint16 activations)", timings=report.timings,
                  key="quantize"):
            proto = quantize_for_htp(proto, list(samples))
    with step(f"compiling the HTP context binary for {soc}", timings=report.timings, key="compile"):
        result = compile_qnn_context(proto, output, soc=soc)
    report.add("compile", result.as_dict())
    report.add("quantized_here", quantized_here)
    report.add_table(f"EPContext model for {result.soc_name} ({result.soc})",
                     ["SoC", "HTP arch", "soc_model", "context nodes", "nodes left to CPU", "context_binary_bytes",
                      "model_bytes", "compile s", "matches HTP run"],
                     [[result.soc, f"v{result.htp_arch}", result.soc_model, result.context_nodes,
                       result.other_nodes, result.context_binary_bytes, result.model_bytes, result.compile_seconds,
                       "identical" if result.identical else f"max abs diff {result.max_abs_diff:.3g}"]])
    report.add_table("What the device needs", ["requirement"], [[result.device_requirements]])
    return _finish(report, output, html=html, result=result)


# ----------------------------------------------------------------------------------------------------------- analyze

def analyze(
    model: str | Path,
    *,
    targets: Sequence[str],
    input_shape: str | Sequence[int] | None = None,
    fix: bool = False,
    output: str | Path | None = None,
    report_path: str | Path | None = None,
    html: bool = False,
) -> CommandResult:
    """Per node and per target: supported or not and why, the partition, CPU<->NPU transitions, delegated MACs;
    with ``fix`` the safe substitutions are applied (verified numerically) and written to ``output``."""
    from npukit.config import parse_shape
    from npukit.targets.api import analyze_model

    if output is not None:
        output = _check_output(output, source=model)
    elif fix:
        raise InputError("--fix writes the fixed model, so it needs -o OUTPUT.onnx", hint="add -o fixed.onnx")
    analyses, report = analyze_model(model, list(targets), input_shape=parse_shape(input_shape), fix=fix,
                                     output=output)
    json_path = Path(report_path) if report_path else (report_path_for(output) if output else None)
    return _finish(report, None, html=html, json_path=json_path, result=analyses)


# ------------------------------------------------------------------------------------------------------- plan-memory

def plan_memory(
    model: str | Path,
    *,
    target: str = "cpu",
    input_shape: str | Sequence[int] | None = None,
    order_search: bool = True,
    runtime_graph: bool = True,
    report_path: str | Path | None = None,
    html: bool = False,
) -> CommandResult:
    """Tensor lifetimes, every planner's arena (checked by the no-overlap invariant), the live bytes per layer and the
    memory timeline, on the graph as ``target`` executes it (fused activations, in-place ops, activation dtype).
    For target "cpu" that graph is read from ORT and ORT's own allocation is replayed on it, unless
    ``runtime_graph`` is False (the rule-based view of the exported graph)."""
    from npukit.memory.plan import plan_memory as _plan

    result, report = _plan(model, target=target, input_shape=input_shape, order_search=order_search,
                           runtime_graph=runtime_graph)
    json_path = Path(report_path) if report_path else None
    return _finish(report, None, html=html, json_path=json_path, result=result)


# ----------------------------------------------------------------------------------------------------------- devices

def devices(*, report_path: str | Path | None = None) -> CommandResult:
    """Probe execution providers, QNN backends, int8-relevant CPU features, cores and memory; say what npukit picks."""
    from npukit.runtime.devices import probe_devices

    probe = probe_devices()
    data = probe.as_dict()
    report = Report("devices", title="npukit devices")
    report.add("devices", data)
    report.add_table("Execution providers", ["provider", "kind"],
                     [[p, "built in"] for p in probe.providers]
                     + [[e["ep_name"], f"plugin ({e['vendor']}, {e['device']})"] for e in data["plugin_eps"]
                        if e["ep_name"] not in probe.providers])
    report.add_table("QNN backends", ["backend", "loads", "why not"],
                     [[b, reason is None, reason or ""] for b, reason in data["qnn"]["backends"].items()])
    cpu = data["cpu"]
    report.add_table("CPU", ["property", "value"],
                     [[k, ", ".join(v) if isinstance(v, list) else v] for k, v in cpu.items()]
                     + [["memory_total_bytes", probe.memory_total_bytes],
                        ["memory_available_bytes", probe.memory_available_bytes]])
    report.add_table("Plan", ["what npukit would pick"], [[line] for line in probe.plan])
    json_path = Path(report_path) if report_path else None
    return _finish(report, None, html=False, json_path=json_path, result=probe)


# ------------------------------------------------------------------------------------------------------------- bench

def bench(
    model: str | Path,
    *,
    data: str | Path | None = None,
    reference: str | Path | None = None,
    threads: int = 1,
    warmup: int = 10,
    runs: int = 50,
    max_samples: int | None = None,
    preprocess: PreprocessConfig | None = None,
    target: str = "cpu",
    soc: str = "SM8650",
    memory: bool = False,
    report_path: str | Path | None = None,
    html: bool = False,
) -> CommandResult:
    """Latency (ORT CPU), size, and — with ``data`` — agreement with ``reference`` and accuracy against labels.

    ``target="qnn-htp"`` also runs the model on Qualcomm's HTP backend (an emulator on x86): which nodes the QNN EP
    took, and how the HTP output agrees with the reference and with the CPU run of the same model, on the HTP of
    ``soc`` (its htp_arch and soc_model; the emulator's own default is v68). ``memory``
    measures ORT CPU's real peak activation memory in a fresh process beside the planner's prediction."""
    from npukit.frontend.onnx_io import load_onnx
    from npukit.measure.latency import measure_latency, measure_latency_interleaved
    from npukit.measure.size import model_size

    config = BenchConfig(threads=threads, warmup=warmup, runs=runs, max_samples=max_samples)
    preprocess = preprocess or PreprocessConfig()
    if target != "cpu":
        from npukit.runtime.compile import soc_info

        soc_info(soc)  # an unknown SoC fails before any work
    proto = load_onnx(model)
    ref_proto = load_onnx(reference) if reference is not None else None
    report = Report("bench", config={"bench": to_dict(config), "preprocess": to_dict(preprocess),
                                     "model": str(model), "reference": str(reference) if reference else None,
                                     "data": str(data) if data else None})
    dataset = None
    if data is not None:
        dataset = _open_data(data, proto, preprocess)
    sizes = {"model": model_size(model)}
    if reference is not None:
        sizes["reference"] = model_size(reference)
    report.add("size", {k: v.as_dict() for k, v in sizes.items()})

    feeds = dataset.sample(0) if dataset is not None else None
    with step(f"timing on ORT CPU, {threads} thread(s)", timings=report.timings, key="latency"):
        if reference is not None:
            lat = measure_latency_interleaved({"model": str(model), "reference": str(reference)}, threads=threads,
                                              warmup=warmup, runs=runs, feeds=feeds)
        else:
            lat = {"model": measure_latency(str(model), threads=threads, warmup=warmup, runs=runs, feeds=feeds)}
    report.add("latency", {k: v.as_dict() for k, v in lat.items()})
    rows = []
    for name, res in lat.items():
        ratio = res.median_ms / lat["reference"].median_ms if "reference" in lat else None
        rows.append([name, Path(str(model if name == "model" else reference)).name, sizes[name].file_bytes,
                     res.median_ms, res.p90_ms, ratio])
    report.add_table(f"Latency on ORT CPU ({threads} thread{'s' if threads > 1 else ''}, median of {runs} runs)",
                     ["role", "file", "size_bytes", "median ms", "p90 ms", "ratio to reference"], rows)
    report.add_figure("Latency (median ms)", "bar",
                      {"labels": list(lat), "values": [v.median_ms for v in lat.values()]}, x_label="ms")

    if dataset is not None:
        agreement = _evaluate(proto, ref_proto, dataset, config=config, threads=threads)
        shown = agreement.as_dict()
        if ref_proto is None:  # without a reference only the accuracy figures mean anything
            shown = {k: v for k, v in shown.items() if k == "samples" or "candidate" in k or k == "labeled_samples"}
        report.add("agreement" if ref_proto is not None else "accuracy", shown)
        fields = [("samples", agreement.samples)]
        if ref_proto is not None:
            fields += [("top-1 agreement", agreement.top1_agreement), ("top-5 overlap", agreement.top5_overlap),
                       ("SQNR dB", agreement.sqnr_db),
                       ("confident samples", agreement.confident_samples),
                       ("top-1 agreement where reference confident", agreement.top1_agreement_confident)]
        if agreement.labeled_samples:
            fields += [("top-1 accuracy", agreement.top1_accuracy_candidate),
                       ("top-5 accuracy", agreement.top5_accuracy_candidate)]
            if ref_proto is not None:
                fields += [("top-1 accuracy (reference)", agreement.top1_accuracy_reference)]
        report.add_table(f"Agreement on {Path(str(data)).name}", ["metric", "value"], [list(f) for f in fields])
    if target != "cpu":
        _bench_npu(report, proto, ref_proto, dataset, target=target, max_samples=max_samples, soc=soc)
    if memory:
        _bench_memory(report, model)
    json_path = Path(report_path) if report_path else None
    return _finish(report, None, html=html, json_path=json_path, result=report.sections)


def _bench_memory(report: Report, model: str | Path) -> None:
    from npukit.memory.measure import measure_ort_peak
    from npukit.memory.ort_cpu import without_graph_inputs
    from npukit.memory.plan import plan_memory as _plan
    from npukit.memory.planners import best_plan

    with step("measuring ORT's peak activation memory (fresh processes)", timings=report.timings, key="memory"):
        planned, _ = _plan(model, target="cpu")
        off = measure_ort_peak(model, arena=False)
        on = measure_ort_peak(model, arena=True)
    predicted = planned.runtime_peak
    placed = best_plan(without_graph_inputs(planned.lifetimes)).arena_bytes
    rows = [["predicted: ORT's allocation replayed on the graph ORT runs", predicted, None],
            ["npukit's best plan of the same graph", placed, placed / predicted - 1],
            ["measured, arena off", off.peak_bytes, off.peak_bytes / predicted - 1],
            ["measured, arena on", on.peak_bytes, on.peak_bytes / predicted - 1]]
    report.add("memory", {"predicted_bytes": predicted, "planned_bytes": placed,
                          "lower_bound_bytes": planned.lower_bound,
                          "measured_arena_off": off.as_dict(), "measured_arena_on": on.as_dict()})
    report.add_table("Peak activation memory (ORT CPU, VmHWM in a fresh process, MALLOC_MMAP_THRESHOLD_=65536; "
                     "graph inputs excluded)", ["what", "bytes", "vs predicted"], rows)


# Measured on the onnxruntime-qnn HTP emulator (QNN SDK 2.51), one 3x3 Conv with uint16 activations and int8
# weights, HTP output against the exact QDQ graph: 63 dB SQNR as HTP v68/v69, 86 dB as v73 and later. Chained through
# MobileNetV2 the v68 error reaches 30 dB at the logits and flips near-tie top-1 predictions.
PRECISE_A16_HTP_ARCH = 73


def _bench_npu(report: Report, proto: onnx.ModelProto, ref_proto: onnx.ModelProto | None, dataset, *, target: str,
               max_samples: int | None, soc: str) -> None:
    from npukit.measure.fidelity import AgreementMeter
    from npukit.quant.tensor_precision import sixteen_bit_activations
    from npukit.runtime.compile import soc_info, soc_provider_options
    from npukit.runtime.ort import make_session
    from npukit.runtime.qnn import make_qnn_session, qdq_reference_session, qnn_node_assignment
    from npukit.targets.registry import get_target

    profile = get_target(target)
    if profile.name != "qnn-htp":
        raise InputError(f"no runtime for {profile.name} on this machine",
                         hint="bench --target qnn-htp runs Qualcomm's HTP backend; use `npukit analyze` for the "
                              "others")
    chip = soc_info(soc)
    options = soc_provider_options(soc)
    report.add("htp_soc", {"soc": chip.part, "name": chip.name, "htp_arch": chip.htp_arch,
                           "soc_model": chip.soc_model})
    if chip.htp_arch < PRECISE_A16_HTP_ARCH and sixteen_bit_activations(proto):
        report.add("htp_note", f"HTP v{chip.htp_arch} computes 16-bit activation layers at reduced precision "
                               f"(measured: 63 dB per Conv against 86 dB on v{PRECISE_A16_HTP_ARCH}+); expect the HTP "
                               "and CPU runs to differ more than on newer SoCs")
    with step("asking the QNN EP which nodes it takes", timings=report.timings, key="qnn_assignment"):
        assignment = qnn_node_assignment(proto)
    report.add("qnn_assignment", assignment.as_dict())
    report.add_table("Nodes the QNN EP took (HTP backend)", ["QNN nodes", "CPU nodes", "QNN partitions"],
                     [[len(assignment.qnn_nodes), len(assignment.cpu_nodes), assignment.partitions]])
    if assignment.rejected:
        report.add_table("Nodes left to the CPU, and QNN's reason", ["node", "reason"],
                         [[k, v] for k, v in assignment.rejected.items()])
    if dataset is None:
        return
    htp = make_qnn_session(proto, allow_cpu_fallback=True, provider_options=options)
    cpu = make_session(proto)
    exact = qdq_reference_session(proto) if is_qdq(proto) else None
    ref = make_session(ref_proto) if ref_proto is not None else None
    meters = {"HTP vs CPU run of the same model": AgreementMeter()}
    if exact is not None:
        meters["HTP vs the QDQ graph unfused (exact numerics)"] = AgreementMeter()
    if ref is not None:
        meters["HTP vs reference"] = AgreementMeter()
        meters["CPU vs reference"] = AgreementMeter()
    total = len(dataset) if max_samples is None else min(max_samples, len(dataset))
    for batch in progress(dataset.batches(1, limit=total), total=total, description="running on the HTP"):
        h = _logits(htp.run(None, batch.feeds))
        c = _logits(cpu.run(None, batch.feeds))
        meters["HTP vs CPU run of the same model"].update(c, h)
        if exact is not None:
            meters["HTP vs the QDQ graph unfused (exact numerics)"].update(_logits(exact.run(None, batch.feeds)), h)
        if ref is not None:
            r = _logits(ref.run(None, batch.feeds))
            meters["HTP vs reference"].update(r, h)
            meters["CPU vs reference"].update(r, c)
    results = {k: m.result() for k, m in meters.items()}
    report.add("npu_agreement", {k: v.as_dict() for k, v in results.items()})
    report.add_table(f"HTP fidelity on {total} samples ({chip.name}, {chip.part}, HTP v{chip.htp_arch})",
                     ["comparison", "top-1 agreement", "top-5 overlap", "SQNR dB", "agreement where confident"],
                     [[k, v.top1_agreement, v.top5_overlap, v.sqnr_db, v.top1_agreement_confident]
                      for k, v in results.items()])


def _open_data(data: str | Path, proto: onnx.ModelProto, preprocess: PreprocessConfig):
    from npukit.data.readers import open_dataset
    from npukit.frontend.onnx_io import graph_inputs

    inputs = graph_inputs(proto)
    if len(inputs) != 1 and Path(data).suffix != ".npz":
        raise InputError(f"the model has {len(inputs)} inputs; an image folder or .npy feeds only one",
                         hint="pass a .npz file with one array per input name")
    first = inputs[0]
    dims = [d.dim_value if d.HasField("dim_value") else None for d in first.type.tensor_type.shape.dim]
    if len(dims) == 4 and dims[1] in (1, 3) and Path(data).is_dir() and dims[2] and dims[2] != preprocess.size:
        preprocess = dataclasses.replace(preprocess, size=dims[2], resize=max(preprocess.resize, dims[2]))
    if len(dims) == 4 and dims[1] == 1 and preprocess.channels != 1:
        preprocess = dataclasses.replace(preprocess, channels=1, mean=(preprocess.mean[0],), std=(preprocess.std[0],))
    dataset = open_dataset(data, preprocess=preprocess, input_name=first.name if len(inputs) == 1 else None)
    dataset.check_against({i.name: tuple(d.dim_value if d.HasField("dim_value") else None
                                         for d in i.type.tensor_type.shape.dim) for i in inputs})
    dataset.validate()
    return dataset


def _evaluate(proto: onnx.ModelProto, ref_proto: onnx.ModelProto | None, dataset, *, config: BenchConfig,
              threads: int):
    from npukit.measure.fidelity import AgreementMeter
    from npukit.runtime.ort import make_session

    session = make_session(proto, threads=threads)
    ref_session = make_session(ref_proto, threads=threads) if ref_proto is not None else None
    meter = AgreementMeter()
    total = len(dataset) if config.max_samples is None else min(config.max_samples, len(dataset))
    for batch in progress(dataset.batches(config.batch_size, limit=total), total=-(-total // config.batch_size),
                          description="evaluating"):
        cand = _logits(session.run(None, batch.feeds))
        ref = _logits(ref_session.run(None, batch.feeds)) if ref_session is not None else cand
        meter.update(ref, cand, batch.labels)
    return meter.result()


def _logits(outputs: list) -> np.ndarray:
    out = np.asarray(outputs[0], dtype=np.float32)
    return out.reshape(out.shape[0], -1)


# -------------------------------------------------------------------------------------------------------------- demo

def demo(
    output_dir: str | Path = "npukit_out",
    *,
    threads: int = 1,
    runs: int = 50,
    html: bool = True,
) -> CommandResult:
    """The main job on the embedded default: MobileNetV2 with official ImageNet weights, real photos, every stage."""
    from npukit.demo import run_demo

    return run_demo(Path(output_dir), threads=threads, runs=runs, html=html)

