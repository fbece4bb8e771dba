"""Tensor-level mixed precision: lift to 16 bits the 8-bit activations whose rounding costs the outputs most per
millisecond the lift adds, within a latency budget measured on this machine.

Why tensors and not layers (``npukit.quant.precision.sensitivity``): lifting a Conv lifts its input and output, often a wide
expanded tensor, and takes its neighbours off ONNX Runtime's int8 kernels too; lifting one tensor takes off only the
nodes that read or write it. On MobileNetV2 the error of the 8-bit activations is spread over many tensors, but a
few (the last stage's 160-channel residual stream) each add several times what the rest do.

The steps, on a QDQ model built with the caller's recipe (AdaRound swapped for bias correction, which removes the
same mean error at a fraction of the time, and no range search: the choice must come before both):

- gain of a tensor: the output noise-to-signal power ratio (all graph outputs, against the float model, on the
  first ``scan_samples`` calibration samples) minus the ratio with that tensor's rounding removed: its
  QuantizeLinear/DequantizeLinear pair becomes a Clip to the same grid's range, so saturation stays, as on a 16-bit
  grid over the same range (whose steps are 256 times finer);
- cost of a tensor: the latency its lift adds, measured: the ``max_candidates`` tensors of highest gain (at least
  ``MIN_GAIN_SHARE`` of the base ratio) are each built with that one tensor at 16 bits and timed interleaved with
  the all-8-bit model (1 thread; the ratio to it paired round by round, ``latency.paired_ratio``). MACs are a poor
  proxy on ONNX Runtime's CPU provider: a float island also pays the 16-bit Q/DQ of its tensors, the
  DequantizeLinear of its weights on every run and the layout changes around it, which follow the tensors' sizes
  and places, not the MACs;
- greedy: the tensor with the most gain per millisecond first, while the summed costs stay within ``budget x`` the
  all-8-bit model's latency; then the chosen set is built and timed together, and the last choices are dropped
  until it fits.

Tensors that ONNX Runtime's quantizer ties to one grid (a Reshape/Flatten/MaxPool/... output takes its input's) are
one candidate, named by the first of them that has a Q/DQ pair (``candidate_groups``). Gains are measured one
candidate at a time and do not add (two tensors can both take the same node off a saturating int8 kernel), so the
plan's estimate is measured with every chosen candidate's rounding removed at once; it still leaves out the 16-bit
grid's own rounding and calibration, and the recipe's later steps: measure the final model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization.operators.direct_q8 import QDQDirect8BitOp
from onnxruntime.quantization.operators.gather import QDQGather
from onnxruntime.quantization.operators.split import QDQSplit
from onnxruntime.quantization.registry import QDQRegistry

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.measure.latency import paired_ratio, time_sessions_interleaved
from npukit.quant.calibration.auto import output_sqnrs
from npukit.quant.calibration.calibrate import iter_samples
from npukit.quant.config import QuantConfig
from npukit.quant.grids import grid_range
from npukit.quant.layer_sqnr import noise_ratio
from npukit.runtime.ort import make_session

TIED_OPS = frozenset(op for op, quantizer in QDQRegistry.items()
                     if issubclass(quantizer, (QDQDirect8BitOp, QDQGather, QDQSplit)))
MIN_GAIN_SHARE = 0.01  # a tensor must remove at least 1% of the output noise to be worth a float island
CHUNK = 16  # candidate models scored per pass over the samples (bounds the sessions held at once)
TIMING = {"threads": 1, "warmup": 3, "runs": 40, "rounds": 10}  # interleaved; ratios paired by round
NOISE_FLOOR = 0.005  # latency differences under 0.5% of the 8-bit model's count as this much (timer noise)


@dataclasses.dataclass(frozen=True)
class TensorGain:
    """One candidate activation: the output noise-to-signal ratio its 8-bit rounding adds (``gain``; ``share`` of
    the all-8-bit model's ratio)."""

    tensor: str
    gain: float
    share: float


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    """``tensors``: the activations to lift, in the order chosen; ``budget``: the latency allowed on top of the
    all-8-bit model's ``base_ms`` (a fraction); ``plan_ms``: ``base_ms`` times the chosen set's latency ratio
    timed beside it (1 thread, this machine); ``added_ms``: what each timed candidate adds alone; ``dropped``:
    choices undone because the set together went past the budget; ``base_sqnr_db`` / ``estimated_sqnr_db``: output
    SQNR on the scanned samples all 8-bit and with the chosen tensors' rounding removed."""

    tensors: tuple[str, ...]
    budget: float
    base_ms: float
    plan_ms: float
    base_sqnr_db: float
    estimated_sqnr_db: float
    scanned: tuple[TensorGain, ...]
    added_ms: dict[str, float]
    dropped: tuple[str, ...]
    samples: int

    def summary(self) -> dict:
        shares = {g.tensor: g.share for g in self.scanned}
        return {
            "tensors": list(self.tensors), "budget": self.budget, "base_ms": self.base_ms, "plan_ms": self.plan_ms,
            "added_share": self.plan_ms / self.base_ms - 1.0 if self.base_ms else 0.0,
            "base_sqnr_db": self.base_sqnr_db, "estimated_sqnr_db": self.estimated_sqnr_db,
            "samples": self.samples, "dropped": list(self.dropped),
            "candidates": [{"tensor": t, "gain_share": shares[t], "added_ms": ms} for t, ms in self.added_ms.items()],
            "scanned": {g.tensor: g.share for g in sorted(self.scanned, key=lambda g: -g.gain)},
        }


def activation_pairs(qdq: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """Tensor (as named in the float model) -> the QuantizeLinear of its activation Q/DQ pair. ORT renames a graph
    output that it quantizes to ``<name>_QuantizeLinear_Input``; it is reported under the output's own name."""
    constants = {i.name for i in qdq.graph.initializer}
    outputs = {o.name for o in qdq.graph.output}
    dq_out = {n.input[0]: n.output[0] for n in qdq.graph.node if n.op_type == "DequantizeLinear"}
    pairs = {}
    for node in qdq.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in constants or node.output[0] not in dq_out:
            continue
        name = dq_out[node.output[0]] if dq_out[node.output[0]] in outputs else node.input[0]
        pairs[name] = node
    return pairs


def sixteen_bit_activations(qdq: onnx.ModelProto) -> set[str]:
    """Tensors (named as ``activation_pairs`` names them) whose activation Q/DQ pair has a 16-bit type."""
    types = {i.name: i.data_type for i in qdq.graph.initializer}
    wide = (onnx.TensorProto.UINT16, onnx.TensorProto.INT16)
    return {t for t, q in activation_pairs(qdq).items() if types.get(q.input[2]) in wide}


def without_rounding(qdq: onnx.ModelProto, quantize_nodes: Iterable[onnx.NodeProto]) -> onnx.ModelProto:
    """A copy of ``qdq`` whose Q/DQ pairs at ``quantize_nodes`` are each a Clip to their grid's range instead: the
    same saturation, no rounding."""
    values = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    out = onnx.ModelProto()
    out.CopyFrom(qdq)
    clips = {}
    for q in quantize_nodes:
        lo, hi = grid_range(float(values[q.input[1]]), values[q.input[2]])
        tag = q.output[0]
        out.graph.initializer.extend([numpy_helper.from_array(np.float32(lo), f"{tag}_clip_lo"),
                                      numpy_helper.from_array(np.float32(hi), f"{tag}_clip_hi")])
        clips[tag] = q.input[0]
    nodes = []
    for node in out.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in clips:
            tag = node.input[0]
            nodes.append(helper.make_node("Clip", [clips[tag], f"{tag}_clip_lo", f"{tag}_clip_hi"],
                                          list(node.output), name=f"{node.name}_unrounded"))
        elif not (node.op_type == "QuantizeLinear" and node.output[0] in clips):
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def tied_groups(reference: onnx.ModelProto) -> dict[str, list[str]]:
    """Tensor -> the tensors whose grid ONNX Runtime's quantizer ties to it (outputs of Reshape, Flatten, MaxPool,
    Split, Gather, ... take their input's scale and type, ``TIED_OPS``), the tensor first. Lifting a tensor lifts its
    group; a tied output asked for alone is not lifted, so only group roots are candidates."""
    index = GraphIndex(reference.graph)

    def root(t: str) -> str:
        while (node := index.producer_node(t)) is not None and node.op_type in TIED_OPS and node.input:
            t = node.input[0]
        return t

    groups: dict[str, list[str]] = {}
    names = [i.name for i in reference.graph.input] + [o for n in reference.graph.node for o in n.output if o]
    for t in names:
        groups.setdefault(root(t), []).append(t)
    return groups


def scan_gains(reference: onnx.ModelProto, qdq: onnx.ModelProto, samples: Iterable[object], *,
               limit: int) -> tuple[float, int, list[TensorGain]]:
    """Base output noise-to-signal ratio and one ``TensorGain`` per group of tied activations with Q/DQ pairs in
    ``qdq`` (``candidate_groups``), on the first ``limit`` samples (see the module docstring)."""
    n = sum(1 for _ in iter_samples(reference, samples, limit=limit))
    pairs = activation_pairs(qdq)
    groups = candidate_groups(reference, pairs)
    base = noise_ratio(output_sqnrs(reference, {"": qdq}, samples, start=0, stop=n)[""])
    names = list(groups)
    gains = []
    for i in range(0, len(names), CHUNK):
        chunk = {r: without_rounding(qdq, [pairs[t] for t in groups[r]]) for r in names[i:i + CHUNK]}
        for r, db in output_sqnrs(reference, chunk, samples, start=0, stop=n).items():
            gain = base - noise_ratio(db)
            gains.append(TensorGain(r, gain, gain / base if base > 0 else 0.0))
    return base, n, gains


def candidate_groups(reference: onnx.ModelProto, pairs: dict[str, onnx.NodeProto]) -> dict[str, list[str]]:
    """``tied_groups`` restricted to the tensors with Q/DQ pairs, each named by its first such tensor (a tied
    output whose root ORT leaves in float, e.g. ReduceMean's, gets a grid of its own)."""
    groups = [[t for t in members if t in pairs] for members in tied_groups(reference).values()]
    return {members[0]: members for members in groups if members}


def choose_tensors(gains: list[TensorGain], added_ms: dict[str, float], *, allowed_ms: float,
                   floor_ms: float) -> list[str]:
    """The greedy choice of the module docstring among the tensors with a measured cost: most gain per millisecond
    first (costs under ``floor_ms`` count as ``floor_ms``), while the summed costs stay within ``allowed_ms``."""
    left = [g for g in gains if g.tensor in added_ms and g.gain > 0]
    left.sort(key=lambda g: (-g.gain / max(added_ms[g.tensor], floor_ms), g.tensor))
    chosen, used = [], 0.0
    for g in left:
        cost = max(added_ms[g.tensor], 0.0)
        if used + cost <= allowed_ms:
            chosen.append(g.tensor)
            used += cost
    return chosen


def check_plan_arguments(budget: float, scan_samples: int, max_candidates: int) -> None:
    if not 0.0 < budget <= 1.0:
        raise InputError(f"int16 budget {budget} must be in (0, 1]",
                         hint="the latency the 16-bit tensors may add, as a fraction of the int8 model's, e.g. 0.1")
    if scan_samples < 1 or max_candidates < 1:
        raise InputError(f"scan_samples {scan_samples} and max_candidates {max_candidates} must be at least 1")


def stand_in_config(config: QuantConfig) -> QuantConfig:
    """The recipe the plan is chosen on: ``config`` without the 16-bit budget, AdaRound (bias correction instead),
    range search and the conv-kernel move (the candidates are built without it, and timed against it)."""
    return (config.with_precision(int16_budget=0.0).with_cpu(gemm_convs=False)
            .with_recipe(adaround=None, range_search=None,
                         bias_correction=config.recipe.bias_correction or bool(config.recipe.adaround)))


def plan_int16_tensors(built: Any, samples: Iterable[object], *,
                       build: Callable[[Iterable[str]], onnx.ModelProto], calib_samples: int | None, budget: float,
                       scan_samples: int = 16, max_candidates: int = 8) -> TensorPlan:
    """The activations to quantize at 16 bits so that the latency grows by at most ``budget`` (a fraction of the
    all-8-bit model's, measured here), scanned on the first ``scan_samples`` samples (all when fewer), the
    ``max_candidates`` of highest gain timed; see the module docstring. ``built``: the stand-in quantization
    (``stand_in_config``; a ``QuantResult``: its ``model``, ``reference`` and ``ranges``); ``build(tensors)``: that
    model built again with ``tensors`` lifted to 16 bits (``npukit.quant.qdq.plan_int16`` provides both).
    ``samples`` must be re-iterable (a list, a reader)."""
    check_plan_arguments(budget, scan_samples, max_candidates)
    reference = built.reference
    first = next(iter_samples(reference, samples))
    available = sum(1 for _ in iter_samples(reference, samples, limit=calib_samples))
    base, n, gains = scan_gains(reference, built.model, samples, limit=min(scan_samples, available))
    ranked = sorted((g for g in gains if g.share >= MIN_GAIN_SHARE), key=lambda g: -g.gain)[:max_candidates]

    sessions = {"": make_session(built.model)} | {g.tensor: make_session(build([g.tensor])) for g in ranked}
    times = time_sessions_interleaved(sessions, feeds=first, **TIMING)
    base_ms = times[""].median_ms
    added = {g.tensor: (paired_ratio(times[""], times[g.tensor], rounds=TIMING["rounds"]) - 1.0) * base_ms
             for g in ranked}
    chosen = choose_tensors(ranked, added, allowed_ms=budget * base_ms, floor_ms=NOISE_FLOOR * base_ms)
    dropped: list[str] = []
    plan_ms = base_ms
    while chosen:  # costs need not add: time the set together, undo the last choices until it fits
        timed = time_sessions_interleaved({"": sessions[""], "plan": make_session(build(chosen))}, feeds=first,
                                          **TIMING)
        ratio = paired_ratio(timed[""], timed["plan"], rounds=TIMING["rounds"])
        base_ms, plan_ms = timed[""].median_ms, timed[""].median_ms * ratio
        if ratio <= 1.0 + budget:
            break
        dropped.append(chosen.pop())
        plan_ms = base_ms
    pairs = activation_pairs(built.model)
    groups = candidate_groups(reference, pairs)
    together = without_rounding(built.model, [pairs[t] for r in chosen for t in groups[r]])
    estimated = output_sqnrs(reference, {"": together}, samples, start=0, stop=n)[""]
    return TensorPlan(tensors=tuple(chosen), budget=budget, base_ms=base_ms, plan_ms=plan_ms,
                      base_sqnr_db=float(-10.0 * np.log10(base)) if base > 0 else float("inf"),
                      estimated_sqnr_db=float(estimated), scanned=tuple(gains), added_ms=added,
                      dropped=tuple(dropped), samples=n)
