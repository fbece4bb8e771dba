"""The plan-memory verb: tensor lifetimes, buffer plans and the peak as a target runs the graph."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from npukit.report.finish import CommandResult, finish


def plan_memory(
    model: str | Path,
    *,
    target: str = "cpu",
    input_shape: str | Sequence[int] | None = None,
    order_search: bool = True,
    runtime_graph: bool = True,
    report_path: str | Path | None = None,
    html: bool = False,
) -> CommandResult:
    """Tensor lifetimes, every planner's arena (checked by the no-overlap invariant), the live bytes per layer and the
    memory timeline, on the graph as ``target`` executes it (fused activations, in-place ops, activation dtype).
    For target "cpu" that graph is read from ORT and ORT's own allocation is replayed on it, unless
    ``runtime_graph`` is False (the rule-based view of the exported graph)."""
    from npukit.memory.plan import plan_memory as _plan
    from npukit.report.memory import memory_report
    from npukit.verbs.common import check_report_path

    report_path = check_report_path(report_path)
    result = _plan(model, target=target, input_shape=input_shape, order_search=order_search,
                   runtime_graph=runtime_graph)
    report = memory_report(result)
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=html, json_path=json_path, result=result, source=model)
