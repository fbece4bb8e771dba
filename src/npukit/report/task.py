"""Tables for a task check: the task and why, its metrics, every output's fidelity, and the verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from npukit.report.core import Report
from npukit.tasks import QualityGate, TaskChoice, TaskResult, Verdict


def add_task_check(report: Report, choice: TaskChoice, result: TaskResult, gate: QualityGate, verdict: Verdict, *,
                   where: str, against: str = "the float model") -> None:
    """Add the task check of ``result`` (measured on ``where``, e.g. "12 held-out samples of photos/", against the
    reference ``against`` names) to ``report``: its JSON section, two tables, and the verdict line that starts the
    report."""
    report.add("task_check", {"choice": choice.as_dict(), "result": result.as_dict(), "gate": gate.as_dict(),
                              "verdict": verdict.as_dict(), "where": where, "against": against})
    rows = [["task", f"{choice.name} ({choice.reason})"], ["checked on", where],
            [result.metric + " (headline)", result.value if result.value is not None else f"undefined: {result.note}"]]
    rows += [[k, v] for k, v in result.metrics.items() if k != result.metric and not isinstance(v, dict)]
    report.add_table(f"Task check: the artifact against {against}", ["metric", "value"], rows)
    report.add_table(f"Every output against {against}",
                     ["output", "shape", "decoded by the task", "SQNR dB", "cosine", "max abs error",
                      "reference max |value|"],
                     [[o.name, "x".join(map(str, o.shape)), o.name in result.decoded, o.sqnr_db, o.cosine,
                       o.max_abs_error, o.reference_max_abs] for o in result.outputs])
    if result.at_detections:
        report.add_table("Outputs read only at the detections, measured there (what the SQNR floor holds)",
                         ["output", "rows", "SQNR dB", "cosine", "max abs error", "reference max |value|"],
                         [[o.name, o.shape[0], o.sqnr_db, o.cosine, o.max_abs_error, o.reference_max_abs]
                          for o in result.at_detections])
    report.set_verdict(verdict.line, passed=verdict.passed)


def add_rolled_check(report: Report, rolled: Any, result: TaskResult, held: Sequence[str]) -> None:
    """The check of a recurrent model with each model fed its own state (``measure.recurrent.RolledCheck``) beside
    the one-step figures of ``result``: its JSON section and a table (``held``: the outputs held to the SQNR
    floor)."""
    report.add("recurrent_check", rolled.as_dict())
    one_step = {o.name: o.sqnr_db for o in result.outputs}
    fed = {o: i for i, o in rolled.pairs}
    report.add_table(f"Recurrent state: each model fed its own state back over {rolled.steps} samples in order "
                     "(as it runs in use; the check above gives both the data's state each sample)",
                     ["output", "fed back as", "held to the SQNR floor", "SQNR dB, state fed back",
                      "SQNR dB, one step", "max abs error", "reference max |value|"],
                     [[o.name, fed.get(o.name, ""), o.name in held, o.sqnr_db, one_step.get(o.name),
                       o.max_abs_error, o.reference_max_abs] for o in rolled.outputs])
