"""The qat report: the training (each epoch's loss, agreement with the float model, bits, time), how far the exported
model is from the training simulation, and the PTQ and QAT models of the same bits side by side."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from npukit.report.core import Report
from npukit.report.quantize import KERNEL_COLUMNS, kernel_row


def rounded(value: Any, digits: int = 4) -> Any:
    """A finite float rounded for a table; anything else as it is."""
    return round(value, digits) if isinstance(value, float) and math.isfinite(value) else value


def add_training(report: Report, trained: Any, *, bits: bool = True) -> None:
    """Each epoch's loss and agreement (training and validation samples), the weight bits (``bits``: quantized
    weights), and which epoch was kept."""
    report.add("training", {"history": [e.as_dict() for e in trained.history], "steps": trained.steps,
                            "resumed_from_epoch": trained.resumed_from, "processes": trained.world_size,
                            "seconds": trained.seconds, "kept_epoch": trained.kept,
                            "start": trained.start.as_dict() if trained.start else None,
                            "lowered": list(trained.lowered)})
    resumed = f"; resumed after epoch {trained.resumed_from}" if trained.resumed_from else ""
    unmoved = validation_unmoved(trained)
    kept = (f"the start: {unmoved}" if unmoved else
            "the start (no epoch did better on the validation samples)" if trained.kept == 0 else
            f"epoch {trained.kept}" if trained.start is not None else
            f"epoch {trained.kept}, the last: no validation samples to choose on (every tenth training sample "
            "validates; fewer than 10 were given), so it may be worse than the start")
    rows = [[0, None, None, trained.start.metric, trained.start.bits, None, rounded(trained.start.validation_loss),
             rounded(trained.start.validation_agreement), "kept" if trained.kept == 0 else "start"]] if trained.start \
        else []
    rows += [[e.epoch, rounded(e.loss), rounded(e.agreement), e.metric, e.bits, rounded(e.seconds, 1),
              rounded(e.validation_loss), rounded(e.validation_agreement), "kept" if e.epoch == trained.kept else ""]
             for e in trained.history]
    measure = "SQNR dB" if trained.history and all(e.metric == "SQNR dB" for e in trained.history) else "agreement"
    columns = ["epoch", "loss (training)", f"{measure} (training)", "measure", "weight bits", "s",
               "loss (validation)", f"{measure} (validation)", ""]
    if not bits:  # float weights: no bits to show
        columns.pop(4)
        rows = [row[:4] + row[5:] for row in rows]
    if trained.history and trained.history[0].share is not None:  # a substitution blended in: its share
        columns.insert(1, "substitute's share")
        shares = ([trained.start.share] if trained.start else []) + [e.share for e in trained.history]
        rows = [[row[0], rounded(share, 2)] + row[1:] for row, share in zip(rows, shares)]
    report.add_table(f"Training ({trained.steps} steps on {trained.world_size} process(es), "
                     f"{trained.seconds:.0f} s in this run{resumed}; kept: {kept})", columns, rows)
    if trained.history:  # one epoch is one point, which the chart marks (a line needs two)
        report.add_figure("Training loss per epoch", "line",
                          {"series": {"loss": {"x": [e.epoch for e in trained.history],
                                               "y": [e.loss for e in trained.history]}}},
                          x_label="epoch", y_label="loss")


def validation_unmoved(trained: Any) -> str | None:
    """Why training could not be judged, when the start was kept because the validation loss did not move at all
    in any epoch (the validation samples' outputs stayed on the same points of their output grid); else None."""
    if trained.kept != 0 or trained.start is None or not trained.history or any(
            e.validation_loss != trained.start.validation_loss for e in trained.history):
        return None
    return ("the validation loss did not move at all in any epoch (its samples' outputs stayed on the same points "
            "of their output grid), so training could not be judged; give more training data (every tenth sample "
            "validates)")


def add_bit_plan(report: Report, plan: Any) -> None:
    """Which weights keep 8 bits (``quant.qat.bit_plan``): every weight, most sensitive first, with the outputs'
    SQNR when it alone is at the narrower bits."""
    report.add("bit_plan", plan.as_dict())
    kept = sorted(plan.eight_bit)
    rows = [[layer.node, layer.weights, rounded(layer.sqnr_db, 1), layer.bits]
            for layer in sorted(plan.layers, key=lambda layer: layer.sqnr_db)]
    report.add_table(f"Weight bits: {len(kept)} of {len(plan.layers)} weights keep 8 bits ({plan.kept_share:.1%} of "
                     f"the weights, at most {plan.share:.0%}), the most sensitive: the outputs' SQNR with each "
                     f"alone at {plan.bits} bits, on {plan.samples} calibration samples",
                     ["node", "weights", f"SQNR dB alone at {plan.bits} bits", "bits"], rows)


def add_lowering(report: Report, lowering: Any) -> None:
    """How the PTQ baseline's weights were lowered below 8 bits (``quant.qat.lower``): the layers GPTQ re-rounded,
    with the output error each removed against nearest rounding on the clipped grid, and those left nearest."""
    report.add("lowering", lowering.as_dict())
    gains = sorted(lowering.gains_db.items(), key=lambda item: -item[1])
    rows = [[node, rounded(gain, 1)] for node, gain in gains] + [[node, "nearest"] for node in lowering.nearest]
    median = f", median {float(np.median(list(lowering.gains_db.values()))):.1f} dB" if gains else ""
    report.add_table(f"Weights lowered to {lowering.bits} bits: clipped grids, {len(gains)} layers re-rounded by "
                     f"GPTQ on {lowering.samples} calibration samples{median} less output error than nearest "
                     f"rounding ({lowering.seconds:.0f} s)", ["node", "output error removed, dB"], rows)


def add_export_check(report: Report, export: Any) -> None:
    report.add("export_check", export.as_dict())
    report.add_table(f"The exported model (ONNX Runtime) against the training simulation (torch) on {export.samples} "
                     f"held-out samples: {'the same' if export.exact else 'DIFFERENT'}",
                     ["check", "value"],
                     [["quantized activations compared layer by layer (same inputs)", export.layers],
                      ["largest difference, grid steps (at most 1)", f"{export.max_steps:.2f} ({export.worst_tensor})"
                       if export.worst_tensor else f"{export.max_steps:.2f}"],
                      ["outputs, integer kernels against the simulation, SQNR dB", rounded(export.sqnr_db, 1)],
                      ["outputs, integer kernels against ORT's float run of the same Q/DQ model, SQNR dB",
                       rounded(export.runtime_sqnr_db, 1)]])


def add_comparison(report: Report, rows: dict[str, Any], latency: dict[str, Any], sizes: dict[str, int],
                   deflated: dict[str, int], kernels: dict, *, bits: int, written: str = "QAT") -> None:
    """The PTQ and QAT models of the same bits on the held-out samples: task metric, worst output SQNR, latency
    and size (as stored and deflated) against the float model; ``kernels``: what ORT runs of the ``written`` one."""
    report.add("comparison", {k: v.as_dict() for k, v in rows.items()})
    report.add("latency", {k: v.as_dict() for k, v in latency.items()})
    report.add("size", sizes)
    report.add("deflated_size", deflated)
    metric = next(iter(rows.values())).metric
    base = latency["float"].median_ms
    table = [["float", None, None, round(base, 3), 1.0, sizes["float"], deflated["float"]]]
    for label, result in rows.items():
        worst = min((o.sqnr_db for o in result.outputs), default=None)
        table.append([f"{label} (w{bits}a8)", rounded(result.value), rounded(worst, 2),
                      round(latency[label].median_ms, 3), round(latency[label].median_ms / base, 3), sizes[label],
                      deflated[label]])
    report.add_table(f"PTQ and QAT on the held-out samples ({metric} against the float model; ORT CPU latency, "
                     f"interleaved medians{noisy_timing(latency['float'], latency['QAT'])})",
                     ["model", metric, "worst output SQNR dB", "median ms", "x float", "bytes",
                      "bytes deflated (zip)"], table)
    compute = kernels["integer_compute"]
    note = ("" if compute else "no integer conv/matmul kernel: ORT CPU dequantizes these weights and computes in "
            "float (smaller, not faster)")
    report.add_table(f"What ORT runs (the {written} model, written)", KERNEL_COLUMNS + ["note"],
                     [kernel_row(kernels) + [note]])


def add_kept(report: Report, written: str, why: str, where: str, figures: dict[str, dict[str, Any]]) -> None:
    """Which model the artifact is, the PTQ model ("PTQ") or the trained one ("QAT"), why, and the validation figures
    that decided it (``verbs.qat._choose``: label -> figures; the validation losses where training kept its start,
    else what the task check measures), measured on ``where``: the validation samples, never the held-out ones."""
    report.add("kept", {"model": written, "why": why, "chosen_on": where, "figures": figures})
    title = f"Written: {'the PTQ model' if written == 'PTQ' else 'the trained model'}, chosen on {where}"
    if any("validation_loss" in f for f in figures.values()):
        rows = [[label, f.get("epoch", 0 if label == "PTQ" else None), rounded(f["validation_loss"]),
                 "written" if label == written else ""] for label, f in figures.items()]
        report.add_table(title, ["model", "epoch", "validation loss", ""], rows)
    elif figures:
        metric = next(iter(figures.values()))["metric"]
        rows = [[label, rounded(f["value"]), rounded(f["worst_sqnr_db"], 2), f["samples"],
                 "written" if label == written else ""] for label, f in figures.items()]
        report.add_table(title, ["model", f"{metric} (validation)", "worst output SQNR dB (validation)", "samples",
                                 ""], rows)


def add_sparsity_kept(report: Report, masks: dict[str, Any]) -> None:
    """The zeros of a pruned model that training keeps (``masks``: weight name -> boolean mask, True = trained)."""
    kept = {"tensors": len(masks), "zeros": int(sum((~m).sum() for m in masks.values())),
            "weights": int(sum(m.size for m in masks.values()))}
    report.add("sparsity_kept", kept)
    report.add_table("Zeros of the pruned float model kept while training (tensors at least half zeros)",
                     ["weight tensors", "zeros", "of weights"], [[kept["tensors"], kept["zeros"], kept["weights"]]])


NOISY = 1.5  # paired timing ratios spread wider than this (largest over smallest): the median ratio says little


def noisy_timing(reference: Any, candidate: Any) -> str:
    """A caveat where the runs timed side by side disagree (``NOISY``): a busy machine or too few --runs; "" where
    they agree. Run i of each model was timed in the same round, so their ratio pairs like with like."""
    ratios = [c / f for f, c in zip(reference.times_ms, candidate.times_ms) if f > 0]
    if len(ratios) < 2 or max(ratios) <= NOISY * min(ratios):
        return ""
    return (f"; the timing was noisy: the runs timed side by side gave ratios {min(ratios):.2f}-{max(ratios):.2f} "
            f"over {len(ratios)} runs, so 'x float' says little (more --runs, on a quiet machine)")
