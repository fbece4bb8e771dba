"""The quantize verb's tables and figures: the steps it ran (the plan, 16-bit tensors, moved convs, float joins and
head), per-layer SQNR, size and speed, where the time goes, agreement with the float model; where its check was
made and its verdict's notes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from npukit.quant.precision.scored_head import TIE_DB
from npukit.quant.steps import (FloatConvsRecord, FloatFragileRecord, FloatHeadRecord, FloatJoinsRecord,
                                FloatSquaresRecord, FoldedAffinesRecord, QuantSteps)
from npukit.report.core import Report
from npukit.report.plan import add_plan


def add_steps(report: Report, steps: QuantSteps, *, plan_of: str = "") -> None:
    """``QuantResult.steps`` into ``report``: the JSON section and one table per step that chose something;
    ``plan_of``: whose plan it is where it is not the artifact's (qat's PTQ start, before its bits are lowered)."""
    _add_folded_affines(report, steps.folded_affines)
    report.add("steps", steps.as_dict())
    assert steps.plan is not None
    _add_recipe_choice(report, steps.recipe)
    add_plan(report, steps.plan, of=plan_of)
    _add_int16_plan(report, steps.int16_plan)
    _add_conv_kernels(report, steps.conv_kernels)
    _add_float_joins(report, steps.float_joins)
    _add_float_squares(report, steps.float_squares)
    _add_float_fragile(report, steps.float_fragile)
    _add_float_convs(report, steps.float_convs)
    _add_float_head(report, steps.float_stem)
    _add_scored_head(report, steps.float_head_scored)


def _add_folded_affines(report: Report, folded: FoldedAffinesRecord | None) -> None:
    """The constant scales and shifts folded into the convs before them, grouped by conv."""
    if not folded:
        return
    by_conv: dict[str, list[str]] = {}
    for node, conv in folded["into"].items():
        by_conv.setdefault(conv, []).append(node)
    report.add_table(f"Constant scales and shifts after convs, folded into them ({len(folded['into'])} nodes into "
                     f"{len(by_conv)} convs: one output grid each, not one per node)",
                     ["conv", "folded into it"],
                     [[conv, ", ".join(nodes)] for conv, nodes in by_conv.items()])


def _add_recipe_choice(report: Report, choice: dict[str, Any] | None) -> None:
    """``--recipe auto``'s choice: each candidate recipe's held-out score and time, the one chosen, those not tried."""
    if not choice:
        return
    rows = [[name, c["flags"] or "(none)", c["method"], c["held_out_sqnr_db"], c["against_first"], c["seconds"],
             "chosen" if name == choice["chosen"] else ""] for name, c in choice["candidates"].items()]
    rows += [[name, "", "", "", "", "", f"not tried: {why}"] for name, why in choice["skipped"].items()]
    report.add_table(f"Recipe chosen on {choice['held_out_samples']} held-out calibration samples (output SQNR "
                     f"against the float model; a later recipe replaces the first only when clearly better, sign "
                     f"test p <= {choice['alpha']:g}; time budget {choice['budget_s']:g} s)"
                     + (f"; {choice['note']}" if choice.get("note") else ""),
                     ["recipe", "flags", "method", "held-out SQNR dB", "against the first", "seconds", ""], rows)


def _add_int16_plan(report: Report, plan: dict[str, Any] | None) -> None:
    """The 16-bit activations the latency budget chose: each one's share of the noise and the latency it adds."""
    if not plan:
        return
    added = {c["tensor"]: c["added_ms"] for c in plan["candidates"]}
    report.add_table(f"16-bit activations chosen (int8 model {plan['base_ms']:.2f} ms, with them "
                     f"{plan['plan_ms']:.2f} ms, budget +{plan['budget']:.0%}; output SQNR, every output pooled, on "
                     f"{plan['samples']} calibration samples {plan['base_sqnr_db']:.2f} dB all 8-bit, "
                     f"{plan['estimated_sqnr_db']:.2f} dB without their rounding)",
                     ["tensor", "share of the 8-bit output noise", "latency it adds alone (ms)"],
                     [[t, plan["scanned"][t], added[t]] for t in plan["tensors"]])


def _add_conv_kernels(report: Report, moves: dict[str, Any] | None) -> None:
    """The int8 convs moved from ORT's symmetric conv kernel to its GEMM, where any were."""
    if not (moves and moves["moved_to_gemm"]):
        return
    report.add_table(f"Convs moved from ORT's symmetric int8 conv kernel to its int8 GEMM (whole model "
                     f"{moves['model_ratio']:.3f}x the time as built; same outputs)",
                     ["node", "GEMM / symmetric-conv time alone"],
                     [[n, moves["gemm_over_convsym_alone"][n]] for n in moves["moved_to_gemm"]])


def _add_float_joins(report: Report, joins: FloatJoinsRecord | None) -> None:
    """The joins of very different scales left in float: each input's largest value, the nodes after them."""
    if not joins:
        return
    report.add_table(f"Joins of very different scales left in float, with the nodes after them (each input keeps "
                     f"its own grid; ratio >= {joins['ratio']:g})",
                     ["join", "largest |value| per input", "ratio", "nodes after it, in float"],
                     [[j["node"], ", ".join(f"{k} {v:.4g}" for k, v in j["input_magnitudes"].items()), j["ratio"],
                       ", ".join(j["after"]) or "-"] for j in joins["joins"]])


def _add_float_squares(report: Report, squares: FloatSquaresRecord | None) -> None:
    """The squares read back by a root, logarithm or division, left in float with the nodes between."""
    if not squares:
        return
    report.add_table("Squares read back by a root, logarithm or division, left in float with the nodes between "
                     "(one 8-bit grid would round their small values to zero)",
                     ["square", "read back by", "nodes in float"],
                     [[c["square"], c["reader"], ", ".join(c["nodes"])] for c in squares["chains"]])


def _add_float_fragile(report: Report, fragile: FloatFragileRecord | None) -> None:
    """The depthwise convs whose input one 8-bit grid cannot carry, left in float with that input's writer."""
    if not (fragile and fragile["convs"]):
        return
    report.add_table(f"Depthwise convs whose input one 8-bit grid cannot carry, left in float with the conv "
                     f"writing that input (output SQNR with the input alone rounded < {fragile['threshold_db']:g} "
                     f"dB, {fragile['samples']} calibration samples)",
                     ["depthwise conv", "input", "SQNR dB, input rounded", "writer, in float"],
                     [[c["node"], c["input"], c["sqnr_db"], c["producer"] or "-"] for c in fragile["convs"]])


def _add_float_convs(report: Report, convs: FloatConvsRecord | None) -> None:
    """The float convs reading a quantized input, and how ONNX Runtime runs each."""
    if not (convs and (convs["quantized_input_kept_float"] or convs["int8_by_ort"])):
        return
    report.add_table("Float convs that read a quantized input (ONNX Runtime would quantize their weights per "
                     "tensor at load; each reads its input through a DequantizeLinear of its own instead)",
                     ["node", "on ONNX Runtime"],
                     [[n, "float, as planned"] for n in convs["quantized_input_kept_float"]]
                     + [[n, "int8 weights, one scale (ORT's own; opset below 13)"] for n in convs["int8_by_ort"]])


def _add_float_head(report: Report, head: FloatHeadRecord | None) -> None:
    """The float head timed on this CPU: its convs, or why it was dropped."""
    if not (head and (head["nodes"] or head.get("dropped"))):
        return
    report.add_table("Float head (the stem and the convs after it that run fastest in float on this CPU)",
                     ["convs left in float", "note"], [[", ".join(head["nodes"]) or "-", head.get("dropped", "")]])


def _add_scored_head(report: Report, scored: dict[str, Any] | None) -> None:
    """The float head chosen by accuracy: each stem's prefixes within the MAC share, their SQNR, the one chosen."""
    if not scored:
        return
    first, last = scored["scored_on_samples"]
    where = f"sample {first}" if last - first == 1 else f"samples {first}-{last - 1}"
    floor = scored.get("floor_db")
    rows = [[h["stem"], ", ".join(h["chain"][:int(k)]) or "(none: all quantized)", share, h["sqnr_db"].get(k, "-"),
             *([h.get("worst_output_db", {}).get(k, "-")] if floor is not None else []),
             ("chosen, to reach the floor" if h.get("stretched_to_floor") else "chosen")
             if int(k) == len(h["nodes"]) else ""]
            for h in scored["heads"] for k, share in h["mac_share"].items()]
    rows += [[h["stem"], "(none: all quantized)", 0.0, "-", h["worst_output_db"]["0"], "chosen"]
             for h in scored["heads"] if not h["mac_share"] and "0" in h.get("worst_output_db", {})]
    stretch = (f"; where an output stays below {floor:g} dB, the shortest prefix within {scored['floor_share']:.0%} "
               "whose every output reaches it" if floor is not None else "")
    report.add_table(f"Float head chosen by accuracy (prefixes of the stem's chain within {scored['share']:.0%} of "
                     f"the MACs, output SQNR on calibration {where}, {scored['score_on']} "
                     f"arithmetic; the shortest within {TIE_DB} dB of the best{stretch})",
                     ["stem", "convs in float", "share of MACs", "SQNR dB",
                      *(["worst output dB"] if floor is not None else []), ""],
                     rows or [[", ".join(h["stem"] for h in scored["heads"]) or "-",
                               "none within the MAC share", "-", "-", *(["-"] if floor is not None else []), ""]])


def add_layer_sqnr(report: Report, layers: list[dict], *, samples: str = "4 calibration samples") -> None:
    """Per-layer activation SQNR against the float model (measured on ``samples``, said in the table's title: the
    task check below reads others): the twelve worst in a table, all of them in a figure."""
    report.add("layer_sqnr", layers)
    worst = sorted((r for r in layers if np.isfinite(r["sqnr_db"])), key=lambda r: r["sqnr_db"])[:12]
    report.add_table(f"Layers that hurt most (activation SQNR vs float on {samples}, dB; higher is better)",
                     ["node", "op", "tensor", "SQNR dB"], [[r["node"], r["op_type"], r["tensor"], r["sqnr_db"]]
                                                          for r in worst])
    exact = sum(1 for r in layers if r["sqnr_db"] == np.inf)  # kept in float (the float head): no error to draw
    report.add_figure("Per-layer activation SQNR (dB), in graph order"
                      + (f"; {exact} layer(s) exact (kept in float: infinite SQNR) not drawn" if exact else ""),
                      "line",
                      {"series": {"SQNR": {"x": list(range(len(layers))),
                                           "y": [r["sqnr_db"] for r in layers]}}},
                      x_label="layer", y_label="dB")


def add_size_and_speed(report: Report, sizes: dict[str, int], latency: dict[str, Any], kernels: dict, *,
                       threads: int, runs: int) -> None:
    """File sizes and interleaved latencies of the float and int8 models, and what ORT runs on integer kernels."""
    report.add("latency", {k: v.as_dict() for k, v in latency.items()})
    report.add("size", sizes)
    rows = [[k, sizes[k], latency[k].median_ms, latency[k].median_ms / latency["float"].median_ms] for k in latency]
    report.add_table(f"Size and latency (ORT CPU, {threads} thread(s), interleaved medians of {runs})",
                     ["model", "size_bytes", "median ms", "latency vs float"], rows)
    report.add_table("What ORT runs", KERNEL_COLUMNS, [kernel_row(kernels)])


KERNEL_COLUMNS = ["integer conv/matmul kernels", "other integer kernels",
                  "float conv/matmul/recurrent (fed by DequantizeLinear)", "integer fraction of them"]


def kernel_row(kernels: dict) -> list[Any]:
    """One row of KERNEL_COLUMNS from ``npukit.quant.qdq.integer_kernel_report``."""
    compute = kernels["integer_compute"]
    floats = sum(kernels["float_compute"].values())
    return [compute, sum(kernels["integer_ops"].values()) - compute,
            f"{floats} ({sum(kernels['float_compute_after_dq'].values())})", round(kernels["integer_fraction"], 3)]


def add_kernel_profile(report: Report, profiles: dict[str, Any], *, threads: int) -> None:
    """ORT CPU kernel time by kind, float against int8."""
    from npukit.measure.op_profile import compare_kinds

    report.add("kernel_profile", {k: p.as_dict() for k, p in profiles.items()})
    kinds = compare_kinds(profiles["float"], profiles["int8"])
    report.add_table(f"Where the time goes (ORT CPU kernel time by kind, ms, {threads} thread(s); speedup = float / "
                     "int8)",
                     ["kind", "float ms", "int8 ms", "speedup", "int8 nodes", "int8 share on integer kernels"],
                     [[kind, v["base_ms"], v["ms"], v["speedup"], v["nodes"], v["integer_share"]]
                      for kind, v in kinds.items()])


def add_mixed_precision(report: Report, plan: dict[str, Any]) -> None:
    """The per-layer precision search (``npukit.quant.precision.layer_plan.LayerPlan.summary``): each candidate
    layer's sensitivity, what each option buys and costs, the choice; the models checked; the plan timed beside the
    all-int8 and all-16-bit models."""
    report.add("mixed_precision", plan)
    chosen = plan["assignment"]
    rows = {}
    for o in plan["options"]:
        row = rows.setdefault(o["node"], {"node": o["node"], "sensitivity": plan["sensitivity"].get(o["node"], 0.0)})
        row[o["precision"]] = (o["share"], o["added_ms"])
    timing = plan["timing_ms"]
    report.add_table(
        f"Mixed precision per layer: {len(chosen)} of {len(rows)} measured layers lifted (output SQNR, every output "
        "pooled (the task check below names the worst one), on "
        f"{plan['samples']} calibration samples {plan['base_sqnr_db']:.2f} dB all int8, {plan['plan_sqnr_db']:.2f} dB "
        f"as planned; latency, 1 thread: int8 {timing['int8']:.2f} ms, plan {timing['plan']:.2f} ms, every "
        f"activation 16-bit {timing['all_16bit']:.2f} ms)",
        ["layer", "share of the int8 noise it adds", "int16: share of that noise removed", "int16: +ms",
         "float32: share of that noise removed", "float32: +ms", "choice"],
        [[r["node"], r["sensitivity"], *r.get("int16", (None, None)), *r.get("float32", (None, None)),
          chosen.get(r["node"], "int8")] for r in rows.values()])
    where = plan.get("checked_on", "the calibration samples")
    written = "; the model written is then calibrated on them all, the held-back ones too" if "held back" in where \
        else ""
    report.add_table(f"Mixed precision: models checked under the floors, in search order (on {where}{written})",
                     ["layers lifted", "of layers measured", "passed", "verdict"],
                     [[t["lifted"], t["candidates"], t["passed"], t["line"]] for t in plan["tried"]]
                     + [["every activation 16-bit", "", plan["all_16bit"]["passed"], plan["all_16bit"]["line"]]])


def add_htp_mixed_precision(report: Report, plan: dict[str, Any]) -> None:
    """The HTP's per-layer precision search (``npukit.runtime.htp_precision.HtpLayerPlan.summary``): each layer's
    estimated gain and energy cost per option, the choice, and the models checked on the HTP."""
    report.add("mixed_precision", plan)
    chosen = plan["assignment"]
    rows: dict[str, dict[str, Any]] = {}
    for o in plan["options"]:
        rows.setdefault(o["node"], {})[o["precision"]] = (o["share"], o["added_ms"])
    ranked = sorted(rows, key=lambda n: -max(v[0] for v in rows[n].values()))
    report.add_table(
        f"Mixed precision per layer on the HTP: {len(chosen)} of {len(rows)} layers lifted from int8 (noise removed: "
        f"the share of the int8 model's output noise each option removes, estimated on the QDQ graph's CPU reference, {plan['samples']} calibration samples; cost: "
        f"{plan['cost_unit']}; {plan['energy_added_pj'] / 1e6:.3g} uJ added)",
        ["layer", "MACs", "int16: share of noise removed", "int16: +pJ", "float16: share of noise removed",
         "float16: +pJ", "choice"],
        [[n, plan["macs"].get(n), *rows[n].get("int16", (None, None)), *rows[n].get("float16", (None, None)),
          chosen.get(n, "int8")] for n in ranked])
    report.add_table(f"Mixed precision: models checked on the HTP under the floors (on "
                     f"{plan.get('checked_on', 'the calibration samples')})",
                     ["layers lifted", "passed", "verdict"],
                     [[t["lifted"], t["passed"], t["line"]] for t in plan["tried"]])


def checked_on(data: Any, *, held_out: bool, same_as_calib: bool) -> str:
    """Where the task check was made, as the verdict and its tables say it: on the calibration samples (optimistic:
    the model was fitted to them) when no ``data`` was given (``held_out`` False) or it is the calibration data
    again, else on the held-out ``data`` (by its file name, or as given in memory)."""
    if not held_out:
        return "calibration samples (no --data given: optimistic, the model was fitted to them)"
    if same_as_calib:
        return "calibration samples (--data is the --calib data again: optimistic, the model was fitted to them)"
    return f"held-out data {Path(str(data)).name if isinstance(data, (str, Path)) else '(given in memory)'}"


def slower_note(latency_ratio: float, *, threads: int) -> str:
    """Where the quantized model is not faster than the float one here (``latency_ratio``: its median over the
    float model's), a note for the verdict that says so; otherwise ""."""
    if latency_ratio < 1.0:
        return ""
    return (f"; the INT8 model takes {latency_ratio:.2f}x the float model's time on this CPU ({threads} thread(s)): "
            "the float model may serve better here, or compile for an NPU")


def add_verdict_notes(report: Report, *, slower: str, recipe: dict[str, Any] | None) -> None:
    """A passing verdict's notes: ``slower`` (``slower_note``) and, where ``--recipe auto`` chose among fewer
    recipes than it names (``recipe``: ``QuantSteps.recipe``), the ones it did not try and why."""
    if slower and report.passed:  # a passing model that is not faster than the float one says so too
        report.set_verdict(report.verdict + slower, passed=True)
    untried = (recipe or {}).get("skipped") or {}
    if untried and report.passed:
        report.set_verdict(f"{report.verdict}; --recipe auto did not try {', '.join(untried)} "
                           f"({next(iter(untried.values()))}; --recipe-budget gives it more time)", passed=True)
