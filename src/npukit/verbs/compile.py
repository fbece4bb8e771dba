"""The compile verb: QDQ for the Qualcomm HTP, an EPContext model for one Snapdragon SoC, run back and checked."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from npukit.config import PreprocessConfig
from npukit.errors import InputError
from npukit.report.compile import add_context_model, add_float_layers, add_htp_quantization
from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish
from npukit.report.progress import step
from npukit.tasks import QualityGate
from npukit.verbs.common import (check_output, check_task, data_label, data_name, floor_check, held_back, is_qdq,
                                 keeps_module_modes, open_data, refuse_quantized, refuse_tiny_self_check,
                                 refuse_uniform_samples, samples_read, seeded_feeds, task_check, upgrade_opset)


COMPILE_CHECK_SAMPLES = 8  # the HTP emulator takes about 0.6 s per MobileNetV2 image on x86


def quantize_for_htp(model: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """QDQ as the HTP needs it (npukit.runtime.qnn.HTP_QDQ_RULES: int8 symmetric per-channel weights, uint16
    activations; the weights' rounding compensated, the 16-bit grids given headroom, BatchNorms the HTP mishandles
    rewritten), with ONNX Runtime's quantizer doing the mechanics (npukit.runtime.htp_quant.quantize_for_htp)."""
    from npukit.runtime.htp_quant import quantize_for_htp as _quantize_for_htp

    return _quantize_for_htp(model, samples).model


@keeps_module_modes
def compile(  # noqa: A001 - the verb's name
    model: str | Path,
    output: str | Path,
    *,
    soc: str | None = None,
    target: str = "qnn-htp",
    calib: str | Path | None = None,
    input_shape: str | Sequence[int] | None = None,
    preprocess: PreprocessConfig | None = None,
    html: bool = False,
    task: str | None = None,
    gate: QualityGate | None = None,
    weights: str | Path | None = None,
    mixed_precision: bool = False,
    weight_bits: int = 8,
    data: str | Path | None = None,
) -> CommandResult:
    """Static shapes, QDQ as the HTP needs (unless the model already is QDQ), then an EPContext model with the HTP
    context binary for ``soc`` embedded; loaded back and run to prove it works, then checked with the model's task
    (``task``; None: detected) on the HTP against the float model on ORT CPU, on up to ``COMPILE_CHECK_SAMPLES``
    calibration samples, under ``gate``'s floors. ``mixed_precision``: start from int8 activations instead of
    uint16 and lift layers to 16-bit activations or float16 until the floors pass on the HTP
    (``npukit.runtime.htp_precision``). ``weight_bits`` 4: W4A16, int4 symmetric per-channel weights (re-rounded by
    GPTQ and bias-corrected as the int8 ones) with uint16 activations: half the weights' bytes. ``data``: held-out
    samples the task check reads instead of the calibration samples (up to ``COMPILE_CHECK_SAMPLES``)."""
    from npukit.frontend.shapes import fixed_shapes
    from npukit.verbs.compile_mobile import MOBILE_TARGETS, compile_mobile

    if weight_bits not in (8, 4):
        raise InputError(f"--weight-bits {weight_bits}: the HTP path takes 8 or 4", hint="use --weight-bits 4 (W4A16)")
    if target.strip().lower() in MOBILE_TARGETS:
        _refuse_htp_options(target, weight_bits=weight_bits, mixed_precision=mixed_precision, soc=soc)
        return compile_mobile(model, output, target=target.strip().lower(), calib=calib, input_shape=input_shape,
                              preprocess=preprocess, html=html, task=task, gate=gate, weights=weights, data=data)
    target, soc = _htp_target(model, target, soc=soc, weights=weights)
    gate = gate or QualityGate()
    output = check_output(output, source=model)
    proto = _load(model, input_shape, calib if calib is not None else data)
    report = Report("compile", config={"model": str(model), "target": target, "soc": soc,
                                       "calib": data_label(calib), "data": data_label(data),
                                       "weight_bits": weight_bits,
                                       "input_shape": {k: list(v) for k, v in fixed_shapes(proto).items()}})
    quantized_here, samples, held = _check_request(model, proto, calib, data, preprocess, soc=soc, task=task,
                                                   weight_bits=weight_bits, mixed_precision=mixed_precision)
    reference = proto  # the float model (or the QDQ model given) on ORT CPU: what the HTP's outputs are checked against
    proto = _prepare(report, proto, samples)
    if quantized_here:
        proto = _quantize_for_the_htp(report, proto, samples, soc=soc, weight_bits=weight_bits,
                                      mixed_precision=mixed_precision, task=task, gate=gate)
    result = _compile_context(report, proto, output, soc=soc)
    _check_on_the_htp(report, output, reference, samples, held, soc=soc, float_model=quantized_here, task=task,
                      gate=gate)
    add_context_model(report, result, quantized_here=quantized_here)
    if not quantized_here:
        _note_float_layers(report, reference)
    _energy(report, proto, reference if quantized_here else None,
            feeds=dict(samples.sample(0)) if samples is not None else None)
    return finish(report, output, html=html, result=result)


def _htp_target(model: Any, target: str, *, soc: str | None, weights: Any) -> tuple[str, str]:
    """The HTP target's name and its SoC, from ``--target`` (``qnn-htp@SOC`` names the SoC as ``--soc`` does) and
    ``--soc``, after the refusals of what the HTP does not compile: a PyTorch model, --weights, another target, no
    SoC named."""
    from npukit.targets.registry import get_target
    from npukit.verbs.compile_mobile import built_by

    if not isinstance(model, (str, Path)):
        raise InputError(f"the HTP compiles an ONNX model, not a {type(model).__name__}",
                         hint="export it first: npukit.export(module, 'model.onnx', input_shape=...)")
    if weights is not None:
        raise InputError("--weights is for a PyTorch MODEL (--target executorch-xnnpack, litert or coreml)",
                         hint="give the HTP an .onnx model with its weights in it")
    kind, _, variant = target.strip().partition("@")
    if kind.lower() == "qnn-htp" and variant:  # --target qnn-htp@SOC names the SoC as --soc does
        if soc is not None and soc.upper() != variant.upper():
            raise InputError(f"--target {target} and --soc {soc} name two SoCs", hint="give one of them")
        target, soc = kind, soc or variant
    profile = get_target(target)
    built = built_by(profile.name)
    if built is not None:  # an analysis profile of what a mobile target builds and runs (litert-xnnpack: litert's)
        raise InputError(f"{profile.name} is the analysis profile of what `--target {built}` builds and runs",
                         hint=f"use --target {built} (analyze --target {profile.name} predicts its delegation)")
    if profile.name != "qnn-htp":
        raise InputError(f"compiling for {profile.name} is not supported yet",
                         hint="use --target qnn-htp, executorch-xnnpack, litert or coreml; other targets: export "
                              "the QDQ model from `npukit quantize`")
    if soc is None:
        raise InputError("compiling for the HTP needs the Snapdragon SoC", hint="pass --soc, e.g. --soc SM8650")
    return profile.name, soc


def _load(model: str | Path, input_shape: str | Sequence[int] | None, data: Any) -> onnx.ModelProto:
    """``model`` loaded with ``input_shape`` fixed in (without one, the sizes it leaves open as one sample of
    ``data`` has them), as the HTP needs static shapes; a symbolic batch alone becomes 1."""
    from npukit.frontend.shapes import (InputSpec, apply_input_spec, fixed_shapes, load_with_inputs, require_static,
                                        symbolic_inputs)
    from npukit.verbs.common import refuse_unfitting_data, shapes_from_data

    spec = InputSpec.parse(input_shape)
    proto = load_with_inputs(model, spec)
    if spec is None:
        proto, spec = shapes_from_data(proto, data)
        refuse_unfitting_data(proto, data)
    require_static(proto, needs="the HTP")
    if symbolic_inputs(proto, allow_batch=False):  # a symbolic batch alone becomes 1
        proto = apply_input_spec(proto, InputSpec(tuple(fixed_shapes(proto).items())))
    return proto


def _check_request(model: str | Path, proto: onnx.ModelProto, calib: str | Path | None, data: str | Path | None,
                   preprocess: PreprocessConfig | None, *, soc: str, task: str | None, weight_bits: int,
                   mixed_precision: bool) -> tuple[bool, Any, tuple[Any, str] | None]:
    """The checks that fail before any work: the SoC known, a model quantized otherwise than QDQ refused, the
    calibration and held-out data read against the model's inputs, the quantization options that apply, the task.
    Returns whether the model is float (quantized here), the calibration samples (None without ``calib``) and the
    held-out samples with their name (None without ``data``, or where it is ``calib`` again)."""
    from npukit.data.readers import same_data
    from npukit.runtime.compile import soc_info

    soc_info(soc)  # an unknown SoC fails before any work
    quantized_here = not is_qdq(proto)
    if quantized_here:  # ConvInteger / QLinear* models: nothing for the HTP, and not to be quantized again
        refuse_quantized(proto, model, verb="compile")
    samples = held = None
    if data is not None and not same_data(data, calib):
        held = (open_data(data, proto, preprocess or PreprocessConfig()), data_name(data))
        refuse_uniform_samples(held[0], held[1], "check")
    if calib is not None:
        samples = open_data(calib, proto, preprocess or PreprocessConfig())
        refuse_uniform_samples(samples, data_name(calib))
        if quantized_here and held is None:  # fitted to the samples the check then reads
            refuse_tiny_self_check(len(samples), held_out="--data")
    _check_quantization_request(float_model=quantized_here, calibrated=samples is not None, weight_bits=weight_bits,
                                mixed_precision=mixed_precision)
    check_task(proto, samples if samples is not None else held[0] if held else None, task)
    return quantized_here, samples, held


def _prepare(report: Report, proto: onnx.ModelProto, samples: Any) -> onnx.ModelProto:
    """``proto`` through npukit's graph passes with its shapes fixed (``runtime.compile.prepare_graph``), checked on
    the first calibration sample where there is one; what they did goes into ``report``."""
    from npukit.runtime.compile import prepare_graph

    # With the shapes fixed, Shape/Range subgraphs fold to constants; Constant nodes become initializers (else the
    # quantizer would quantize them as activations, which the HTP rejects).
    with step("folding constants with the shapes fixed (npukit's graph passes)", timings=report.timings,
              key="prepare"):
        proto, prepared = prepare_graph(proto, feeds=samples.sample(0) if samples is not None else None)
    report.add("graph_preparation", prepared)
    return proto


def _compile_context(report: Report, proto: onnx.ModelProto, output: Path, *, soc: str) -> Any:
    """The HTP context binary for ``soc`` compiled from the QDQ model ``proto`` into the EPContext model at
    ``output`` (``runtime.compile.compile_qnn_context``: loaded back and run), its record in ``report``."""
    from npukit.runtime.compile import compile_qnn_context

    with step(f"compiling the HTP context binary for {soc}", timings=report.timings, key="compile"):
        result = compile_qnn_context(proto, output, soc=soc)
    report.add("compile", result.as_dict())
    return result


_WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def _note_float_layers(report: Report, qdq: onnx.ModelProto) -> None:
    """A given QDQ model whose weighted layers are not all quantized (a CPU scheme from ``npukit quantize`` leaves
    the stem and head float where ORT's CPU kernels run them fastest): the HTP runs those in float16, which the
    check above measured; the verdict says so and how to get the HTP's own scheme."""
    dequantized = {o for n in qdq.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    weighted = [n for n in qdq.graph.node if n.op_type in _WEIGHTED_OPS]
    left = [n.name or n.op_type for n in weighted if len(n.input) > 1 and n.input[1] not in dequantized]
    add_float_layers(report, left, weighted=len(weighted))


def _refuse_htp_options(target: str, *, weight_bits: int, mixed_precision: bool, soc: str | None) -> None:
    """One-line refusals of the HTP's options given with a mobile runtime's target."""
    if weight_bits != 8:
        raise InputError(f"--weight-bits is for --target qnn-htp, not {target}", hint="drop --weight-bits")
    if mixed_precision:
        raise InputError(f"--mixed-precision is for --target qnn-htp, not {target}",
                         hint="drop --mixed-precision, or quantize for the CPU with `npukit quantize "
                              "--mixed-precision`")
    if soc is not None:
        raise InputError(f"--soc is for --target qnn-htp; {target} runs on the CPU (XNNPACK)", hint="drop --soc")


def _check_quantization_request(*, float_model: bool, calibrated: bool, weight_bits: int,
                                mixed_precision: bool) -> None:
    """One-line refusals of quantization options that cannot apply: the HTP quantizes only a float model it is
    given calibration data for; --weight-bits 4 and --mixed-precision do not combine."""
    if weight_bits != 8 and not (float_model and calibrated):
        raise InputError("--weight-bits chooses how a float model is quantized for the HTP: it needs a float model "
                         "and --calib", hint="pass the float model with --calib DATA, or drop --weight-bits")
    if weight_bits != 8 and mixed_precision:
        raise InputError("--mixed-precision plans int8 weights; it does not take --weight-bits 4",
                         hint="drop one of the two")
    if mixed_precision and not (float_model and calibrated):
        raise InputError("--mixed-precision chooses how a float model is quantized for the HTP: it needs a float "
                         "model and --calib", hint="pass the float model with --calib DATA, or drop --mixed-precision")
    if float_model and not calibrated:
        raise InputError("the model is float: npukit compiles it for the HTP's integer path (8/16-bit), not its "
                         "fp16 one, and quantizing needs calibration data",
                         hint="pass --calib DIR (calibration images or .npy) or give a QDQ model from "
                              "`npukit quantize`")


def _quantize_for_the_htp(report: Report, proto: onnx.ModelProto, samples: Any, *, soc: str, weight_bits: int,
                          mixed_precision: bool, task: str | None, gate: QualityGate) -> onnx.ModelProto:
    """The float model quantized as the HTP needs it (opset raised for 16-bit Q/DQ first): uint16 activations with
    int8 or int4 weights, or the mixed-precision plan checked on the HTP of ``soc``."""
    from npukit.frontend.opset import SIXTEEN_BIT_QDQ_OPSET

    proto = upgrade_opset(report, proto, SIXTEEN_BIT_QDQ_OPSET, "uint16 activation Q/DQ for the HTP", samples)
    if mixed_precision:
        htp_quant = _htp_mixed_precision(report, proto, samples, soc=soc, task=task, gate=gate)
        scheme = "int8 weights, uint8 activations, the layers of the mixed-precision plan lifted"
    else:
        scheme = f"int{weight_bits} weights, uint16 activations"
        with step(f"quantizing for the HTP ({scheme})", timings=report.timings, key="quantize"):
            from npukit.runtime.htp_quant import quantize_for_htp as _quantize_for_htp
            from npukit.runtime.qnn import HTP_QDQ_RULES

            rules = dataclasses.replace(HTP_QDQ_RULES, weight_type=f"int{weight_bits}")
            htp_quant = _quantize_for_htp(proto, list(samples), rules=rules)
    add_htp_quantization(report, htp_quant.as_dict(), scheme=scheme)
    return htp_quant.model


def _check_on_the_htp(report: Report, output: Path, reference: onnx.ModelProto, samples: Any,
                      held: tuple[Any, str] | None, *, soc: str, float_model: bool, task: str | None,
                      gate: QualityGate) -> None:
    """The compiled model run on the HTP as ``soc`` against ``reference`` on ORT CPU, with the model's task, on up
    to ``COMPILE_CHECK_SAMPLES`` held-out samples (``held``: the samples and their name), else calibration samples
    (one seeded input without either)."""
    from npukit.measure.task_fidelity import check_samples, session_runner
    from npukit.runtime.compile import soc_provider_options
    from npukit.runtime.qnn import make_qnn_session

    with step(f"task check: the compiled model on the HTP ({soc}) against the "
              f"{'float' if float_model else 'given'} model on ORT CPU", timings=report.timings,
              key="task_check"):
        htp = make_qnn_session(output, provider_options=soc_provider_options(soc))
        given = len(held[0]) if held is not None else len(samples) if samples is not None else 0
        more = (f"bench the context model with --data for more (compile's HTP check reads at most "
                f"{COMPILE_CHECK_SAMPLES} of the {given} samples given)" if given > COMPILE_CHECK_SAMPLES
                else "give more data")
        if held is not None:
            check = check_samples(held[0], COMPILE_CHECK_SAMPLES)
            where = f"{samples_read(len(check), len(held[0]))} held out in {held[1]}"
        else:
            check = check_samples(samples, COMPILE_CHECK_SAMPLES) if samples is not None else \
                [seeded_feeds(reference)]
            where = ("one seeded random input (no --calib or --data given: pass one for a task check on real "
                     "inputs)" if samples is None
                     else f"{len(check)} calibration samples (optimistic: the grids were fitted to them; pass "
                     "held-out --data)" if float_model
                     else f"{len(check)} samples of --calib (the given QDQ model's grids were not fitted to them "
                     "here)")
        task_check(report, reference, None, check, task=task, gate=gate, what="compile",
                    where=where, candidate_runner=session_runner(htp), more_data=more,
                    sequence=held[0] if held is not None else samples,
                    against="the float model" if float_model else "the given QDQ model on ORT CPU",
                    hint=("`npukit quantize` with a recovery recipe and compile its QDQ model" if float_model
                          else "quantizing again with a recovery recipe") + ", or another --soc; "
                         "--accept-degraded passes it as it is (exit 0, DEGRADED)")


def _energy(report: Report, compiled: onnx.ModelProto, float_model: onnx.ModelProto | None, *,
            feeds: dict[str, np.ndarray] | None = None) -> None:
    """The per-operator energy estimate of the compiled model's QDQ graph, its activation peak planned on the HTP's
    execution view (and of the float model it came from, on ORT CPU's), sizes shape inference cannot tell filled by
    one run on ``feeds`` (a calibration sample); the HTP's own energy is not measured here."""
    from npukit.measure.energy import MeasuredEnergy, energy_figures
    from npukit.report.energy import add_energy

    with step("energy per operator (estimate)", timings=report.timings, key="energy"):
        roles = {"compiled (its QDQ model)": compiled} | ({"float": float_model} if float_model is not None else {})
        # the compiled model's activations as the HTP holds them (uint16 where its Q/DQ says so), not as ORT CPU
        # would run its Q/DQ graph (a float and an integer copy of each: a peak above the float model's)
        estimates, _ = energy_figures(roles, measure=False, feeds=feeds, views={"compiled (its QDQ model)": "qnn-htp"})
    add_energy(report, estimates, measured={"compiled (its QDQ model)": MeasuredEnergy(
        None, 0, "the HTP's energy is not measured: no device here (x86 runs Qualcomm's HTP emulator)")})


def _htp_mixed_precision(report: Report, proto: onnx.ModelProto, samples: Any, *, soc: str, task: str | None,
                         gate: QualityGate) -> Any:
    """The HTP model of the mixed-precision plan (``npukit.runtime.htp_precision``), each candidate checked under
    ``gate`` on the HTP as ``soc`` on ``COMPILE_CHECK_SAMPLES`` calibration samples; the search goes into
    ``report``. No plan that passes: an input error, nothing written."""
    from npukit.report.quantize import add_htp_mixed_precision
    from npukit.runtime.compile import soc_info, soc_provider_options
    from npukit.runtime.htp_precision import plan_htp_precision
    from npukit.runtime.qnn import make_qnn_session

    options = soc_provider_options(soc)
    fp16 = soc_info(soc).fp16  # v68 has no float unit: 16-bit activations only
    fit, held, where = held_back(samples)
    accept = floor_check(proto, held[:COMPILE_CHECK_SAMPLES], task=task, gate=gate, what="compile",
                         session=lambda model: make_qnn_session(model, provider_options=options), sequence=samples)
    with step(f"mixed precision per layer on the HTP ({soc}): int8, 16-bit activations"
              f"{' or float16' if fp16 else ' (no float unit on this SoC)'}", timings=report.timings,
              key="mixed_precision"):
        plan = plan_htp_precision(proto, fit, accept=accept, float16=fp16)
    add_htp_mixed_precision(report, plan.summary() | {"checked_on": where})
    if not plan.met:
        raise InputError(f"no per-layer precision plan meets the floors on the HTP ({soc}, {where}), even with "
                         f"every layer that helps lifted ({len(plan.assignment)}): {plan.tried[-1]['line']}",
                         hint="lower --min-task-metric / --min-sqnr, or compile without --mixed-precision "
                              "(uint16 activations everywhere)")
    return plan.result
