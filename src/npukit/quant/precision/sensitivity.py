"""Mixed precision: find the layers whose 8-bit quantization hurts most and lift the fewest of them to 16-bit
activations (or leave them in float) until the model's output SQNR reaches a target.

Sensitivity of a Conv/Gemm = the noise-to-signal power ratio its own step adds in the all-8-bit model: 10^(-SQNR/10)
at its output minus at its input (per-layer SQNR from ``layer_sqnr``), so a layer is blamed for the error it adds,
not the error it inherits; layers left in float (excluded, or the float head) are not ranked. The search lifts the
1, 2, 4, ... most sensitive layers (at most ``max_layers``), re-quantizes and measures the output SQNR on the samples
each time, and returns the first plan that reaches the target, or the best one tried. The float head
(``FloatHead()``) is timed and chosen once, for the all-8-bit model, and the other float nodes ``quantize`` chose
with it (``qdq.decided_floats``); every trial keeps them (as exclusions).
16-bit layers run off ONNX Runtime's int8 kernels (see ``integer_kernel_report``), so each plan also records its
integer-kernel fraction: measure its latency before shipping it. ``npukit.quant.precision.tensor_precision`` (QuantConfig
``int16_budget``) chooses single activations instead, within a budget of MACs taken off the int8 kernels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import Literal

import numpy as np
import onnx

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.quant.calibration.calibrate import iter_samples
from npukit.quant.config import QuantConfig
from npukit.quant.layer_sqnr import layer_sqnr, noise_ratio, sqnr_db
from npukit.quant.precision.tensor_precision import TIED_OPS
from npukit.quant.qdq import QuantResult, integer_kernel_report, keep_decided_floats, quantize
from npukit.runtime.ort import make_session

Mode = Literal["int16", "exclude"]


@dataclasses.dataclass(frozen=True)
class MixedPrecisionPlan:
    """``config``: the chosen QuantConfig; ``nodes``: the lifted layers; ``sqnr_db``: output SQNR with them;
    ``baseline_sqnr_db``: all 8-bit; ``sensitivity``: (node, noise-to-signal ratio it adds) most sensitive first;
    ``tried``: one {"nodes", "sqnr_db", "integer_fraction"} per plan measured; ``reached``: target met."""

    config: QuantConfig
    nodes: tuple[str, ...]
    sqnr_db: float
    baseline_sqnr_db: float
    sensitivity: list[tuple[str, float]]
    tried: list[dict]
    reached: bool
    result: QuantResult


def output_sqnr(float_model: onnx.ModelProto, quant_model: onnx.ModelProto, samples: Iterable[object]) -> float:
    """SQNR in dB of the first output of ``quant_model`` against ``float_model`` over all samples."""
    ref_s, q_s = make_session(float_model), make_session(quant_model)
    signal = noise = 0.0
    for feeds in iter_samples(float_model, samples):
        r = np.asarray(ref_s.run(None, feeds)[0], np.float64)
        q = np.asarray(q_s.run(None, feeds)[0], np.float64)
        signal += float(np.sum(r * r))
        noise += float(np.sum((r - q) ** 2))
    return sqnr_db(signal, noise)


def layer_sensitivity(result: QuantResult, samples: Iterable[object], *, limit: int = 8,
                      ops: Collection[str] | None = ("Conv", "Gemm")) -> list[tuple[str, float]]:
    """(node, noise-to-signal ratio it adds) for every quantized node of ``ops`` (None: every node with a quantized
    output of its own, a grid tied to its input's excepted: Reshape, MaxPool, ... add no noise of their own), most
    sensitive first. A node's input noise is the largest of its inputs' (a graph input: exact); a node none of whose
    inputs is measured (it reads a float node's output) is not ranked."""
    rows = layer_sqnr(result.reference, result.model, samples, limit=limit)
    at = {r["tensor"]: r["sqnr_db"] for r in rows}
    index = GraphIndex(result.reference.graph)
    excluded = {r["node"] for r in result.per_layer if r["excluded"]}  # in float: the user's and the float head
    scores = []
    for node in result.reference.graph.node:
        if (node.op_type not in ops if ops is not None else node.op_type in TIED_OPS) or node.name in excluded \
                or not any(t in at or t in index.inputs for t in node.input):
            continue
        before = max((noise_ratio(at[t]) for t in node.input if t in at), default=0.0)
        out = node.output[0]
        # the reported activation may be the fused Relu/Clip's output
        while out not in at and len(readers := index.consumer_nodes(out)) == 1 \
                and readers[0].op_type in ("Relu", "Clip"):
            out = readers[0].output[0]
        if out in at:
            scores.append((node.name, float(noise_ratio(at[out]) - before)))
    return sorted(scores, key=lambda s: -s[1])


def choose_mixed_precision(model: onnx.ModelProto, samples: Iterable[object], *, config: QuantConfig,
                           target_sqnr_db: float, max_layers: int, mode: Mode = "int16",
                           eval_samples: Iterable[object] | None = None) -> MixedPrecisionPlan:
    """The fewest most-sensitive layers (up to ``max_layers``) to lift so the output SQNR on ``eval_samples``
    (default: ``samples``) reaches ``target_sqnr_db``; calibration always uses ``samples``."""
    if max_layers < 1:
        raise InputError(f"max_layers {max_layers} must be at least 1", hint="allow at least one 16-bit layer")
    if mode not in ("int16", "exclude"):
        raise InputError(f"unknown mixed-precision mode {mode!r}", hint="use int16 or exclude")
    samples = list(samples)
    evals = samples if eval_samples is None else list(eval_samples)
    base = quantize(model, samples, config=config)
    config = keep_decided_floats(config, base)  # the trials keep the float head etc. instead of deciding anew
    baseline = output_sqnr(model, base.model, evals)
    ranking = layer_sensitivity(base, samples)
    tried = [{"nodes": [], "sqnr_db": baseline,
              "integer_fraction": integer_kernel_report(base.model)["integer_fraction"]}]
    best = (baseline, (), config, base)
    limit = min(max_layers, len(ranking))
    sizes = sorted({min(2 ** k, limit) for k in range(limit.bit_length() + 1)} - {0})
    field = "int16_nodes" if mode == "int16" else "exclude"
    for size in sizes if baseline < target_sqnr_db else ():
        nodes = tuple(name for name, _ in ranking[:size])
        trial_config = config.with_scheme(**{field: tuple(getattr(config.scheme, field)) + nodes})
        trial = quantize(model, samples, config=trial_config)
        value = output_sqnr(model, trial.model, evals)
        tried.append({"nodes": list(nodes), "sqnr_db": value,
                      "integer_fraction": integer_kernel_report(trial.model)["integer_fraction"]})
        if value > best[0]:
            best = (value, nodes, trial_config, trial)
        if value >= target_sqnr_db:
            break
    value, nodes, chosen, result = best
    return MixedPrecisionPlan(config=chosen, nodes=nodes, sqnr_db=value, baseline_sqnr_db=baseline,
                              sensitivity=ranking, tried=tried, reached=value >= target_sqnr_db, result=result)
