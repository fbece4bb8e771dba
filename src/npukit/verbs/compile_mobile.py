"""compile for the mobile runtimes: a PyTorch model -> an ExecuTorch .pte with the XNNPACK delegate
(``--target executorch-xnnpack``), a LiteRT .tflite run by LiteRT's XNNPACK delegate (``--target litert``) or a Core
ML .mlpackage (``--target coreml``), fp32 or INT8 from npukit's quantization plan, run on the runtime itself and
checked against eager torch; where the runtime cannot run on this machine (Core ML off macOS), the artifact is
reloaded and read instead (inputs, outputs, the plan's integer grids), and the verdict says it was not run."""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from npukit.config import PreprocessConfig
from npukit.data.readers import same_data
from npukit.data.subsets import spread
from npukit.errors import InputError, NumericCheckError
from npukit.frontend._messages import first_line
from npukit.frontend.spec import eval_mode
from npukit.quant.config import (ActivationEqualization, CalibrationSpec, FloatHead, Precision, QuantConfig, Recipe,
                                 Scheme)
from npukit.quant.precision.scored_head import FLOOR_MARGIN_DB, MOBILE_SHARE, held_to_floor
from npukit.report.compile import add_carried_plan, add_fp32_error, add_mobile_latency
from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish
from npukit.report.progress import step
from npukit.tasks import QualityGate
from npukit.verbs.common import (add_source, check_task, data_label, held_outputs, note_export_drift,
                                 note_shape_from_data, note_untrained, scratch_export, shape_origin, torch_source)

CHECK_SAMPLES = 32  # calibration samples the task check reads
# seeded random inputs an fp32 artifact is checked on without --calib: enough that the check is not a weak one
# (tasks.base.FEW_SAMPLES; on 4 its verdict said "give more data", which fp32 compile has no flag to take)
FP32_SAMPLES = 8
FP32_TOLERANCE = 1e-4  # fp32 artifact against eager torch: max abs error over the output's range
TIMED_RUNS = 30

# XNNPACK's quantized kernels (qs8): int8 asymmetric activations, int8 symmetric per-channel weights on their full
# range; none of ORT's x86 kernel workarounds (7-bit weights, float stem, conv kernel moves), which XNNPACK does not
# need. The calibration method ("auto") is chosen on the Q/DQ graph's own arithmetic (``score_on="reference"``: what
# XNNPACK computes with its 32-bit accumulators), never on ORT's integer kernels, which on x86 CPUs without VNNI
# saturate full-range weights: scored there, the plan for a phone depended on the CPU it was built on. The recipe:
# CLE + activation equalization + bias correction. Measured (AMD EPYC without VNNI; the QDQ model on the reference
# arithmetic against the float model, mean of each input's worst-output SQNR): MobileNetV2 (42 calibration crops of
# 7 photos, 208 evaluation crops of 13 others) 82.2% top-1 agreement / 18.3 dB, MTCNN PNet 24.9 dB, ONet 28.9 dB;
# the former recipe (CLE + bias correction, scored on ORT's kernels) 86.5% / 17.2 dB, 24.2 dB, 28.4 dB; the same
# scored on the reference arithmetic 78.8% / 16.3 dB, 24.9, 28.9; the recipe chosen per model (``Recipe.choose``)
# kept the plain one on both MTCNN nets (23.9, 27.4 dB). ExecuTorch's own XNNPACKQuantizer: 61.5% / 10.6 dB on
# MobileNetV2, 24.6 dB on PNet (benchmarks/results/mobile_runtimes.md).
# The float head: the stem and the convs right after it stay fp32 as far as that scores best within MOBILE_SHARE (10%)
# of the model's MACs (``quant.precision.scored_head``: a phone cannot be timed here, so the cost is counted in MACs,
# which XNNPACK's fp32 kernels take on). MobileNetV2's .pte (208 crops): quantized whole 85.6% / 18.2 dB, 14.4 ms;
# the stem and the next two convs in fp32 (6.9% of the MACs) 88.0% / 20.1 dB, 13.0 ms (this AVX2 host, 1 thread,
# where XNNPACK's int8 stem is slower than its fp32 one; on a phone's int8 dot-product kernels the head costs time).
XNNPACK_INT8 = QuantConfig(scheme=Scheme(activation_dtype="int8"), calibration=CalibrationSpec(method="auto"),
                           recipe=Recipe(cle=True, activation_equalization=ActivationEqualization(),
                                         bias_correction=True, score_on="reference", fold_affines=False),
                           precision=Precision(float_head=FloatHead("accuracy", MOBILE_SHARE)))
@dataclasses.dataclass(frozen=True)
class MobileTarget:
    """A mobile runtime npukit compiles PyTorch models for; ``runtime`` names its module in ``npukit.runtime``, which
    provides ``require()``, ``cannot_run()`` (why this machine cannot run its artifacts, or None),
    ``lower(program, example, names=) -> Lowered`` (``.write(path)``, ``.summary()``, ``.table()``), ``Runner(path,
    threads=)``, ``CARRY``: how npukit's plan is carried for its converter (``CarryOptions``), and
    ``unhonoured_floats(lowered, qdq)``: why the artifact does not keep the plan's float layers float, or None. A
    runtime that may not run here also provides ``package_interface(path)`` and ``package_grids(lowered)``, what
    ``_inspect`` reads."""

    name: str
    suffix: str
    artifact: str  # what the report calls the compiled file
    runtime: str
    lowering: str  # what the lowering step does, for the progress line
    package: bool = False  # the artifact is a directory (a Core ML package), not a file

    def module(self) -> Any:
        return importlib.import_module(f"npukit.runtime.{self.runtime}")


MOBILE_TARGETS = {
    "executorch-xnnpack": MobileTarget("executorch-xnnpack", ".pte", "ExecuTorch .pte", "executorch",
                                       "lowering to ExecuTorch with the XNNPACK delegate"),
    "litert": MobileTarget("litert", ".tflite", "LiteRT .tflite", "litert",
                           "converting to LiteRT (.tflite; XNNPACK delegate at load)"),
    "coreml": MobileTarget("coreml", ".mlpackage", "Core ML .mlpackage", "coreml",
                           "converting to Core ML (ML Program, float32 compute)", package=True),
}
ACCEPT = "accept-degraded passes it as it is (exit 0, DEGRADED)"
INT8_HINT = f"compile without --calib for fp32; --{ACCEPT}"  # an INT8 check that failed
PREDICTED_BY = {"litert-xnnpack": "litert"}  # an analysis profile of what a mobile target above builds and runs


def built_by(profile: str) -> str | None:
    """The mobile compile target whose artifact the analysis profile ``profile`` predicts, or None."""
    return profile if profile in MOBILE_TARGETS else PREDICTED_BY.get(profile)


def compile_mobile(model: str | Path, output: str | Path, *, target: str, calib: str | Path | None = None,
                   input_shape: str | Sequence[int] | None = None, preprocess: PreprocessConfig | None = None,
                   html: bool = False, task: str | None = None, gate: QualityGate | None = None,
                   threads: int = 1, weights: str | Path | None = None,
                   data: str | Path | None = None) -> CommandResult:
    """``model`` (a PyTorch model: torchvision:NAME, module:factory, .pt2, TorchScript, a pickled module) exported
    with ``torch.export`` and lowered for ``target`` (a key of ``MOBILE_TARGETS``): fp32 without ``calib``; with it,
    INT8 on npukit's quantization plan (``XNNPACK_INT8``, made on the ONNX export of the same model and carried onto
    the torch program by ``npukit.quant.emit.pt2e``). The artifact is loaded in the runtime and checked against
    eager torch: fp32 within ``FP32_TOLERANCE`` of the output range, INT8 with the model's task under ``gate``, on
    the held-out samples of ``data`` where given (else on the calibration samples: optimistic, or for fp32 on seeded
    random inputs); latency beside eager torch and ORT, 1 thread, interleaved."""
    from npukit.frontend.onnx_io import graph_inputs
    from npukit.frontend.spec import model_label
    from npukit.runtime.tensors import plain_tensor

    mobile = MOBILE_TARGETS[target]
    runtime = mobile.module()
    runtime.require()
    output = _artifact_path(mobile, output)
    source, shape = torch_source(model, weights, input_shape, needs=f"--target {mobile.name} converts PyTorch "
                                 "programs", otherwise="compile the ONNX model with --target qnn-htp", data=calib,
                                 from_onnx=True)
    int8 = calib is not None
    gate = gate or QualityGate()
    report = Report("compile", config={"model": model_label(model), "target": mobile.name,
                                       "precision": "int8" if int8 else "fp32",
                                       "calib": data_label(calib), "data": data_label(data),
                                       "input_shape": list(shape),
                                       "input_shape_from": shape_origin(source, input_shape, calib),
                                       "quant": None, "threads": threads})
    add_source(report, source)
    module = eval_mode(source.module)
    float_onnx = _export_onnx(report, source, shape, int8=int8)
    samples = _samples(calib, float_onnx, preprocess, shape, held_out=data is not None and not same_data(data, calib))
    checked = _checked(samples, calib, data, float_onnx, preprocess, int8=int8)
    check_task(float_onnx, samples, task)
    held = held_outputs(float_onnx, samples, task) if int8 else ()
    config = held_to_floor(XNNPACK_INT8, gate.min_sqnr_db, held) if int8 else None
    report.config["quant"] = config.as_dict() if config else None
    example = tuple(plain_tensor(v) for v in samples[0].values())
    exportable = _exportable(module, example)
    program, carried, qdq = (_quantize(report, exportable, float_onnx, samples, example, runtime, config)
                             if config else (exportable, None, None))
    names = ([i.name for i in graph_inputs(float_onnx)], [o.name for o in float_onnx.graph.output])
    lowered = _lower(report, mobile, runtime, program, example, output, names=names)
    eager = _torch_runner(module)
    absent = runtime.cannot_run()
    if absent:
        _inspect(report, mobile, runtime, lowered, output, eager, samples[0], qdq=qdq, carried=carried,
                 reason=absent)
        if qdq is not None and report.passed:
            _check_plan(report, mobile, eager, qdq, float_onnx, checked, task=task, gate=gate)
    else:
        runner = _load(mobile, runtime, output, threads=threads, int8=int8)
        why = runtime.unhonoured_floats(lowered, qdq) if qdq is not None else None
        _check(report, mobile, eager, runner, float_onnx, checked, int8=int8, task=task,
               gate=gate, failures=[why] if why else [])
        _time(report, mobile, eager, runner, float_onnx, samples[0], threads=threads,
              twin=(runtime, exportable, example, names) if int8 else None)
    if qdq is not None:
        _note_float_share(report, qdq)
        _note_stretched_head(report)
    report.add("carried_plan", carried.summary() if carried is not None else None)
    note_untrained(report, source)
    note_shape_from_data(report, report.config["input_shape_from"], shape)
    return finish(report, output, html=html, result=lowered)  # the runtime's Lowered: bytes, ops, delegation


def _artifact_path(mobile: MobileTarget, output: str | Path) -> Path:
    """``output`` where it names what ``mobile`` writes (a file or a package, with its suffix); refused otherwise."""
    output = Path(output)
    if output.suffix.lower() != mobile.suffix or (output.is_dir() and not mobile.package) \
            or (output.is_file() and mobile.package):
        kind = "a package (a directory)" if mobile.package else "a file"
        raise InputError(f"output {output} must be {kind} ending in {mobile.suffix} for --target {mobile.name}",
                         hint=f"name the output like model{mobile.suffix}")
    return output


def _note_float_share(report: Report, qdq: onnx.ModelProto) -> None:
    """The share of the plan's convolutions and matrix products in int8, in the report and, below all, the verdict
    (a ShuffleNet's channel-shuffle joins kept 79% of its layers float and the INT8 .tflite PASSed as if INT8)."""
    from npukit.search.mobile import float_share_note, quantized_compute

    fraction = quantized_compute(qdq)
    report.add("integer_fraction", fraction)
    if report.verdict and (note := float_share_note(fraction)):
        report.set_verdict(report.verdict + note, passed=report.passed)


def _note_stretched_head(report: Report) -> None:
    """The verdict's note where the float head went past ``MOBILE_SHARE`` of the MACs to reach the SQNR floor."""
    scored = report.sections.get("float_head_stretched")
    if scored and report.verdict:
        report.set_verdict(f"{report.verdict}; note: the float head ({scored['nodes']}) takes {scored['share']:.0%} "
                           f"of the MACs in fp32, past the {MOBILE_SHARE:.0%} planned, to hold "
                           f"{scored['outputs']} to {scored['floor_db']:g} dB on the plan's arithmetic (the check's "
                           f"floor and a {FLOOR_MARGIN_DB:g} dB margin for the runtime's own)", passed=report.passed)


def _exportable(module: Any, example: tuple[Any, ...]) -> Any:
    """``module`` as torch.export takes it: a TorchScript module (which torch.export refuses) converted to the
    module of an ExportedProgram by torch's TorchScript converter, checked against the TorchScript module."""
    import torch

    if not isinstance(module, torch.jit.ScriptModule):
        return module
    from torch._export.converter import TS2EPConverter

    from npukit.frontend.verify import flatten_outputs

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted = _as_conv2d(TS2EPConverter(module, example).convert().module())
        with torch.no_grad():
            same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in
                       zip(flatten_outputs(module(*example)), flatten_outputs(converted(*example)), strict=True))
    except Exception as exc:  # noqa: BLE001 - any failure of the converter is the model's, said in one line
        raise InputError(f"torch cannot convert this TorchScript model into a torch.export program: "
                         f"{first_line(exc)}", hint="give the model as a module:factory or a .pt2 "
                         "(torch.export.save), or compile its ONNX export with --target qnn-htp") from exc
    if not same:
        raise InputError("torch's TorchScript converter changed this model's outputs",
                         hint="give the model as a module:factory or a .pt2 (torch.export.save)")
    return converted


def _as_conv2d(module: Any) -> Any:
    """``module`` (the converter's) as torch.export writes a module: its generic ``aten.convolution`` of a 2-D, not
    transposed conv as ``aten.conv2d`` (the same op; the one the runtimes' quantizers annotate), and the weights and
    biases of its convs, linears and BatchNorms as parameters, not buffers (PT2E folds BatchNorm into parameters)."""
    import torch

    aten = torch.ops.aten
    weighted = {aten.conv2d.default, aten.linear.default, aten.batch_norm.default}
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is aten.convolution.default:
            x, weight, bias, stride, padding, dilation, transposed, _, groups = node.args
            if not transposed and len(stride) == 2:
                node.target = aten.conv2d.default
                node.args = (x, weight, bias, stride, padding, dilation, groups)
        if node.target in weighted:
            for arg in node.args[1:3]:
                if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                    _as_parameter(module, arg.target)
    module.recompile()
    return module


def _as_parameter(module: Any, target: str) -> None:
    import torch

    *path, name = target.split(".")
    owner = module.get_submodule(".".join(path))
    if name in owner._buffers:
        value = owner._buffers.pop(name)
        owner.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))


def _export_onnx(report: Report, source: Any, shape: tuple[int, ...], *, int8: bool) -> onnx.ModelProto:
    """The ONNX export of the model (checked against torch; a drift is noted, not refused: the artifact is built from
    the torch program and checked against eager torch): what npukit's quantization plans on and what ORT times as the
    float baseline."""
    proto, result = scratch_export(source, shape, what="the model npukit's plan is made on" if int8 else
                                   "ORT's float baseline", timings=report.timings)
    report.add("export", {k: v for k, v in result.as_dict().items() if k != "path"})  # a scratch file, gone
    use = "npukit's INT8 plan was made on it" if int8 else "only ORT's fp32 latency row runs it"
    note_export_drift(report, result, consequence=f"{use}; the artifact, built from the torch program, was checked "
                                                  "against eager torch")
    return proto


def _samples(calib: str | Path | None, float_onnx: onnx.ModelProto, preprocess: PreprocessConfig | None,
             shape: tuple[int, ...], *, held_out: bool) -> list[dict[str, np.ndarray]]:
    from npukit.frontend.onnx_io import graph_inputs
    from npukit.frontend.verify import seeded_samples
    from npukit.measure.task_fidelity import check_samples, feeds_and_labels
    from npukit.verbs.common import data_name, open_data, refuse_tiny_self_check, refuse_uniform_samples

    name = graph_inputs(float_onnx)[0].name
    if calib is None:
        return [{name: x} for x in seeded_samples(shape, samples=FP32_SAMPLES, seed=0)]
    data = open_data(calib, float_onnx, preprocess or PreprocessConfig())
    if not held_out:  # the INT8 check reads the samples the grids were fitted to
        refuse_tiny_self_check(len(data), held_out="--data")
    refuse_uniform_samples(data, data_name(calib))
    return [dict(feeds) for feeds, _ in feeds_and_labels(check_samples(data, len(data)))]


@dataclasses.dataclass(frozen=True)
class _Checked:
    """The samples the artifact is checked on, where they come from, and whether the verdict is optimistic (INT8
    judged on the samples its grids were fitted to)."""

    samples: list[dict[str, np.ndarray]]
    where: str
    optimistic: bool
    real: bool  # real inputs (not seeded random ones)


def _checked(samples: list[dict[str, np.ndarray]], calib: str | Path | None, data: str | Path | None,
             float_onnx: onnx.ModelProto, preprocess: PreprocessConfig | None, *, int8: bool) -> _Checked:
    """The held-out samples of ``data`` (all of them) where given, else ``CHECK_SAMPLES`` of ``samples``."""
    from npukit.measure.task_fidelity import check_samples, feeds_and_labels
    from npukit.verbs.common import data_name, open_data, refuse_uniform_samples

    if data is None or same_data(data, calib):
        check = spread(samples, CHECK_SAMPLES)
        if not int8:
            return _Checked(check, f"{len(check)} seeded random inputs (pass --data or --calib for real inputs)",
                            optimistic=False, real=False)
        again = " (--data is --calib)" if data is not None else ""
        return _Checked(check, f"{len(check)} calibration samples{again} (optimistic: the grids were fitted to "
                               "them; pass held-out --data)", optimistic=True, real=True)
    held = open_data(data, float_onnx, preprocess or PreprocessConfig())
    refuse_uniform_samples(held, data_name(data), "check")
    feeds = [dict(f) for f, _ in feeds_and_labels(check_samples(held, len(held)))]
    return _Checked(feeds, f"{len(feeds)} held-out samples of {data_name(data)}", optimistic=False, real=True)


def _quantize(report: Report, module: Any, float_onnx: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
              example: tuple[Any, ...], runtime: Any, config: QuantConfig) -> tuple[Any, Any, onnx.ModelProto]:
    from npukit.quant.emit.pt2e import carry_plan
    from npukit.quant.qdq import quantize
    from npukit.report.quantize import add_steps

    with step("quantizing: npukit's plan for XNNPACK (int8 activations, int8 per-channel weights)",
              timings=report.timings, key="quantize"):
        result = quantize(float_onnx, samples, config=config)
    add_steps(report, result.steps)
    scored = result.steps.float_head_scored or {}
    stretched = [h for h in scored.get("heads", []) if h.get("stretched_to_floor")]
    if stretched:
        report.add("float_head_stretched", {
            "nodes": ", ".join(n for h in stretched for n in h["nodes"]), "floor_db": scored["floor_db"],
            "outputs": ", ".join(repr(n) for n in scored["floor_outputs"]),
            "share": sum(h["mac_share"][str(len(h["nodes"]))] for h in scored["heads"] if h["mac_share"])})
    with step("carrying the plan onto the torch program (PT2E, fixed grids)", timings=report.timings, key="carry"):
        carried = carry_plan(module, example, float_model=float_onnx, qdq=result.model, plan=result.plan,
                             options=runtime.CARRY)
    if carried.unmatched:
        raise InputError(f"npukit cannot yet carry its INT8 plan onto {len(carried.unmatched)} tensor(s) of this "
                         f"model's torch program: an npukit limitation, not a fault of the "
                         f"model (not matched to the ONNX export the plan was made on: "
                         f"{', '.join(carried.unmatched[:5])})",
                         hint="compile without --calib for an fp32 artifact, or quantize the ONNX export with "
                              "`npukit quantize`")
    add_carried_plan(report, carried)
    return carried.program, carried, result.model


def _lower(report: Report, mobile: MobileTarget, runtime: Any, program: Any, example: tuple[Any, ...],
           output: Path, *, names: tuple[list[str], list[str]]) -> Any:
    with step(mobile.lowering, timings=report.timings, key="lower"):
        lowered = runtime.lower(program, example, names=names)
    lowered.write(output)
    report.add("lowered", lowered.summary())
    report.add_table(*lowered.table())
    return lowered


def _load(mobile: MobileTarget, runtime: Any, output: Path, *, threads: int, int8: bool) -> Any:
    """The artifact loaded in its runtime; one the runtime refuses fails the compile (exit 1, the artifact removed)
    with its reason, not as an internal error (a U-Net's .pte that XNNPACK refused at load: 'Failed to load method
    forward')."""
    try:
        return runtime.Runner(output, threads=threads)
    except (RuntimeError, ValueError) as exc:
        raise NumericCheckError(f"the {mobile.artifact} npukit built does not load in its runtime ({first_line(exc)}):"
                                " an npukit bug, please report it",
                                hint="try the other mobile target" + (", or compile without --calib for fp32"
                                                                      if int8 else ", or npukit export for ORT")
                                ) from exc


def _inspect(report: Report, mobile: MobileTarget, runtime: Any, lowered: Any, output: Path, eager: Any,
             feeds: dict[str, np.ndarray], *, qdq: onnx.ModelProto | None, carried: Any, reason: str) -> None:
    """Where the runtime cannot run here: the artifact reloaded from disk, its inputs and outputs against the torch
    program's, and for INT8 its integer grids against npukit's plan (every weight's integers and scales the plan's,
    every activation grid one of the plan's or one derived for a tensor only the torch program has); a mismatch
    fails the compile. The verdict says the artifact was not run."""
    from npukit.quant.grids import qdq_grids, same_weight, unplanned_grids
    from npukit.report.compile import add_package_check

    interface = runtime.package_interface(output)
    want = {"inputs": [list(v.shape) for v in feeds.values()], "outputs": [list(o.shape) for o in eager(feeds)]}
    failures = [f"its {side} have shapes {list(interface[side].values())}, the torch program's {want[side]}"
                for side in ("inputs", "outputs") if list(interface[side].values()) != want[side]]
    check: dict[str, Any] = {"reloaded": True, "interface": interface, "not_run": reason}
    if qdq is not None:
        planned_grids, planned_weights = qdq_grids(qdq)
        grids, weights = runtime.package_grids(lowered)
        foreign = unplanned_grids(grids, planned_grids)
        strange = sum(not same_weight(ints, scales, planned_weights) for ints, scales in weights)
        check |= {"weights": len(weights), "weights_not_the_plans": strange, "activation_grids": len(grids),
                  "activation_grids_not_the_plans": len(foreign), "derived_allowed": len(carried.derived)}
        if strange:
            failures.append(f"{strange} of its {len(weights)} int8 weights are none of the plan's (integers or "
                            "scales)")
        elif len(weights) != carried.weights:  # not every int8 weight of the plan: a GroupNorm's affine, int8 on
            # its Mul / Add in the ONNX model, stays float in the torch program, which carries conv / linear weights
            failures.append(f"it holds {len(weights)} int8 weights where {carried.weights} were carried from the "
                            "plan onto the torch program")
        if len(foreign) > len(carried.derived):
            failures.append(f"{len(foreign)} activation grids are not the plan's (e.g. scale {foreign[0][0]:g}, "
                            f"zero point {foreign[0][1]})")
    add_package_check(report, check, artifact=mobile.artifact)
    what = f"{mobile.artifact} ({'int8 grids as planned, ' if qdq is not None else ''}written and reloaded)"
    if failures:
        report.set_verdict(f"FAIL compile: {mobile.artifact}: {failures[0]}", passed=False)
    else:
        report.set_verdict(f"EXPORTED compile: {what}; not run: {reason}, so no numerical check here", passed=True)


def _check_plan(report: Report, mobile: MobileTarget, eager: Any, qdq: onnx.ModelProto, float_onnx: onnx.ModelProto,
                checked: _Checked, *, task: str | None, gate: QualityGate) -> None:
    """Where the runtime cannot run here, the INT8 plan the artifact carries is checked on the plan's own arithmetic
    instead (its QDQ model on ORT's CPU, against eager torch, with the model's task and the same floors): an
    artifact whose plan npukit itself measured below a floor is not passed because its runtime is elsewhere (a PNet
    .mlpackage exported with a plan at 19.3 dB under the 20 dB floor that the .tflite of the same plan FAILed)."""
    from npukit.measure.task_fidelity import session_runner
    from npukit.runtime.ort import make_session
    from npukit.verbs.common import task_check

    exported = report.verdict or ""
    check = checked.samples
    where = f"{checked.where}, on the plan's QDQ model on ORT's CPU: the {mobile.artifact} itself was not run"
    with step("task check: the INT8 plan's QDQ model on ORT CPU against eager torch", timings=report.timings,
              key="task_check"):
        _, _, verdict = task_check(report, float_onnx, None, check, task=task, gate=gate, what="compile",
                                   where=where, reference_runner=eager,
                                   candidate_runner=session_runner(make_session(qdq)),
                                   hint=INT8_HINT)
    if verdict.passed and not verdict.degraded:
        body = verdict.line.split(": ", 1)[1] if ": " in verdict.line else verdict.line
        report.set_verdict(f"{exported}; its INT8 plan checked on ORT's CPU instead: {body}", passed=True)
    else:
        report.set_verdict(f"{verdict.line} (the INT8 plan the {mobile.artifact} carries, on ORT's CPU; the "
                           f"{mobile.artifact} itself was written, not run)", passed=verdict.passed)


def _torch_runner(module: Any) -> Any:
    import torch

    from npukit.frontend.verify import flatten_outputs
    from npukit.runtime.tensors import plain_tensor

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            return [o.numpy() for o in flatten_outputs(module(*[plain_tensor(v) for v in feeds.values()]))]
    return run


def _check(report: Report, mobile: MobileTarget, eager: Any, runner: Any, float_onnx: onnx.ModelProto,
           checked: _Checked, *, int8: bool, task: str | None, gate: QualityGate, failures: list[str]) -> None:
    """The artifact against eager torch with the model's task (fp32 also within ``FP32_TOLERANCE``) on ``checked``;
    ``failures``: what failed before it ran (the artifact is not the plan)."""
    from npukit.verbs.common import task_check

    check = checked.samples
    failures = list(failures)
    unstable = False
    if not int8:
        failure, unstable = _fp32_check(report, mobile, eager, runner, float_onnx, check)
        failures += [failure] if failure else []
    imposed = ""
    if not checked.real and task is None:  # a task metric on seeded random inputs measures nothing (a detector
        # finds no box there, and its undefined mAP failed an fp32 artifact equal to eager torch): every output judged
        task, imposed = "generic", "every output judged: a task metric on seeded random inputs measures nothing"
    with step(f"task check: the {mobile.artifact} on its runtime against eager torch", timings=report.timings,
              key="task_check"):
        task_check(report, float_onnx, None, check, task=task, gate=gate, what="compile", where=checked.where,
                   reference_runner=eager, candidate_runner=runner, extra_failures=failures, imposed=imposed,
                   hint=_check_hint(int8=int8, unstable=unstable, real=checked.real))
    if checked.optimistic:  # the verdict's figures are the calibration samples'
        report.set_verdict(f"{report.verdict} (checked on the calibration samples: optimistic, the grids were fitted "
                           "to them; pass held-out --data)", passed=report.passed)


def _check_hint(*, int8: bool, unstable: bool, real: bool) -> str:
    """What to try when the check fails: INT8, fp32 whose reference is unstable on the inputs (ONNX Runtime as far
    off eager torch: real inputs, --data, where they were seeded random ones; a U-Net's fp32 .tflite was sent to
    --calib), or fp32 this runtime computes differently."""
    if int8:
        return INT8_HINT
    if unstable:
        return (f"--{ACCEPT}" if real else "check it on real inputs with --data (the model's outputs on seeded random "
                                          "inputs are unstable: ONNX Runtime's differ as much)")
    return f"the other mobile target (this runtime computes the model differently from eager torch), or npukit " \
           f"export for ORT; --{ACCEPT}"


def _fp32_check(report: Report, mobile: MobileTarget, eager: Any, runner: Any, float_onnx: onnx.ModelProto,
                check: Sequence[dict[str, np.ndarray]]) -> tuple[str | None, bool]:
    """(why the fp32 artifact fails against eager torch, or None; whether the inputs make the model's float outputs
    unstable). Past ``FP32_TOLERANCE``, ORT's run of the float model on the same inputs is the control: where it is
    as far from eager torch, the seeded inputs drive the model where float32's rounding decides its outputs (a deep
    U-Net on random inputs: ORT 0.97 of the output range off eager torch on one, the .tflite 1.0; on a real tile
    2e-3), and the verdict says so rather than blame the runtime."""
    from npukit.runtime.ort import make_session

    def worst(candidate: Any) -> float:
        error = 0.0
        for feeds in check:
            for ref, got in zip(eager(feeds), candidate(feeds)):
                span = float(ref.max() - ref.min()) or 1.0
                error = max(error, float(np.abs(ref - np.asarray(got)).max()) / span)
        return error

    error = worst(runner)
    control = None
    if error > FP32_TOLERANCE:
        session = make_session(float_onnx)
        control = worst(lambda feeds: session.run(None, dict(feeds)))
    add_fp32_error(report, artifact=mobile.artifact, worst=error, tolerance=FP32_TOLERANCE, control=control)
    if error <= FP32_TOLERANCE:
        return None, False
    failure = (f"fp32 {mobile.artifact} differs from eager torch by {error:.2e} of the output range "
               f"(> {FP32_TOLERANCE:g})")
    if control is not None and control > FP32_TOLERANCE:
        return (f"{failure}; ONNX Runtime differs from eager torch by {control:.2e} on the same seeded random inputs: "
                "on them the model's float outputs are unstable, so this check cannot judge the runtime", True)
    return failure, False


def _time(report: Report, mobile: MobileTarget, eager: Any, runner: Any, float_onnx: onnx.ModelProto,
          feeds: dict[str, np.ndarray], *, threads: int, twin: tuple[Any, ...] | None) -> None:
    """The artifact beside eager torch, ORT float and, for INT8 (``twin``: the runtime, the float program, its
    example and names), the fp32 artifact of the same model on the same runtime, lowered into a scratch folder:
    an INT8 .tflite of LR-ASPP ran at 0.8x its fp32 .tflite's speed (LiteRT's int8 HARD_SWISH outside XNNPACK) and
    the report, timing eager torch and ORT only, could not show it."""
    import tempfile

    from npukit._threads import torch_threads
    from npukit.measure.latency import time_calls_interleaved
    from npukit.runtime.ort import make_session

    session = make_session(float_onnx, threads=threads)
    fp32 = f"{mobile.artifact} fp32" if twin is not None else None
    with tempfile.TemporaryDirectory(prefix="npukit-fp32-") as folder:
        calls = {mobile.artifact: lambda: runner(feeds)}
        twin_runner = _fp32_twin(report, mobile, twin, Path(folder), threads=threads) if twin else None
        if twin_runner is not None:
            calls[fp32] = lambda: twin_runner(feeds)
        calls |= {"eager torch fp32": lambda: eager(feeds), "ORT CPU fp32": lambda: session.run(None, feeds)}
        with torch_threads(threads), step(f"timing the {', '.join(calls)}, {threads} thread(s)",
                                          timings=report.timings, key="latency"):
            latency = time_calls_interleaved(calls, threads=threads, warmup=3, runs=TIMED_RUNS, rounds=3)
    add_mobile_latency(report, latency, artifact=mobile.artifact, threads=threads, runs=TIMED_RUNS, fp32=fp32)


def _fp32_twin(report: Report, mobile: MobileTarget, twin: tuple[Any, ...], folder: Path, *, threads: int) -> Any:
    """The fp32 artifact (``twin``: runtime, float program, example, names) written in ``folder`` and loaded; one
    that does not lower or load is said in the report (``fp32_twin``) and left out of the table, not a failure: the
    artifact checked is the INT8 one."""
    runtime, program, example, names = twin
    try:
        with step(f"lowering the fp32 {mobile.artifact} too, for the latency table", timings=report.timings,
                  key="lower_fp32"):
            lowered = runtime.lower(program, example, names=names)
        path = folder / f"fp32{mobile.suffix}"
        lowered.write(path)
        return runtime.Runner(path, threads=threads)
    except Exception as exc:  # noqa: BLE001 - a row of the latency table, not the artifact: said, not raised
        report.add("fp32_twin", {"error": f"{type(exc).__name__}: {first_line(exc)}"})
        return None
