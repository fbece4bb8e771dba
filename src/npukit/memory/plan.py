"""plan-memory: lifetimes on the graph a target executes, a better order where one lowers the peak, every planner's
offsets (each checked), as one ``MemoryResult`` (``npukit.report.memory`` presents it: planners against the lower
bound, live bytes per layer, a memory timeline).

For target "cpu" the graph is the one ONNX Runtime CPU really executes, read back from ORT (its NCHWc layout, fused
kernels, padded channels; :mod:`npukit.memory.ort_cpu`), and ORT's own allocation planner is replayed on it: its peak
is what the device needs (``runtime_peak``), next to what npukit's planners would need for the same graph."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from npukit.memory.lifetimes import Lifetimes, lifetimes_of
from npukit.memory.order import OrderResult, search_order
from npukit.memory.planners import MemoryPlan, all_plans, best_plan
from npukit.memory.runtime_view import apply_view, get_view


@dataclasses.dataclass(frozen=True)
class MemoryResult:
    """``lifetimes`` are those of ``target``'s view in the order kept (``order`` says how it was found, None when
    the search was off); ``plans`` holds every planner's checked plan and ``best`` the smallest.
    ``unfused_lower_bound`` is the lower bound of the exported graph in its own order, for comparison."""

    model: str
    target: str
    lifetimes: Lifetimes
    plans: dict[str, MemoryPlan]
    best: MemoryPlan
    lower_bound: int
    unfused_lower_bound: int
    order: OrderResult | None
    runtime_peak: int | None = None
    runtime_allocator: str = ""
    description: str = ""  # the graph planned, in words (the view's, or the graph ORT executes)
    # the bound ORT's replayed peak is compared with: the peak live bytes in the order ORT runs (the replay's order,
    # not the searched one) less the graph inputs, counted as the replay counts them; the replay never goes below it
    runtime_lower_bound: int | None = None
    input_shape: dict[str, Any] | None = None  # the shapes fixed into the model first (InputSpec.as_dict)

    @property
    def naive_bytes(self) -> int:
        return self.plans["naive"].arena_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "target": self.target, "lower_bound_bytes": self.lower_bound,
            "unfused_lower_bound_bytes": self.unfused_lower_bound, "best_algorithm": self.best.algorithm,
            "best_arena_bytes": self.best.arena_bytes,
            "plans": {name: plan.arena_bytes for name, plan in self.plans.items()},
            "runtime_peak_bytes": self.runtime_peak, "runtime_allocator": self.runtime_allocator or None,
            "runtime_lower_bound_bytes": self.runtime_lower_bound,
            "order_search": None if self.order is None else {
                "improved": self.order.improved, "peak_bytes": self.order.peak_bytes,
                "original_peak_bytes": self.order.original_peak_bytes,
                "exact_regions": self.order.exact_regions, "heuristic_regions": self.order.heuristic_regions},
            "steps": [dataclasses.asdict(s) for s in self.lifetimes.steps],
            "offsets": dict(self.best.offsets),
        }


def plan_memory(
    model_path: str | Path,
    *,
    target: str = "cpu",
    input_shape: str | Sequence[int] | None = None,
    order_search: bool = True,
    runtime_graph: bool = True,
) -> MemoryResult:
    """Plan the activation memory of the ONNX model at ``model_path`` as ``target`` executes it.

    ``input_shape`` (``InputSpec`` forms) is fixed into the model first; a model left with symbolic dimensions other
    than the batch (planned as 1) is an InputError naming them.
    ``runtime_graph``: for target "cpu", plan on the graph ORT CPU executes, read from ORT, and replay ORT's own
    allocation (default); False applies the rule-based "cpu" view to the exported graph instead (no ORT needed)."""
    from npukit.frontend.onnx_io import save_onnx
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.memory.graph import load_tensor_graph
    from npukit.memory.ort_cpu import without_graph_inputs

    execution = get_view(target)  # an unknown target fails before the model is read
    spec = InputSpec.parse(input_shape)
    proto = load_with_inputs(model_path, spec, needs="plan-memory")
    exported = load_tensor_graph(proto)
    runtime_peak, allocator, description = None, "", execution.description
    if execution.name == "cpu" and runtime_graph:
        from npukit.memory.ort_cpu import ort_allocation, ort_executed_graph

        with tempfile.TemporaryDirectory(prefix="npukit-plan-") as tmp:  # ORT reads the model with shapes fixed
            executed = ort_executed_graph(model_path if spec is None else save_onnx(proto, Path(tmp) / "model.onnx"))
        graph = executed.graph
        runtime_peak = ort_allocation(executed).peak_bytes
        allocator = "ORT CPU's allocation planner, replayed (same-shape reuse; inputs excluded)"
        description = (f"the graph ORT CPU executes, read from ORT at optimization level {executed.optimization} "
                       f"({len(graph.nodes)} nodes, {executed.layout_ops} in the NCHWc layout)")
    else:
        graph = apply_view(exported, execution)
    order = search_order(graph) if order_search else None
    lifetimes = lifetimes_of(graph, order=None if order is None else order.order, view=execution.name)
    plans = all_plans(lifetimes)
    result = MemoryResult(
        model=str(model_path), target=execution.name, lifetimes=lifetimes, plans=plans,
        best=best_plan(lifetimes, plans.values()), lower_bound=lifetimes.peak_bytes,
        unfused_lower_bound=lifetimes_of(exported).peak_bytes, order=order,
        runtime_peak=runtime_peak, runtime_allocator=allocator, description=description,
        runtime_lower_bound=None if runtime_peak is None else without_graph_inputs(lifetimes_of(graph)).peak_bytes,
        input_shape=None if spec is None else spec.as_dict(),
    )
    return result
