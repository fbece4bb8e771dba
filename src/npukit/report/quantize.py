"""The quantize verb's tables and figures: the steps it ran (the plan, 16-bit tensors, moved convs, float joins and
head), per-layer SQNR, size and speed, where the time goes, agreement with the float model."""

from __future__ import annotations

from typing import Any

import numpy as np

from npukit.quant.precision.scored_head import TIE_DB
from npukit.quant.steps import QuantSteps
from npukit.report.core import Report
from npukit.report.plan import add_plan


def add_steps(report: Report, steps: QuantSteps) -> None:
    """``QuantResult.steps`` into ``report``: the JSON section and one table per step that chose something."""
    folded = steps.folded_affines
    if folded:
        by_conv: dict[str, list[str]] = {}
        for node, conv in folded["into"].items():
            by_conv.setdefault(conv, []).append(node)
        report.add_table(f"Constant scales and shifts after convs, folded into them ({len(folded['into'])} nodes into "
                         f"{len(by_conv)} convs: one output grid each, not one per node)",
                         ["conv", "folded into it"],
                         [[conv, ", ".join(nodes)] for conv, nodes in by_conv.items()])
    report.add("steps", steps.as_dict())
    assert steps.plan is not None
    choice = steps.recipe
    if choice:
        rows = [[name, c["flags"] or "(none)", c["method"], c["held_out_sqnr_db"], c["against_first"], c["seconds"],
                 "chosen" if name == choice["chosen"] else ""] for name, c in choice["candidates"].items()]
        rows += [[name, "", "", "", "", "", f"not tried: {why}"] for name, why in choice["skipped"].items()]
        report.add_table(f"Recipe chosen on {choice['held_out_samples']} held-out calibration samples (output SQNR "
                         f"against the float model; a later recipe replaces the first only when clearly better, sign "
                         f"test p <= {choice['alpha']:g}; time budget {choice['budget_s']:g} s)"
                         + (f"; {choice['note']}" if choice.get("note") else ""),
                         ["recipe", "flags", "method", "held-out SQNR dB", "against the first", "seconds", ""], rows)
    add_plan(report, steps.plan)
    plan = steps.int16_plan
    if plan:
        added = {c["tensor"]: c["added_ms"] for c in plan["candidates"]}
        report.add_table(f"16-bit activations chosen (int8 model {plan['base_ms']:.2f} ms, with them "
                         f"{plan['plan_ms']:.2f} ms, budget +{plan['budget']:.0%}; output SQNR on "
                         f"{plan['samples']} calibration samples {plan['base_sqnr_db']:.2f} dB all 8-bit, "
                         f"{plan['estimated_sqnr_db']:.2f} dB without their rounding)",
                         ["tensor", "share of the 8-bit output noise", "latency it adds alone (ms)"],
                         [[t, plan["scanned"][t], added[t]] for t in plan["tensors"]])
    moves = steps.conv_kernels
    if moves and moves["moved_to_gemm"]:
        report.add_table(f"Convs moved from ORT's symmetric int8 conv kernel to its int8 GEMM (whole model "
                         f"{moves['model_ratio']:.3f}x the time as built; same outputs)",
                         ["node", "GEMM / symmetric-conv time alone"],
                         [[n, moves["gemm_over_convsym_alone"][n]] for n in moves["moved_to_gemm"]])
    joins = steps.float_joins
    if joins:
        report.add_table(f"Joins of very different scales left in float, with the nodes after them (each input keeps "
                         f"its own grid; ratio >= {joins['ratio']:g})",
                         ["join", "largest |value| per input", "ratio", "nodes after it, in float"],
                         [[j["node"], ", ".join(f"{k} {v:.4g}" for k, v in j["input_magnitudes"].items()), j["ratio"],
                           ", ".join(j["after"]) or "-"] for j in joins["joins"]])
    squares = steps.float_squares
    if squares:
        report.add_table("Squares read back by a root, logarithm or division, left in float with the nodes between "
                         "(one 8-bit grid would round their small values to zero)",
                         ["square", "read back by", "nodes in float"],
                         [[c["square"], c["reader"], ", ".join(c["nodes"])] for c in squares["chains"]])
    fragile = steps.float_fragile
    if fragile and fragile["convs"]:
        report.add_table(f"Depthwise convs whose input one 8-bit grid cannot carry, left in float with the conv "
                         f"writing that input (output SQNR with the input alone rounded < {fragile['threshold_db']:g} "
                         f"dB, {fragile['samples']} calibration samples)",
                         ["depthwise conv", "input", "SQNR dB, input rounded", "writer, in float"],
                         [[c["node"], c["input"], c["sqnr_db"], c["producer"] or "-"] for c in fragile["convs"]])
    convs = steps.float_convs
    if convs and (convs["quantized_input_kept_float"] or convs["int8_by_ort"]):
        report.add_table("Float convs that read a quantized input (ONNX Runtime would quantize their weights per "
                         "tensor at load; each reads its input through a DequantizeLinear of its own instead)",
                         ["node", "on ONNX Runtime"],
                         [[n, "float, as planned"] for n in convs["quantized_input_kept_float"]]
                         + [[n, "int8 weights, one scale (ORT's own; opset below 13)"] for n in convs["int8_by_ort"]])
    head = steps.float_stem
    if head and (head["nodes"] or head.get("dropped")):
        report.add_table("Float head (the stem and the convs after it that run fastest in float on this CPU)",
                         ["convs left in float", "note"], [[", ".join(head["nodes"]) or "-", head.get("dropped", "")]])
    scored = steps.float_head_scored
    if scored:
        first, last = scored["scored_on_samples"]
        where = f"sample {first}" if last - first == 1 else f"samples {first}-{last - 1}"
        rows = [[h["stem"], ", ".join(h["chain"][:int(k)]) or "(none: all quantized)", share, h["sqnr_db"][k],
                 "chosen" if int(k) == len(h["nodes"]) else ""]
                for h in scored["heads"] for k, share in h["mac_share"].items()]
        report.add_table(f"Float head chosen by accuracy (prefixes of the stem's chain within {scored['share']:.0%} of "
                         f"the MACs, output SQNR on calibration {where}, {scored['score_on']} "
                         f"arithmetic; the shortest within {TIE_DB} dB of the best)",
                         ["stem", "convs in float", "share of MACs", "SQNR dB", ""],
                         rows or [[", ".join(h["stem"] for h in scored["heads"]) or "-",
                                   "none within the MAC share", "-", "-", ""]])


def add_layer_sqnr(report: Report, layers: list[dict]) -> None:
    """Per-layer activation SQNR against the float model: the twelve worst in a table, all of them in a figure."""
    report.add("layer_sqnr", layers)
    worst = sorted((r for r in layers if np.isfinite(r["sqnr_db"])), key=lambda r: r["sqnr_db"])[:12]
    report.add_table("Layers that hurt most (activation SQNR vs float, dB; higher is better)",
                     ["node", "op", "tensor", "SQNR dB"], [[r["node"], r["op_type"], r["tensor"], r["sqnr_db"]]
                                                          for r in worst])
    report.add_figure("Per-layer activation SQNR (dB), in graph order", "line",
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


KERNEL_COLUMNS = ["integer conv/matmul kernels", "other integer kernels", "float conv/matmul (fed by DequantizeLinear)",
                  "integer fraction of conv/matmul"]


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
        f"Mixed precision per layer: {len(chosen)} of {len(rows)} measured layers lifted (output SQNR on "
        f"{plan['samples']} calibration samples {plan['base_sqnr_db']:.2f} dB all int8, {plan['plan_sqnr_db']:.2f} dB "
        f"as planned; latency, 1 thread: int8 {timing['int8']:.2f} ms, plan {timing['plan']:.2f} ms, every "
        f"activation 16-bit {timing['all_16bit']:.2f} ms)",
        ["layer", "share of the int8 noise it adds", "int16: noise removed", "int16: +ms", "float32: noise removed",
         "float32: +ms", "choice"],
        [[r["node"], r["sensitivity"], *r.get("int16", (None, None)), *r.get("float32", (None, None)),
          chosen.get(r["node"], "int8")] for r in rows.values()])
    report.add_table(f"Mixed precision: models checked under the floors, in search order (on "
                     f"{plan.get('checked_on', 'the calibration samples')})",
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
        f"estimated on the QDQ graph's CPU reference, {plan['samples']} calibration samples; cost: "
        f"{plan['cost_unit']}; {plan['energy_added_pj'] / 1e6:.3g} uJ added)",
        ["layer", "MACs", "int16: noise removed", "int16: +pJ", "float16: noise removed", "float16: +pJ", "choice"],
        [[n, plan["macs"].get(n), *rows[n].get("int16", (None, None)), *rows[n].get("float16", (None, None)),
          chosen.get(n, "int8")] for n in ranked])
    report.add_table(f"Mixed precision: models checked on the HTP under the floors (on "
                     f"{plan.get('checked_on', 'the calibration samples')})",
                     ["layers lifted", "passed", "verdict"],
                     [[t["lifted"], t["passed"], t["line"]] for t in plan["tried"]])
