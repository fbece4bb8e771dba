"""The bench verb: latency, size, peak memory and the task check against a reference, on ORT CPU or the HTP."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx

from npukit.config import BenchConfig, PreprocessConfig, to_dict
from npukit.data.subsets import spread
from npukit.errors import InputError
from npukit.report.bench import (
    add_agreement,
    add_context_latency,
    add_htp_fidelity,
    add_htp_soc,
    add_latency,
    add_memory,
    add_qnn_assignment,
    set_measured_verdict,
)
from npukit.report.core import Report
from npukit.report.energy import add_energy
from npukit.report.finish import CommandResult, finish
from npukit.report.progress import progress, step
from npukit.tasks import QualityGate
from npukit.verbs.common import (check_report_path, classified_output, data_label, data_name, evaluate, is_qdq, logits,
                                 open_data, preprocess_record, samples_read, task_check)


# Measured on the onnxruntime-qnn HTP emulator (QNN SDK 2.51), one 3x3 Conv with uint16 activations and int8
# weights, HTP output against the exact QDQ graph: 63 dB SQNR as HTP v68/v69, 86 dB as v73 and later. Chained through
# MobileNetV2 the v68 error reaches 30 dB at the logits and flips near-tie top-1 predictions.
PRECISE_A16_HTP_ARCH = 73
_REQUANTIZE_HINT = ("quantizing again with a recovery recipe (npukit quantize --cle --equalize-activations "
                    "--bias-correction, --int16-budget 0.1); --accept-degraded accepts it")


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
    soc: str | None = None,
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
    ``soc`` (its htp_arch and soc_model; the emulator's own default is v68; None: SM8650, and a compiled context
    runs as the SoC it was compiled for, which a ``soc`` given must name). ``memory``
    measures ORT CPU's real peak activation memory in a fresh process beside the planner's prediction.

    ``input_shape`` (``InputSpec`` forms) is fixed into the model and the reference first, and they are timed,
    compared and planned with it; without ``data``, a model with symbolic dimensions other than the batch needs it."""
    from npukit.frontend.onnx_io import is_context_model
    from npukit.runtime.qnn import FLOAT_HTP_SOC

    report_path = check_report_path(report_path)
    config = BenchConfig(threads=threads, warmup=warmup, runs=runs, max_samples=max_samples)
    preprocess = preprocess or PreprocessConfig()
    given_soc, soc = soc, soc or FLOAT_HTP_SOC  # a context binary runs as the SoC it was compiled for
    spec, proto = _load(model, input_shape, target=target, soc=soc, timed_only=data is None)
    if is_context_model(proto):  # a compiled HTP context binary runs only on the QNN EP
        return _bench_context(model, proto, data=data, reference=reference, warmup=warmup, runs=runs,
                              max_samples=max_samples, preprocess=preprocess, target=target, soc=given_soc,
                              report_path=report_path, html=html, task=task, gate=gate, spec=spec)
    if target == "cpu" and given_soc is not None:  # it was ignored: the CPU alone ran, and the report said nothing
        raise InputError(f"--soc {given_soc} names the HTP that --target qnn-htp runs on; this bench runs on the CPU "
                         "alone", hint="add --target qnn-htp, or drop --soc")
    models = _Models.load(model, proto, reference, spec)
    dataset = open_data(data, proto, preprocess) if data is not None else None
    report = _report(models, config, preprocess_record(dataset), data=data)
    feeds = dataset.sample(0) if dataset is not None else None
    _latency(report, models, feeds, config)
    _energy(report, models, feeds, config)
    choice = _task_check(report, models, dataset, config, data=data, task=task, gate=gate)
    _agreement(report, models, dataset, choice, config, data=data)
    if target != "cpu":
        _bench_npu(report, proto, models.ref_proto, dataset, target=target, max_samples=max_samples, soc=soc)
    if memory:
        _bench_memory(report, models)
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=html, json_path=json_path, result=report.sections, source=model)


@dataclasses.dataclass(frozen=True)
class _Models:
    """The model benched and its reference (None without one): the paths given, and the protos with ``spec``'s input
    shapes fixed in."""

    model: str | Path
    proto: onnx.ModelProto
    reference: str | Path | None
    ref_proto: onnx.ModelProto | None
    spec: Any

    @classmethod
    def load(cls, model: str | Path, proto: onnx.ModelProto, reference: str | Path | None, spec: Any) -> _Models:
        """``model`` (``proto``: loaded) with its reference loaded with the same shapes and checked to take its
        inputs."""
        ref_proto = _load_reference(reference, spec, proto) if reference is not None else None
        if ref_proto is not None:
            _check_reference(proto, ref_proto, reference)
        return cls(model, proto, reference, ref_proto, spec)

    def timed(self) -> dict[str, Any]:
        """What is timed per role: the files as given, or with fixed shapes the models as fixed."""
        timed: dict[str, Any] = {"model": self.proto if self.spec else str(self.model)}
        if self.reference is not None:
            timed["reference"] = self.ref_proto if self.spec else str(self.reference)
        return timed


def _load(model: str | Path, input_shape: Any, *, target: str, soc: str,
          timed_only: bool) -> tuple[Any, onnx.ModelProto]:
    """The input specification parsed and ``model`` loaded with it fixed in (a compiled context model too), after
    an HTP target's SoC is checked so that an unknown one fails before any work; ``timed_only``: no data, the model
    is timed on seeded random inputs."""
    from npukit.frontend.shapes import InputSpec, load_with_inputs

    if target != "cpu":
        from npukit.runtime.compile import soc_info

        soc_info(soc)  # an unknown SoC fails before any work
    spec = InputSpec.parse(input_shape)
    return spec, load_with_inputs(model, spec, needs="timing on seeded random inputs" if timed_only else None,
                                  compiled=True)


def _report(models: _Models, config: BenchConfig, preprocess: Any, *, data: Any) -> Report:
    """The bench report, its config: the settings, the files, the input shapes fixed and ``preprocess`` (the
    record ``preprocess_record`` makes)."""
    reference, spec = models.reference, models.spec
    return Report("bench", config={"bench": to_dict(config), "preprocess": preprocess,
                                   "model": str(models.model), "reference": str(reference) if reference else None,
                                   "data": data_label(data),
                                   "input_shape": spec.as_dict() if spec else None})


def _latency(report: Report, models: _Models, feeds: Any, config: BenchConfig) -> None:
    """The model's latency on ORT CPU (interleaved with the reference's where there is one) on ``feeds`` (seeded
    random inputs when None), with each file's size."""
    from npukit.measure.latency import measure_latency, measure_latency_interleaved
    from npukit.measure.size import model_size

    threads, warmup, runs = config.threads, config.warmup, config.runs
    timed = models.timed()
    sizes = {"model": model_size(models.model)}
    if models.reference is not None:
        sizes["reference"] = model_size(models.reference)
    with step(f"timing on ORT CPU, {threads} thread(s)", timings=report.timings, key="latency"):
        if models.reference is not None:
            lat = measure_latency_interleaved(timed, threads=threads, warmup=warmup, runs=runs, feeds=feeds)
        else:
            lat = {"model": measure_latency(timed["model"], threads=threads, warmup=warmup, runs=runs, feeds=feeds)}
    add_latency(report, lat, sizes, {"model": models.model, "reference": models.reference or ""}, threads=threads,
                runs=runs)


def _energy(report: Report, models: _Models, feeds: Any, config: BenchConfig) -> None:
    """The per-operator energy estimate of each timed model, and RAPL's measurement where it is readable."""
    from npukit.measure.energy import energy_figures

    with step("energy per operator (estimate; RAPL where readable)", timings=report.timings, key="energy"):
        estimates, measured = energy_figures(models.timed(), threads=config.threads, runs=config.runs,
                                             feeds=feeds)
        add_energy(report, estimates, measured=measured)


def _task_check(report: Report, models: _Models, dataset: Any, config: BenchConfig, *, data: Any, task: str | None,
                gate: QualityGate | None) -> Any:
    """The model checked against the reference with its task on up to ``config.max_samples`` of ``dataset``, and
    the verdict; without data or a reference, a measured-only verdict. Returns the task chosen (None: no check)."""
    from npukit.measure.task_fidelity import check_samples

    if dataset is None or models.ref_proto is None:
        set_measured_verdict(report, models.model, with_data=dataset is not None,
                             with_reference=models.ref_proto is not None)
        unused = [flag for flag, given in (("--task", task is not None),
                                           ("the floors", gate is not None and gate != QualityGate())) if given]
        if unused:  # given for a check that cannot run: said, not dropped in silence
            report.set_verdict(f"{report.verdict} ({' and '.join(unused)} given, not used: a task check needs "
                               "--reference and --data)", passed=True)
        return None
    with step("task check against the reference", timings=report.timings, key="task_check"):
        total = len(dataset) if config.max_samples is None else min(config.max_samples, len(dataset))
        choice, _, _ = task_check(report, models.ref_proto, models.proto, check_samples(dataset, total), task=task,
                                   gate=gate or QualityGate(), what="bench", threads=config.threads,
                                   where=f"{samples_read(total, len(dataset))} of {data_name(data)}",
                                   hint=_REQUANTIZE_HINT, sequence=dataset,
                                   against=f"the reference ({Path(str(models.reference)).name})")
    return choice


def _agreement(report: Report, models: _Models, dataset: Any, choice: Any, config: BenchConfig, *,
               data: Any) -> None:
    """A classifier's top-k agreement with the reference and accuracy against the labels, on ``dataset``; nothing
    without data or when the task check chose another task than classification."""
    if dataset is None or (choice is not None and choice.name != "classify"):
        return
    output = choice.output if choice is not None else classified_output(models.proto, dataset)
    if output is None:  # no reference, and the model's outputs are not class scores: nothing to agree on
        return
    agreement = evaluate(models.proto, models.ref_proto, dataset, config=config, threads=config.threads,
                         output=output)
    add_agreement(report, agreement, with_reference=models.ref_proto is not None, data_name=data_name(data))


def _load_reference(reference: str | Path, spec: Any, model: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """The --reference model with ``spec``'s shapes fixed in; what is wrong with it said of the reference. Where
    ``model`` is given, a reference with other inputs is refused as such before the shapes are fixed (an unrelated
    detector given as a classifier's reference read as a wrong --input-shape)."""
    from npukit.frontend.onnx_io import load_onnx, refuse_context_model
    from npukit.frontend.shapes import fix_inputs, input_dims

    loaded = _said_of_reference(reference, load_onnx, reference)
    if model is not None and spec is not None:
        _refuse_other_inputs(input_dims(model), input_dims(loaded), reference)
    _said_of_reference(reference, refuse_context_model, loaded, reference)
    return _said_of_reference(reference, fix_inputs, loaded, spec)


def _said_of_reference(reference: str | Path, step: Callable[..., Any], *args: Any) -> Any:
    """``step(*args)``, an InputError it raises said of the reference (its file name first)."""
    try:
        return step(*args)
    except InputError as exc:
        raise InputError(f"the reference {Path(str(reference)).name}: {exc.message}", hint=exc.hint) from None


def _refuse_other_inputs(mine: Any, theirs: Any, path: str | Path) -> None:
    """An InputError where the reference at ``path`` takes other inputs (by name) than the model."""
    if set(mine) != set(theirs):
        raise InputError(f"the reference {Path(str(path)).name} takes inputs {sorted(theirs)}, the model "
                         f"{sorted(mine)}", hint="give as --reference the float model this one was made from")


def _check_reference(model: onnx.ModelProto, reference: onnx.ModelProto, path: str | Path) -> None:
    """The reference must take the model's inputs (the same names and, where both are fixed, the same sizes) and
    give as many outputs: the check compares them one for one."""
    from npukit.frontend.shapes import input_dims

    mine, theirs = input_dims(model), input_dims(reference)
    _refuse_other_inputs(mine, theirs, path)
    outputs, ref_outputs = len(model.graph.output), len(reference.graph.output)
    if outputs != ref_outputs:
        raise InputError(f"the reference {Path(str(path)).name} gives {ref_outputs} output(s), the model {outputs}",
                         hint="give as --reference the float model this one was made from")
    for name, dims in mine.items():
        other = theirs[name]
        if dims is None or other is None:  # a rank unknown: nothing to compare
            continue
        fixed = all(isinstance(d, int) for d in (*dims, *other))
        if len(dims) != len(other) or (fixed and dims != other):
            shown = ",".join(str(d) for d in dims)
            raise InputError(f"input {name!r} is {list(dims)} in the model but {list(other)} in the reference "
                             f"{Path(str(path)).name}",
                             hint=f"fix both to the model's size with --input-shape {shown}, or give the reference "
                                  "the model was made from")


def _bench_context(model: str | Path, proto: onnx.ModelProto, *, data, reference, warmup: int, runs: int,
                   max_samples: int | None, preprocess: PreprocessConfig, target: str, soc: str | None, report_path,
                   html: bool, task: str | None, gate: QualityGate | None, spec) -> CommandResult:
    """``bench`` of a compiled EPContext model (``npukit compile``): it runs only on the QNN HTP backend, as the SoC
    it was compiled for. Latency on the HTP emulator (x86: not the device's latency), size, and with ``data`` and
    ``reference`` the task check of its HTP outputs against the reference on ORT CPU."""
    from npukit.measure.latency import LatencyResult, _timed_calls
    from npukit.measure.size import model_size
    from npukit.measure.task_fidelity import check_samples, session_runner
    from npukit.runtime.compile import context_activations16, context_session
    from npukit.runtime.ort import random_feeds
    from npukit.targets.registry import get_target

    if get_target(target).name != "qnn-htp":
        raise InputError(f"{Path(str(model)).name} is a compiled EPContext model: it runs only on the QNN HTP, not "
                         f"on {target}", hint="bench it with --target qnn-htp, or bench the QDQ model it was "
                                              "compiled from")
    report = Report("bench", config={"model": str(model), "reference": str(reference) if reference else None,
                                     "data": data_label(data), "target": target, "soc": soc,
                                     "input_shape": spec.as_dict() if spec else None})
    with step("loading the context binary on the HTP", timings=report.timings, key="load"):
        ctx = context_session(model, proto, soc=soc)
    chip = ctx.soc
    notes = [n for n in (ctx.note, _reduced_precision_note(chip) if context_activations16(proto) else None) if n]
    add_htp_soc(report, chip, note="; ".join(notes) or None, epcontext=True)
    size = model_size(model)
    dataset = open_data(data, proto, preprocess) if data is not None else None
    feeds = dataset.sample(0) if dataset is not None else random_feeds(ctx.session, seed=0)
    with step(f"timing on the HTP emulator ({chip.part})", timings=report.timings, key="latency"):
        for _ in range(warmup):
            ctx.session.run(None, feeds)
        fixed = dict(feeds)
        latency = LatencyResult.from_times(_timed_calls(lambda: ctx.session.run(None, fixed), runs), threads=1)
    add_context_latency(report, model, size, latency, chip=chip, runs=runs)
    if dataset is not None and reference is not None:
        ref_proto = _load_reference(reference, spec)
        total = len(dataset) if max_samples is None else min(max_samples, len(dataset))
        with step("task check: the EPContext model on the HTP against the reference on ORT CPU",
                  timings=report.timings, key="task_check"):
            task_check(report, ref_proto, None, check_samples(dataset, total), task=task, gate=gate or QualityGate(),
                        what="bench",
                        where=f"{samples_read(total, len(dataset))} of {data_name(data)}, on the HTP as {chip.part}",
                        candidate_runner=session_runner(ctx.session), sequence=dataset,
                        hint=_REQUANTIZE_HINT, against=f"the reference ({Path(str(reference)).name}) on ORT CPU")
    else:
        set_measured_verdict(report, model, with_data=dataset is not None, on="the HTP emulator",
                             with_reference=reference is not None)
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=html, json_path=json_path, result=report.sections)


def _bench_memory(report: Report, models: _Models) -> None:
    """ORT CPU's peak activation memory measured in fresh processes (arena off and on) beside the planner's
    prediction and its best plan, on the model as timed (with fixed shapes: written to a temporary file first)."""
    import tempfile

    from npukit.frontend.onnx_io import save_onnx
    from npukit.memory.measure import measure_ort_peak
    from npukit.memory.ort_cpu import without_graph_inputs
    from npukit.memory.plan import plan_memory as _plan
    from npukit.memory.planners import best_plan

    with tempfile.TemporaryDirectory(prefix="npukit-bench-") as tmp:  # measured with the shapes fixed
        model = models.model if models.spec is None else save_onnx(models.proto, Path(tmp) / "model.onnx")
        with step("measuring ORT's peak activation memory (fresh processes)", timings=report.timings, key="memory"):
            planned = _plan(model, target="cpu")
            off = measure_ort_peak(model, arena=False)
            on = measure_ort_peak(model, arena=True)
    placed = best_plan(without_graph_inputs(planned.lifetimes)).arena_bytes
    add_memory(report, predicted=planned.runtime_peak, planned=placed, lower_bound=planned.lower_bound, off=off, on=on)


def _reduced_precision_note(chip: Any) -> str | None:
    """What to expect of 16-bit activation layers on ``chip``'s HTP: a note before v73, else None."""
    if chip.htp_arch >= PRECISE_A16_HTP_ARCH:
        return None
    return (f"HTP v{chip.htp_arch} computes 16-bit activation layers at reduced precision (measured: 63 dB per Conv "
            f"against 86 dB on v{PRECISE_A16_HTP_ARCH}+); expect the HTP and CPU runs to differ more than on newer "
            "SoCs")


def _bench_npu(report: Report, proto: onnx.ModelProto, ref_proto: onnx.ModelProto | None, dataset, *, target: str,
               max_samples: int | None, soc: str) -> None:
    from npukit.measure.fidelity import AgreementMeter
    from npukit.quant.precision.tensor_precision import sixteen_bit_activations
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
    note = _reduced_precision_note(chip)  # None from v73 on: the model's activations need no reading then
    add_htp_soc(report, chip, note=note if note and sixteen_bit_activations(proto) else None)
    with step("asking the QNN EP which nodes it takes", timings=report.timings, key="qnn_assignment"):
        assignment = qnn_node_assignment(proto)
    add_qnn_assignment(report, assignment)
    if dataset is None:
        return
    with step(f"compiling the model on the HTP emulator ({chip.part})", timings=report.timings, key="qnn_compile"):
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
    scores = classified_output(ref_proto if ref_proto is not None else proto, dataset)  # the class scores' output
    k = scores or 0
    for batch in progress(spread(dataset, total).batches(1), total=total, description="running on the HTP"):
        h = logits(htp.run(None, batch.feeds), k)
        c = logits(cpu.run(None, batch.feeds), k)
        meters["HTP vs CPU run of the same model"].update(c, h)
        if exact is not None:
            meters["HTP vs the QDQ graph unfused (exact numerics)"].update(logits(exact.run(None, batch.feeds), k), h)
        if ref is not None:
            r = logits(ref.run(None, batch.feeds), k)
            meters["HTP vs reference"].update(r, h)
            meters["CPU vs reference"].update(r, c)
    add_htp_fidelity(report, {k: m.result() for k, m in meters.items()}, samples=total, chip=chip,
                     output=None if scores is not None else proto.graph.output[0].name)
