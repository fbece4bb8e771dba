"""Mixed precision per layer under an accuracy floor: each quantized node (Conv, Gemm, and the Adds, Concats,
pooling, resizes... between them) stays int8 or is lifted to 16-bit activations or to float32, chosen by what the
lift buys (output error removed) per millisecond it costs (measured on this machine), until the quantized model
passes the caller's check (the task metric and SQNR floors of ``npukit.tasks.QualityGate``).

The steps, on a QDQ model built with the stand-in recipe (``tensor_precision.stand_in_config``: no AdaRound, range
search or conv-kernel move, whose choices must come after the precision's), the nodes its steps left in float
(float head, float joins and squares, fragile depthwise convs: ``qdq.decided_floats``) kept float in every
candidate, so a candidate is the model the final build gives (until 2026-12-04 only the float head was kept: a
RetinaFace candidate quantized the two depthwise convs the shipped model keeps float):

- sensitivity of a layer: the output noise it adds in the all-int8 model (``sensitivity.layer_sensitivity``, its
  output's noise-to-signal ratio less its noisiest input's); layers are measured in that order, ``max_layers`` at a
  time. Not only convolutions: RetinaFace's landmarks stayed at 11.9 dB with 41 of its 54 convs lifted (the floor
  18 dB; every activation at 16 bits: 21.9 dB), the rest of the error in the Adds and Concats of its heads;
- per measured layer and option (``OPTIONS``), a model built with that one change: its *gain* is the output
  noise-to-signal power ratio it removes (all graph outputs against the float model, first ``scan_samples``
  calibration samples), its *cost* the latency it adds to the all-int8 model, timed interleaved with it
  (1 thread, ratios paired round by round, ``latency.paired_ratio``). A 16-bit layer runs off ONNX Runtime's int8
  kernels with its neighbours (they read or write its 16-bit tensors); a float layer pays the DequantizeLinear of
  its weights on every run: MACs predict neither, so both are measured. Sensitivity does not predict the gain
  well either (MobileNetV2: the 16 options that met a 20 dB floor came from layers ranked 1 to 50);
- order: every option by gain per millisecond (costs under ``NOISE_FLOOR`` of the base latency count as that
  much), best first; a layer's later option replaces its earlier one where it removes more (``assignment_of``);
- search: the first 1, 2, 4, ... options of that order are taken, the model built and checked (``accept``) until
  one passes; then the smallest passing prefix between the last failing and the first passing size is bisected
  (gains do not add, so the check, not the estimate, decides). The all-int8 model is checked first: when it
  passes, nothing is lifted. While nothing passes, the next ``max_layers`` layers are measured and the search
  runs again over all measured options.

For comparison the plan is timed beside the all-int8 model and the all-16-bit one (every node's activations at 16
bits, the usual way to buy accuracy on a CPU), and the all-16-bit model is checked too: the report shows whether
the per-layer plan beats it.

Options left out on ONNX Runtime's CPU provider: float16 (ORT 1.32 on x86 has no fp16 Conv kernel: its optimized
graph runs a float32 Conv between two Casts, so a float16 layer costs a float32 one plus the casts and adds fp16
rounding) and int4 weights (ORT runs them as a float conv after a DequantizeLinear: smaller files, never faster than
int8; ``npukit qat --bits w4a8`` and ``npukit prune --sparsity`` make them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import onnx

from npukit.errors import InputError
from npukit.measure.latency import paired_ratio, time_sessions_interleaved
from npukit.quant.calibration.auto import output_sqnrs
from npukit.quant.calibration.calibrate import iter_samples
from npukit.quant.config import QuantConfig
from npukit.quant.layer_sqnr import noise_ratio, sqnr_db
from npukit.quant.plan import Decision
from npukit.quant.precision.sensitivity import layer_sensitivity
from npukit.quant.precision.tensor_precision import CHUNK, stand_in_config
from npukit.quant.qdq import build_qdq, decided_floats, keep_decided_floats, quantize
from npukit.runtime.ort import make_session

OPTIONS = ("int16", "float32")  # what a layer may be lifted to on ONNX Runtime's CPU provider
TIMING = {"threads": 1, "warmup": 3, "runs": 30, "rounds": 10}  # interleaved; ratios paired by round
NOISE_FLOOR = 0.005  # latency differences under 0.5% of the int8 model's count as this much (timer noise)
LIFTED = Decision("mixed_precision", "lifted: most output error removed per ms added until the floors were met")


@dataclasses.dataclass(frozen=True)
class Check:
    """One model's check under the caller's floors: ``passed`` and the verdict's one line."""

    passed: bool
    line: str


@dataclasses.dataclass(frozen=True)
class LayerOption:
    """One layer at one precision: ``gain``, the output noise-to-signal ratio it removes (``share`` of the all-int8
    model's); ``added_ms``, the latency it adds alone to the all-int8 model's ``base_ms``."""

    node: str
    precision: str
    gain: float
    share: float
    added_ms: float
    base_ms: float = 0.0


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """``assignment``: the lifted layers (node -> "int16" or "float32"), every other layer int8; ``met``: the plan's
    model passed ``accept``; ``sensitivity``: (layer, share of the output noise it adds) for every quantized
    node, most sensitive first; ``options``: what was measured per candidate; ``order``: the search order;
    ``tried``: one {"lifted", "passed", "line"} per model checked; ``timing``: median ms of the all-int8 model, the
    plan and the all-16-bit model, timed together (1 thread); ``all_16bit``: that model's check; ``samples``: the
    scanned samples."""

    assignment: Mapping[str, str]
    met: bool
    sensitivity: tuple[tuple[str, float], ...]
    options: tuple[LayerOption, ...]
    order: tuple[LayerOption, ...]
    tried: tuple[dict, ...]
    timing: Mapping[str, float]
    all_16bit: Check
    base_sqnr_db: float
    plan_sqnr_db: float
    samples: int
    config: QuantConfig
    why: Mapping[str, Decision]

    def summary(self) -> dict[str, Any]:
        return {"assignment": dict(self.assignment), "met": self.met, "samples": self.samples,
                "base_sqnr_db": self.base_sqnr_db, "plan_sqnr_db": self.plan_sqnr_db,
                "timing_ms": dict(self.timing), "all_16bit": dataclasses.asdict(self.all_16bit),
                "sensitivity": dict(self.sensitivity), "tried": list(self.tried),
                "options": [dataclasses.asdict(o) for o in self.options],
                "order": [f"{o.node}:{o.precision}" for o in self.order],
                "float_head": [n for n, d in self.why.items() if d.step == "float_stem"]}


def lifted(config: QuantConfig, assignment: Mapping[str, str]) -> QuantConfig:
    """``config`` with the layers of ``assignment`` at their precision: int16 ones among ``int16_nodes``, float32
    ones among ``exclude``."""
    unknown = set(assignment.values()) - set(OPTIONS)
    if unknown:
        raise InputError(f"unknown layer precision(s) {sorted(unknown)}", hint=f"use one of {', '.join(OPTIONS)}")
    wide = tuple(n for n, p in assignment.items() if p == "int16")
    floats = tuple(n for n, p in assignment.items() if p == "float32")
    return config.with_scheme(int16_nodes=tuple(dict.fromkeys(config.scheme.int16_nodes + wide)),
                              exclude=tuple(dict.fromkeys(config.scheme.exclude + floats)))


def search_order(options: Iterable[LayerOption], *, floor_ms: float) -> list[LayerOption]:
    """Every option that removes noise, most gain per millisecond first (costs under ``floor_ms`` count as
    ``floor_ms``); a layer may appear twice, its later option an upgrade (``assignment_of``)."""
    def value(o: LayerOption) -> float:
        return o.gain / max(o.added_ms, floor_ms)

    return sorted((o for o in options if o.gain > 0), key=lambda o: (-value(o), o.node, o.precision))


def assignment_of(order: Iterable[LayerOption]) -> dict[str, str]:
    """Layer -> precision after taking ``order``'s options in turn, a later option of a layer replacing the earlier
    one where it removes more noise (a float32 layer cheap enough to come first can become 16-bit later)."""
    taken: dict[str, LayerOption] = {}
    for o in order:
        if o.node not in taken or o.gain > taken[o.node].gain:
            taken[o.node] = o
    return {node: o.precision for node, o in taken.items()}


def smallest_passing(count: int, check: Callable[[int], bool]) -> int | None:
    """The smallest n in 1..count with ``check(n)`` true, probing 1, 2, 4, ... then bisecting below the first
    size that passes (as if passing were monotone in n); None when ``count`` itself fails."""
    failing, size = 0, 1
    while True:
        size = min(size, count)
        if check(size):
            break
        if size == count:
            return None
        failing, size = size, size * 2
    passing = size
    while passing - failing > 1:
        mid = (failing + passing) // 2
        if check(mid):
            passing = mid
        else:
            failing = mid
    return passing


def _measure_options(layers: list[str], build: Callable[[Mapping[str, str]], onnx.ModelProto],
                     reference: onnx.ModelProto, samples: Iterable[object], n: int, base_session: Any,
                     base_nsr: float, first: dict, *, base_ms: float | None) -> list[LayerOption]:
    """Each option of each of ``layers`` built alone: the output noise-to-signal ratio it removes on the first
    ``n`` samples and the latency it adds, timed interleaved with the all-int8 model (``base_session``; its
    ``base_ms``, when None measured here, turns ratios into milliseconds)."""
    keys = [(node, p) for node in layers for p in OPTIONS]
    options = []
    for i in range(0, len(keys), CHUNK):  # bounds the sessions held at once; each chunk timed beside the base
        models = {f"{node}:{p}": build({node: p}) for node, p in keys[i:i + CHUNK]}
        scores = output_sqnrs(reference, models, samples, start=0, stop=n)
        times = time_sessions_interleaved({"": base_session} | {k: make_session(m) for k, m in models.items()},
                                          feeds=first, **TIMING)
        base_ms = base_ms or times[""].median_ms
        for key in models:
            node, p = key.rsplit(":", 1)
            gain = base_nsr - noise_ratio(scores[key])
            added = (paired_ratio(times[""], times[key], rounds=TIMING["rounds"]) - 1.0) * base_ms
            options.append(LayerOption(node, p, gain, gain / base_nsr if base_nsr > 0 else 0.0, added, base_ms))
    return options


def _timed_beside(models: Mapping[str, onnx.ModelProto], first: dict) -> dict[str, float]:
    """Median ms of each model, timed interleaved with the first one (1 thread) and given as that one's median
    times the ratio paired by round."""
    timed = time_sessions_interleaved({k: make_session(m) for k, m in models.items()}, feeds=first, **TIMING)
    base = next(iter(models))
    return {k: timed[base].median_ms * paired_ratio(timed[base], timed[k], rounds=TIMING["rounds"]) for k in models}


def plan_layer_precision(model: onnx.ModelProto, samples: Iterable[object], *, config: QuantConfig,
                         accept: Callable[[onnx.ModelProto], Check], scan_samples: int = 16,
                         max_layers: int = 24) -> LayerPlan:
    """The fewest layer lifts, in the order of the module docstring, that make the model built with ``config``
    pass ``accept``. ``samples``: the calibration samples (re-iterable). Candidates are measured ``max_layers`` at a
    time, the most sensitive first, and more are measured (and the search run again on all of them) while no plan
    passes. Returns the plan with ``config`` as it must be built (the lifts added, the stand-in's float nodes
    kept); ``met`` False when every layer was measured and lifting all that help still fails (the plan is then
    that one)."""
    if scan_samples < 1 or max_layers < 1:
        raise InputError(f"scan_samples {scan_samples} and max_layers {max_layers} must be at least 1")
    samples = list(samples) if iter(samples) is samples else samples
    stand_in = stand_in_config(config)
    built = quantize(model, samples, config=stand_in)
    as_built = keep_decided_floats(stand_in, built)
    first = next(iter_samples(model, samples))
    reference = built.reference

    def build(layers: Mapping[str, str]) -> onnx.ModelProto:  # from the bias-corrected weights, when corrected
        return build_qdq(built.source, first, lifted(as_built, layers), built.ranges, {})

    base = build({})
    n = min(scan_samples, sum(1 for _ in iter_samples(reference, samples, limit=config.calibration.samples)))
    base_nsr = noise_ratio(output_sqnrs(reference, {"": base}, samples, start=0, stop=n)[""])
    noise = layer_sensitivity(built, samples, limit=min(n, 8), ops=None)
    total = sum(max(v, 0.0) for _, v in noise) or 1.0
    sensitivity = tuple((node, v / total) for node, v in noise)
    base_session = make_session(base)
    options: list[LayerOption] = []
    tried: list[dict] = []
    checked: dict[tuple, Check] = {}

    def passes(layers: dict[str, str]) -> bool:
        key = tuple(sorted(layers.items()))
        if key not in checked:
            checked[key] = accept(build(layers))
            tried.append({"lifted": len(layers), "candidates": len(options) // len(OPTIONS),
                          "passed": checked[key].passed, "line": checked[key].line})
        return checked[key].passed

    ranked = [node for node, _ in noise]
    order: list[LayerOption] = []
    size = 0 if passes({}) else None
    measured = 0
    while size is None and measured < len(ranked):  # more candidates while no plan passes
        options += _measure_options(ranked[measured:measured + max_layers], build, reference, samples, n,
                                    base_session, base_nsr, first, base_ms=options[0].base_ms if options else None)
        measured += max_layers
        order = search_order(options, floor_ms=NOISE_FLOOR * options[0].base_ms)
        size = smallest_passing(len(order), lambda k: passes(assignment_of(order[:k]))) if order else None
    met = size is not None
    chosen = assignment_of(order[:size if met else len(order)])
    plan = build(chosen)
    wide = as_built.with_scheme(int16_nodes=tuple(nd.name for nd in reference.graph.node
                                                  if nd.name not in as_built.scheme.exclude))
    all_16bit = build_qdq(built.source, first, wide, built.ranges, {})
    timing = _timed_beside({"int8": base, "plan": plan, "all_16bit": all_16bit}, first)
    plan_db = output_sqnrs(reference, {"": plan}, samples, start=0, stop=n)[""]
    why = decided_floats(built) | {n: LIFTED for n, p in chosen.items() if p == "float32"}
    why |= {t: LIFTED for nd in reference.graph.node if chosen.get(nd.name) == "int16"
            for t in (*nd.input, *nd.output) if t}
    return LayerPlan(assignment=chosen, met=met, sensitivity=sensitivity, options=tuple(options),
                     order=tuple(order), tried=tuple(tried), timing=timing, all_16bit=accept(all_16bit),
                     base_sqnr_db=float(sqnr_db(1.0, base_nsr)) if base_nsr > 0 else float("inf"),
                     plan_sqnr_db=float(plan_db), samples=n,
                     config=lifted(keep_decided_floats(config, built), chosen), why=why)
