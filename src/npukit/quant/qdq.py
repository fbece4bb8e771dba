"""INT8 post-training quantization: constant scales and shifts after convs folded into them -> (CLE) -> (activation
equalization) -> (channel pairing) -> calibrate with our observers -> (choose the method, for "auto") -> (AdaRound)
-> (bias correction) -> QDQ -> (range search on that model, then QDQ again on the searched ranges) -> (move the convs
that ORT runs faster on its general int8 GEMM there, ``conv_kernel``).

ONNX Runtime's ``quantize_static`` does the mechanical Q/DQ placement; every activation range it uses is ours, passed
as ``TensorQuantOverrides`` (rmin/rmax, plus the 16-bit type for ``int16_nodes`` / ``int16_tensors``), so its own
calibration pass (given one sample) decides nothing; AdaRound's weights come with their grids (scales, zero points) as
overrides too, so ORT reproduces the learned integers. ``integer_kernel_report`` checks that ORT CPU then runs integer
kernels.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization.shape_inference import quant_pre_process

from npukit._scratch import scratch_cwd
from npukit.data.subsets import in_spread_order
from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.frontend.onnx_io import named_nodes
from npukit.measure.summary import summarize
from npukit.quant.algorithms.adaround import adaround
from npukit.quant.algorithms.bias_correction import correct_bias, correct_bias_each
from npukit.quant.algorithms.equalize import equalize
from npukit.quant.algorithms.range_search import search_ranges
from npukit.quant.algorithms.stream_equalize import equalize_streams
from npukit.quant import memo, recipe
from npukit.quant.calibration.auto import Split, choose_method, output_sqnrs, split_samples, worst_output_sqnrs
from npukit.quant.calibration.calibrate import (Calibration, Progress, calibrate, iter_samples,
                                                sixteen_bit_tensors)
from npukit.quant.config import QuantConfig, Recipe
from npukit.quant.cpu.conv_kernel import choose_conv_kernels, require_exact_move
from npukit.quant.cpu.float_head import HeadChoice, choose_float_head
from npukit.quant.cpu.pair_channels import pair_channels, pairing_pays
from npukit.quant.cpu.schemes import (PAIR_BOUNDED, STEM_MAX_K, pair_bounded, pair_bounded_scale, reduced_weight_range,
                                      stem_convs, weight_rows)
from npukit.quant.emit.ort_float import FLOAT_INPUT, TAKEN_OPS, taken_by_ort
from npukit.quant.emit.ort_qdq import emit_qdq, resolve_grids
from npukit.quant.grids import weight_axis
from npukit.quant.plan import Decision, QuantPlan, SIXTEEN_BIT, TensorSpec
from npukit.quant.precision.float_neighbours import AFTER, BETWEEN, float_neighbours
from npukit.quant.precision.fragile import FRAGILE_DB, fragile_convs, grouped_convs
from npukit.quant.precision.joins import JOIN_RATIO, mixed_scale_joins
from npukit.quant.precision.scored_head import Floor, choose_scored_heads
from npukit.quant.precision.squares import square_chains
from npukit.quant.precision.tensor_precision import (TensorPlan, activation_pairs, check_plan_arguments,
                                                     plan_int16_tensors, sixteen_bit_activations, stand_in_config,
                                                     tied_groups)
from npukit.quant.scoring import session_for
from npukit.quant.steps import FloatConvsRecord, FoldedAffinesRecord, QuantSteps
from npukit.runtime.ort import INTEGER_COMPUTE_KERNELS, INTEGER_KERNELS, make_session

FLOAT_COMPUTE_OPS = ("Conv", "FusedConv", "MatMul", "FusedMatMul", "Gemm", "FusedGemm")
FLOAT_NEIGHBOUR = {AFTER: Decision("float_neighbour", "elementwise on float nodes' outputs only: quantized once, after "
                                                      "it"),
                   BETWEEN: Decision("float_neighbour", "only float nodes feed and read it: quantizing it adds "
                                                        "roundings, no integer kernel")}
FRAGILE_SAMPLES = 4  # calibration samples the depthwise-input measure runs on (its own min-max ranges)
FLOAT_HEAD = Decision("float_stem", "a short-reduction stem and the chain after it run fastest in float here")
USER_EXCLUDE = Decision("exclude", "named by the user")
SCORED_HEAD = Decision("float_head_scored", "the stem and the convs after it whose float model scored best within "
                                            "the float head's share of the MACs")


@dataclasses.dataclass(frozen=True)
class QuantResult:
    """The QDQ model, the activation ranges used, one dict per node, and notes from each step.

    ``reference`` is the float model the quantized one mirrors tensor for tensor (pre-processed and, with CLE,
    equalized: the same function as the input model): compare per-layer activations against it.
    """

    model: onnx.ModelProto
    reference: onnx.ModelProto
    ranges: dict[str, tuple[float, float]]
    per_layer: list[dict]
    seconds: float
    steps: QuantSteps
    plan: QuantPlan | None = None  # what every tensor was quantized to and which step decided it, as emitted
    source: onnx.ModelProto | None = None  # the float model emitted (reference, bias-corrected / AdaRound weights)


class _Reiterable:
    """Lets a one-shot iterator be read several times (by holding it in memory); re-iterables pass through. A data set
    or a list is read in ``spread_order`` (``npukit.data.subsets``): the first k samples a step reads (the precision
    scans, ``calibration.samples``) and the last quarter "auto" holds out lie spread over all of them, not in the
    first or last classes of a folder sorted by class."""

    def __init__(self, samples: Iterable[object]) -> None:
        self._samples = in_spread_order(list(samples) if iter(samples) is samples else samples)

    def __iter__(self):
        return iter(self._samples)


# Pre-processed models by the digest of the model given (``npukit.quant.memo``): every trial of a search
# pre-processes the same model (a quarter of a second on MobileNetV2). One or two models, not one per trial.
_PREPROCESSED = memo.memo("pre-processed models", entries=2, max_bytes=256 << 20)


def preprocess(model: onnx.ModelProto) -> onnx.ModelProto:
    """ORT's quantization pre-processing (shape inference, BatchNorm folding and other basic optimizations).

    It runs in a scratch working directory: ORT's symbolic shape inference saves ``sym_shape_infer_temp.onnx`` (and
    its weights) into the current directory when it gives up. When it does give up, ONNX shape inference alone is
    used (enough for the static shapes npukit quantizes with). The nodes its optimizations add (a function op it
    inlines: HardSwish as HardSigmoid and Mul) get names, as ``named_nodes`` gives them, the same on every run.
    A model pre-processed before in this process comes back as it did then (a copy)."""
    digest = memo.model_digest(model)
    if not digest:
        return _preprocess(model)
    kept = _PREPROCESSED.get(digest)
    if kept is None:
        kept = _preprocess(model).SerializeToString()
        _PREPROCESSED.put(digest, kept, len(kept))
    return onnx.load_from_string(kept)


def _preprocess(model: onnx.ModelProto) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory(prefix="npukit-quant-") as tmp:
        out = Path(tmp) / "pre.onnx"
        with scratch_cwd(prefix="npukit-quant-cwd-"):
            try:
                quant_pre_process(model, str(out))
            except Exception as exc:  # ORT raises a bare Exception("Incomplete symbolic shape inference")
                import traceback

                # ... or an AssertionError inside it (an If branch's output without a type, as in Silero VAD)
                inside = any(f.filename.endswith("symbolic_shape_infer.py")
                             for f in traceback.extract_tb(exc.__traceback__))
                if "symbolic shape inference" not in str(exc) and not inside:
                    raise
                source = Path(tmp) / "in.onnx"  # from a path: given a ModelProto here ORT loses its weights
                onnx.save(model, str(source))
                quant_pre_process(str(source), str(out), skip_symbolic_shape=True)
        return named_nodes(onnx.load(str(out)))


def fold_conv_affines(model: onnx.ModelProto, keep: Iterable[str] = (), keep_tensors: Iterable[str] = ()
                      ) -> tuple[onnx.ModelProto, FoldedAffinesRecord | None]:
    """``model`` with the constant scales and shifts after its convs folded into them (``passes.fold_conv_affine``),
    and the record of the folds; ``model`` itself and None when there is nothing to fold. The affine nodes named in
    ``keep``, and those reading or writing a tensor of ``keep_tensors``, stay (a node or tensor the user named)."""
    import onnx_ir as ir

    from npukit.passes.fold_conv_affine import AFFINE_OPS, FoldConvAffinePass

    tensors = set(keep_tensors)
    kept = set(keep) | {n.name for n in model.graph.node
                        if n.op_type in AFFINE_OPS and tensors & {*n.input, *n.output}}
    fold = FoldConvAffinePass(keep=frozenset(kept))
    result = fold(ir.serde.deserialize_model(copy.deepcopy(model)))
    if not fold.folded:
        return model, None
    return ir.serde.serialize_model(result.model), {"into": dict(fold.folded)}


def effective_ranges(model: onnx.ModelProto, ranges: dict[str, tuple[float, float]], config: QuantConfig
                     ) -> dict[str, tuple[float, float]]:
    """The range each calibrated tensor is quantized with, mirroring ORT's rule that a Relu/Clip input takes its
    output's range (the two fuse); a bounded activation's output (Softmax, Sigmoid, HardSigmoid: [0, 1]; Tanh:
    [-1, 1]) spans its whole range, never what a clipping observer chose (``BOUNDED``)."""
    adjusted = dict(ranges)
    index = GraphIndex(model.graph)
    for node in index.nodes:
        if node.name in config.scheme.exclude:
            continue
        if node.op_type in ("Relu", "Clip") and len(index.consumer_nodes(node.input[0])) == 1 \
                and node.output[0] in ranges and node.input[0] in ranges:
            adjusted[node.input[0]] = ranges[node.output[0]]
    for name, bounds in bounded_outputs(model, config).items():
        if name in ranges:
            adjusted[name] = bounds
    return adjusted


# Activations whose output lies in a fixed range: quantized over all of it. A clipping observer (percentile, entropy,
# MSE) that cuts a sigmoid's rare high values cuts exactly the confident scores a detector reports (on a YOLOv8
# detector's calibration photos MSE chose [0, 0.53] for its class scores), while the whole [0, 1] costs a few levels
# at most. Their inputs are kept wide enough too (``calibrate.saturating_inputs``).
BOUNDED = {"Softmax": (0.0, 1.0), "Sigmoid": (0.0, 1.0), "HardSigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0)}


def bounded_outputs(model: onnx.ModelProto, config: QuantConfig) -> dict[str, tuple[float, float]]:
    """Outputs of the quantized bounded activations (``BOUNDED``) and the range each spans whatever was
    calibrated."""
    return {n.output[0]: BOUNDED[n.op_type] for n in model.graph.node
            if n.op_type in BOUNDED and n.name not in config.scheme.exclude}


def softmax_outputs(model: onnx.ModelProto, config: QuantConfig) -> list[str]:
    """Outputs of the quantized Softmax nodes, whose range is [0, 1] whatever was calibrated."""
    return [n.output[0] for n in model.graph.node if n.op_type == "Softmax" and n.name not in config.scheme.exclude]


def plan_for(model: onnx.ModelProto, config: QuantConfig, ranges: Mapping[str, tuple[float, float]],
             weights: Mapping[str, TensorSpec] | None = None, *, why: Mapping[str, Decision] | None = None,
             range_why: Mapping[str, Decision] | None = None) -> QuantPlan:
    """The quantization plan of ``config`` on ``model`` with these activation ``ranges`` and fixed ``weights``
    grids (AdaRound's), each entry with its decisions: the calibrated range (``range_why``: the step per tensor,
    calibration by default, range search), the float nodes and 16-bit tensors (``why``: the step per node or tensor
    when not the user's choice: the float head, a float join, the 16-bit plan) and the light nodes that join them
    (``precision.float_neighbours``: a float conv's activation, a node between float nodes), ORT's Relu/Clip fusion
    and the bounded activations' whole range (``effective_ranges``), the 16-bit tensors, and under
    ``reduce_range`` the weights this CPU's kernels take on more than 7 bits (``npukit.quant.cpu.schemes``)."""
    why, range_why = why or {}, range_why or {}
    plan = scheme_plan(config)
    for node in config.scheme.exclude:
        plan = plan.keep_float([node], why.get(node, USER_EXCLUDE))
    neighbours = float_neighbours(model, plan.float_nodes, keep=config.scheme.int16_nodes)
    for node, kind in neighbours.items():
        plan = plan.keep_float([node], FLOAT_NEIGHBOUR[kind])
    calibrated = Decision("calibration", f"{config.calibration.method} over the calibration samples")
    act = config.scheme.activation_dtype
    plan = plan.with_specs({t: TensorSpec(act, symmetric=config.scheme.symmetric_activations, range=r)
                            for t, r in ranges.items()}, {t: range_why.get(t, calibrated) for t in ranges})
    adjusted = effective_ranges(model, ranges, config)
    bounded = bounded_outputs(model, config)
    moved = {t: r for t, r in adjusted.items() if t not in ranges or tuple(r) != tuple(ranges[t])}
    plan = plan.with_specs(
        {t: TensorSpec(act, symmetric=config.scheme.symmetric_activations, range=r) for t, r in moved.items()},
        {t: Decision("bounded_activation", "the whole range of a bounded activation's output") if t in bounded
         else Decision("ort_fusion", "a Relu/Clip input takes its output's grid (ORT fuses the two)") for t in moved})
    wide = sixteen_bit_tensors(model, config)
    lifted = {t: plan.tensors[t].as_dtype(SIXTEEN_BIT[act]) for t in adjusted if t in wide}
    by_node = {t for n in model.graph.node if n.name in config.scheme.int16_nodes for t in (*n.input, *n.output)}
    plan = plan.with_specs(lifted, {t: why.get(t, Decision("int16", "read or written by a 16-bit node" if t in by_node
                                                           else "named a 16-bit tensor")) for t in lifted})
    plan = plan.with_specs(*_weight_grids(model, config))
    if weights:
        plan = plan.with_specs(weights, Decision("adaround", "learned rounding; the grid ORT must reproduce"))
    return plan


def scheme_plan(config: QuantConfig) -> QuantPlan:
    """An empty plan on ``config``'s scheme (int8 weights)."""
    scheme = config.scheme
    return QuantPlan(activation_dtype=scheme.activation_dtype, weight_dtype="int8", per_channel=scheme.per_channel,
                     symmetric_weights=scheme.symmetric_weights, symmetric_activations=scheme.symmetric_activations,
                     reduce_range=config.cpu.reduce_range)


def _weight_grids(model: onnx.ModelProto, config: QuantConfig) -> tuple[dict[str, TensorSpec], dict[str, Decision]]:
    """Under ``reduce_range``, the weights whose kernel does not saturate at 7 bits: depthwise convs keep all 8 bits;
    1x1 convs and Gemms take the pair-bounded grid (``npukit.quant.cpu.schemes``), as explicit scales."""
    if not config.cpu.reduce_range:
        return {}, {}
    inits = GraphIndex(model.graph).initializers
    specs: dict[str, TensorSpec] = {}
    reasons: dict[str, Decision] = {}
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 2 or node.input[1] not in inits \
                or node.name in config.scheme.exclude:
            continue
        shape = tuple(inits[node.input[1]].dims)
        if pair_bounded(node, shape, config):
            rows = weight_rows(node, numpy_helper.to_array(inits[node.input[1]]))
            specs[node.input[1]] = TensorSpec.fixed_weight(
                pair_bounded_scale(rows, per_channel=config.scheme.per_channel),
                axis=weight_axis(node, per_channel=config.scheme.per_channel))
            reasons[node.input[1]] = PAIR_BOUNDED
        elif not reduced_weight_range(node, shape, config):
            specs[node.input[1]] = TensorSpec("int8", symmetric=config.scheme.symmetric_weights,
                                              axis=0 if config.scheme.per_channel else None,
                                              quant_min=-127 if config.scheme.symmetric_weights else -128)
            reasons[node.input[1]] = Decision("cpu_scheme", "full 8 bits: this kernel does not saturate")
    return specs, reasons


def _per_layer(float_model: onnx.ModelProto, qdq: onnx.ModelProto, ranges: dict[str, tuple[float, float]],
               config: QuantConfig) -> list[dict]:
    q_index = GraphIndex(qdq.graph)
    qdq_nodes = {n.name: n for n in qdq.graph.node if n.name}
    wide, wide_tensors = set(config.scheme.int16_nodes), set(config.scheme.int16_tensors)
    rows = []
    for node in float_model.graph.node:
        twin = qdq_nodes.get(node.name)
        quantized = twin is not None and all(q_index.producer_op(t) == "DequantizeLinear" for t in twin.input if t)
        rows.append({
            "node": node.name,
            "op_type": node.op_type,
            "quantized": bool(quantized),
            "activation_bits": 16 if node.name in wide or wide_tensors & set(node.output) else 8,
            "excluded": node.name in config.scheme.exclude,
            "input_ranges": {t: ranges[t] for t in node.input if t in ranges},
            "output_ranges": {t: ranges[t] for t in node.output if t in ranges},
        })
    return rows


def build_qdq(work: onnx.ModelProto, first: dict[str, np.ndarray], config: QuantConfig,
              ranges: Mapping[str, tuple[float, float]], weight_grids: Mapping[str, TensorSpec]) -> onnx.ModelProto:
    """ORT's QDQ placement on the float model ``work`` with our activation ranges (and fixed weight grids): the
    plan of ``plan_for``, emitted by ``emit.ort_qdq.emit_qdq``."""
    return emit_qdq(work, first, plan_for(work, config, ranges, weight_grids))


def one_sample_ranges(work: onnx.ModelProto, first: dict[str, np.ndarray],
                      config: QuantConfig) -> dict[str, tuple[float, float]]:
    """Min-max ranges of ``work``'s activations on the one sample ``first``: enough to build a QDQ model whose
    structure and speed (not accuracy) are those of the real one, in seconds."""
    return calibrate(work, [first], config=config.with_calibration(method="minmax", samples=None)).ranges


def check_int16_tensors(work: onnx.ModelProto, first: dict[str, np.ndarray], config: QuantConfig,
                        probe: dict[str, tuple[float, float]]) -> None:
    """Fail before any long step when ORT's quantizer would keep one of ``config.scheme.int16_tensors`` at 8 bits: it
    gives a tied output (of Flatten, Reshape, MaxPool, ... ``tensor_precision.TIED_OPS``) its input's grid, so only the
    input can be lifted. Found by building the QDQ model on the ``probe`` ranges (``one_sample_ranges``)."""
    built = build_qdq(work, first, config, probe, {})
    pairs, wide = activation_pairs(built), sixteen_bit_activations(built)
    stuck = [t for t in config.scheme.int16_tensors if t in pairs and t not in wide]
    if stuck:
        root = {t: r for r, members in tied_groups(work).items() for t in members}
        raise InputError(f"int16 tensor(s) {', '.join(stuck)} would stay 8-bit: ONNX Runtime's quantizer ties "
                         + ", ".join(f"{t} to the grid of {root[t]}" for t in stuck),
                         hint=f"name {', '.join(dict.fromkeys(root[t] for t in stuck))} instead (that lifts the "
                              "tensors tied to it too)")


def head_stems(work: onnx.ModelProto, config: QuantConfig) -> list[str]:
    """The stems of ``work`` (``schemes.stem_convs``) a float head may start from: not excluded, not 16-bit."""
    return [n for n in stem_convs(work) if n not in config.scheme.exclude and n not in config.scheme.int16_nodes]


def float_heads(work: onnx.ModelProto, first: dict[str, np.ndarray], config: QuantConfig,
                probe: dict[str, tuple[float, float]] | None = None) -> list[HeadChoice]:
    """For each stem of ``work`` (``schemes.stem_convs``, less the excluded and 16-bit nodes), the Convs to leave in
    float: the stem and the prefix of its chain that runs fastest here (``float_head``), each candidate built on the
    ``probe`` ranges (``one_sample_ranges``, computed here when None)."""
    stems = head_stems(work, config)
    if not stems:
        return []
    if probe is None:
        probe = one_sample_ranges(work, first, config)
    quick = config.with_precision(float_head=None)
    heads: list[HeadChoice] = []
    for i, stem in enumerate(stems):
        others = tuple(stems[i + 1:])  # the stems still to choose for, in float alone meanwhile

        def build(prefix: tuple[str, ...], others: tuple[str, ...] = others) -> onnx.ModelProto:
            chosen = tuple(n for h in heads for n in h.nodes)
            return build_qdq(work, first, quick.with_scheme(exclude=quick.scheme.exclude + chosen + others + prefix),
                             probe, {})

        heads.append(choose_float_head(work, stem, first, build, keep=frozenset(config.scheme.int16_nodes)))
    return heads


def quantize(model: onnx.ModelProto, samples: Iterable[object], *, config: QuantConfig,
             progress: Progress | None = None, why: Mapping[str, Decision] | None = None) -> QuantResult:
    """Quantize ``model`` to a QDQ model (int8 weights, ``config.scheme.activation_dtype`` activations) on ``samples``.

    ``samples`` (dicts of input name -> array) are read once per step; pass a re-iterable (a list, a reader) to
    keep memory bounded, since a one-shot iterator is held in memory. With ``method="auto"`` the method is chosen
    after CLE and before AdaRound and bias correction (see ``npukit.quant.calibration.auto``); ``steps.auto`` holds
    each candidate's held-out output SQNR and the choice. ``why``: the step that chose a float node or a 16-bit tensor
    of ``config`` when it was not the user (e.g. a mixed-precision plan), for the plan's provenance.

    The steps run in this order, each one a function below that does nothing when ``config`` leaves it off.
    """
    start = time.perf_counter()
    build = _Build.begin(model, samples, config, why)
    _float_head(build)
    _float_joins(build)
    _float_squares(build)
    _int16_plan(build)
    build = _recipe(build, progress)  # CLE, activation equalization, pairing, fragile convs, held-out scores
    _calibration(build, progress)
    _scored_head(build)
    _adaround(build)
    _bias_correction(build)
    _emit(build)
    _range_search(build)
    _conv_kernels(build)
    return build.result(time.perf_counter() - start)


@dataclasses.dataclass
class _Build:
    """What ``quantize``'s steps read and write. ``requested`` is the config as given and is never rewritten. What
    the steps decide goes into ``decided``, the plan so far, each entry with the step that set it and why: the nodes
    left in float, the 16-bit tensors a step chose (``int16_plan``), the activations' ranges (``calibration``, then
    ``range_search``), AdaRound's fixed weight grids (``adaround``); besides it, ``recipe`` (the recipe chosen among
    candidates) and ``method`` (the calibration method "auto" chose); ``done`` names the deciding steps that ran.
    ``config`` is what the later steps build with, derived from those. Then the float model being quantized, the plan
    and the QDQ model emitted (``emit``: the decided plan completed by the scheme, ``plan_for``), and the steps'
    records."""

    model: onnx.ModelProto  # the user's model, every node named
    samples: _Reiterable
    first: dict[str, np.ndarray]  # the first sample: what ORT's placement and the timing probes run on
    requested: QuantConfig
    work: onnx.ModelProto  # the float model as the steps so far changed it (pre-processed, equalized, ...)
    decided: QuantPlan  # the plan so far: float nodes (the user's first), 16-bit tensors, ranges, weight grids
    why: dict[str, Decision]  # the caller's reasons for the 16-bit tensors it named, when not the user's choice
    recipe: Recipe | None = None  # the recipe, once chosen among candidates
    method: str | None = None  # the calibration method "auto" chose
    done: frozenset[str] = frozenset()  # deciding steps that ran: "float_head", "int16_plan", "recipe", "scored_head"
    steps: QuantSteps = dataclasses.field(default_factory=QuantSteps)
    probe: dict[str, tuple[float, float]] | None = None  # one-sample ranges, for the probes that only build
    reference: onnx.ModelProto | None = None  # the float model calibrated: what the QDQ model mirrors
    before_rounding: dict[str, np.ndarray] | None = None  # AdaRound's float weights, for bias correction
    plan: QuantPlan | None = None
    qdq: onnx.ModelProto | None = None
    held: _HeldOut | None = None  # the method choice on held-out samples, where one was made
    started: float = dataclasses.field(default_factory=time.perf_counter)

    @classmethod
    def begin(cls, model: onnx.ModelProto, samples: Iterable[object], config: QuantConfig,
              why: Mapping[str, Decision] | None) -> _Build:
        """Checks that fail before any long step, then ORT's pre-processing (``preprocess``) and the folds of constant
        scales and shifts into the convs before them (``fold_conv_affines``)."""
        _require_opset(model, config)
        model = named_nodes(model)  # unnamed nodes would all match an exclusion of the name ""
        samples = _Reiterable(samples)
        first = next(iter_samples(model, samples, limit=config.calibration.samples))  # validates before any work
        if config.cpu.gemm_convs:
            require_exact_move()  # refused where ORT's two int8 conv kernels are not both exact
        scheme, work, folded = config.scheme, preprocess(model), None
        if config.recipe.fold_affines:
            work, folded = fold_conv_affines(work, keep=(*scheme.exclude, *scheme.int16_nodes),
                                             keep_tensors=scheme.int16_tensors)
        # a node of the graph, or one pre-processing added (a plan chosen on the pre-processed graph may name those)
        missing = set(config.scheme.exclude) - {n.name for g in (model, work) for n in g.graph.node}
        if missing:
            raise InputError(f"nodes to exclude {sorted(missing)} are not in the model",
                             hint="use node names from the graph")
        why = dict(why or {})
        decided = scheme_plan(config)
        for node in config.scheme.exclude:
            decided = decided.keep_float([node], why.pop(node, USER_EXCLUDE))
        build = cls(model=model, samples=samples, first=first, requested=config, work=work, decided=decided, why=why)
        build.steps.folded_affines = folded
        if config.scheme.int16_tensors:
            build.probe = one_sample_ranges(work, first, config)
            check_int16_tensors(work, first, config, build.probe)
        return build

    @property
    def config(self) -> QuantConfig:
        """The requested config with what the deciding steps chose so far: the plan's float nodes excluded, the
        16-bit tensors chosen named, the recipe's fields and the method chosen set, and the steps that ran
        (float head, 16-bit plan, recipe choice) off."""
        asked = self.requested
        return dataclasses.replace(
            asked,
            scheme=dataclasses.replace(asked.scheme, exclude=tuple(self.decided.float_nodes), int16_tensors=tuple(
                dict.fromkeys(asked.scheme.int16_tensors + tuple(self.decided.set_by("int16_plan"))))),
            calibration=dataclasses.replace(asked.calibration, method=self.method or asked.calibration.method),
            recipe=self.recipe or asked.recipe,
            precision=dataclasses.replace(
                asked.precision,
                float_head=None if self.done & {"float_head", "scored_head"} else asked.precision.float_head,
                int16_budget=0.0 if "int16_plan" in self.done else asked.precision.int16_budget))

    @property
    def ranges(self) -> dict[str, tuple[float, float]]:
        """The activations' ranges decided so far (calibration, range search)."""
        return self.decided.ranges()

    def keep_float(self, nodes: Iterable[str], decision: Decision) -> None:
        self.decided = self.decided.keep_float(nodes, decision)

    def fork(self, candidate: Recipe) -> _Build:
        """A copy that goes on with the ``candidate`` recipe (scored on the requested arithmetic), sharing what the
        steps so far made."""
        recipe = dataclasses.replace(candidate, score_on=self.requested.recipe.score_on)
        return dataclasses.replace(self, recipe=recipe, done=self.done | {"recipe"}, why=dict(self.why),
                                   steps=copy.copy(self.steps))

    def reasons(self) -> dict[str, Decision]:
        """Float node or 16-bit tensor -> the step that chose it (``plan_for``'s ``why``)."""
        floats = {n: history[-1] for n, history in self.decided.float_nodes.items()}
        sixteen_bit = {t: next(d for d in self.decided.provenance(t) if d.step == "int16_plan")
                       for t in self.decided.set_by("int16_plan")}
        return {**self.why, **sixteen_bit, **floats}

    def probe_ranges(self) -> dict[str, tuple[float, float]]:
        if self.probe is None:
            self.probe = one_sample_ranges(self.work, self.first, self.config)
        return self.probe

    def planned(self) -> QuantPlan:
        """The decided plan completed by the scheme (``plan_for``): what the model would be emitted with now, and
        what the steps that measure quantization (AdaRound, bias correction) read."""
        ranges = self.ranges
        return plan_for(self.work, self.config, ranges, self.decided.set_by("adaround"), why=self.reasons(),
                        range_why={t: self.decided.provenance(t)[-1] for t in ranges})

    def emit(self) -> None:
        """The plan as decided (``planned``), and the QDQ model ORT places for it."""
        self.plan = self.planned()
        self.qdq = emit_qdq(self.work, self.first, self.plan)

    def result(self, seconds: float) -> QuantResult:
        assert self.qdq is not None and self.plan is not None and self.reference is not None
        plan, not_honoured = resolve_grids(self.work, self.qdq, self.plan)
        self.steps.plan = plan.summary() | {"not_as_planned": not_honoured}
        self.steps.float_convs = float_conv_record(self.qdq, plan)
        return QuantResult(model=self.qdq, reference=self.reference, ranges=self.ranges, plan=plan, source=self.work,
                           per_layer=_per_layer(self.work, self.qdq, self.ranges, self.config), seconds=seconds,
                           steps=self.steps)


def _require_opset(model: onnx.ModelProto, config: QuantConfig) -> None:
    """Refuse per-channel weights on a model below opset 13: ORT's quantizer writes DequantizeLinear nodes with an
    axis that the model's opset lacks, a model no runtime loads (16-bit activations below opset 21 are written as
    com.microsoft Q/DQ, which ORT runs)."""
    from npukit.frontend.opset import PER_CHANNEL_QDQ_OPSET, onnx_opset

    if config.scheme.per_channel and onnx_opset(model) < PER_CHANNEL_QDQ_OPSET:
        raise InputError(f"the model is at opset {onnx_opset(model)}; per-channel Q/DQ needs opset "
                         f"{PER_CHANNEL_QDQ_OPSET}",
                         hint=f"convert it first: npukit.frontend.opset.ensure_opset(model, {PER_CHANNEL_QDQ_OPSET}, "
                              "reason=...) (npukit quantize does this and verifies the conversion), or quantize "
                              "per tensor")


def _float_head(b: _Build) -> None:
    """The stem convs and the chain after them that run fastest in float on this CPU stay float (``float_heads``);
    before the 16-bit plan, which then times and scans the model with its float head."""
    if not b.config.precision.timed_head:
        return
    heads = float_heads(b.work, b.first, b.config, b.probe)
    head_nodes = tuple(n for h in heads for n in h.nodes)
    compute = {n.name for n in b.work.graph.node if n.op_type in FLOAT_COMPUTE_OPS} - set(b.config.scheme.exclude)
    dropped = ""
    if head_nodes and compute <= set(head_nodes):  # the head would leave no integer compute at all
        dropped = (f"the float head ({', '.join(head_nodes)}) would have left every conv/matmul of the model in "
                   "float; it is dropped and the model quantized whole")
        head_nodes = ()
    b.keep_float(head_nodes, FLOAT_HEAD)
    b.done |= {"float_head"}
    b.steps.float_stem = {"nodes": list(head_nodes), "max_k": STEM_MAX_K, "heads": [h.summary() for h in heads],
                          "dropped": dropped}


def _float_joins(b: _Build) -> None:
    """A join of very different scales (boxes and scores) and what follows it stay in float."""
    if not b.config.precision.float_joins:
        return
    taken = set(b.config.scheme.exclude) | set(b.config.scheme.int16_nodes)
    joins = [j for j in mixed_scale_joins(b.work, b.probe_ranges()) if j.node not in b.config.scheme.exclude]
    kept = tuple(dict.fromkeys(n for j in joins for n in (j.node, *j.after) if n not in taken))
    if kept:
        b.keep_float(kept, Decision("float_joins", "a join of tensors on very different scales, or after one"))
        b.steps.float_joins = {"nodes": list(kept), "ratio": JOIN_RATIO, "joins": [j.summary() for j in joins]}


def _float_squares(b: _Build) -> None:
    """A square that a root, logarithm or division reads back (a magnitude, a variance) stays in float with the
    nodes between."""
    if not b.config.precision.float_squares:
        return
    chains = square_chains(b.work)
    taken = set(b.config.scheme.exclude) | set(b.config.scheme.int16_nodes)
    kept = tuple(dict.fromkeys(n for c in chains for n in c.nodes if n not in taken))
    if kept:
        b.keep_float(kept, Decision("float_squares", "a square read back by a root, logarithm or division, or between"))
        b.steps.float_squares = {"nodes": list(kept), "chains": [c.summary() for c in chains]}


def _int16_plan(b: _Build) -> None:
    """The 16-bit activations within a latency budget: chosen on the recipe without them, then built like a list
    the user gave."""
    if b.config.precision.int16_budget <= 0:
        return
    int16 = plan_int16(b.model, b.samples, config=b.config, budget=b.config.precision.int16_budget)
    b.done |= {"int16_plan"}
    b.steps.int16_plan = int16.summary()
    act = b.config.scheme.activation_dtype
    b.decided = b.decided.with_specs(
        {t: TensorSpec(SIXTEEN_BIT[act], symmetric=b.config.scheme.symmetric_activations) for t in int16.tensors},
        Decision("int16_plan", f"most output error per ms within a {int16.budget:.0%} latency budget"))


def _cross_layer_equalization(b: _Build) -> None:
    if not b.config.recipe.cle:
        return
    eq = equalize(b.work, samples=b.samples, limit=b.config.calibration.samples)
    b.work = eq.model
    b.steps.cle = eq.summary()


def _activation_equalization(b: _Build) -> None:
    if not b.config.recipe.activation_equalization:
        return
    streams = equalize_streams(b.work, b.samples, alpha=b.config.recipe.activation_equalization.alpha,
                               limit=b.config.calibration.samples)
    b.work = streams.model
    b.steps.activation_equalization = streams.summary()


def _channel_pairing(b: _Build) -> None:
    if not pairing_pays(b.config):
        return
    paired = pair_channels(b.work, b.config)
    b.work = paired.model
    b.steps.pair_channels = paired.summary()


def _float_fragile(b: _Build) -> None:
    """A grouped (depthwise) conv whose output one 8-bit grid on its input ruins stays in float with the node that
    writes that input (``precision.fragile``); measured on the model as equalized, on the first calibration
    samples."""
    if not b.config.precision.float_fragile or not grouped_convs(b.work):
        return
    taken = set(b.config.scheme.exclude) | set(b.config.scheme.int16_nodes)
    wide = set(b.config.scheme.int16_tensors)
    samples = list(itertools.islice(iter_samples(b.work, b.samples, limit=b.config.calibration.samples),
                                    FRAGILE_SAMPLES))
    ranges = calibrate(b.work, samples, config=b.config.with_calibration(method="minmax", samples=None)).ranges
    found = [f for f in fragile_convs(b.work, samples, ranges, signed=b.config.scheme.activation_dtype == "int8",
                                      symmetric=b.config.scheme.symmetric_activations, skip=taken)
             if f.input not in wide]
    kept = tuple(dict.fromkeys(n for f in found for n in (f.node, f.producer) if n and n not in taken))
    b.steps.float_fragile = {"nodes": list(kept), "threshold_db": FRAGILE_DB, "samples": len(samples),
                             "convs": [f.summary() for f in found]}
    if kept:
        b.keep_float(kept, Decision("float_fragile", "a depthwise conv whose input one 8-bit grid cannot carry, or "
                                                     "the node writing that input"))


@dataclasses.dataclass(frozen=True)
class _HeldOut:
    """The method choice on held-out samples: the split, the observers fed the calibration part, the method chosen
    and its score (the held-out output SQNR, dB)."""

    split: Split
    calibration: Calibration
    chosen: str
    score: float
    per_sample: tuple[float, ...]  # the chosen method's score sample by sample


def _recipe(b: _Build, progress: Progress | None) -> _Build:
    """The recipe's own steps before calibration (``_recipe_steps``): once for the config's recipe, or, with
    ``Recipe.choose``, for each candidate of ``recipe.CANDIDATES`` that fits the time budget, keeping the one whose
    held-out output SQNR is highest (``npukit.quant.recipe``). The build the later steps go on with."""
    if not b.config.recipe.choose:
        _recipe_steps(b, progress)
        return b
    trials: dict[str, _Build] = {}
    seconds: dict[str, float] = {}
    skipped: dict[str, str] = {}
    budget_s = b.config.recipe.choose.budget_s
    for name, candidate in recipe.CANDIDATES.items():
        elapsed = time.perf_counter() - b.started
        last = seconds[next(reversed(seconds))] if seconds else 0.0
        if trials and not recipe.within_budget(elapsed, last, budget_s):
            skipped[name] = (f"{elapsed:.0f} s spent and the last candidate took {last:.0f} s: over the "
                             f"{budget_s:.0f} s budget")
            continue
        began = time.perf_counter()
        trial = b.fork(candidate)
        _recipe_steps(trial, progress, score=True)
        trials[name], seconds[name] = trial, time.perf_counter() - began
    held = {n: t.held for n, t in trials.items() if t.held is not None}  # every trial scored (score=True)
    any_held = next(iter(held.values()))
    chosen, record = recipe.choose({n: recipe.Scored(h.score, h.per_sample, h.chosen, seconds[n])
                                    for n, h in held.items()}, skipped=skipped, budget_s=budget_s,
                                   note=any_held.split.note)
    winner = trials[chosen]
    winner.steps.recipe = record
    return winner


def _recipe_steps(b: _Build, progress: Progress | None, *, score: bool = False) -> None:
    """Equalization, channel pairing and the fragile convs, then (``score``, or with method "auto") the methods'
    models scored on held-out samples."""
    _cross_layer_equalization(b)
    _activation_equalization(b)
    _channel_pairing(b)
    _float_fragile(b)
    if score or b.config.calibration.method == "auto":
        _held_out(b, progress)


def _held_out(b: _Build, progress: Progress | None) -> None:
    """Ranges from the first calibration samples, and each method's model (every method with "auto", else the one
    configured) scored on the held-out rest (``calibration.auto``); candidates are bias-corrected, on the calibration
    part in one pass, where the final model will be."""
    work, config = b.work, b.config
    split = _split(b)
    calibration = Calibration(work, config).feed(b.samples, stop=split.calibration, progress=progress)
    first_part = calibration.result()
    method = config.calibration.method
    candidates = first_part.candidates if method == "auto" else {method: first_part.ranges}

    def build(distinct: dict[str, dict[str, tuple[float, float]]]) -> dict[str, onnx.ModelProto]:
        # scored as they will be built: with bias correction (AdaRound's stand-in: both remove the mean error, which
        # the methods' clipping and rounding shift differently) measured on the calibration part only
        bases = dict.fromkeys(distinct, work)
        if config.recipe.bias_correction or config.recipe.adaround:
            plans = {m: plan_for(work, config, ranges) for m, ranges in distinct.items()}
            bases = {m: r.model for m, r in correct_bias_each(work, b.samples, plans=plans,
                                                              limit=split.calibration).items()}
        return {m: build_qdq(bases[m], b.first, config, ranges, {}) for m, ranges in distinct.items()}

    chosen, summary = choose_method(work, candidates, b.samples, split=split, build=build,
                                    session=session_for(config.recipe.score_on))
    if config.calibration.method == "auto":
        b.steps.auto = summary
    b.held = _HeldOut(split=split, calibration=calibration, chosen=chosen, score=summary["candidates"][chosen],
                      per_sample=tuple(summary["chosen_per_sample_db"]))


def _split(b: _Build) -> Split:
    """The calibration / held-out split of the samples the config reads (``calibration.auto.split_samples``)."""
    return split_samples(sum(1 for _ in iter_samples(b.work, b.samples, limit=b.config.calibration.samples)))


def _calibration(b: _Build, progress: Progress | None) -> None:
    """The activation ranges: after a choice on held-out samples, the observers go on over the held-out part (the
    ranges of calibrating on every sample); otherwise one pass. The model calibrated is the reference the QDQ model
    mirrors."""
    b.reference = work = b.work
    config = b.config
    held = b.held
    if held is not None:
        split = held.split
        if split.calibration < split.total:
            held.calibration.feed(b.samples, start=split.calibration, stop=split.total, progress=progress)
        calib = held.calibration.result()
    else:
        calib = calibrate(work, b.samples, config=config, progress=progress)
    if config.calibration.method == "auto":  # chosen on the held-out samples (``_held_out`` always runs for "auto")
        assert held is not None
        b.method = held.chosen
        calib = calib.with_method(held.chosen)
        b.steps.calibration = {"method": "auto", "chosen": held.chosen, "samples": calib.samples,
                               "tensors": len(calib.ranges)}
        method = f"auto (chose {held.chosen})"
    else:
        b.steps.calibration = {"method": config.calibration.method, "samples": calib.samples,
                               "tensors": len(calib.ranges)}
        method = config.calibration.method
    b.decided = b.decided.with_ranges(calib.ranges, Decision("calibration", f"{method} over {calib.samples} samples"))


def _scored_head(b: _Build) -> None:
    """For a runtime this machine cannot time (``FloatHead("accuracy", share)``): the float head chosen by the score
    of each candidate on the last calibration samples (``precision.scored_head``), once the ranges are known and before
    AdaRound and bias correction, which then work on the convs that stay quantized."""
    config = b.config
    if config.precision.head_share <= 0:
        return
    stems = head_stems(b.work, config)
    layers = {row.name: row.macs for row in summarize(b.work).layers}
    total = sum(m or 0 for m in layers.values())
    split = b.held.split if b.held is not None else _split(b)
    session = session_for(config.recipe.score_on)
    floats = set(config.scheme.exclude)
    macs = {n: 0 if n in floats else m for n, m in layers.items()}  # a conv already in float costs nothing more

    def build(prefix: tuple[str, ...]) -> onnx.ModelProto:
        extra = tuple(n for n in prefix if n not in floats)
        return build_qdq(b.work, b.first, config.with_scheme(exclude=config.scheme.exclude + extra), b.ranges, {})

    def score(models: dict[int, onnx.ModelProto]) -> dict[int, float]:
        return output_sqnrs(b.work, models, b.samples, start=split.held_out_start, stop=split.total, session=session)

    head = config.precision.float_head
    floor = None
    if head is not None and head.floor_db is not None:
        def worst(models: dict[int, onnx.ModelProto]) -> dict[int, float]:
            # on every calibration sample: what compile's check reads (the score's last few are too few)
            return worst_output_sqnrs(b.work, models, b.samples, start=0, stop=split.total,
                                      outputs=head.floor_outputs, session=session)

        floor = Floor(head.floor_db, head.floor_share, worst)
    heads = choose_scored_heads(b.work, stems, macs=macs, total=total, share=config.precision.head_share, build=build,
                                score=score, keep=frozenset(config.scheme.int16_nodes), floor=floor)
    nodes = tuple(n for h in heads for n in h.nodes if n not in floats)
    b.keep_float(nodes, SCORED_HEAD)
    b.done |= {"scored_head"}
    b.steps.float_head_scored = {"nodes": list(nodes), "share": config.precision.head_share,
                                 **({"floor_db": floor.db, "floor_share": floor.share,
                                     "floor_outputs": list(head.floor_outputs)} if floor else {}),
                                 "score_on": config.recipe.score_on,
                                 "scored_on_samples": [split.held_out_start, split.total],
                                 "heads": [h.summary() for h in heads]}


def _adaround(b: _Build) -> None:
    """Learned weight rounding for the 8-bit tensors; its grids go into the plan as fixed specs."""
    if not b.config.recipe.adaround:
        return
    ar = adaround(b.work, b.samples, plan=b.planned(), iterations=b.config.recipe.adaround.iterations,
                  limit=b.config.calibration.samples)
    b.before_rounding = {i.name: numpy_helper.to_array(i) for i in b.work.graph.initializer
                         if i.name in ar.weight_specs}
    b.work = ar.model
    b.decided = b.decided.with_specs(ar.weight_specs, Decision("adaround", "learned rounding; the grid ORT must "
                                                                           "reproduce"))
    b.steps.adaround = ar.summary()


def _bias_correction(b: _Build) -> None:
    if not b.config.recipe.bias_correction:
        return
    bc = correct_bias(b.work, b.samples, plan=b.planned(), limit=b.config.calibration.samples,
                      reference_weights=b.before_rounding)
    b.work = bc.model
    b.steps.bias_correction = {
        "nodes": len(bc.shifts), "samples": bc.samples,
        "mean_abs_shift": float(np.mean([np.abs(s).mean() for s in bc.shifts.values()])) if bc.shifts else 0.0}


def _emit(b: _Build) -> None:
    b.emit()


def _range_search(b: _Build) -> None:
    """Last among the grid choices, on the model as built (bias correction stays as measured on the first grid):
    ranges moved where that raised the output SQNR, and the plan emitted again."""
    if not b.config.recipe.range_search:
        return
    assert b.reference is not None and b.qdq is not None
    assert b.plan is not None
    search = search_ranges(b.reference, b.qdq, b.samples, ranges=b.plan.ranges(),
                           limit=b.config.calibration.samples, passes=b.config.recipe.range_search.passes,
                           symmetric=b.plan.symmetric_activations, threads=0,
                           fixed=bounded_outputs(b.work, b.config), score_on=b.config.recipe.score_on)
    b.steps.range_search = search.summary()
    b.decided = b.decided.with_ranges(search.ranges, Decision("range_search", "moved where that raised the output "
                                                                              "SQNR on the calibration samples"))
    b.emit()


def _conv_kernels(b: _Build) -> None:
    """Last: exact, it only picks ORT's kernel per conv."""
    if not b.config.cpu.gemm_convs:
        return
    assert b.qdq is not None
    kernels = choose_conv_kernels(b.qdq, b.first)
    b.qdq = kernels.model
    b.steps.conv_kernels = kernels.summary()


def plan_int16(model: onnx.ModelProto, samples: Iterable[object], *, config: QuantConfig, budget: float,
               scan_samples: int = 16, max_candidates: int = 8) -> TensorPlan:
    """The 16-bit activations for ``config`` within a latency ``budget`` (``tensor_precision.plan_int16_tensors``),
    chosen on the stand-in recipe's model (``tensor_precision.stand_in_config``) and candidates built from its
    ranges with its float nodes kept (``keep_decided_floats``)."""
    check_plan_arguments(budget, scan_samples, max_candidates)
    stand_in = stand_in_config(config)
    built = quantize(model, samples, config=stand_in)
    as_built = keep_decided_floats(stand_in, built)
    first = next(iter_samples(model, samples))

    def build(tensors: Iterable[str]) -> onnx.ModelProto:
        lifted = as_built.with_scheme(int16_tensors=tuple(dict.fromkeys(as_built.scheme.int16_tensors
                                                                         + tuple(tensors))))
        return build_qdq(built.reference, first, lifted, built.ranges, {})

    return plan_int16_tensors(built, samples, build=build, calib_samples=config.calibration.samples, budget=budget,
                              scan_samples=scan_samples, max_candidates=max_candidates)


def float_conv_record(qdq: onnx.ModelProto, plan: QuantPlan) -> FloatConvsRecord:
    """The plan's float Conv/ConvTranspose/Gemm nodes, those among them that read a quantized input (kept off ORT's
    own weight quantizer by ``emit.ort_float``), and any ORT would still run on its per-tensor int8 grid."""
    ops = {n.name: n.op_type for n in qdq.graph.node}
    convs = [n for n in plan.float_nodes if ops.get(n) in TAKEN_OPS]
    own = {n.name for n in qdq.graph.node if n.op_type in TAKEN_OPS and n.input and n.input[0].endswith(FLOAT_INPUT)}
    return {"float_convs": convs, "quantized_input_kept_float": [n for n in convs if n in own],
            "int8_by_ort": taken_by_ort(qdq, convs)}


# The steps of ``quantize`` that choose float nodes themselves (their ``Decision.step``)
DECIDING_STEPS = (FLOAT_HEAD.step, SCORED_HEAD.step, "float_joins", "float_squares", "float_fragile")


def decided_floats(result: QuantResult) -> dict[str, Decision]:
    """The nodes ``quantize``'s own steps left in float in ``result`` (float head, float joins, squares, fragile
    depthwise convs), each with the decision that kept it."""
    assert result.plan is not None
    return {node: history[-1] for node, history in result.plan.float_nodes.items()
            if history and history[-1].step in DECIDING_STEPS}


def keep_decided_floats(config: QuantConfig, result: QuantResult) -> QuantConfig:
    """``config`` that builds ``result``'s float nodes again without deciding them anew: the nodes of
    ``decided_floats`` excluded (a model built from it directly, ``build_qdq``, is then the model ``quantize``
    built, not one with those nodes quantized), no float head step (the head is not chosen again)."""
    chosen = tuple(n for n in decided_floats(result) if n not in config.scheme.exclude)
    return config.with_precision(float_head=None).with_scheme(exclude=tuple(config.scheme.exclude) + chosen)


def integer_kernel_report(model: onnx.ModelProto) -> dict:
    """What ORT CPU actually runs after its optimizations: integer kernels vs float compute fed by DequantizeLinear.

    Returns {"integer_ops": {op: count}, "integer_compute": the conv/matmul kernels among them,
    "float_compute_after_dq": {op: count}, "float_compute": {op: count}, "float_compute_16bit": the float ones fed by
    or quantized onto a 16-bit grid, "integer_fraction": integer conv/matmul kernels / (those + float Conv/MatMul/Gemm and LSTM/GRU/RNN)}. An elementwise
    integer kernel (QLinearAdd, QLinearMul, ...) beside convs computed in float leaves the fraction at 0.
    """
    with tempfile.TemporaryDirectory(prefix="npukit-quant-") as tmp:
        path = Path(tmp) / "optimized.onnx"
        make_session(model, optimized_model_path=str(path))
        optimized = onnx.load(str(path))
    index = GraphIndex(optimized.graph)
    integer = collections.Counter(n.op_type for n in optimized.graph.node if n.op_type in INTEGER_KERNELS)
    float_ops = [n for n in optimized.graph.node if n.op_type in FLOAT_COMPUTE_OPS]
    # recurrent layers have no integer kernel in ORT: float compute too, inside If / Loop bodies as well (Silero
    # VAD's LSTM, in an If: "integer fraction 1" beside the layer that takes most of its estimated energy)
    float_ops += [n for n in _all_nodes(optimized.graph) if n.op_type in RECURRENT_OPS]
    after_dq = collections.Counter(n.op_type for n in float_ops
                                   if any(index.producer_op(t) == "DequantizeLinear" for t in n.input))
    wide = sum(1 for n in float_ops if any(_dequantizes_16_bit(index, t) for t in n.input)
               or any(_quantizes_16_bit(index, c) for o in n.output for c in index.consumer_nodes(o)))
    heavy_integer = sum(v for k, v in integer.items() if k in INTEGER_COMPUTE_KERNELS)
    total = heavy_integer + len(float_ops)
    return {
        "integer_ops": dict(integer),
        "integer_compute": heavy_integer,
        "float_compute_after_dq": dict(after_dq),
        "float_compute": dict(collections.Counter(n.op_type for n in float_ops)),
        "float_compute_16bit": wide,  # fed by or quantized onto a 16-bit grid
        "integer_fraction": heavy_integer / total if total else 0.0,
    }


RECURRENT_OPS = ("LSTM", "GRU", "RNN")


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` and of every subgraph its nodes hold (If branches, Loop and Scan bodies)."""
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)):
                nodes += _all_nodes(sub)
    return nodes


def _dequantizes_16_bit(index: GraphIndex, tensor: str) -> bool:
    """Whether ``tensor`` is a DequantizeLinear's output from a 16-bit grid (its zero point's type): a conv fed so
    computes in float by the plan's choice (ORT has no 16-bit integer conv)."""
    node = index.producer_node(tensor)
    return node is not None and node.op_type == "DequantizeLinear" and _zero_point_16_bit(index, node)


def _quantizes_16_bit(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a QuantizeLinear onto a 16-bit grid (a conv whose output is quantized so has no 8-bit
    integer kernel either)."""
    return node.op_type == "QuantizeLinear" and _zero_point_16_bit(index, node)


def _zero_point_16_bit(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """Whether a Q or DQ node's zero point (its grid's type) is 16-bit; none given is 8-bit."""
    zero = index.initializers.get(node.input[2]) if len(node.input) > 2 else None
    return zero is not None and zero.data_type in (onnx.TensorProto.UINT16, onnx.TensorProto.INT16)


def integer_failures(kernels: dict, result: QuantResult) -> list[str]:
    """A quantized model whose convolutions and matrix products all run in float (elementwise integer kernels
    beside them do not count) is a failure, unless 16-bit activations the plan chose account for them (with the
    float head); the float head's part in it is named."""
    if kernels["integer_compute"]:
        return []
    head = result.steps.float_head_nodes
    floats = sum(kernels["float_compute"].values())  # those fed by DequantizeLinear among them
    if not floats:
        return []  # nothing to run on integer kernels (no Conv, MatMul or Gemm)
    wide = kernels.get("float_compute_16bit", 0)
    if wide and wide + len(head) >= floats:
        return []  # 16-bit activations where the plan (an int16 budget, mixed precision) asked for them
    # (excluding every conv/matmul is refused before quantizing; a partial --exclude leaves the others to the
    # integer kernels, so it excuses nothing here)
    why = f" (the float head left {len(head)} conv(s) in float: {', '.join(head)}; try --float-stem off)" if head \
        else " (try --per-tensor, or check the model's ops with npukit analyze --target cpu)"
    return [f"no integer kernels: ORT runs all {floats} conv/matmul nodes in float{why}"]
