"""analyze's report: operator support and delegation per target, the nodes each leaves to the CPU or computes
wrongly, the share of MACs delegated, and with --fix what each target's fixes did and where the fixed models went."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from npukit.report.core import Report, Table


def analyze_report(outcome: Any, written: Mapping[str, Path]) -> Report:
    """The report of a ``npukit.targets.api.ModelAnalysis``; ``written``: target -> the fixed model written for it."""
    analyses = list(outcome.analyses)
    report = Report("analyze", config={"targets": [p.name for p in outcome.profiles], "fix": outcome.fix,
                                       "input_shape": list(outcome.input_shape) if outcome.input_shape else None})
    for target, path in written.items():
        report.add_artifact(f"fixed_model[{target}]", path)
    for table in target_tables(analyses, fixed=outcome.fix):
        report.tables.append(table)
    for a in analyses:
        rows = [[v.name, v.op_type, "; ".join(v.reasons) or "-", v.fix or "-"] for v in a.unsupported]
        if rows:
            report.add_table(f"Nodes left to the CPU on {a.target}", ["node", "op", "why", "fix"], rows)
        wrong = [[v.name, v.op_type, "; ".join(v.warnings), v.fix or "-"] for v in a.inaccurate]
        if wrong:
            report.add_table(f"Nodes {a.target} takes but computes wrongly", ["node", "op", "why", "fix"], wrong)
        if a.notes:  # what the counts above leave out (nodes the layout transform cancels, ...): in the JSON only
            report.add_table(f"Notes on {a.target}", ["note"], [[note] for note in a.notes])
        if a.problem():
            report.add(f"problem[{a.target}]", {"message": a.problem(), "hint": a.hint()})
    known = [a for a in analyses if a.mac_share is not None]
    if known:  # a share unknown (symbolic shapes) is not drawn as 0%
        report.add_figure("Share of MACs delegated", "bar",
                          {"labels": [a.target for a in known], "values": [round(100 * a.mac_share, 2) for a in known]},
                          x_label="target", y_label="% of MACs")
    report.add("profiles", [p.as_dict() for p in outcome.profiles])
    report.add("analyses", [a.as_dict() for a in analyses])
    if outcome.fix:
        report.add("fixes", {name: r.as_dict() for name, r in outcome.fixes.items()})
        waiting = [a.target for a in analyses if not outcome.fixes[a.target].changed
                   and any(v.fix == "fix_input_shape" for v in a.nodes)]
        _add_fixes(report, outcome.fixes, written, waiting=waiting)
    return report


def _add_fixes(report: Report, fixes: Mapping[str, Any], written: Mapping[str, Path], *,
               waiting: Sequence[str] = ()) -> None:
    """What --fix did per target, its check, and where each fixed model went; the verdict says it first."""
    rows = []
    for target, result in fixes.items():
        done = [f"{a['fix']} x{a['rewrites']}" for a in result.applied if a["rewrites"]]
        check = "-" if result.errors is None else f"max abs error {result.errors.max_abs:.3g}, within tolerance"
        rows.append([target, ", ".join(done) or "nothing to fix", check, str(written.get(target, "not written"))])
    report.add_table("Fixes applied (--fix), each fixed model checked against the original on the same inputs",
                     ["target", "fixes", "check", "written to"], rows)
    changed = [t for t, r in fixes.items() if r.changed]
    checked = [fixes[t].errors.max_abs for t in changed if fixes[t].errors is not None]
    if changed:
        check = (f"every fixed model within its tolerance of the original (max abs error {max(checked):.3g})"
                 if checked else "no rewrite changed the model")
        report.set_verdict(f"PASS analyze --fix: fixed for {', '.join(changed)}, {check}", passed=True)
    else:
        copies = [str(p) for p in written.values()]
        report.set_verdict(f"INFO analyze --fix: nothing to fix for {', '.join(fixes)}; the analysis only"
                           + (f" ({', '.join(copies)}: the model as given)" if copies else "")
                           + (f"; {', '.join(waiting)} would take more with the input shape fixed: pass --input-shape"
                              if waiting else ""), passed=True)


def _cell(verdicts: list[Any], needs_quant: bool) -> str:
    taken = sum(1 for v in verdicts if v.partition is not None)
    if taken == len(verdicts):
        text = "yes"
    else:
        first = next((v.reasons[0] for v in verdicts if v.partition is None and v.reasons), "")
        fix = next((v.fix for v in verdicts if v.fix), None)
        text = ("no" if taken == 0 else f"{taken}/{len(verdicts)}") + (f": {first}" if first else "")
        if fix:
            text += f" [fix: {fix}]"
    wrong = [v for v in verdicts if v.warnings]
    if wrong:
        fixes = ", ".join(sorted({v.fix for v in wrong if v.fix}))
        text += f"; {len(wrong)} computed wrongly" + (f" [fix: {fixes}]" if fixes else "")
    return text + (" (after quantization)" if needs_quant and taken else "")


def target_tables(analyses: Sequence[Any], *, fixed: bool = False) -> list[Table]:
    """Side-by-side tables for analyses of one model (``fixed``: each after its own target's fixes): op support per
    target, and a delegation summary."""
    if not analyses:
        return []
    # Grouped by op type per analysis: a target whose runtime optimizes the graph first (ORT's basic level) sees
    # fewer nodes, numbered afresh, than one that takes the model as given; with --fix each target's model is its
    # own. A count that differs between targets is said in each target's cell.
    per_target = [collections.Counter(v.op_type for v in a.nodes) for a in analyses]
    counts: dict[str, int] = {}
    for counted in per_target:
        for op, n in counted.items():
            counts[op] = max(counts.get(op, 0), n)
    absent = ("none in the model analysed for this target (each target's fixes make its own)" if fixed else
              "none: removed by the runtime's graph optimizations")
    op_rows = []
    for op, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        row: list[Any] = [op, count]
        differs = len({counted.get(op, 0) for counted in per_target}) > 1
        for a, counted in zip(analyses, per_target):
            verdicts = [v for v in a.nodes if v.op_type == op]
            cell = _cell(verdicts, a.needs_quantization) if verdicts else absent
            row.append(f"x{counted[op]}: {cell}" if differs and verdicts else cell)
        op_rows.append(row)
    summary_rows = []
    for a in analyses:
        share = a.mac_share
        summary_rows.append([
            a.target, f"{a.delegated_nodes}/{len(a.nodes)}", len(a.partitions), a.transitions,
            ("unknown" if a.macs_unknown else "n/a") if share is None else f"{100 * share:.1f}%",
            "yes" if a.needs_quantization else "no",
            ", ".join(sorted({v.fix for v in a.nodes if v.fix})) or "-",
        ])
    return [
        Table("Operator support by target", ["op", "count", *[a.target for a in analyses]], op_rows),
        Table("Delegation by target", ["target", "nodes delegated", "partitions", "delegate<->fallback transitions",
                                       "MACs delegated", "needs quantization", "fixes available"], summary_rows),
    ]
