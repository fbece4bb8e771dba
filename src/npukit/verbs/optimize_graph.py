"""The optimize-graph verb: npukit's graph passes, each verified, and an optional memory budget."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx_ir as ir

from npukit.config import OptimizeConfig, to_dict
from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish
from npukit.report.progress import step
from npukit.verbs.common import check_output, summary_figures


def optimize_graph(
    model: str | Path,
    output: str | Path,
    *,
    skip_passes: Sequence[str] = (),
    verify: bool = True,
    rtol: float = 1e-4,
    input_shape: str | Sequence[int] | None = None,
    memory_budget: int | None = None,
    html: bool = False,
) -> CommandResult:
    """Run the graph passes on an ONNX model, verify the result against the original, write it to ``output``.

    With ``memory_budget`` (bytes) the model is then restructured so that its peak activation memory fits the budget
    (outputs verified): on ORT CPU, upsamples whose NCHWc form raises the peak are kept in the plain layout; then, if
    needed, the early high-resolution stage is split into spatial tiles with the halo their receptive field needs.

    ``input_shape`` (``InputSpec`` forms) is fixed into the model before the passes run, so the passes, the numeric
    check, the MAC counts and the memory plan all use it, and the output keeps it. ``skip_passes`` takes the names
    the Passes table prints (FoldBatchNormPass) or the registry's (fold_batch_norm)."""
    from npukit.frontend.onnx_io import save_onnx
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.measure.summary import summarize
    from npukit.passes.pipeline import optimize_model, resolve_pass_names, verify_equivalent
    from npukit.report.terminal import before_after_table

    config = OptimizeConfig(skip_passes=resolve_pass_names(skip_passes), verify=verify, rtol=rtol)
    output = check_output(output, source=model)
    spec = InputSpec.parse(input_shape)
    original = load_with_inputs(model, spec, needs="optimize-graph's numeric check (skipped with --no-verify)"
                                if verify else None)
    shape = spec.first if spec else None
    report = Report("optimize-graph", config={"optimize": to_dict(config), "model": str(model),
                                              "input_shape": spec.as_dict() if spec else None})
    with step("running graph passes", timings=report.timings, key="passes"):
        ir_model = ir.serde.deserialize_model(original)
        pipeline = optimize_model(ir_model, config=config)
        optimized = ir.serde.serialize_model(pipeline.model)
    errors = None
    if verify:
        with step("verifying against the original", timings=report.timings, key="verify"):
            errors = verify_equivalent(original, optimized, rtol=rtol, seed=config.seed)
    tiling = None
    if memory_budget is None:
        save_onnx(optimized, output)
    else:  # restructure from a staged copy, so a budget nothing reaches leaves no output behind
        import tempfile

        from npukit.memory.tiling import optimize_for_memory

        with tempfile.TemporaryDirectory(prefix=".npukit-", dir=output.parent) as tmp, \
                step(f"restructuring to fit {memory_budget:,} bytes", timings=report.timings, key="tiling"):
            staged = save_onnx(optimized, Path(tmp) / "optimized.onnx")
            _choice, tiling = optimize_for_memory(staged, output, budget_bytes=memory_budget, input_shape=shape)
    before = summarize(original, input_shape=shape)
    after = summarize(optimized, input_shape=shape)
    report.add("passes", [r.as_dict() for r in pipeline.records])
    report.add("before", {k: v for k, v in before.as_dict().items() if k != "layers"})
    report.add("after", {k: v for k, v in after.as_dict().items() if k != "layers"})
    report.add("verification", errors.as_dict() if errors else None)
    report.tables.append(before_after_table(summary_figures(before), summary_figures(after), title="Graph"))
    report.tables.append(before_after_table(dict(sorted(before.ops.items())), dict(sorted(after.ops.items())),
                                            title="Ops by type", key_label="op"))
    report.add_table("Passes", ["pass", "rewrites", "nodes before", "nodes after", "ms", "notes"],
                     [[r.name, r.rewrites, r.nodes_before, r.nodes_after, round(r.seconds * 1000, 1),
                       "; ".join(r.notes[:3]) + (f" (+{len(r.notes) - 3} more)" if len(r.notes) > 3 else "")]
                      for r in pipeline.records])
    if errors is not None:
        from npukit.measure.compare import ABS_FLOOR

        # the output nearest its bound: abs error against rtol x its max |value| + the float32 floor (<= 1 passes)
        worst = max(range(len(errors.per_output)), default=None,
                    key=lambda k: errors.per_output[k][0] / errors.allowed(k, rtol))
        share = None if worst is None else errors.per_output[worst][0] / errors.allowed(worst, rtol)
        runtime = (f" + twice ORT's own deviation on the unmodified model (its optimizations on vs off: up to "
                   f"{max(errors.runtime_allowance) / 2:.3g}; the rewrites alone, both run without them, are within "
                   "the plain tolerance)" if errors.runtime_allowance else "")
        report.add_table(f"Verification against the original (an output passes when its max abs error <= rtol x "
                         f"its max |value| + {ABS_FLOOR:g}{runtime})",
                         ["max abs error", "max rel error", "rtol", "worst output's error / allowed"],
                         [[errors.max_abs, errors.max_rel, rtol, share]])
    nodes = f"{before.nodes} -> {after.nodes} nodes"
    if errors is None:
        report.set_verdict(f"UNVERIFIED optimize-graph: {nodes}, numeric check skipped (--no-verify)", passed=True)
    else:
        report.set_verdict(f"PASS optimize-graph: {nodes}, every output within its tolerance of the original's "
                           f"(max abs error {errors.max_abs:.3g}, worst output at {share or 0:.2f} of its allowance"
                           + ("; the allowance includes ORT's own deviation on the unmodified model"
                              if errors.runtime_allowance else "") + ")", passed=True)
    if tiling is not None:
        report.add("tiling", tiling.sections)
        report.tables.extend(tiling.tables)
        report.config["memory_budget"] = memory_budget
    return finish(report, output, html=html, result=pipeline)
