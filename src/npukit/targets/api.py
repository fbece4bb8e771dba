"""``analyze`` as one function for the CLI: load a model, analyze it for several targets, optionally fix it, and
build the report (tables, a bar figure of delegated MAC share per target, the analyses as JSON)."""

from __future__ import annotations

from pathlib import Path

import onnx

from npukit.errors import InputError
from npukit.report.core import Report
from npukit.targets.fix import FixResult, apply_fixes
from npukit.targets.partition import Analysis, analyze, tables
from npukit.targets.registry import get_target


def analyze_model(
    model_path: str | Path | onnx.ModelProto,
    targets: list[str],
    *,
    input_shape: tuple[int, ...] | None = None,
    fix: bool = False,
    output: str | Path | None = None,
) -> tuple[list[Analysis], Report]:
    """Analyze the model for each target (after the target's fixes when ``fix``), and report.

    With ``fix`` and ``output`` the fixed model of each target is written to ``output`` (one target) or to
    ``<stem>.<target><suffix>`` beside it (several). Raises InputError for an unknown target, no targets, or when no
    target takes any node of the model (the message names the ops and what to do).
    """
    from npukit.frontend.onnx_io import load_onnx, save_onnx

    if not targets:
        raise InputError("no target given", hint="pass --target, e.g. --target qnn-htp")
    profiles = [get_target(t) for t in targets]
    model = model_path if isinstance(model_path, onnx.ModelProto) else load_onnx(model_path)
    report = Report("analyze", config={"targets": [p.name for p in profiles], "fix": fix,
                                       "input_shape": list(input_shape) if input_shape else None})
    analyses: list[Analysis] = []
    fixes: dict[str, FixResult] = {}
    for profile in profiles:
        candidate = model
        if fix:
            result = apply_fixes(model, profile, input_shape=input_shape)
            fixes[profile.name] = result
            candidate = result.model
            if output is not None and (len(profiles) == 1 or result.changed):  # several targets: those it changed
                path = Path(output)
                if len(profiles) > 1:
                    path = path.with_name(f"{path.stem}.{profile.name.replace('@', '_')}{path.suffix or '.onnx'}")
                save_onnx(candidate, path)
                report.add_artifact(f"fixed_model[{profile.name}]", path)
        shape = input_shape if not fix else None  # a fixed model already carries the input shape
        analyses.append(analyze(candidate, profile, input_shape=shape))

    failed = [a for a in analyses if a.problem()]
    if failed and len(failed) == len(analyses):
        a = failed[0]
        raise InputError("; ".join(f.problem() for f in failed), hint=a.hint())  # type: ignore[misc]

    for table in tables(analyses):
        report.tables.append(table)
    for a in analyses:
        rows = [[v.name, v.op_type, "; ".join(v.reasons) or "-", v.fix or "-"] for v in a.unsupported]
        if rows:
            report.add_table(f"Nodes left to the CPU on {a.target}", ["node", "op", "why", "fix"], rows)
        wrong = [[v.name, v.op_type, "; ".join(v.warnings), v.fix or "-"] for v in a.inaccurate]
        if wrong:
            report.add_table(f"Nodes {a.target} takes but computes wrongly", ["node", "op", "why", "fix"], wrong)
        if a.problem():
            report.add(f"problem[{a.target}]", {"message": a.problem(), "hint": a.hint()})
    report.add_figure("Share of MACs delegated", "bar",
                      {"labels": [a.target for a in analyses],
                       "values": [round(100 * (a.mac_share or 0.0), 2) for a in analyses]},
                      x_label="target", y_label="% of MACs")
    report.add("profiles", [p.as_dict() for p in profiles])
    report.add("analyses", [a.as_dict() for a in analyses])
    if fix:
        report.add("fixes", {name: r.as_dict() for name, r in fixes.items()})
        _add_fixes(report, fixes)
    return analyses, report


def _add_fixes(report: Report, fixes: dict[str, FixResult]) -> None:
    """What --fix did per target, its check, and where each fixed model went; the verdict says it first."""
    written = {k[len("fixed_model["):-1]: v for k, v in report.artifacts.items() if k.startswith("fixed_model[")}
    rows = []
    for target, result in fixes.items():
        done = [f"{a['fix']} x{a['rewrites']}" for a in result.applied if a["rewrites"]]
        check = "-" if result.errors is None else f"max abs error {result.errors.max_abs:.3g}, within tolerance"
        rows.append([target, ", ".join(done) or "nothing to fix", check, str(written.get(target, "not written"))])
    report.add_table("Fixes applied (--fix), each fixed model checked against the original on the same inputs",
                     ["target", "fixes", "check", "written to"], rows)
    changed = [t for t, r in fixes.items() if r.changed]
    checked = [fixes[t].errors.max_abs for t in changed if fixes[t].errors is not None]  # type: ignore[union-attr]
    if changed:
        check = (f"every fixed model within its tolerance of the original (max abs error {max(checked):.3g})"
                 if checked else "no rewrite changed the model")
        report.set_verdict(f"PASS analyze --fix: fixed for {', '.join(changed)}, {check}", passed=True)
    else:
        copies = [str(p) for p in written.values()]
        report.set_verdict(f"INFO analyze --fix: nothing to fix for {', '.join(fixes)}; the analysis only"
                           + (f" ({', '.join(copies)}: the model as given)" if copies else ""), passed=True)
