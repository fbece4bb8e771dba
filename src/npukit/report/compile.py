"""The compile verb's tables: what quantizing for the HTP did, the EPContext model it wrote, the hazards rewritten
before compiling, what the device needs and the layers a given QDQ model left float; for the mobile runtimes,
npukit's plan carried onto the torch program, the fp32 artifact against eager torch, and the latency beside eager
torch and ORT."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from npukit.report.core import Report


def add_htp_quantization(report: Report, done: Mapping[str, Any], *, scheme: str) -> None:
    """``HtpQuantResult.as_dict()``: the steps npukit.runtime.htp_quant ran, counted."""
    report.add("htp_quantization", dict(done))
    report.add_table(f"Quantized for the HTP ({scheme}; npukit.runtime.htp_quant)",
                     ["step", "count"],
                     [["BatchNorm / bias Add folded into a ConvTranspose", len(done["folded"])],
                      ["BatchNorm rewritten as Mul + Add", len(done["batchnorms_rewritten"])],
                      ["zero biases added", done["biases_added"]],
                      ["weights re-rounded (GPTQ)", done["gptq_nodes"]],
                      [f"weight rounding bias corrected ({done['correction_samples']} samples)",
                       done["bias_corrected_nodes"]],
                      ["16-bit grids given headroom", done["widened_grids"]]])


def add_context_model(report: Report, result: Any, *, quantized_here: bool) -> None:
    """The EPContext model (``CompileResult``), the hazard rewrites made before compiling, what the device needs."""
    report.add("quantized_here", quantized_here)
    report.add_table(f"EPContext model for {result.soc_name} ({result.soc})",
                     ["SoC", "HTP arch", "soc_model", "context nodes", "nodes left to CPU", "context_binary_bytes",
                      "model_bytes", "compile s", "matches HTP run"],
                     [[result.soc, f"v{result.htp_arch}", result.soc_model, result.context_nodes,
                       result.other_nodes, result.context_binary_bytes, result.model_bytes, result.compile_seconds,
                       result.match_summary]])
    for name in dict.fromkeys(r["hazard"] for r in result.hazard_rewrites):
        done = [r for r in result.hazard_rewrites if r["hazard"] == name]
        report.add_table(f"Rewritten before compiling (exact on ORT CPU), because the HTP computes it wrongly: "
                         f"{done[0]['reason'].rsplit(' [', 1)[0]}", ["nodes", "input", "rewrite"],
                         [[" + ".join(r["nodes"]), r["where"], r["fix"]] for r in done])
    report.add_table("What the device needs", ["requirement"], [[result.device_requirements]])


def add_float_layers(report: Report, left: list[str], *, weighted: int) -> None:
    """The weighted layers a given QDQ model left float (of its ``weighted`` ones), which the HTP runs in float16;
    where there are any, a note on the verdict saying how to get the HTP's own scheme."""
    report.add("float_layers_in_given_model", left)
    if left and report.verdict:
        shown = ", ".join(left[:3]) + (f" (+{len(left) - 3} more)" if len(left) > 3 else "")
        report.set_verdict(f"{report.verdict}; note: {len(left)} of the given QDQ model's {weighted} weighted "
                           f"layers are float ({shown}), run by the HTP in float16 (a CPU scheme's float layers?): "
                           "compile the float model with --calib for the HTP's own scheme", passed=report.passed)


def add_carried_plan(report: Report, carried: Any) -> None:
    """How npukit's plan went onto the torch program (``CarriedPlan`` of ``quant.emit.pt2e``)."""
    report.add_table("npukit's plan carried onto the torch program (PT2E, grids fixed from the plan)",
                     ["tensors matched by value", "of them in another layout (ORT moved their op)",
                      "activation grids", "weights (plan's integers)", "layers left in float",
                      "ops with no tensor in the plan (ORT fused them), in float",
                      "ops writing a float concatenation, float for the converter",
                      "tensors float in the ONNX model, int8 here on their calibrated range"],
                     [[carried.matched, len(carried.permuted), carried.activations, carried.weights,
                       len(carried.float_nodes), ", ".join(carried.unplanned) or "none",
                       ", ".join(carried.float_concat_inputs) or "none", ", ".join(carried.derived) or "none"]])


def add_fp32_error(report: Report, *, artifact: str, worst: float, tolerance: float,
                   control: float | None = None) -> None:
    """The fp32 artifact's largest error against eager torch, as a share of the output range; ``control``: ORT's on
    the same inputs, where it was measured (the artifact past the tolerance)."""
    report.add("fp32_error", {"max_abs_over_range": worst, "tolerance": tolerance, "ort_max_abs_over_range": control})
    columns = ["max abs error / output range", "tolerance"] + (["ORT fp32 on the same inputs"] if control is not None
                                                                else [])
    report.add_table(f"fp32 {artifact} against eager torch", columns,
                     [[f"{worst:.2e}", f"{tolerance:g}"] + ([f"{control:.2e}"] if control is not None else [])])


def add_package_check(report: Report, check: dict[str, Any], *, artifact: str) -> None:
    """What was checked of an artifact this machine cannot run: reloaded from disk, its inputs and outputs, and for
    INT8 its integer grids against npukit's plan."""
    report.add("package_check", check)
    rows = [["reloaded from disk", "yes"],
            ["inputs", ", ".join(f"{k} {v}" for k, v in check["interface"]["inputs"].items())],
            ["outputs", ", ".join(f"{k} {v}" for k, v in check["interface"]["outputs"].items())]]
    if "weights" in check:
        rows += [["int8 weights / not the plan's", f"{check['weights']} / {check['weights_not_the_plans']}"],
                 ["activation grids / not the plan's", f"{check['activation_grids']} / "
                                                       f"{check['activation_grids_not_the_plans']}"]]
    rows.append(["run", f"no: {check['not_run']}"])
    report.add_table(f"{artifact} as written (read back, not run)", ["check", "result"], rows)


def add_mobile_latency(report: Report, latency: Mapping[str, Any], *, artifact: str, threads: int, runs: int,
                       fp32: str | None = None) -> None:
    """Latency of the ``artifact`` on its runtime, eager torch, ORT float and (``fp32``: its row, for an INT8
    artifact) the fp32 artifact on the same runtime, timed in interleaved rounds; a passing verdict says where the
    artifact is not faster than eager torch, or than its fp32 twin."""
    report.add("latency", {k: dataclasses.asdict(v) for k, v in latency.items()})
    eager_ms = latency["eager torch fp32"].median_ms
    ratio = latency[artifact].median_ms / eager_ms
    if ratio >= 1.0 and report.passed:  # a passing artifact that is not faster than eager torch says so (a model
        # with attention ran as a .pte at 0.47x eager torch's speed, and the verdict said nothing)
        report.set_verdict(f"{report.verdict}; the {artifact} takes {ratio:.2f}x eager torch's time on this CPU "
                           f"({threads} thread(s)): eager torch may serve better here", passed=True)
    twin = latency[artifact].median_ms / latency[fp32].median_ms if fp32 in latency else 0.0
    if twin >= 1.0 and report.passed:
        report.set_verdict(f"{report.verdict}; the INT8 {artifact} takes {twin:.2f}x the fp32 one's time on this "
                           f"CPU ({threads} thread(s)): the fp32 artifact (compile without --calib) may serve better "
                           "here", passed=True)
    report.add_table(f"Latency ({threads} thread(s), {runs} runs each, interleaved; this machine's CPU)",
                     ["runtime", "median ms", "p90 ms", "time vs eager torch (under 1: faster)"],
                     [[name, f"{r.median_ms:.2f}", f"{r.p90_ms:.2f}", f"{r.median_ms / eager_ms:.2f}x"]
                      for name, r in latency.items()])  # a time ratio, as quantize's and bench's (it was a speedup)
