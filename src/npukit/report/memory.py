"""The tables and figures of memory planning: plan-memory's planners against the lower bound, execution order, live
bytes per layer and memory timeline (``memory_report``), and optimize-graph --memory-budget's restructuring
(``add_memory_restructure``)."""

from __future__ import annotations

from typing import Any

from npukit.report.core import Report


def _ratio(value: int, bound: int) -> str:
    return f"{value / bound:.3f}x" if bound else "—"


def memory_report(result: Any) -> Report:
    """plan-memory's report of a ``npukit.memory.plan.MemoryResult``."""
    report = Report("plan-memory", config={"model": result.model, "target": result.target,
                                           "input_shape": result.input_shape,
                                           "order_search": result.order is not None})
    report.add("memory", result.as_dict())
    bound = result.lower_bound
    runtime = f"; ORT CPU's own plan {result.runtime_peak:,} B" if result.runtime_peak is not None else ""
    report.set_verdict(f"INFO plan-memory: activation arena {result.best.arena_bytes:,} B ({result.best.algorithm}, "
                       f"lower bound {bound:,} B){runtime}; a plan, nothing was checked", passed=True)
    report.add_table(
        f"Memory plans ({result.target}: {result.description})",
        ["planner", "arena_bytes", "vs lower bound"],
        [*([name, plan.arena_bytes, _ratio(plan.arena_bytes, bound)] for name, plan in result.plans.items()),
         ["lower bound (target view)", bound, "1.000x"],
         ["lower bound (exported graph, unfused)", result.unfused_lower_bound,
          _ratio(result.unfused_lower_bound, bound)],
         *([[result.runtime_allocator, result.runtime_peak,
             f"{_ratio(result.runtime_peak, result.runtime_lower_bound)} of the bound in ORT's order without the "
             f"inputs (that bound: {result.runtime_lower_bound:,} B)"]]
           if result.runtime_peak is not None else [])],
    )
    if result.runtime_peak is not None:
        report.add("device_peak_bytes", result.runtime_peak)
    if result.order is not None:
        report.add_table("Execution order", ["order", "peak_bytes", "exact regions", "heuristic regions"],
                         [["graph order", result.order.original_peak_bytes, "", ""],
                          ["kept" + (" (searched, lower)" if result.order.improved else " (graph order)"),
                           result.order.peak_bytes, result.order.exact_regions, result.order.heuristic_regions]])
    report.add_table("Live bytes per layer", ["step", "node", "op", "live_bytes", "new_bytes"],
                     [[s.step, s.node, s.op, s.live_bytes, s.new_bytes] for s in result.lifetimes.steps])
    items = [{"label": t.name, "start": t.start, "end": t.end, "offset": result.best.offsets[t.name], "size": t.size}
             for t in result.lifetimes.tensors if t.size]
    report.add_figure(f"Memory timeline ({result.best.algorithm}, {result.target})", "timeline",
                      {"items": items, "peak": result.best.arena_bytes}, x_label="step", y_label="offset")
    return report


def add_memory_restructure(report: Report, done: Any) -> None:
    """What optimize-graph --memory-budget did (a ``npukit.memory.tiling.MemoryRestructure``): each step's peaks
    before and after and its MAC overhead, and the tiling candidates planned."""
    report.add("memory_restructure", done.as_dict())
    layout, tiling = done.layout, done.tiling
    steps = []
    if layout is not None:
        steps.append(["layout: keep plain " + ", ".join(layout.planar), layout.predicted_peak_before,
                      layout.predicted_peak_after, "0.0%"])
    if tiling is not None:
        steps.append([f"tiling: {tiling.tiles[0]}x{tiling.tiles[1]} tiles, cut {tiling.cut}",
                      tiling.planned_peak_before, tiling.planned_peak_after, f"{tiling.mac_overhead:.1%}"])
    if not steps:
        steps.append(["none needed: the model already fits", done.peak_before, done.peak_after, "0.0%"])
    report.add_table(f"Restructuring for memory (budget {done.budget_bytes} bytes; peaks: {done.predictor}; "
                     f"max rel error {done.max_rel_error:.2g})", ["step", "peak before", "peak after", "MAC overhead"],
                     steps)
    if tiling is not None:
        report.add_table("Tiling candidates planned", ["cut", "tiles", "peak", "MAC overhead"],
                         [[c.cut, f"{c.tiles[0]}x{c.tiles[1]}", c.planned_peak_bytes, f"{c.mac_overhead:.1%}"]
                          for c in tiling.candidates])
