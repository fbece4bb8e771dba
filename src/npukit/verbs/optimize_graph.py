"""The optimize-graph verb: npukit's graph passes, each verified, and an optional memory budget."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from npukit.config import OptimizeConfig, to_dict
from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish
from npukit.report.graph import add_optimize, verification_share
from npukit.report.memory import add_memory_restructure
from npukit.report.progress import step
from npukit.verbs.common import check_output, summary_of


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
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.measure.size import model_size
    from npukit.passes.pipeline import resolve_pass_names, verify_equivalent

    config = OptimizeConfig(skip_passes=resolve_pass_names(skip_passes), verify=verify, rtol=rtol)
    output = check_output(output, source=model)
    spec = InputSpec.parse(input_shape)
    original = load_with_inputs(model, spec, needs="optimize-graph's numeric check (skipped with --no-verify)"
                                if verify else None)
    shape = spec.first if spec else None
    report = Report("optimize-graph", config={"optimize": to_dict(config), "model": str(model),
                                              "input_shape": spec.as_dict() if spec else None})
    pipeline, optimized = _run_passes(report, original, config)
    errors = None
    if verify:
        with step("verifying against the original", timings=report.timings, key="verify"):
            errors = verify_equivalent(original, optimized, rtol=rtol, seed=config.seed)
    restructured = _write(report, optimized, output, memory_budget=memory_budget, shape=shape)
    before = summary_of(original, input_shape=shape)
    # the tables and the headline describe the model written: the restructured one under a budget
    after = summary_of(optimized if restructured is None else restructured.model, input_shape=shape)
    add_optimize(report, pipeline.records, before, after, errors, rtol=rtol,
                 file_bytes=(model_size(model).file_bytes, model_size(output).file_bytes))
    _set_verdict(report, before, after, errors, restructured, memory_budget=memory_budget, rtol=rtol)
    if restructured is not None:
        add_memory_restructure(report, restructured)
        report.config["memory_budget"] = memory_budget
    return finish(report, output, html=html, result=pipeline)


def _run_passes(report: Report, original: onnx.ModelProto, config: OptimizeConfig) -> tuple[Any, onnx.ModelProto]:
    """The graph passes run on ``original`` (in onnx_ir); the pipeline's result and the optimized model."""
    from npukit.passes.pipeline import optimize_model

    with step("running graph passes", timings=report.timings, key="passes"):
        ir_model = ir.serde.deserialize_model(original)
        pipeline = optimize_model(ir_model, config=config)
        optimized = ir.serde.serialize_model(pipeline.model)
    return pipeline, optimized


def _write(report: Report, optimized: onnx.ModelProto, output: Path, *, memory_budget: int | None,
           shape: Sequence[int] | None) -> Any:
    """``optimized`` written to ``output``; under a ``memory_budget``, restructured to fit it first (returned) from a
    staged copy, so a budget nothing reaches leaves no output behind."""
    from npukit.frontend.onnx_io import save_onnx

    if memory_budget is None:
        save_onnx(optimized, output)
        return None
    import tempfile

    from npukit.memory.tiling import optimize_for_memory

    output.parent.mkdir(parents=True, exist_ok=True)  # a new folder: the CLI removes it if this fails
    with tempfile.TemporaryDirectory(prefix=".npukit-", dir=output.parent) as tmp, \
            step(f"restructuring to fit {memory_budget:,} bytes", timings=report.timings, key="tiling"):
        staged = save_onnx(optimized, Path(tmp) / "optimized.onnx")
        return optimize_for_memory(staged, output, budget_bytes=memory_budget, input_shape=shape)


def _set_verdict(report: Report, before: Any, after: Any, errors: Any, restructured: Any, *,
                 memory_budget: int | None, rtol: float) -> None:
    """The verdict: the node counts (and the peak under a budget), verified within tolerance or left unverified."""
    nodes = f"{before.nodes} -> {after.nodes} nodes"
    if restructured is not None:
        nodes += (f"; peak activation memory {restructured.peak_before:,} -> {restructured.peak_after:,} bytes, "
                  f"within the budget of {memory_budget:,}")
    if errors is None:
        report.set_verdict(f"UNVERIFIED optimize-graph: {nodes}, numeric check skipped (--no-verify)", passed=True)
    else:
        share = verification_share(errors, rtol)
        report.set_verdict(f"PASS optimize-graph: {nodes}, every output within its tolerance of the original's "
                           f"(max abs error {errors.max_abs:.3g}, worst output at {share or 0:.2g} of its allowance"
                           + ("; the allowance includes ORT's own deviation on the unmodified model"
                              if errors.runtime_allowance else "") + ")", passed=True)
