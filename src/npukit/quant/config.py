"""QuantConfig: a quantization scheme (what each tensor becomes) plus how it is found (calibration, recovery recipe,
the steps that decide precisions, this CPU's kernel tweaks), each part frozen and validated on creation.

A config reads as its parts::

    QuantConfig(scheme=Scheme(per_channel=True, exclude=("head",)),
                calibration=CalibrationSpec(method="auto"),
                recipe=Recipe(cle=True, adaround=AdaRound(iterations=300)),
                precision=Precision(float_head=FloatHead()),
                cpu=CpuKernels(reduce_range=True))

A step that takes options is a small frozen record that is either present (on, with its options) or None (off):
``Recipe.adaround``, ``Recipe.activation_equalization``, ``Recipe.range_search``, ``Recipe.choose`` and
``Precision.float_head``. ``with_scheme``, ``with_calibration``, ``with_recipe``, ``with_precision`` and ``with_cpu``
give a copy with fields of one part replaced. ``as_dict`` is what reports store, part by part.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Literal

from npukit.errors import InputError
from npukit.quant.calibration.observers import METHODS
from npukit.quant.scoring import OPTIMIZATION, ScoreOn

Method = str  # "auto" or a name of ``quant.calibration.observers.OBSERVERS``
ActivationDtype = Literal["uint8", "int8"]
HeadChoice = Literal["latency", "accuracy"]


def _require(cond: bool, message: str, hint: str = "") -> None:
    if not cond:
        raise InputError(message, hint=hint)


@dataclasses.dataclass(frozen=True)
class Scheme:
    """What each tensor is quantized to: weights int8, per output channel or per tensor, symmetric or not;
    activations ``activation_dtype`` (symmetric or not) except the inputs and outputs of ``int16_nodes`` and the
    activations named in ``int16_tensors``, which use the 16-bit type of the same signedness (a tensor alone takes
    only the nodes that read or write it off the int8 kernels); ``exclude`` names nodes left in float."""

    per_channel: bool = True
    symmetric_weights: bool = True
    activation_dtype: ActivationDtype = "uint8"
    symmetric_activations: bool = False
    exclude: tuple[str, ...] = ()
    int16_nodes: tuple[str, ...] = ()
    int16_tensors: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("exclude", "int16_nodes", "int16_tensors"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        _require(self.activation_dtype in typing.get_args(ActivationDtype),
                 f"unknown activation dtype {self.activation_dtype!r}", "use uint8 or int8")
        overlap = set(self.int16_nodes) & set(self.exclude)
        _require(not overlap, f"nodes {sorted(overlap)} are both excluded and marked 16-bit",
                 "name each node in only one of int16_nodes and exclude")

    @property
    def activation_signed(self) -> bool:
        return self.activation_dtype == "int8"


@dataclasses.dataclass(frozen=True)
class CalibrationSpec:
    """How activation ranges are observed: ``method`` (a name of ``calibration.observers.OBSERVERS``, or "auto":
    calibrate once with one histogram per tensor, derive every method's ranges from it and keep the method whose QDQ
    model's outputs are closest (SQNR) to the float model's on held-out samples, see
    ``npukit.quant.calibration.auto``), the percentile method's ``percentile``, the histogram methods' ``num_bins``,
    and ``samples``, a cap on the calibration samples read (fewer available is an error)."""

    method: Method = "minmax"
    percentile: float = 99.99
    num_bins: int = 2048
    samples: int | None = None

    def __post_init__(self) -> None:
        _require(self.method in METHODS, f"unknown calibration method {self.method!r}", f"use {', '.join(METHODS)}")
        _require(50.0 < self.percentile <= 100.0, f"percentile {self.percentile} must be in (50, 100]",
                 "typical values are 99.9 to 99.999")
        _require(self.num_bins >= 128 and self.num_bins % 4 == 0,
                 f"num_bins {self.num_bins} must be a multiple of 4 and at least 128", "the default is 2048")
        _require(self.samples is None or self.samples >= 1, "calib_samples must be at least 1")


@dataclasses.dataclass(frozen=True)
class ActivationEqualization:
    """Scale the channels of linear streams (residual Adds, Relu) towards equal ranges; ``alpha`` the strength (0:
    off, 1: every channel full range; see ``npukit.quant.algorithms.stream_equalize``)."""

    alpha: float = 0.5

    def __post_init__(self) -> None:
        _require(0.0 <= self.alpha <= 1.0, f"activation_equalization_alpha {self.alpha} must be in [0, 1]",
                 "0.5 is the measured default")


@dataclasses.dataclass(frozen=True)
class AdaRound:
    """Learn each Conv/Gemm weight's rounding on the calibration data, ``iterations`` Adam steps per layer (it needs
    symmetric weights). Measured on MobileNetV2 (42 calibration crops, 2 cores, 300 steps, with CLE, activation
    equalization, reduce_range and the float stem alone; AMD EPYC without VNNI,
    benchmarks/results/quant_vs_anchors_avx2.md): per-channel (channels paired) 6.6 min, 89.4% top-1 agreement /
    19.2 dB against 84.1% / 19.5 dB with bias correction instead; per-tensor 6.7 min, 84.6% / 17.3 dB against
    85.1% / 16.6 dB. On an Intel Xeon with VNNI, full-range weights and the float head
    (benchmarks/results/quant_vs_anchors.md): per-channel 3.3 min, 90.4% / 19.6 dB against 91.3% / 20.5 dB with
    bias correction instead (AdaRound no longer pays there); per-tensor 85.1% / 17.8 dB against 83.7% / 18.0 dB.
    Agreement on those 208 crops of 13 photos has a photo-level 95% interval about +-5 to +-9 points wide
    (benchmarks/agreement_noise.py)."""

    iterations: int = 300

    def __post_init__(self) -> None:
        _require(self.iterations >= 1, f"adaround_iterations {self.iterations} must be at least 1",
                 "1000 to 2000 is typical")


@dataclasses.dataclass(frozen=True)
class RangeSearch:
    """Runs last: on the built QDQ model it moves each activation grid (scaled about zero, or its larger side alone)
    where that raises the output SQNR against the float model on the calibration samples, for at most ``passes``
    walks over the grids, and builds the model again on the new ranges (see
    ``npukit.quant.algorithms.range_search``). Measured on MobileNetV2 (per-channel, auto + CLE + activation
    equalization + bias correction, reduce_range, 42 calibration crops, 2 cores, AMD EPYC, stem alone in float):
    5 min, 757 trials, five grids moved (the two 160-channel residual Adds and two projection outputs narrowed, one
    stem projection cut on its positive side); 208 evaluation crops of other photos 85.6% / 18.8 dB -> 88.0% /
    19.6 dB. On the Xeon with VNNI and the float head, full-range weights: 2.6 min, 91.3% / 20.5 dB -> 90.9% /
    22.0 dB (benchmarks/results/quant_vs_anchors.md)."""

    passes: int = 2

    def __post_init__(self) -> None:
        _require(self.passes >= 1, f"range_search_passes {self.passes} must be at least 1", "2 is the default")


@dataclasses.dataclass(frozen=True)
class RecipeChoice:
    """Compare the recipes of ``npukit.quant.recipe.CANDIDATES`` (plain; CLE + activation equalization + bias
    correction) on held-out calibration samples and keep the better, each candidate after the first only while the
    time spent stays within ``budget_s`` seconds. It sets the recipe's steps itself, so none of them (nor AdaRound,
    range search or a 16-bit budget, which choose on a stand-in recipe) may be given with it."""

    budget_s: float = 60.0

    def __post_init__(self) -> None:
        _require(self.budget_s > 0, f"recipe_budget_s {self.budget_s} must be positive", "60 is the default")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The accuracy-recovery steps and the arithmetic their choices are scored on: ``cle`` (cross-layer
    equalization), ``activation_equalization``, ``bias_correction``, ``adaround``, ``range_search``, or ``choose``
    (the recipe chosen among candidates); ``score_on`` is the arithmetic the choices (the method under "auto", the
    recipe, range search, the float head by accuracy) score candidate models on: "ort-cpu" (ONNX Runtime's integer
    kernels on this CPU, as ``quantize`` ships the model) or "reference" (the Q/DQ graph's own arithmetic, what
    XNNPACK and other runtimes with 32-bit accumulators compute; the plans carried to ExecuTorch and LiteRT use it;
    see ``npukit.quant.scoring``). ``fold_affines``: before every other step, fold a constant scale or shift after a
    conv into it (``passes.fold_conv_affine``), so the block gets one grid; off for a plan carried onto a torch
    program, whose conv and affine ops stay separate and each need a grid of the plan."""

    cle: bool = False
    activation_equalization: ActivationEqualization | None = None
    bias_correction: bool = False
    adaround: AdaRound | None = None
    range_search: RangeSearch | None = None
    choose: RecipeChoice | None = None
    score_on: ScoreOn = "ort-cpu"
    fold_affines: bool = True

    def __post_init__(self) -> None:
        _require(self.score_on in OPTIMIZATION, f"unknown score_on {self.score_on!r}",
                 f"use {' or '.join(OPTIMIZATION)}")
        given = self.steps()
        _require(not (self.choose and given), f"choose_recipe picks the recipe itself; {', '.join(given)} "
                 "cannot be given with it", "drop choose_recipe to run exactly the recipe given")

    def steps(self) -> list[str]:
        """The names of the recovery steps that are on."""
        return [f for f in ("cle", "activation_equalization", "bias_correction", "adaround", "range_search")
                if getattr(self, f)]


@dataclasses.dataclass(frozen=True)
class FloatHead:
    """The Convs that read the model's float input with a short reduction (at most ``schemes.STEM_MAX_K`` = input
    channels x kernel taps, e.g. a 3x3 RGB stem: 27) stay in float, so the input is never quantized, with the
    convolutions that follow the stem in a chain (at most three):

    - ``by="latency"``: as far as that is timed fastest on this machine (``npukit.quant.cpu.float_head``; ties go to
      float, the more accurate): on x86 CPUs, with VNNI or without, such a stem runs faster in float.
    - ``by="accuracy"``: for a runtime this machine cannot time as it will run (XNNPACK on a phone): of the prefixes
      of each stem's chain whose convs take at most ``share`` of the model's MACs, the one whose model scores best on
      the last calibration samples, on ``Recipe.score_on``'s arithmetic (``npukit.quant.precision.scored_head``).
      With ``floor_db``: where that head leaves one of ``floor_outputs`` below ``floor_db`` (each output's SQNR on
      every calibration sample, as compile's check measures it), the shortest longer prefix within ``floor_share``
      of the MACs whose every such output reaches it (none: as chosen).
    """

    by: HeadChoice = "latency"
    share: float = 0.0  # with by="accuracy": the share of the model's MACs the head may take
    floor_db: float | None = None  # with by="accuracy": the SQNR floor_outputs should reach (the check's floor)
    floor_share: float = 0.0  # the share of the MACs the head may take to reach floor_db
    floor_outputs: tuple[str, ...] = ()  # the outputs the check holds to floor_db (not those its task metric covers)

    def __post_init__(self) -> None:
        _require(self.by in typing.get_args(HeadChoice), f"unknown float head choice {self.by!r}",
                 "use latency or accuracy")
        if self.by == "accuracy":
            _require(0.0 < self.share <= 1.0, f"float_head_macs {self.share} must be in (0, 1]",
                     "the share of the model's MACs the float head may take, e.g. 0.1")
        else:
            _require(self.share == 0.0 and self.floor_db is None, "a float head timed on this CPU takes no MAC share "
                     "or floor", 'give share and floor_db only with by="accuracy"')
        if self.floor_db is not None:
            _require(math.isfinite(self.floor_db), f"float head floor {self.floor_db} dB must be finite",
                     "e.g. the check's --min-sqnr, 20")
            _require(bool(self.floor_outputs), "a float head floor names the outputs it holds",
                     "give floor_outputs: the outputs the check holds to the SQNR floor")
            _require(self.share <= self.floor_share <= 1.0, f"float head floor share {self.floor_share} must be in "
                     f"[{self.share}, 1]", "the share the head may take to reach the floor, at least share")


@dataclasses.dataclass(frozen=True)
class Precision:
    """The steps that decide, per model, which nodes stay in float or take 16-bit activations:

    ``float_head`` (see ``FloatHead``; None: no head). ``float_joins`` leaves a join of tensors on very different
    scales (a Concat of box coordinates and class scores) and every node after it in float, so that each input keeps
    its own grid (``npukit.quant.precision.joins``). ``float_squares`` leaves a square that a root, logarithm or
    division reads back (a spectrogram's magnitude, a LayerNorm's variance) in float with the nodes between
    (``npukit.quant.precision.squares``). ``float_fragile`` leaves a depthwise (grouped) conv whose output falls below
    ``precision.fragile.FRAGILE_DB`` SQNR with its input alone rounded to its 8-bit grid in float, with the conv that
    writes that input (measured on the model as equalized, on the first calibration samples;
    ``npukit.quant.precision.fragile``). ``int16_budget`` > 0 adds to the scheme's 16-bit tensors the activations
    whose 8-bit rounding costs the outputs most per millisecond their 16-bit grid adds, while the latency (measured
    on this machine, 1 thread) grows by at most that fraction of the all-8-bit model's (chosen on the calibration
    data first; see ``npukit.quant.precision.tensor_precision``)."""

    float_head: FloatHead | None = None
    float_joins: bool = True
    float_squares: bool = True
    float_fragile: bool = True
    int16_budget: float = 0.0

    def __post_init__(self) -> None:
        _require(0.0 <= self.int16_budget <= 1.0, f"int16_budget {self.int16_budget} must be in [0, 1]",
                 "the latency the 16-bit tensors may add, as a fraction of the int8 model's, e.g. 0.1; 0 turns it off")

    @property
    def timed_head(self) -> bool:
        """Whether the float head is chosen by latency on this CPU."""
        return self.float_head is not None and self.float_head.by == "latency"

    @property
    def head_share(self) -> float:
        """The MAC share of a float head chosen by accuracy; 0 when there is none."""
        return self.float_head.share if self.float_head is not None and self.float_head.by == "accuracy" else 0.0


@dataclasses.dataclass(frozen=True)
class CpuKernels:
    """What ONNX Runtime's int8 kernels on this CPU need or run faster with.

    ``reduce_range`` keeps weights out of saturation on x86 CPUs without VNNI, where ONNX Runtime's u8s8 integer
    kernels add pairs of 8-bit products (input channels 2j and 2j + 1) in saturating 16-bit lanes, which full-range
    int8 weights overflow: 1x1 convs and Gemms get a grid on which each such pair stays within 128 levels together,
    depthwise convs (a kernel that does not saturate) all 8 bits, other convs 7 bits ([-64, 64]); see
    ``npukit.quant.cpu.schemes``. ``pair_channels`` reorders channels so that each large weight shares its kernel
    pair with a small one, which lowers the pair-bounded scales (exact in float; per channel and without bias
    correction only, where it pays: see ``npukit.quant.cpu.pair_channels``). ``gemm_convs`` times each int8 Conv of
    the built model on ONNX Runtime's two int8 conv kernels (its symmetric-conv kernel, taken when the weights' zero
    points are 0, and its general int8 GEMM, AMX tiles on CPUs with AMX) and moves those faster on the GEMM there by
    shifting their weight integers and zero point by one: the same dequantized weights, the same outputs (see
    ``npukit.quant.cpu.conv_kernel``). This CPU's scheme turns it on where both kernels accumulate in 32 bits (x86
    with VNNI or AMX)."""

    reduce_range: bool = False
    pair_channels: bool = True
    gemm_convs: bool = False

    def __post_init__(self) -> None:
        _require(not (self.gemm_convs and self.reduce_range),
                 "gemm_convs shifts weight integers by one, which can push reduce_range's pair-bounded weights into "
                 "the saturation they avoid", "turn one of them off (--gemm-convs off or --reduce-range off)")


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """How a model is quantized: the ``scheme`` (what each tensor becomes), the ``calibration`` of activation
    ranges, the recovery ``recipe``, the ``precision`` steps that decide float and 16-bit nodes per model, and the
    ``cpu`` kernel tweaks. Each part validates itself; the rules across parts are checked here."""

    scheme: Scheme = Scheme()
    calibration: CalibrationSpec = CalibrationSpec()
    recipe: Recipe = Recipe()
    precision: Precision = Precision()
    cpu: CpuKernels = CpuKernels()

    def __post_init__(self) -> None:
        _require(not (self.recipe.adaround and not self.scheme.symmetric_weights), "AdaRound needs symmetric weights",
                 "drop symmetric_weights=False or adaround")
        _require(not (self.recipe.choose and self.precision.int16_budget > 0),
                 "choose_recipe picks the recipe itself; int16_budget cannot be given with it",
                 "drop choose_recipe to run exactly the recipe given")

    def with_scheme(self, **fields: Any) -> QuantConfig:
        return dataclasses.replace(self, scheme=dataclasses.replace(self.scheme, **fields))

    def with_calibration(self, **fields: Any) -> QuantConfig:
        return dataclasses.replace(self, calibration=dataclasses.replace(self.calibration, **fields))

    def with_recipe(self, **fields: Any) -> QuantConfig:
        return dataclasses.replace(self, recipe=dataclasses.replace(self.recipe, **fields))

    def with_precision(self, **fields: Any) -> QuantConfig:
        return dataclasses.replace(self, precision=dataclasses.replace(self.precision, **fields))

    def with_cpu(self, **fields: Any) -> QuantConfig:
        return dataclasses.replace(self, cpu=dataclasses.replace(self.cpu, **fields))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# quantize's flat vocabulary (its CLI flags, and the "options" of older reports and benchmark columns): name -> the
# part and field it sets. The steps with options take True / False (on with their defaults / off) and their option.
_FLAT = {
    "per_channel": ("scheme", "per_channel"), "symmetric_weights": ("scheme", "symmetric_weights"),
    "activation_dtype": ("scheme", "activation_dtype"), "symmetric_activations": ("scheme", "symmetric_activations"),
    "exclude": ("scheme", "exclude"), "int16_nodes": ("scheme", "int16_nodes"),
    "int16_tensors": ("scheme", "int16_tensors"),
    "method": ("calibration", "method"), "percentile": ("calibration", "percentile"),
    "num_bins": ("calibration", "num_bins"), "calib_samples": ("calibration", "samples"),
    "cle": ("recipe", "cle"), "bias_correction": ("recipe", "bias_correction"), "score_on": ("recipe", "score_on"),
    "fold_affines": ("recipe", "fold_affines"),
    "float_joins": ("precision", "float_joins"), "float_squares": ("precision", "float_squares"),
    "float_fragile": ("precision", "float_fragile"), "int16_budget": ("precision", "int16_budget"),
    "reduce_range": ("cpu", "reduce_range"), "pair_channels": ("cpu", "pair_channels"),
    "gemm_convs": ("cpu", "gemm_convs"),
}
# flat switch -> (part, field, the step's record, its option's flat name, the option's field)
_FLAT_STEPS = {
    "activation_equalization": ("recipe", "activation_equalization", ActivationEqualization,
                                "activation_equalization_alpha", "alpha"),
    "adaround": ("recipe", "adaround", AdaRound, "adaround_iterations", "iterations"),
    "range_search": ("recipe", "range_search", RangeSearch, "range_search_passes", "passes"),
    "choose_recipe": ("recipe", "choose", RecipeChoice, "recipe_budget_s", "budget_s"),
}
FLAT_NAMES = (*_FLAT, *_FLAT_STEPS, *(s[3] for s in _FLAT_STEPS.values()), "float_stem", "float_head_macs")


def from_flat(**flat: Any) -> QuantConfig:
    """A QuantConfig from quantize's flat vocabulary (``FLAT_NAMES``: ``method="auto", cle=True, adaround=True,
    adaround_iterations=50, float_stem=True, reduce_range=True, ...``), as its CLI flags and older reports name the
    fields; an unknown name is an ``InputError``."""
    unknown = sorted(set(flat) - set(FLAT_NAMES))
    _require(not unknown, f"unknown quantization option(s) {', '.join(unknown)}", f"use {', '.join(FLAT_NAMES)}")
    parts: dict[str, dict[str, Any]] = {"scheme": {}, "calibration": {}, "recipe": {}, "precision": {}, "cpu": {}}
    for name, value in flat.items():
        if name in _FLAT:
            part, field = _FLAT[name]
            parts[part][field] = value
    for name, (part, field, record, option, option_field) in _FLAT_STEPS.items():
        if flat.get(name):
            parts[part][field] = record(**({option_field: flat[option]} if option in flat else {}))
    _require(not (flat.get("float_stem") and flat.get("float_head_macs")), "float_stem times the float head on this "
             "CPU; float_head_macs chooses it by accuracy: give one of them", "turn float_stem or float_head_macs off")
    if flat.get("float_stem"):
        parts["precision"]["float_head"] = FloatHead()
    elif flat.get("float_head_macs"):
        parts["precision"]["float_head"] = FloatHead("accuracy", flat["float_head_macs"])
    return QuantConfig(scheme=Scheme(**parts["scheme"]), calibration=CalibrationSpec(**parts["calibration"]),
                       recipe=Recipe(**parts["recipe"]), precision=Precision(**parts["precision"]),
                       cpu=CpuKernels(**parts["cpu"]))


def to_flat(config: QuantConfig) -> dict[str, Any]:
    """``config`` in quantize's flat vocabulary (``from_flat`` reads it back): every name of ``FLAT_NAMES``."""
    flat = {name: getattr(getattr(config, part), field) for name, (part, field) in _FLAT.items()}
    for name, (part, field, record, option, option_field) in _FLAT_STEPS.items():
        step = getattr(getattr(config, part), field)
        flat[name] = step is not None
        flat[option] = getattr(step if step is not None else record(), option_field)  # the default when off
    flat["float_stem"] = config.precision.timed_head
    flat["float_head_macs"] = config.precision.head_share
    return flat
