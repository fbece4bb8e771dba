"""The quantization plan in a report: what the model's tensors became, which steps decided them, what stays float."""

from __future__ import annotations

from typing import Any

from npukit.report.core import Report


def add_plan(report: Report, summary: dict[str, Any], *, of: str = "") -> None:
    """One table of the plan's ``QuantPlan.summary()`` (as emitted): per step, the tensors it decided last; the
    dtypes and granularities in the title; and a line per float node with the step that kept it. ``of``: whose
    plan, where it is not the artifact's."""
    dtypes = ", ".join(f"{n} {d}" for d, n in summary["dtypes"].items())
    scheme = summary["scheme"]
    whose = f" for {of}" if of else ""
    title = (f"Quantization plan as emitted{whose} ({summary['tensors']} tensors: {dtypes}; weights "
             f"{'per channel' if scheme['per_channel'] else 'per tensor'}"
             f"{', 7-bit unless said otherwise' if scheme['reduce_range'] else ''})")
    rows = [[step, f"{n} tensors", summary["decisions_by_step"].get(step, n)]
            for step, n in summary["decided_last_by"].items()]
    kept: dict[str, list[str]] = {}
    for node, history in summary["float_nodes"].items():
        kept.setdefault(history[-1], []).append(node)
    rows += [[why.split(": ", 1)[0], f"{len(nodes)} nodes left in float", why.split(": ", 1)[-1]]
             for why, nodes in kept.items()]
    report.add_table(title, ["step", "decided last", "decisions it made (or why)"], rows)
    wrong = summary.get("not_as_planned") or []
    if wrong:
        report.add_table("Tensors the emitter did not quantize as planned (planned -> emitted)", ["tensor"],
                         [[w] for w in wrong])
