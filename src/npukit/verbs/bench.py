"""The bench verb: latency, size, peak memory and the task check against a reference, on ORT CPU or the HTP."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from npukit.config import BenchConfig, PreprocessConfig, to_dict
from npukit.errors import InputError
from npukit.report.core import Report
from npukit.report.energy import add_energy
from npukit.report.finish import CommandResult, finish
from npukit.report.progress import progress, step
from npukit.tasks import QualityGate
from npukit.verbs.common import evaluate, is_qdq, logits, open_data, task_check


# Measured on the onnxruntime-qnn HTP emulator (QNN SDK 2.51), one 3x3 Conv with uint16 activations and int8
# weights, HTP output against the exact QDQ graph: 63 dB SQNR as HTP v68/v69, 86 dB as v73 and later. Chained through
# MobileNetV2 the v68 error reaches 30 dB at the logits and flips near-tie top-1 predictions.
PRECISE_A16_HTP_ARCH = 73


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
    from npukit.measure.energy import energy_figures
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
        dataset = open_data(data, proto, preprocess)
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
    with step("energy per operator (estimate; RAPL where readable)", timings=report.timings, key="energy"):
        estimates, measured = energy_figures(timed, threads=threads, runs=runs, feeds=feeds)
        add_energy(report, estimates, measured=measured)

    choice = None
    if dataset is not None and ref_proto is not None:
        with step("task check against the reference", timings=report.timings, key="task_check"):
            total = len(dataset) if max_samples is None else min(max_samples, len(dataset))
            choice, _, _ = task_check(report, ref_proto, proto, check_samples(dataset, total), task=task,
                                       gate=gate or QualityGate(), what="bench", threads=threads,
                                       where=f"{total} samples of {Path(str(data)).name}",
                                       hint="quantizing again with a recovery recipe (npukit quantize --cle --equalize-activations --bias-correction, "
                         "--int16-budget 0.1); --accept-degraded accepts it")
    else:
        report.set_verdict(f"MEASURED bench: {Path(str(model)).name}, no "
                           f"{'reference' if dataset is not None else 'data and reference'} given, so no task check",
                           passed=True)
    if dataset is not None and (choice is None or choice.name == "classify"):
        agreement = evaluate(proto, ref_proto, dataset, config=config, threads=threads)
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
    from npukit.measure.latency import LatencyResult, _timed_calls
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
    dataset = open_data(data, proto, preprocess) if data is not None else None
    feeds = dataset.sample(0) if dataset is not None else random_feeds(ctx.session, seed=0)
    with step(f"timing on the HTP emulator ({chip.part})", timings=report.timings, key="latency"):
        for _ in range(warmup):
            ctx.session.run(None, feeds)
        fixed = dict(feeds)
        latency = LatencyResult.from_times(_timed_calls(lambda: ctx.session.run(None, fixed), runs), threads=1)
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
            task_check(report, ref_proto, None, check_samples(dataset, total), task=task, gate=gate or QualityGate(),
                        what="bench", where=f"{total} samples of {Path(str(data)).name}, on the HTP as {chip.part}",
                        candidate_runner=session_runner(ctx.session),
                        hint="quantizing again with a recovery recipe (npukit quantize --cle --equalize-activations --bias-correction, "
                             "--int16-budget 0.1); --accept-degraded accepts it")
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
        h = logits(htp.run(None, batch.feeds))
        c = logits(cpu.run(None, batch.feeds))
        meters["HTP vs CPU run of the same model"].update(c, h)
        if exact is not None:
            meters["HTP vs the QDQ graph unfused (exact numerics)"].update(logits(exact.run(None, batch.feeds)), h)
        if ref is not None:
            r = logits(ref.run(None, batch.feeds))
            meters["HTP vs reference"].update(r, h)
            meters["CPU vs reference"].update(r, c)
    results = {k: m.result() for k, m in meters.items()}
    report.add("npu_agreement", {k: v.as_dict() for k, v in results.items()})
    report.add_table(f"HTP fidelity on {total} samples ({chip.name}, {chip.part}, HTP v{chip.htp_arch})",
                     ["comparison", "top-1 agreement", "top-5 overlap", "SQNR dB", "agreement where confident"],
                     [[k, v.top1_agreement, v.top5_overlap, v.sqnr_db, v.top1_agreement_confident]
                      for k, v in results.items()])
