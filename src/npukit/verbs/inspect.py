"""The inspect verb: what a model holds (ops, parameters, MACs, largest tensors)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish


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
