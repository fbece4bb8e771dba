"""The tables of the verbs that describe or rewrite a graph: inspect (what a model holds), export (the ONNX file it
wrote and how it was verified) and optimize-graph (the passes, the graph before and after, the verification); and
an opset upgrade any verb made first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from npukit.report.core import Report


def macs_shown(summary: Any) -> int | str:
    """The MAC count to show for a ``ModelSummary``: "unknown" with the reason when layers lack shapes."""
    if not summary.unknown_mac_layers:
        return summary.macs
    mac_layers = summary.unknown_mac_layers + sum(1 for la in summary.layers if la.macs)
    return (f"unknown ({summary.unknown_mac_layers} of {mac_layers} conv/matmul layers have symbolic shapes; pass "
            "--input-shape)")


def add_summary(report: Report, summary: Any, *, top_layers: int, file_bytes: int | None = None) -> None:
    """inspect's tables of a ``ModelSummary``: the model, ops by type, the heaviest layers, the largest tensors;
    ``file_bytes``: the size of the file given, shown as the model's (the model serialized with --input-shape's
    sizes written in read 4.551 MiB for PP-OCRv4 det's 4.526 MiB file)."""
    report.add("summary", summary.as_dict())
    if file_bytes is not None:
        report.add("file_bytes", file_bytes)
    if summary.unknown_mac_layers:
        mac_layers = summary.unknown_mac_layers + sum(1 for la in summary.layers if la.macs)
        report.add("macs_note", f"{summary.unknown_mac_layers} of {mac_layers} conv/matmul layers have symbolic "
                                f"shapes: the {summary.macs:,} MACs counted leave them out")
    report.add_table("Model", ["inputs", "nodes", "parameters", "MACs", "size_bytes"],
                     [[", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in summary.input_shapes.items()),
                       summary.nodes, summary.parameters, macs_shown(summary),
                       summary.serialized_bytes if file_bytes is None else file_bytes]])
    report.add_table("Ops by type", ["op", "count"], sorted(([k, v] for k, v in summary.ops.items()),
                                                             key=lambda r: (-r[1], r[0])))
    heavy = sorted((layer for layer in summary.layers if layer.macs), key=lambda layer: -layer.macs)[:top_layers]
    report.add_table(f"Layers by MACs (top {len(heavy)} of {sum(1 for la in summary.layers if la.macs)})",
                     ["layer", "op", "output shape", "params", "MACs", "share", "output_bytes"],
                     [[la.name, la.op, "x".join(map(str, la.output_shape or ())), la.params, la.macs,
                       f"{la.macs / summary.macs:.1%}" if summary.macs and not summary.unknown_mac_layers else "—",
                       la.output_bytes] for la in heavy])
    symbolic = summary.unknown_mac_layers or any(not isinstance(d, int) or d <= 0 for shape in
                                                 summary.input_shapes.values() for d in shape)
    report.add_table("Largest activations" + (" of those with static shapes (the others' sizes are symbolic: "
                                              "pass --input-shape to size them)" if symbolic else ""),
                     ["tensor", "shape", "dtype", "bytes"],
                     [[a.name, "x".join(map(str, a.shape)), a.dtype, a.bytes] for a in summary.largest_activations])


def add_export(report: Report, source: Any, result: Any, summary: Any) -> None:
    """export's tables: the exported model (``ExportResult``) and its summary, how the model was loaded, and why
    the dynamo exporter fell back when it did."""
    report.add("export", result.as_dict())
    report.add("summary", {k: v for k, v in summary.as_dict().items() if k != "layers"})
    report.add_table("Export", ["model", "exporter", "opset", "input shape", "nodes", "max abs err", "max rel err",
                                "verified"],
                     [[source.description, result.exporter, result.opset, "x".join(map(str, result.input_shape or ())),
                       result.node_count, result.max_abs_error, result.max_rel_error,
                       "not compared" if result.max_abs_error is None else result.passed]])
    if source.notes:
        report.add_table("Model loading", ["note"], [[note] for note in source.notes])
    if result.fallback_reason:
        report.add_table("Exporter fallback", ["tried", "reason"], [["dynamo", result.fallback_reason]])


def _figures(summary: Any, file_bytes: int | None = None) -> dict[str, int]:
    """The Graph table's figures; ``file_bytes``: the file's size on disk where there is one (the in-memory
    model's serialized size counts inferred shapes the file does not hold: the demo's table said +4.7 KiB for a
    file 1.3 KB smaller)."""
    size = {"file bytes": file_bytes} if file_bytes is not None else {"size_bytes": summary.serialized_bytes}
    return {"nodes": summary.nodes, "parameters": summary.parameters, "MACs": summary.macs, **size}


def verification_share(errors: Any, rtol: float) -> float | None:
    """How near its bound the worst output came: its max abs error over what it was allowed (<= 1 passes)."""
    worst = max(range(len(errors.per_output)), default=None,
                key=lambda k: errors.per_output[k][0] / errors.allowed(k, rtol))
    return None if worst is None else errors.per_output[worst][0] / errors.allowed(worst, rtol)


def add_optimize(report: Report, records: Sequence[Any], before: Any, after: Any, errors: Any, *,
                 rtol: float, file_bytes: tuple[int, int] | None = None) -> None:
    """optimize-graph's tables: the graph and its ops before and after (``file_bytes``: the input's and the
    output's sizes on disk), each pass (``PassRecord``), and the verification against the original
    (``OutputErrors``; None when skipped)."""
    from npukit.measure.compare import ABS_FLOOR
    from npukit.report.terminal import before_after_table

    report.add("passes", [r.as_dict() for r in records])
    report.add("before", {k: v for k, v in before.as_dict().items() if k != "layers"})
    report.add("after", {k: v for k, v in after.as_dict().items() if k != "layers"})
    report.add("verification", errors.as_dict() if errors else None)
    sizes = file_bytes or (None, None)
    if file_bytes is not None:
        report.add("file_bytes", {"before": file_bytes[0], "after": file_bytes[1]})
    report.tables.append(before_after_table(_figures(before, sizes[0]), _figures(after, sizes[1]), title="Graph"))
    report.tables.append(before_after_table(dict(sorted(before.ops.items())), dict(sorted(after.ops.items())),
                                            title="Ops by type", key_label="op"))
    report.add_table("Passes", ["pass", "rewrites", "nodes before", "nodes after", "ms", "notes"],
                     [[r.name, r.rewrites, r.nodes_before, r.nodes_after, round(r.seconds * 1000, 1),
                       "; ".join(r.notes[:3]) + (f" (+{len(r.notes) - 3} more)" if len(r.notes) > 3 else "")]
                      for r in records])
    if errors is None:
        return
    runtime = (f" + twice ORT's own deviation on the unmodified model (its optimizations on vs off: up to "
               f"{max(errors.runtime_allowance) / 2:.3g}; the rewrites alone, both run without them, are within "
               "the plain tolerance)" if errors.runtime_allowance else "")
    report.add_table(f"Verification against the original (an output passes when its max abs error <= rtol x "
                     f"its max |value| + {ABS_FLOOR:g}{runtime})",
                     ["max abs error", "max rel error", "rtol", "worst output's error / allowed"],
                     [[errors.max_abs, errors.max_rel, rtol, verification_share(errors, rtol)]])


def add_opset_upgrade(report: Report, upgrade: Any) -> None:
    """An opset conversion a verb made before its work (``OpsetUpgrade``), and how it was verified."""
    report.add("opset_upgrade", upgrade.as_dict())
    report.add_table("Opset upgrade (onnx.version_converter, verified)",
                     ["from", "to", "needed for", "checked on", "max abs error", "max rel error"],
                     [[upgrade.from_opset, upgrade.to_opset, upgrade.reason,
                       f"{upgrade.samples} {upgrade.inputs}", upgrade.max_abs_error, upgrade.max_rel_error]])
