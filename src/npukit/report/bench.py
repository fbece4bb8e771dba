"""The bench verb's tables and figures: latency and size on ORT CPU, agreement with the reference, peak memory, and
the HTP run (the SoC, which nodes the QNN EP took, the HTP's fidelity, a compiled context model's latency); the
verdict of a bench that measures only."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npukit.report.core import Report


def add_latency(report: Report, latency: Mapping[str, Any], sizes: Mapping[str, Any], files: Mapping[str, str | Path],
                *, threads: int, runs: int) -> None:
    """ORT CPU latency per role (``LatencyResult``), with each file's size (``ModelSize``) and the ratio to the
    reference where there is one."""
    report.add("size", {k: v.as_dict() for k, v in sizes.items()})
    report.add("latency", {k: v.as_dict() for k, v in latency.items()})
    reference = latency.get("reference")
    rows = [[role, _shown_path(files[role]), sizes[role].file_bytes, res.median_ms, res.p90_ms,
             res.median_ms / reference.median_ms if reference is not None else None]
            for role, res in latency.items()]
    report.add_table(f"Latency on ORT CPU ({threads} thread{'s' if threads > 1 else ''}, median of {runs} runs)",
                     ["role", "file", "size_bytes", "median ms", "p90 ms", "ratio to reference"], rows)
    report.add_figure("Latency (median ms)", "bar",
                      {"labels": list(latency), "values": [v.median_ms for v in latency.values()]}, x_label="ms")


def _shown_path(path: str | Path, width: int = 48) -> str:
    """``path`` as given where it is short, else its last folder and name (two models may share a name; a table
    cell cut at its end would lose the name)."""
    text = str(path)
    return text if len(text) <= width else "…/" + "/".join(Path(text).parts[-2:])


def add_agreement(report: Report, agreement: Any, *, with_reference: bool, data_name: str) -> None:
    """A classifier's top-k agreement with the reference (``with_reference``) and its accuracy against labels."""
    shown = agreement.as_dict()
    if not with_reference:  # without a reference only the accuracy figures mean anything
        shown = {k: v for k, v in shown.items() if k == "samples" or "candidate" in k or k == "labeled_samples"}
    report.add("agreement" if with_reference else "accuracy", shown)
    fields: list[tuple[str, Any]] = [("samples", agreement.samples)]
    if with_reference:
        fields += [("top-1 agreement", agreement.top1_agreement), ("top-5 overlap", agreement.top5_overlap),
                   ("SQNR dB", agreement.sqnr_db),
                   ("confident samples", agreement.confident_samples),
                   ("top-1 agreement where reference confident", agreement.top1_agreement_confident)]
    if agreement.labeled_samples:
        fields += [("top-1 accuracy", agreement.top1_accuracy_candidate),
                   ("top-5 accuracy", agreement.top5_accuracy_candidate)]
        if with_reference:
            fields += [("top-1 accuracy (reference)", agreement.top1_accuracy_reference)]
    report.add_table(f"Agreement on {data_name}", ["metric", "value"], [list(f) for f in fields])


def add_memory(report: Report, *, predicted: int, planned: int, lower_bound: int, off: Any, on: Any) -> None:
    """ORT CPU's measured peak activation memory (``PeakMeasurement`` arena off and on) beside the prediction."""
    rows = [["predicted: ORT's allocation replayed on the graph ORT runs", predicted, None],
            ["npukit's best plan of the same graph", planned, f"{planned / predicted - 1:+.1%}"],
            ["measured, arena off", off.peak_bytes, f"{off.peak_bytes / predicted - 1:+.1%}"],
            ["measured, arena on", on.peak_bytes, f"{on.peak_bytes / predicted - 1:+.1%}"]]
    report.add("memory", {"predicted_bytes": predicted, "planned_bytes": planned, "lower_bound_bytes": lower_bound,
                          "measured_arena_off": off.as_dict(), "measured_arena_on": on.as_dict()})
    report.add_table("Peak activation memory (ORT CPU, VmHWM in a fresh process, MALLOC_MMAP_THRESHOLD_=65536; "
                     "graph inputs excluded)", ["what", "bytes", "vs predicted"], rows)


def add_htp_soc(report: Report, chip: Any, *, note: str | None = None, epcontext: bool = False) -> None:
    """The SoC whose HTP ran the model (``SocInfo``) and what to expect of it."""
    report.add("htp_soc", {"soc": chip.part, "name": chip.name, "htp_arch": chip.htp_arch,
                           "soc_model": chip.soc_model} | ({"epcontext": True} if epcontext else {}))
    if note:
        report.add("htp_note", note)
        report.add_table(f"What to expect of the HTP ({chip.part}, HTP v{chip.htp_arch})", ["note"], [[note]])


def add_qnn_assignment(report: Report, assignment: Any) -> None:
    """Which nodes the QNN EP took (``QnnAssignment``), and its reason for each node it left to the CPU."""
    report.add("qnn_assignment", assignment.as_dict())
    report.add_table("Nodes the QNN EP took (HTP backend)", ["QNN nodes", "CPU nodes", "QNN partitions"],
                     [[len(assignment.qnn_nodes), len(assignment.cpu_nodes), assignment.partitions]])
    if assignment.rejected:
        report.add_table("Nodes left to the CPU, and QNN's reason", ["node", "reason"],
                         [[k, v] for k, v in assignment.rejected.items()])


def add_htp_fidelity(report: Report, results: Mapping[str, Any], *, samples: int, chip: Any,
                     output: str | None = None) -> None:
    """Agreement (``Agreement``) of the HTP run with the CPU run, the exact QDQ graph and the reference, on the class
    scores; ``output``: the output compared where the model has no class scores (a detector's boxes), whose SQNR
    alone is shown (top-1 of YOLOv8n's 1x22x2100 read as classes meant nothing)."""
    report.add("npu_agreement", {k: v.as_dict() for k, v in results.items()})
    title = f"HTP fidelity on {samples} samples ({chip.name}, {chip.part}, HTP v{chip.htp_arch})"
    if output is not None:
        report.add_table(f"{title}; output {output!r}, no class scores to agree on", ["comparison", "SQNR dB"],
                         [[k, v.sqnr_db] for k, v in results.items()])
        return
    report.add_table(title, ["comparison", "top-1 agreement", "top-5 overlap", "SQNR dB", "agreement where confident"],
                     [[k, v.top1_agreement, v.top5_overlap, v.sqnr_db, v.top1_agreement_confident]
                      for k, v in results.items()])


def add_context_latency(report: Report, model: str | Path, size: Any, latency: Any, *, chip: Any,
                        runs: int) -> None:
    """A compiled EPContext model's size and latency on the HTP emulator (x86: not the device's latency)."""
    report.add("size", {"model": size.as_dict()})
    report.add("latency", {"model": latency.as_dict()})
    report.add_table(f"Latency of the EPContext model on the HTP emulator ({chip.name}, {chip.part}; x86 "
                     f"emulation, not the device's latency; median of {runs} runs)",
                     ["file", "size_bytes", "median ms", "p90 ms"],
                     [[Path(str(model)).name, size.file_bytes, latency.median_ms, latency.p90_ms]])


def set_measured_verdict(report: Report, model: str | Path, *, with_data: bool, on: str | None = None,
                         with_reference: bool = False) -> None:
    """The verdict of a bench without a task check (``on``: where it ran, when not ORT CPU): measured only, and what
    was not given for a check (a reference without data: the data; it said "no data and reference given")."""
    where = f" on {on}" if on else ""
    missing = ("no reference given" if with_data else "no --data given to check it against the reference on"
               if with_reference else "no data and reference given")
    report.set_verdict(f"MEASURED bench: {Path(str(model)).name}{where}, {missing}, so no task check", passed=True)
