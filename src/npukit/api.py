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
from npukit.report.finish import CommandResult, finish, report_path_for
from npukit.report.plan import add_plan
from npukit.report.progress import progress, step
from npukit.tasks import QualityGate


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
    """Export MODEL (a spec string or a torch.nn.Module) to a verified single-file ONNX model at ``output``.

    ``input_shape`` takes the ``InputSpec`` forms; a torch model has one input (``input``), an .onnx file passed
    through gets the shape of one of its inputs fixed (its first, or the one named)."""
    from npukit.frontend.export import export_model
    from npukit.frontend.shapes import InputSpec
    from npukit.frontend.spec import ModelSource, resolve_model
    from npukit.measure.summary import summarize

    spec = InputSpec.parse(input_shape)
    config = ExportConfig(input_shape=spec.first if spec else None, dynamic_batch=dynamic_batch, opset=opset,
                          exporter=exporter, rtol=rtol)
    output = _check_output(output, source=model if isinstance(model, (str, Path)) else None)
    if isinstance(model, (str, Path)):
        source = resolve_model(str(model), weights=str(weights) if weights else None)
    else:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise InputError(f"cannot export a {type(model).__name__}", hint="pass a torch.nn.Module or a model spec")
        if config.input_shape is None:
            raise InputError("exporting a torch module needs an input shape", hint="pass input_shape=(1, 3, 224, 224)")
        from npukit.frontend.checkpoint import load_weights

        notes = load_weights(model, weights) if weights else ()
        source = ModelSource(kind="torch", spec=type(model).__name__, module=model.eval(), onnx_path=None,
                             default_input_shape=None, description=f"torch module {type(model).__name__}",
                             notes=notes)
    if spec is not None and spec.first is None:
        config = dataclasses.replace(config, input_shape=_export_input_shape(spec, source))
    report = Report("export", config={"export": to_dict(config), "model": str(source.spec),
                                      "weights": str(weights) if weights else None})
    report.add("model", {"description": source.description, "notes": list(source.notes)})
    with step(f"exporting {source.description}", timings=report.timings, key="export"):
        result = export_model(source, output, config=config)
    report.add("export", result.as_dict())
    summary = summarize(onnx.load(str(output)), input_shape=result.input_shape)
    report.add("summary", {k: v for k, v in summary.as_dict().items() if k != "layers"})
    report.add_table("Export", ["model", "exporter", "opset", "input shape", "nodes", "max abs err", "max rel err",
                                "verified"],
                     [[source.description, result.exporter, result.opset, "x".join(map(str, result.input_shape or ())),
                       result.node_count, result.max_abs_error, result.max_rel_error, result.passed]])
    if source.notes:
        report.add_table("Model loading", ["note"], [[note] for note in source.notes])
    if result.fallback_reason:
        report.add_table("Exporter fallback", ["tried", "reason"], [["dynamo", result.fallback_reason]])
    report.set_verdict(f"{'PASS' if result.passed else 'FAIL'} export: {source.description} with the "
                       f"{result.exporter} exporter, outputs against torch's on seeded inputs: max abs error "
                       f"{_g(result.max_abs_error)}, rel {_g(result.max_rel_error)} (rtol {config.rtol:g})",
                       passed=result.passed)
    return finish(report, output, html=html, result=result)


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _export_input_shape(spec, source) -> tuple[int, ...]:
    """The one input shape ``export`` fixes, from a spec that names its input."""
    (name, shape), *more = spec.shapes
    if source.kind == "onnx":
        from npukit.frontend.onnx_io import load_onnx
        from npukit.frontend.shapes import runtime_inputs

        proto = load_onnx(source.onnx_path)
        resolved = spec.resolve(proto, override_static=True)
        if list(resolved) == [runtime_inputs(proto)[0].name]:
            return resolved[runtime_inputs(proto)[0].name]
        raise InputError(f"export fixes the shape of an .onnx file's first input only, not of {spec.describe()}",
                         hint="fix several or other inputs with `npukit optimize-graph MODEL.onnx -o OUT.onnx "
                              "--input-shape NAME=... --input-shape NAME=...`")
    if more or name != "input":
        raise InputError(f"a torch model is exported with one input, named 'input', not {spec.describe()}",
                         hint="pass --input-shape 1,3,224,224 (or input=1,3,224,224)")
    return shape


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
    needed, the early high-resolution stage is split into spatial tiles with the halo their receptive field needs.

    ``input_shape`` (``InputSpec`` forms) is fixed into the model before the passes run, so the passes, the numeric
    check, the MAC counts and the memory plan all use it, and the output keeps it. ``skip_passes`` takes the names
    the Passes table prints (FoldBatchNormPass) or the registry's (fold_batch_norm)."""
    from npukit.frontend.onnx_io import save_onnx
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.measure.summary import summarize
    from npukit.passes.pipeline import optimize_model, resolve_pass_names, verify_equivalent
    from npukit.report.terminal import before_after_table

    config = OptimizeConfig(skip_passes=resolve_pass_names(skip_passes), verify=verify, rtol=rtol)
    output = _check_output(output, source=model)
    spec = InputSpec.parse(input_shape)
    original = load_with_inputs(model, spec, needs="optimize-graph's numeric check (skipped with --no-verify)"
                                if verify else None)
    shape = spec.first if spec else None
    report = Report("optimize-graph", config={"optimize": to_dict(config), "model": str(model),
                                              "input_shape": spec.as_dict() if spec else None})
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
        from npukit.measure.compare import ABS_FLOOR

        # the output nearest its bound: abs error against rtol x its max |value| + the float32 floor (<= 1 passes)
        worst = max(range(len(errors.per_output)), default=None,
                    key=lambda k: errors.per_output[k][0] / errors.allowed(k, rtol))
        share = None if worst is None else errors.per_output[worst][0] / errors.allowed(worst, rtol)
        runtime = (f" + twice ORT's own deviation on the unmodified model (its optimizations on vs off: up to "
                   f"{max(errors.runtime_allowance) / 2:.3g}; the rewrites alone, both run without them, are within "
                   "the plain tolerance)" if errors.runtime_allowance else "")
        report.add_table(f"Verification against the original (an output passes when its max abs error <= rtol x "
                         f"its max |value| + {ABS_FLOOR:g}{runtime})",
                         ["max abs error", "max rel error", "rtol", "worst output's error / allowed"],
                         [[errors.max_abs, errors.max_rel, rtol, share]])
    nodes = f"{before.nodes} -> {after.nodes} nodes"
    if errors is None:
        report.set_verdict(f"UNVERIFIED optimize-graph: {nodes}, numeric check skipped (--no-verify)", passed=True)
    else:
        report.set_verdict(f"PASS optimize-graph: {nodes}, every output within its tolerance of the original's "
                           f"(max abs error {errors.max_abs:.3g}, worst output at {share or 0:.2f} of its allowance"
                           + ("; the allowance includes ORT's own deviation on the unmodified model"
                              if errors.runtime_allowance else "") + ")", passed=True)
    if tiling is not None:
        report.add("tiling", tiling.sections)
        report.tables.extend(tiling.tables)
        report.config["memory_budget"] = memory_budget
    return finish(report, output, html=html, result=pipeline)


# ----------------------------------------------------------------------------------------------------------- inspect

def inspect(model: str | Path, *, input_shape: str | Sequence[int] | None = None, top_layers: int = 15) -> CommandResult:
    """Summarize an ONNX model: ops by type, parameters, MACs per layer and in total, the largest tensors.

    ``input_shape`` (``InputSpec`` forms) is fixed into the model first. A symbolic batch counts as 1; when other
    symbolic dimensions leave conv/matmul layers without shapes, the total is shown as unknown (the JSON keeps the
    partial sum with ``unknown_mac_layers``) rather than a number that leaves them out."""
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.measure.summary import summarize

    spec = InputSpec.parse(input_shape)
    proto = load_with_inputs(model, spec)
    summary = summarize(proto)
    report = Report("inspect", config={"model": str(model), "input_shape": spec.as_dict() if spec else None})
    report.add("summary", summary.as_dict())
    mac_layers = summary.unknown_mac_layers + sum(1 for la in summary.layers if la.macs)
    macs_shown: int | str = summary.macs
    if summary.unknown_mac_layers:
        macs_shown = (f"unknown ({summary.unknown_mac_layers} of {mac_layers} conv/matmul layers have symbolic "
                      f"shapes; pass --input-shape)")
        report.add("macs_note", f"{summary.unknown_mac_layers} of {mac_layers} conv/matmul layers have symbolic "
                                f"shapes: the {summary.macs:,} MACs counted leave them out")
    report.add_table("Model", ["inputs", "nodes", "parameters", "MACs", "size_bytes"],
                     [[", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in summary.input_shapes.items()),
                       summary.nodes, summary.parameters, macs_shown, summary.serialized_bytes]])
    report.add_table("Ops by type", ["op", "count"], sorted(([k, v] for k, v in summary.ops.items()),
                                                             key=lambda r: (-r[1], r[0])))
    heavy = sorted((layer for layer in summary.layers if layer.macs), key=lambda layer: -layer.macs)[:top_layers]
    report.add_table(f"Layers by MACs (top {len(heavy)} of {sum(1 for la in summary.layers if la.macs)})",
                     ["layer", "op", "output shape", "params", "MACs", "share", "output_bytes"],
                     [[la.name, la.op, "x".join(map(str, la.output_shape or ())), la.params, la.macs,
                       f"{la.macs / summary.macs:.1%}" if summary.macs and not summary.unknown_mac_layers else "—",
                       la.output_bytes] for la in heavy])
    report.add_table("Largest activations", ["tensor", "shape", "dtype", "bytes"],
                     [[a.name, "x".join(map(str, a.shape)), a.dtype, a.bytes] for a in summary.largest_activations])
    report.set_verdict(f"INFO inspect: {summary.nodes} nodes, {summary.parameters:,} parameters, "
                       f"{macs_shown if isinstance(macs_shown, str) else f'{macs_shown:,}'} MACs; nothing was checked",
                       passed=True)
    return finish(report, None, html=False, result=summary)


# ---------------------------------------------------------------------------------------------------------- quantize

def cpu_scheme() -> dict:
    """The activation dtype and weight range this machine's CPU runs accurately (npukit.quant.schemes)."""
    from npukit.quant.schemes import cpu_int8_scheme
    from npukit.runtime.devices import read_cpu_info

    return cpu_int8_scheme(read_cpu_info("/proc/cpuinfo"))


def _gemm_convs_auto(scheme: dict, reduced: bool) -> bool:
    """The conv kernel choice's default: on where this CPU's scheme takes it, the weights are full range, and both of
    ORT's int8 conv kernels were measured exact here (``runtime.int8_paths``)."""
    from npukit.runtime.int8_paths import full_range_exact, probe_int8_paths

    return bool(scheme["gemm_convs"]) and not reduced and full_range_exact(probe_int8_paths())


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
    task: str | None = None,
    gate: QualityGate | None = None,
    input_shape: str | Sequence[Any] | None = None,
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

    The result is checked with the model's task (``task``: classify, detect, segment, text-detect, text-recognize,
    generic; None detects it from the outputs) against the float model on ``data`` (else on up to
    ``CHECK_SAMPLES`` calibration samples, which the report says is optimistic): the task metric and every output
    the task does not decode are held to ``gate``'s floors, and a model that runs no integer kernel fails unless
    every node was excluded on purpose. The report's verdict says which; a failed check makes the CLI exit 1.

    ``input_shape`` (``InputSpec`` forms) is fixed into the model first; a model with symbolic dimensions other
    than the batch needs it. A model below the opset its Q/DQ needs (per-channel: 13, 16-bit: 21) is converted and
    verified on calibration samples first (``npukit.frontend.opset``); the report records it.
    """
    from npukit.frontend.onnx_io import save_onnx
    from npukit.frontend.shapes import InputSpec, load_with_inputs, require_static
    from npukit.measure.latency import measure_latency_interleaved
    from npukit.measure.op_profile import compare_kinds, profile_ops
    from npukit.measure.size import model_size
    from npukit.quant.config import QuantConfig
    from npukit.quant.layer_sqnr import layer_sqnr
    from npukit.quant.qdq import integer_kernel_report
    from npukit.quant.qdq import quantize as _quantize

    output = _check_output(output, source=model)
    preprocess = preprocess or PreprocessConfig()
    spec = InputSpec.parse(input_shape)
    proto = load_with_inputs(model, spec)
    _refuse_quantized(proto, model)
    require_static(proto, needs="quantize")
    timed_float = proto if spec else str(model)  # with --input-shape: the float model as fixed (static sizes too)
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
                         gemm_convs=_gemm_convs_auto(scheme, reduced) if gemm_convs is None else gemm_convs,
                         calib_samples=calib_samples, **(extra or {}))
    samples = _open_data(calib, proto, preprocess) if isinstance(calib, (str, Path)) else list(calib)
    evaluation = _open_data(data, proto, preprocess) if data is not None else None
    report = Report("quantize", config={"quant": config.as_dict(), "cpu_scheme": scheme, "model": str(model),
                                        "calib": str(calib) if isinstance(calib, (str, Path)) else
                                        f"{len(samples)} samples given in memory",
                                        "data": str(data) if data else None, "preprocess": to_dict(preprocess),
                                        "task": task or "auto", "gate": (gate or QualityGate()).as_dict(),
                                        "input_shape": spec.as_dict() if spec else None})
    proto = _quant_opset(report, proto, config, samples)
    with step("quantizing (calibrate, equalize, correct, insert Q/DQ)", timings=report.timings, key="quantize"):
        result = _quantize(proto, samples, config=config)
    save_onnx(result.model, output)
    report.add("steps", result.steps)
    add_plan(report, result.steps["plan"])
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
    joins = result.steps.get("float_joins")
    if joins:
        report.add_table(f"Joins of very different scales left in float, with the nodes after them (each input keeps "
                         f"its own grid; ratio >= {joins['ratio']:g})",
                         ["join", "largest |value| per input", "ratio", "nodes after it, in float"],
                         [[j["node"], ", ".join(f"{k} {v:.4g}" for k, v in j["input_magnitudes"].items()), j["ratio"],
                           ", ".join(j["after"]) or "-"] for j in joins["joins"]])
    head = result.steps.get("float_stem")
    if head and (head["nodes"] or head.get("dropped")):
        report.add_table("Float head (the stem and the convs after it that run fastest in float on this CPU)",
                         ["convs left in float", "note"], [[", ".join(head["nodes"]) or "-", head.get("dropped", "")]])
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
        latency = measure_latency_interleaved({"float": timed_float, "int8": str(output)}, threads=threads,
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
        profiles = profile_ops({"float": timed_float, "int8": str(output)}, threads=threads, warmup=3,
                               runs=min(runs, 10), rounds=2, feeds=feeds)
    report.add("kernel_profile", {k: p.as_dict() for k, p in profiles.items()})
    kinds = compare_kinds(profiles["float"], profiles["int8"])
    report.add_table(f"Where the time goes (ORT CPU kernel time by kind, ms, {threads} thread(s); speedup = float / "
                     "int8)",
                     ["kind", "float ms", "int8 ms", "speedup", "int8 nodes", "int8 share on integer kernels"],
                     [[kind, v["base_ms"], v["ms"], v["speedup"], v["nodes"], v["integer_share"]]
                      for kind, v in kinds.items()])
    from npukit.measure.task_fidelity import check_samples

    with step("task check against the float model", timings=report.timings, key="task_check"):
        check = evaluation if evaluation is not None else samples
        limit = (max_samples or len(check)) if evaluation is not None else CHECK_SAMPLES
        where = (f"held-out data {Path(str(data)).name}" if evaluation is not None else
                 "calibration samples (no --data given: optimistic, the model was fitted to them)")
        choice, _, _ = _task_check(report, proto, result.model, check_samples(check, limit), task=task,
                                   gate=gate or QualityGate(), what="quantize", where=where, threads=threads,
                                   extra_failures=_integer_failures(kernels, result, config))
    if evaluation is not None and choice.name == "classify":
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
    return finish(report, output, html=html, result=result)


CHECK_SAMPLES = 32  # calibration samples the task check reads when no held-out data is given


def _refuse_quantized(proto: onnx.ModelProto, model: str | Path, *, verb: str = "quantize") -> None:
    """An InputError (exit 2) when ``proto`` is quantized already (Q/DQ nodes, QLinear*/ConvInteger/... kernels),
    before ``verb`` would quantize it again: grids stacked on grids, and ORT's quantizer fails on it (KeyError on a
    '<tensor>_scale' it expects to have made)."""
    from npukit.frontend.onnx_io import QDQ_OPS, quantized_ops

    found = quantized_ops(proto)
    if not found:
        return
    ops = ", ".join(f"{op} x{n}" for op, n in found.items())
    where = ("bench it as it is (`npukit bench MODEL --data ...`) or compile it as it is (`npukit compile` takes "
             "a QDQ model)" if set(found) <= QDQ_OPS else
             "bench it as it is (`npukit bench MODEL --data ...`, ORT CPU runs these ops); the HTP takes float or "
             "QDQ models, not these ops")
    takes = "a float model" if verb == "quantize" else "a float model (quantized here for the HTP) or a QDQ model"
    raise InputError(f"{Path(str(model)).name} is already quantized ({ops}); {verb} takes {takes}",
                     hint=f"{where}; to quantize it with npukit, start from its float original")


def _quant_opset(report: Report, proto: onnx.ModelProto, config: Any, samples: Any) -> onnx.ModelProto:
    """``proto`` at the opset its Q/DQ needs (16-bit: 21, per-channel: 13), converted and verified on the first
    calibration samples when below it; the conversion goes into ``report``."""
    from npukit.frontend.opset import PER_CHANNEL_QDQ_OPSET, SIXTEEN_BIT_QDQ_OPSET

    if config.int16_nodes or config.int16_tensors or config.int16_budget > 0:
        return _upgrade_opset(report, proto, SIXTEEN_BIT_QDQ_OPSET, "16-bit Q/DQ", samples,
                              alternative="quantize without 16-bit activations")
    if config.per_channel:
        return _upgrade_opset(report, proto, PER_CHANNEL_QDQ_OPSET, "per-channel Q/DQ", samples,
                              alternative="pass --per-tensor")
    return proto


def _upgrade_opset(report: Report, proto: onnx.ModelProto, minimum: int, reason: str, samples: Any, *,
                   alternative: str = "") -> onnx.ModelProto:
    """``proto`` converted to opset ``minimum`` and verified on the first samples, when below it (``ensure_opset``);
    the conversion goes into ``report``."""
    from npukit.frontend.opset import ensure_opset

    feeds = list(samples[:4]) if isinstance(samples, list) else [samples.sample(i) for i in range(min(4, len(samples)))]
    with step(f"checking the opset ({reason} needs {minimum})", timings=report.timings, key="opset"):
        proto, upgrade = ensure_opset(proto, minimum, reason=reason, feeds=feeds, alternative=alternative)
    if upgrade is not None:
        report.add("opset_upgrade", upgrade.as_dict())
        report.add_table("Opset upgrade (onnx.version_converter, verified)",
                         ["from", "to", "needed for", "checked on", "max abs error", "max rel error"],
                         [[upgrade.from_opset, upgrade.to_opset, upgrade.reason,
                           f"{upgrade.samples} {upgrade.inputs}", upgrade.max_abs_error, upgrade.max_rel_error]])
    return proto


def _integer_failures(kernels: dict, result: Any, config: Any) -> list[str]:
    """A quantized model that runs no integer kernel at all is a failure unless every node was excluded on
    purpose; the float head's part in it is named."""
    if kernels["integer_fraction"] > 0 or sum(kernels["integer_ops"].values()):
        return []
    head = result.steps.get("float_stem", {}).get("nodes", [])
    floats = sum(kernels["float_compute_after_dq"].values()) + sum(kernels["float_compute"].values())
    if not floats:
        return []  # nothing to run on integer kernels (no Conv, MatMul or Gemm)
    if config.exclude and not head:
        return []  # asked for: the user excluded the compute nodes
    why = f" (the float head left {len(head)} conv(s) in float: {', '.join(head)}; try --float-stem off)" if head \
        else " (try --per-tensor, or check the model's ops with npukit analyze --target cpu)"
    return [f"no integer kernels: ORT runs all {floats} conv/matmul nodes in float{why}"]


def _task_check(report: Report, reference: Any, candidate: Any, samples: Sequence[Any], *, task: str | None,
                gate: QualityGate, what: str, where: str, threads: int = 1,
                extra_failures: Sequence[str] = (), reference_runner: Any = None, candidate_runner: Any = None):
    """Compare ``candidate`` with ``reference`` (models or paths on ORT CPU, or runners given) on ``samples`` with
    the model's task, judge it under ``gate``, and put the tables and the verdict into ``report``."""
    from npukit.measure.task_fidelity import compare_task, session_runner
    from npukit.report.task import add_task_check
    from npukit.runtime.ort import make_session
    from npukit.tasks import judge

    names = None
    if candidate_runner is None:
        session = make_session(candidate, threads=threads)
        names = [o.name for o in session.get_outputs()]
        candidate_runner = session_runner(session)
    if reference_runner is None:
        ref_session = make_session(reference, threads=threads)
        names = names or [o.name for o in ref_session.get_outputs()]
        reference_runner = session_runner(ref_session)
    if names is None:
        proto = reference if isinstance(reference, onnx.ModelProto) else onnx.load(str(reference),
                                                                                 load_external_data=False)
        names = [o.name for o in proto.graph.output]
    choice, result = compare_task(reference_runner, candidate_runner, samples, output_names=names, task=task)
    verdict = judge(result, gate, what=what, extra_failures=extra_failures)
    add_task_check(report, choice, result, gate, verdict, where=where)
    return choice, result, verdict


# ----------------------------------------------------------------------------------------------------------- compile

COMPILE_CHECK_SAMPLES = 8  # the HTP emulator takes about 0.6 s per MobileNetV2 image on x86


def _seeded_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    from npukit.runtime.ort import make_session, random_feeds

    return random_feeds(make_session(model), seed=0)

def is_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def quantize_for_htp(model: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """QDQ as the HTP needs it (npukit.runtime.qnn.HTP_QDQ_RULES: int8 symmetric per-channel weights, uint16
    activations; the weights' rounding compensated, the 16-bit grids given headroom, BatchNorms the HTP mishandles
    rewritten), with ONNX Runtime's quantizer doing the mechanics (npukit.runtime.htp_quant.quantize_for_htp)."""
    from npukit.runtime.htp_quant import quantize_for_htp as _quantize_for_htp

    return _quantize_for_htp(model, samples).model


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
    task: str | None = None,
    gate: QualityGate | None = None,
) -> CommandResult:
    """Static shapes, QDQ as the HTP needs (unless the model already is QDQ), then an EPContext model with the HTP
    context binary for ``soc`` embedded; loaded back and run to prove it works, then checked with the model's task
    (``task``; None: detected) on the HTP against the float model on ORT CPU, on up to ``COMPILE_CHECK_SAMPLES``
    calibration samples, under ``gate``'s floors."""
    from npukit.frontend.shapes import InputSpec, apply_input_spec, fixed_shapes, load_with_inputs, symbolic_inputs
    from npukit.runtime.compile import compile_qnn_context
    from npukit.targets.registry import get_target

    profile = get_target(target)
    if profile.name != "qnn-htp":
        raise InputError(f"compiling for {profile.name} is not supported yet",
                         hint="use --target qnn-htp; other targets: export the QDQ model from `npukit quantize`")
    output = _check_output(output, source=model)
    spec = InputSpec.parse(input_shape)
    proto = load_with_inputs(model, spec, needs="the HTP")
    if symbolic_inputs(proto, allow_batch=False):  # a symbolic batch alone becomes 1
        proto = apply_input_spec(proto, InputSpec(tuple(fixed_shapes(proto).items())))
    report = Report("compile", config={"model": str(model), "target": profile.name, "soc": soc,
                                       "calib": str(calib) if calib else None,
                                       "input_shape": {k: list(v) for k, v in fixed_shapes(proto).items()}})
    from npukit.runtime.compile import soc_info

    soc_info(soc)  # an unknown SoC fails before any work
    quantized_here = not is_qdq(proto)
    if quantized_here:  # ConvInteger / QLinear* models: nothing for the HTP, and not to be quantized again
        _refuse_quantized(proto, model, verb="compile")
    reference = proto  # the float model (or the QDQ model given) on ORT CPU: what the HTP's outputs are checked against
    samples = None
    if calib is not None:
        samples = _open_data(calib, proto, preprocess or PreprocessConfig())
    if quantized_here and samples is None:
        raise InputError("the model is float and the HTP runs quantized models",
                         hint="pass --calib DIR (calibration images or .npy) or give a QDQ model from "
                              "`npukit quantize`")
    from npukit.runtime.compile import prepare_graph

    # With the shapes fixed, Shape/Range subgraphs fold to constants; Constant nodes become initializers (else the
    # quantizer would quantize them as activations, which the HTP rejects).
    with step("folding constants with the shapes fixed (npukit's graph passes)", timings=report.timings,
              key="prepare"):
        proto, prepared = prepare_graph(proto, feeds=samples.sample(0) if samples is not None else None)
    report.add("graph_preparation", prepared)
    if quantized_here:
        from npukit.frontend.opset import SIXTEEN_BIT_QDQ_OPSET

        proto = _upgrade_opset(report, proto, SIXTEEN_BIT_QDQ_OPSET, "uint16 activation Q/DQ for the HTP", samples)
        with step("quantizing for the HTP (int8 weights, uint16 activations)", timings=report.timings,
                  key="quantize"):
            from npukit.runtime.htp_quant import quantize_for_htp as _quantize_for_htp

            htp_quant = _quantize_for_htp(proto, list(samples))
            proto = htp_quant.model
        done = htp_quant.as_dict()
        report.add("htp_quantization", done)
        report.add_table("Quantized for the HTP (int8 weights, uint16 activations; npukit.runtime.htp_quant)",
                         ["step", "count"],
                         [["BatchNorm / bias Add folded into a ConvTranspose", len(done["folded"])],
                          ["BatchNorm rewritten as Mul + Add", len(done["batchnorms_rewritten"])],
                          ["zero biases added", done["biases_added"]],
                          ["weights re-rounded (GPTQ)", done["gptq_nodes"]],
                          [f"weight rounding bias corrected ({done['correction_samples']} samples)",
                           done["bias_corrected_nodes"]],
                          ["16-bit grids given headroom", done["widened_grids"]]])
    with step(f"compiling the HTP context binary for {soc}", timings=report.timings, key="compile"):
        result = compile_qnn_context(proto, output, soc=soc)
    report.add("compile", result.as_dict())
    with step(f"task check: the compiled model on the HTP ({soc}) against the "
              f"{'float' if quantized_here else 'given'} model on ORT CPU", timings=report.timings,
              key="task_check"):
        from npukit.measure.task_fidelity import check_samples, session_runner
        from npukit.runtime.compile import soc_provider_options
        from npukit.runtime.qnn import make_qnn_session

        htp = make_qnn_session(output, provider_options=soc_provider_options(soc))
        check = check_samples(samples, COMPILE_CHECK_SAMPLES) if samples is not None else \
            [_seeded_feeds(reference)]
        where = (f"{len(check)} calibration samples (optimistic: the grids were fitted to them)" if samples is not None
                 else "one seeded random input (no --calib given: pass it for a task check on real inputs)")
        _task_check(report, reference, None, check, task=task, gate=gate or QualityGate(), what="compile",
                    where=where, candidate_runner=session_runner(htp))
    report.add("quantized_here", quantized_here)
    report.add_table(f"EPContext model for {result.soc_name} ({result.soc})",
                     ["SoC", "HTP arch", "soc_model", "context nodes", "nodes left to CPU", "context_binary_bytes",
                      "model_bytes", "compile s", "matches HTP run"],
                     [[result.soc, f"v{result.htp_arch}", result.soc_model, result.context_nodes,
                       result.other_nodes, result.context_binary_bytes, result.model_bytes, result.compile_seconds,
                       result.match_summary]])
    for name in dict.fromkeys(r["hazard"] for r in result.hazard_rewrites):
        done = [r for r in result.hazard_rewrites if r["hazard"] == name]
        report.add_table(f"Rewritten before compiling (exact on ORT CPU), because the HTP computes it wrongly: "
                         f"{done[0]['reason'].rsplit(' [', 1)[0]}", ["nodes", "input", "rewrite"],
                         [[" + ".join(r["nodes"]), r["where"], r["fix"]] for r in done])
    report.add_table("What the device needs", ["requirement"], [[result.device_requirements]])
    return finish(report, output, html=html, result=result)


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
    with ``fix`` the safe substitutions are applied (verified numerically) and written to ``output``.

    ``input_shape`` (``InputSpec`` forms): an unnamed shape is the first input's (the targets' fix_input_shape);
    shapes by input name are fixed into the model before it is analyzed."""
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.targets.api import analyze_model

    if output is not None:
        output = _check_output(output, source=model)
    elif fix:
        raise InputError("--fix writes the fixed model, so it needs -o OUTPUT.onnx", hint="add -o fixed.onnx")
    spec = InputSpec.parse(input_shape)
    source = load_with_inputs(model, spec) if spec is not None and spec.first is None else model
    analyses, report = analyze_model(source, list(targets), input_shape=spec.first if spec else None, fix=fix,
                                     output=output)
    if spec is not None:
        report.config["input_shape"] = spec.as_dict()
    json_path = Path(report_path) if report_path else (report_path_for(output) if output else None)
    return finish(report, None, html=html, json_path=json_path, result=analyses, source=model)


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
    return finish(report, None, html=html, json_path=json_path, result=result, source=model)


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
    report.add_table("int8 conv paths (measured here against exact integer arithmetic)",
                     ["conv", "ORT kernel", "weights", "exact", "max steps off", "share of outputs off"],
                     [[p.name, p.kernel, p.weights, p.exact, p.steps_off, p.share_off] for p in probe.int8_paths])
    report.add_table("Plan", ["what npukit would pick"], [[line] for line in probe.plan])
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=False, json_path=json_path, result=probe)


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
    task: str | None = None,
    gate: QualityGate | None = None,
    input_shape: str | Sequence[Any] | None = None,
) -> CommandResult:
    """Latency (ORT CPU), size, and — with ``data`` — agreement with ``reference`` and accuracy against labels.

    With ``data`` and ``reference`` the model is checked against the reference with its task (``task``, None:
    detected from the outputs; every output compared) under ``gate``'s floors: the verdict, and exit 1 from the CLI
    when it fails. Without a reference the report measures only.

    ``target="qnn-htp"`` also runs the model on Qualcomm's HTP backend (an emulator on x86): which nodes the QNN EP
    took, and how the HTP output agrees with the reference and with the CPU run of the same model, on the HTP of
    ``soc`` (its htp_arch and soc_model; the emulator's own default is v68). ``memory``
    measures ORT CPU's real peak activation memory in a fresh process beside the planner's prediction.

    ``input_shape`` (``InputSpec`` forms) is fixed into the model and the reference first, and they are timed,
    compared and planned with it; without ``data``, a model with symbolic dimensions other than the batch needs it."""
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.measure.latency import measure_latency, measure_latency_interleaved
    from npukit.measure.size import model_size
    from npukit.measure.task_fidelity import check_samples

    config = BenchConfig(threads=threads, warmup=warmup, runs=runs, max_samples=max_samples)
    preprocess = preprocess or PreprocessConfig()
    if target != "cpu":
        from npukit.runtime.compile import soc_info

        soc_info(soc)  # an unknown SoC fails before any work
    spec = InputSpec.parse(input_shape)
    proto = load_with_inputs(model, spec, needs=None if data is not None else "timing on seeded random inputs")
    from npukit.runtime.compile import is_context_model

    if is_context_model(proto):  # a compiled HTP context binary runs only on the QNN EP
        return _bench_context(model, proto, data=data, reference=reference, warmup=warmup, runs=runs,
                              max_samples=max_samples, preprocess=preprocess, target=target, soc=soc,
                              report_path=report_path, html=html, task=task, gate=gate, spec=spec)
    ref_proto = load_with_inputs(reference, spec) if reference is not None else None
    report = Report("bench", config={"bench": to_dict(config), "preprocess": to_dict(preprocess),
                                     "model": str(model), "reference": str(reference) if reference else None,
                                     "data": str(data) if data else None,
                                     "input_shape": spec.as_dict() if spec else None})
    timed: dict[str, Any] = {"model": proto if spec else str(model)}  # with fixed shapes: the models as fixed
    if reference is not None:
        timed["reference"] = ref_proto if spec else str(reference)
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
            lat = measure_latency_interleaved(timed, threads=threads, warmup=warmup, runs=runs, feeds=feeds)
        else:
            lat = {"model": measure_latency(timed["model"], threads=threads, warmup=warmup, runs=runs, feeds=feeds)}
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

    choice = None
    if dataset is not None and ref_proto is not None:
        with step("task check against the reference", timings=report.timings, key="task_check"):
            total = len(dataset) if max_samples is None else min(max_samples, len(dataset))
            choice, _, _ = _task_check(report, ref_proto, proto, check_samples(dataset, total), task=task,
                                       gate=gate or QualityGate(), what="bench", threads=threads,
                                       where=f"{total} samples of {Path(str(data)).name}")
    else:
        report.set_verdict(f"MEASURED bench: {Path(str(model)).name}, no "
                           f"{'reference' if dataset is not None else 'data and reference'} given, so no task check",
                           passed=True)
    if dataset is not None and (choice is None or choice.name == "classify"):
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
        import tempfile

        from npukit.frontend.onnx_io import save_onnx

        with tempfile.TemporaryDirectory(prefix="npukit-bench-") as tmp:  # measured with the shapes fixed
            _bench_memory(report, model if spec is None else save_onnx(proto, Path(tmp) / "model.onnx"))
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=html, json_path=json_path, result=report.sections, source=model)


def _bench_context(model: str | Path, proto: onnx.ModelProto, *, data, reference, warmup: int, runs: int,
                   max_samples: int | None, preprocess: PreprocessConfig, target: str, soc: str, report_path,
                   html: bool, task: str | None, gate: QualityGate | None, spec) -> CommandResult:
    """``bench`` of a compiled EPContext model (``npukit compile``): it runs only on the QNN HTP backend, as the SoC
    it was compiled for. Latency on the HTP emulator (x86: not the device's latency), size, and with ``data`` and
    ``reference`` the task check of its HTP outputs against the reference on ORT CPU."""
    from npukit.frontend.shapes import load_with_inputs
    from npukit.measure.latency import LatencyResult, _timed_runs
    from npukit.measure.size import model_size
    from npukit.measure.task_fidelity import check_samples, session_runner
    from npukit.runtime.compile import context_session
    from npukit.runtime.ort import random_feeds
    from npukit.targets.registry import get_target

    if get_target(target).name != "qnn-htp":
        raise InputError(f"{Path(str(model)).name} is a compiled EPContext model: it runs only on the QNN HTP, not "
                         f"on {target}", hint="bench it with --target qnn-htp, or bench the QDQ model it was "
                                              "compiled from")
    report = Report("bench", config={"model": str(model), "reference": str(reference) if reference else None,
                                     "data": str(data) if data else None, "target": target, "soc": soc,
                                     "input_shape": spec.as_dict() if spec else None})
    with step("loading the context binary on the HTP", timings=report.timings, key="load"):
        ctx = context_session(model, proto, soc=soc)
    chip = ctx.soc
    report.add("htp_soc", {"soc": chip.part, "name": chip.name, "htp_arch": chip.htp_arch,
                           "soc_model": chip.soc_model, "epcontext": True})
    if ctx.note:
        report.add("htp_note", ctx.note)
    size = model_size(model)
    report.add("size", {"model": size.as_dict()})
    dataset = _open_data(data, proto, preprocess) if data is not None else None
    feeds = dataset.sample(0) if dataset is not None else random_feeds(ctx.session, seed=0)
    with step(f"timing on the HTP emulator ({chip.part})", timings=report.timings, key="latency"):
        for _ in range(warmup):
            ctx.session.run(None, feeds)
        latency = LatencyResult.from_times(_timed_runs(ctx.session, dict(feeds), runs), threads=1)
    report.add("latency", {"model": latency.as_dict()})
    report.add_table(f"Latency of the EPContext model on the HTP emulator ({chip.name}, {chip.part}; x86 "
                     f"emulation, not the device's latency; median of {runs} runs)",
                     ["file", "size_bytes", "median ms", "p90 ms"],
                     [[Path(str(model)).name, size.file_bytes, latency.median_ms, latency.p90_ms]])
    if dataset is not None and reference is not None:
        ref_proto = load_with_inputs(reference, spec)
        total = len(dataset) if max_samples is None else min(max_samples, len(dataset))
        with step("task check: the EPContext model on the HTP against the reference on ORT CPU",
                  timings=report.timings, key="task_check"):
            _task_check(report, ref_proto, None, check_samples(dataset, total), task=task, gate=gate or QualityGate(),
                        what="bench", where=f"{total} samples of {Path(str(data)).name}, on the HTP as {chip.part}",
                        candidate_runner=session_runner(ctx.session))
    else:
        report.set_verdict(f"MEASURED bench: {Path(str(model)).name} on the HTP emulator, no "
                           f"{'reference' if dataset is not None else 'data and reference'} given, so no task check",
                           passed=True)
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=html, json_path=json_path, result=report.sections)


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
                                         for d in i.type.tensor_type.shape.dim) for i in inputs},
                          dtypes={i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
                                  for i in inputs if i.type.tensor_type.elem_type})
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
