"""The quantize verb: this CPU's scheme, npukit's quantization pipeline, the task check of the INT8 model."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npukit.config import BenchConfig, PreprocessConfig
from npukit.data.subsets import spread
from npukit.quant.config import QuantConfig, Recipe
from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish
from npukit.report.quantize import (add_kernel_profile, add_layer_sqnr, add_mixed_precision, add_size_and_speed,
                                     add_steps, add_verdict_notes, checked_on, slower_note)
from npukit.report.progress import step
from npukit.tasks import QualityGate
from npukit.verbs.common import (HOLD_BACK_EVERY, check_output, check_task, check_task_measurable, data_label,
                                 data_name, float_static_model, floor_check, held_back, open_data, preprocess_record,
                                 quant_opset, refuse_nothing_left, refuse_tiny_self_check, refuse_uniform_samples,
                                 samples_read, task_check)


CHECK_SAMPLES = 32  # calibration samples the task check reads when no held-out data is given
SEARCH_SAMPLES = 64  # held-back calibration samples each mixed-precision candidate is checked on, at most
NOTHING_LEFT_HINT = ("exclude fewer nodes (npukit quantize --mixed-precision keeps in float only the layers the task "
                     "check needs)")


def cpu_scheme() -> dict:
    """The activation dtype and weight range this machine's CPU runs accurately (npukit.quant.cpu.schemes)."""
    from npukit.quant.cpu.schemes import cpu_int8_scheme
    from npukit.runtime.devices import read_cpu_info

    return cpu_int8_scheme(read_cpu_info("/proc/cpuinfo"))


def _gemm_convs_auto(scheme: dict, reduced: bool) -> bool:
    """The conv kernel choice's default: on where this CPU's scheme takes it, the weights are full range, and both of
    ORT's int8 conv kernels were measured exact here (``runtime.int8_paths``)."""
    from npukit.runtime.int8_paths import full_range_exact, probe_int8_paths

    return bool(scheme["gemm_convs"]) and not reduced and full_range_exact(probe_int8_paths())


def on_cpu(config: QuantConfig, scheme: dict, *, activation_dtype: str | None = None,
           reduce_range: bool | None = None, float_stem: bool | None = None,
           gemm_convs: bool | None = None) -> QuantConfig:
    """``config`` with what this CPU's ``scheme`` decides (``cpu_scheme``: the activation type, the weight range, the
    float head timed here, the conv kernel choice), each one unless given: what ``quantize`` builds with no flags,
    and the base every recipe of ``optimize`` starts from."""
    from npukit.quant.cpu.schemes import apply_scheme

    reduced = scheme["reduce_range"] if reduce_range is None else reduce_range
    return apply_scheme(config, {
        "activation_dtype": activation_dtype or scheme["activation_dtype"], "reduce_range": reduced,
        "float_stem": scheme["float_stem"] if float_stem is None else float_stem,
        # not with reduce_range (its pair-bounded grids must not shift), even on a CPU that takes both
        "gemm_convs": _gemm_convs_auto(scheme, reduced) if gemm_convs is None else gemm_convs})


def resolve_recipe(recipe: str, *, cle: bool, activation_equalization: bool, bias_correction: bool, adaround: bool,
                   range_search: bool, int16_budget: float, mixed_precision: bool, budget_s: float) -> Recipe:
    """The recovery recipe of ``quantize``'s ``recipe`` and flags (its docstring says how they combine)."""
    from npukit.errors import InputError
    from npukit.quant.config import ActivationEqualization, AdaRound, RangeSearch, RecipeChoice
    from npukit.quant.recipe import CANDIDATES, RECIPES

    if recipe not in RECIPES:
        raise InputError(f"unknown recipe {recipe!r}", hint=f"use {', '.join(RECIPES)}")
    given_steps = Recipe(cle=cle, activation_equalization=ActivationEqualization() if activation_equalization
                         else None, bias_correction=bias_correction, adaround=AdaRound() if adaround else None,
                         range_search=RangeSearch() if range_search else None)
    if recipe == "equalized":
        equalized = CANDIDATES["equalized"]
        return dataclasses.replace(given_steps, cle=True, activation_equalization=equalized.activation_equalization,
                                   bias_correction=True)
    given = [name for name, on in (("--cle", cle), ("--equalize-activations", activation_equalization),
                                   ("--bias-correction", bias_correction), ("--adaround", adaround),
                                   ("--range-search", range_search), ("--int16-budget", int16_budget > 0),
                                   ("--mixed-precision", mixed_precision)) if on]
    if recipe == "auto" and given:
        raise InputError(f"--recipe auto chooses the recovery steps itself; {', '.join(given)} cannot be given with it",
                         hint="drop those flags to let --recipe auto choose, or drop --recipe auto to run exactly "
                              "the flags given")
    return Recipe(choose=RecipeChoice(budget_s)) if recipe == "auto" else given_steps


def quantize(model: str | Path, output: str | Path, *,
             calib: str | Path | np.ndarray | Mapping[str, np.ndarray] | Sequence[dict[str, np.ndarray]],
             per_tensor: bool = False, method: str = "auto", recipe: str = "plain", recipe_budget_s: float = 60.0,
             cle: bool = False, bias_correction: bool = False, equalize_activations: bool = False,
             exclude: Sequence[str] = (), int16_nodes: Sequence[str] = (), int16_tensors: Sequence[str] = (),
             int16_budget: float = 0.0, mixed_precision: bool = False, mixed_precision_layers: int = 24,
             activation_dtype: str | None = None, reduce_range: bool | None = None, float_stem: bool | None = None,
             gemm_convs: bool | None = None, adaround: bool = False, range_search: bool = False,
             calib_samples: int | None = None,
             data: str | Path | np.ndarray | Mapping[str, np.ndarray] | Sequence[dict[str, np.ndarray]] | None = None,
             preprocess: PreprocessConfig | None = None, threads: int = 1, runs: int = 30,
             max_samples: int | None = None, html: bool = False, pair_channels: bool = True, task: str | None = None,
             gate: QualityGate | None = None, input_shape: str | Sequence[Any] | None = None) -> CommandResult:
    """INT8 post-training quantization to a QDQ model that ORT runs with integer kernels, with a report of what it
    cost: per-layer SQNR, size, latency against the float model, where the time goes (kernel time by kind: which
    kernels the integer arithmetic speeds up on this CPU) and, with ``data``, agreement on held-out data.

    ``calib`` (and ``data``) is an image folder / .npy / .npz, an array (read as a .npy's: samples along axis 0), a
    dict of arrays by input name (read as a .npz's), or a sequence of feed dicts (one sample each, stacked).
    ``activation_dtype=None``, ``reduce_range=None`` and ``float_stem=None`` take what this CPU runs accurately and
    fast (e.g. 7-bit weights on x86 CPUs without VNNI, where ORT's u8s8 kernels saturate, and a 3x3 RGB stem left in
    float on x86 CPUs, where it runs faster, with the convs chained after it as far as that is timed fastest);
    ``gemm_convs=None`` likewise (on where ORT's two int8 conv kernels both accumulate in 32 bits, see
    ``npukit.quant.cpu.conv_kernel``).
    ``pair_channels=False`` turns the channel pairing of 7-bit weights off (``npukit.quant.cpu.pair_channels``).

    ``recipe``: "plain" (the default) runs the recovery steps the flags ask for and no others; "equalized" adds
    CLE, activation equalization and bias correction to them; "auto" compares those two on held-out calibration
    samples and keeps the plain one unless the other is clearly better there, within ``recipe_budget_s`` seconds
    (``npukit.quant.recipe``; the report's "Recipe chosen" table); no recipe flag (``cle``,
    ``equalize_activations``, ``bias_correction``, ``adaround``, ``range_search``, ``int16_budget``,
    ``mixed_precision``) may be given with it (an ``InputError``). The default stays plain: on the real models
    measured the plain recipe was the better or as good (benchmarks/results/default_recipe.md).

    The result is checked with the model's task (``task``: classify, detect, segment, text-detect, text-recognize,
    generic; None detects it from the outputs) against the float model on ``data`` (else on up to
    ``CHECK_SAMPLES`` calibration samples, which the report says is optimistic): the task metric and every output
    the task does not decode are held to ``gate``'s floors, and a model that runs no integer kernel fails (an
    ``exclude`` naming every conv/matmul node is refused before any work: an ``InputError``). The report's verdict
    says which; a failed check makes the CLI exit 1.

    ``mixed_precision`` chooses each quantized node's precision (int8, 16-bit activations or float32) so that the
    model passes ``gate`` on the calibration samples with the least latency added, each option's gain and cost
    measured here, ``mixed_precision_layers`` layers at a time, the most sensitive first, more while no plan passes
    (``npukit.quant.precision.layer_plan``); the report shows every measured layer's sensitivity, gain, cost and
    choice, and the plan timed beside the all-int8 and all-16-bit models. No plan that passes: an ``InputError``,
    nothing written.

    ``input_shape`` (``InputSpec`` forms) is fixed into the model first (else the sizes it leaves open as ``calib``'s
    arrays have them: ``common.shapes_from_data``). A model below the opset its Q/DQ needs (per-channel: 13, 16-bit:
    21) is converted and verified on calibration samples first (``npukit.frontend.opset``); the report records it.
    """
    BenchConfig(threads=threads, runs=runs, max_samples=max_samples)  # refused before any work, as bench does
    output = check_output(output, source=model)
    preprocess, gate = preprocess or PreprocessConfig(), gate or QualityGate()
    proto, spec = float_static_model(model, input_shape, verb="quantize", data=calib)
    scheme = cpu_scheme()
    config = _quant_config(scheme, per_tensor=per_tensor, method=method, calib_samples=calib_samples, recipe=recipe,
                           recipe_budget_s=recipe_budget_s, cle=cle, equalize_activations=equalize_activations,
                           bias_correction=bias_correction, adaround=adaround, exclude=exclude, int16_nodes=int16_nodes,
                           int16_tensors=int16_tensors, int16_budget=int16_budget, mixed_precision=mixed_precision,
                           range_search=range_search, activation_dtype=activation_dtype, reduce_range=reduce_range,
                           float_stem=float_stem, gemm_convs=gemm_convs, pair_channels=pair_channels)
    inputs = _Inputs.open(proto, calib, data, preprocess, task=task, max_samples=max_samples, threads=threads,
                          calib_samples=calib_samples)
    refuse_nothing_left(proto, exclude, hint=NOTHING_LEFT_HINT)
    report = _report(model, config, scheme, inputs, preprocess=preprocess, task=task, gate=gate, spec=spec)
    return _quantize_and_check(report, proto, inputs, config, output, float_model=proto if spec else str(model),
                               source=model, task=task, gate=gate, mixed=mixed_precision,
                               layers=mixed_precision_layers, threads=threads, runs=runs, html=html)


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """``quantize``'s samples: the calibration set, the held-out set (None without ``data``), the samples the task
    check reads (at most ``limit`` of ``check``) and where they are, with the sources as given (for the report)."""

    samples: Any
    evaluation: Any
    check: Any
    limit: int
    where: str
    calib: Any
    data: Any

    @classmethod
    def open(cls, proto: Any, calib: Any, data: Any, preprocess: PreprocessConfig, *, task: str | None,
             max_samples: int | None, threads: int, calib_samples: int | None = None) -> _Inputs:
        """Opens ``calib`` and ``data`` and refuses, before any work, a task they cannot check or carry.
        ``calib_samples`` of ``calib`` (fewer than it holds) are taken spread over it (``data.subsets.spread``)."""
        from npukit.data.readers import same_data

        samples = open_data(calib, proto, preprocess)
        if calib_samples is not None:
            samples = spread(samples, calib_samples)  # more than it holds: quantize says so
        evaluation = open_data(data, proto, preprocess) if data is not None else None
        check_task(proto, samples, task)  # a --task the outputs cannot carry fails here, before any work
        if evaluation is None or same_data(data, calib):
            refuse_tiny_self_check(len(samples), held_out="--data")
        check = evaluation if evaluation is not None else samples
        limit = (max_samples or len(check)) if evaluation is not None else CHECK_SAMPLES
        where = checked_on(data, held_out=evaluation is not None, same_as_calib=same_data(data, calib))
        if limit < len(check):
            where += f"; {samples_read(limit, len(check))}"
        inputs = cls(samples, evaluation, check, limit, where, calib, data)
        check_task_measurable(proto, inputs.checked(), task, where=where, threads=threads)  # nothing to find?
        refuse_uniform_samples(samples, data_name(calib))  # held-out data fine, the grids fitted to one input
        return inputs

    def checked(self) -> list[Any]:
        """The samples the task check reads, taken afresh for each reader (``check_samples``)."""
        from npukit.measure.task_fidelity import check_samples

        return check_samples(self.check, self.limit)


def _report(model: str | Path, config: QuantConfig, scheme: dict, inputs: _Inputs, *, preprocess: PreprocessConfig,
            task: str | None, gate: QualityGate, spec: Any) -> Report:
    """The report, its config recording what ``quantize`` was asked and resolved, so a run can be repeated."""
    return Report("quantize", config={"quant": config.as_dict(), "cpu_scheme": scheme, "model": str(model),
                                      "calib": data_label(inputs.calib, inputs.samples),
                                      "data": data_label(inputs.data, inputs.evaluation),
                                      "preprocess": preprocess_record(inputs.samples, inputs.evaluation),
                                      "task": task or "auto", "gate": gate.as_dict(),
                                      "input_shape": spec.as_dict() if spec else None})


def _quantize_and_check(report: Report, proto: Any, inputs: _Inputs, config: QuantConfig, output: Path, *,
                        float_model: Any, source: str | Path, task: str | None, gate: QualityGate, mixed: bool,
                        layers: int, threads: int, runs: int, html: bool) -> CommandResult:
    """The work once nothing is refused: build and write the INT8 model, measure it beside ``float_model`` (the
    float model as timed: with --input-shape, as fixed, static sizes too), hold it to the task check, finish."""
    result, proto, config = _quantized(report, proto, inputs.samples, config, output, task=task, gate=gate,
                                       mixed=mixed, layers=layers)
    kernels, latency = _measure(report, result, inputs.samples, {"float": float_model, "int8": str(output)},
                                {"float": source, "int8": output}, threads=threads, runs=runs)
    _task_check(report, proto, result, config, inputs, kernels, latency, task=task, gate=gate, mixed=mixed,
                threads=threads)
    return finish(report, output, html=html, result=result)


def _quantized(report: Report, proto: Any, samples: Any, config: QuantConfig, output: Path, *, task: str | None,
               gate: QualityGate, mixed: bool, layers: int) -> tuple[Any, Any, QuantConfig]:
    """The INT8 model built (at the opset its Q/DQ needs, ``mixed`` precision planned first) and written; returns
    the quantization result, the float model it was built from and the config it was built with."""
    from npukit.frontend.onnx_io import save_onnx
    from npukit.quant.qdq import quantize as _quantize

    proto = quant_opset(report, proto, config, samples, sixteen_bit=mixed)
    why = None
    if mixed:
        config, why = _mixed_precision(report, proto, samples, config, task=task, gate=gate, layers=layers)
    with step("quantizing (calibrate, equalize, correct, insert Q/DQ)", timings=report.timings, key="quantize"):
        result = _quantize(proto, samples, config=config, why=why)
    save_onnx(result.model, output)
    add_steps(report, result.steps)
    return result, proto, config


def _task_check(report: Report, proto: Any, result: Any, config: QuantConfig, inputs: _Inputs, kernels: dict,
                latency: dict, *, task: str | None, gate: QualityGate, mixed: bool, threads: int) -> None:
    """The INT8 model held to the task check against the float model (a model that runs no integer kernel fails);
    the verdict's notes and, on held-out data, the classifier's agreement go into ``report``."""
    from npukit.quant.qdq import integer_failures

    slower = slower_note(latency["int8"].median_ms / latency["float"].median_ms, threads=threads)
    with step("task check against the float model", timings=report.timings, key="task_check"):
        choice, checked, _ = task_check(report, proto, result.model, inputs.checked(), task=task,
                                        gate=gate, what="quantize", where=inputs.where, threads=threads,
                                        sequence=inputs.check,
                                        extra_failures=integer_failures(kernels, result),
                                        hint=_recipe_hint(config, result.steps.recipe, mixed=mixed) + slower)
    add_verdict_notes(report, slower=slower, recipe=result.steps.recipe)
    if inputs.where.startswith("calibration samples"):  # said in a table row alone; compile says it in its verdict
        report.set_verdict(f"{report.verdict} (checked on the calibration samples: optimistic, the model was fitted "
                           "to them; pass held-out --data)", passed=report.passed)
    if inputs.evaluation is not None and choice.name == "classify":  # the task check's agreement on the held-out data
        report.add("agreement", checked.metrics)


def _quant_config(scheme: dict, *, per_tensor: bool, method: str, calib_samples: int | None, recipe: str,
                  recipe_budget_s: float, cle: bool, equalize_activations: bool, bias_correction: bool,
                  adaround: bool, range_search: bool, exclude: Sequence[str], int16_nodes: Sequence[str],
                  int16_tensors: Sequence[str], int16_budget: float, mixed_precision: bool,
                  activation_dtype: str | None, reduce_range: bool | None, float_stem: bool | None,
                  gemm_convs: bool | None, pair_channels: bool) -> QuantConfig:
    """``quantize``'s flags as its config: the scheme, calibration, recovery recipe (``resolve_recipe``) and
    precision they ask for, with what this CPU's ``scheme`` decides wherever a flag is None (``on_cpu``)."""
    from npukit.quant.config import CalibrationSpec, CpuKernels, Precision, Scheme

    steps = resolve_recipe(recipe, cle=cle, activation_equalization=equalize_activations,
                           bias_correction=bias_correction, adaround=adaround, range_search=range_search,
                           int16_budget=int16_budget, mixed_precision=mixed_precision, budget_s=recipe_budget_s)
    return on_cpu(QuantConfig(scheme=Scheme(per_channel=not per_tensor, exclude=tuple(exclude),
                                            int16_nodes=tuple(int16_nodes), int16_tensors=tuple(int16_tensors)),
                              calibration=CalibrationSpec(method=method, samples=calib_samples), recipe=steps,
                              precision=Precision(int16_budget=int16_budget),
                              cpu=CpuKernels(pair_channels=pair_channels)),
                  scheme, activation_dtype=activation_dtype, reduce_range=reduce_range, float_stem=float_stem,
                  gemm_convs=gemm_convs)


def _measure(report: Report, result: Any, samples: Any, timed: dict[str, Any], files: dict[str, Any], *,
             threads: int, runs: int) -> tuple[dict, dict]:
    """What the quantized model costs and runs: ORT's integer kernels, per-layer SQNR against the float model on
    four calibration samples, size and latency beside the float model (``timed``: the two models as timed, the
    float one with its shapes fixed) and where the time goes; the integer kernel report and the latencies."""
    from npukit.measure.latency import measure_latency_interleaved
    from npukit.measure.op_profile import profile_ops
    from npukit.measure.size import model_size
    from npukit.quant.layer_sqnr import layer_sqnr
    from npukit.quant.qdq import integer_kernel_report

    kernels = integer_kernel_report(result.model)
    report.add("integer_kernels", kernels)
    with step("per-layer SQNR", timings=report.timings, key="layer_sqnr"):
        layers = layer_sqnr(result.reference, result.model, spread(samples, 4), limit=4)
    add_layer_sqnr(report, layers)
    with step(f"timing float vs int8, {threads} thread(s)", timings=report.timings, key="latency"):
        feeds = samples[0] if isinstance(samples, list) else samples.sample(0)
        latency = measure_latency_interleaved(timed, threads=threads, runs=runs, feeds=feeds)
    sizes = {role: model_size(path).file_bytes for role, path in files.items()}
    add_size_and_speed(report, sizes, latency, kernels, threads=threads, runs=runs)
    with step("where the time goes (ORT kernel profile)", timings=report.timings, key="kernel_profile"):
        profiles = profile_ops(timed, threads=threads, warmup=3, runs=min(runs, 10), rounds=2, feeds=feeds)
    add_kernel_profile(report, profiles, threads=threads)
    return kernels, latency


def _mixed_precision(report: Report, proto: Any, samples: Any, config: Any, *, task: str | None, gate: QualityGate,
                     layers: int) -> tuple[Any, Any]:
    """``config`` with each quantized node's precision chosen so that the model passes ``gate`` on the calibration
    samples (``npukit.quant.precision.layer_plan``, measuring ``layers`` layers at a time); the search goes into
    ``report``. No plan that passes: an input error (the floors are out of reach; nothing is written). Also
    returns the steps that chose its float nodes and 16-bit tensors (``quantize``'s ``why``)."""
    from npukit.errors import InputError
    from npukit.quant.precision.layer_plan import plan_layer_precision

    if config.precision.int16_budget > 0:
        raise InputError("--mixed-precision and --int16-budget both choose what goes to 16 bits",
                         hint="use one of them")
    fit, held, where = held_back(samples)  # --calib-samples: taken by ``_Inputs.open``
    accept = floor_check(proto, held[:SEARCH_SAMPLES], task=task, gate=gate, what="quantize", sequence=samples)
    searched = dataclasses.replace(config, calibration=dataclasses.replace(config.calibration, samples=None))
    with step("mixed precision per layer (sensitivity, each option's gain and cost, search under the floors)",
              timings=report.timings, key="mixed_precision"):
        plan = plan_layer_precision(proto, fit, config=searched, accept=accept, max_layers=layers)
    add_mixed_precision(report, plan.summary() | {"checked_on": where})
    if not plan.met:
        raise InputError(f"no per-layer precision plan meets the floors on {where}: with every "
                         f"layer that helps lifted ({len(plan.assignment)} of {len(plan.sensitivity)}) "
                         f"{plan.tried[-1]['line']}; every activation at 16 bits: {plan.all_16bit.line}",
                         hint="lower --min-task-metric / --min-sqnr, or add --cle --equalize-activations "
                              "--bias-correction")
    return dataclasses.replace(plan.config, calibration=config.calibration), plan.why


def _recipe_hint(config: Any, choice: dict | None = None, *, mixed: bool = False) -> str:
    """What to try when the quantized model fails its check: the recovery steps ``config`` (and the recipe
    ``choice``, ``QuantSteps.recipe``) did not use; after ``mixed`` precision (which --int16-budget cannot join),
    more calibration samples for its own check."""
    tried = []
    if choice and choice["chosen"] == "plain" and "equalized" in choice["candidates"]:
        tried.append("--recipe equalized (it scored lower on the held-out calibration samples)")
    elif choice and "equalized" in choice.get("skipped", {}):
        tried.append("--recipe equalized (--recipe auto did not try it within its time budget)")
    elif not (config.recipe.cle and config.recipe.activation_equalization and config.recipe.bias_correction) \
            and not (choice and choice["chosen"] == "equalized"):
        tried.append("--cle --equalize-activations --bias-correction")
    if mixed:
        tried.append(f"more --calib samples (--mixed-precision judges its plans on every {HOLD_BACK_EVERY}th, held "
                     "back: a plan that passes a few may fail --data)")
    elif not (config.precision.int16_budget or config.scheme.int16_tensors or config.scheme.int16_nodes):
        tried.append("--int16-budget 0.1")
    if not config.recipe.adaround:
        tried.append("--adaround")
    tried.append("--exclude the layers that hurt most (the report's table of them)")
    return ", ".join(tried) + "; --accept-degraded passes it as it is (exit 0, DEGRADED)"
