"""The inspect verb: what a model holds (ops, parameters, MACs, largest tensors)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish
from npukit.report.graph import add_summary, macs_shown


def inspect(model: str | Path, *, input_shape: str | Sequence[int] | None = None, top_layers: int = 15,
            report_path: str | Path | None = None) -> CommandResult:
    """Summarize an ONNX model: ops by type, parameters, MACs per layer and in total, the largest tensors; with
    ``report_path`` (the CLI's ``--json``) the summary is also written there as a JSON report.

    ``input_shape`` (``InputSpec`` forms) is fixed into the model first. A symbolic batch counts as 1; when other
    symbolic dimensions leave conv/matmul layers without shapes, the total is shown as unknown (the JSON keeps the
    partial sum with ``unknown_mac_layers``) rather than a number that leaves them out. Where the inputs are static
    but the graph computes sizes shape inference cannot follow, the model is run once on seeded inputs for them."""
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.verbs.common import check_report_path, given_file_bytes, summary_of

    report_path = check_report_path(report_path)
    spec = InputSpec.parse(input_shape)
    proto = load_with_inputs(model, spec)
    summary = summary_of(proto)
    report = Report("inspect", config={"model": str(model), "input_shape": spec.as_dict() if spec else None})
    add_summary(report, summary, top_layers=top_layers, file_bytes=given_file_bytes(model))
    macs = macs_shown(summary)
    branches = (f"; its control flow's branches hold {summary.branch_nodes} more nodes and "
                f"{summary.branch_parameters:,} parameters, not counted in the MACs (one branch runs per call)"
                if summary.branch_nodes else "")
    report.set_verdict(f"INFO inspect: {summary.nodes} nodes, {summary.parameters:,} parameters, "
                       f"{macs if isinstance(macs, str) else f'{macs:,}'} MACs{branches}; nothing was checked",
                       passed=True)
    return finish(report, None, html=False, json_path=Path(report_path) if report_path else None, result=summary,
                  source=model)
