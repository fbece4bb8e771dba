"""QuantConfig: the INT8 post-training quantization scheme and algorithms, frozen and validated on creation."""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from npukit.errors import InputError
from npukit.quant.calibration.observers import METHODS
from npukit.quant.scoring import OPTIMIZATION, ScoreOn

Method = str  # "auto" or a name of ``quant.calibration.observers.OBSERVERS``
ActivationDtype = Literal["uint8", "int8"]


def _require(cond: bool, message: str, hint: str = "") -> None:
    if not cond:
        raise InputError(message, hint=hint)


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """How weights and activations are quantized and which accuracy-recovery steps run.

    Weights are always int8 (per output channel or per tensor); activations are ``activation_dtype`` except the
    inputs and outputs of ``int16_nodes`` and the activations named in ``int16_tensors``, which use the 16-bit type
    of the same signedness (a tensor alone takes only the nodes that read or write it off the int8 kernels).
    ``int16_budget`` > 0 adds to ``int16_tensors`` the activations whose 8-bit rounding costs the outputs most per
    millisecond their 16-bit grid adds, while the latency (measured on this machine, 1 thread) grows by at most
    that fraction of the all-8-bit model's (chosen on the calibration data first; see
    ``npukit.quant.precision.tensor_precision``).
    ``exclude`` names nodes left in float. ``calib_samples`` caps the calibration samples used; fewer available is an
    error.
    ``reduce_range`` keeps weights out of saturation on x86 CPUs without VNNI, where ONNX Runtime's u8s8 integer
    kernels add pairs of 8-bit products (input channels 2j and 2j + 1) in saturating 16-bit lanes, which full-range
    int8 weights overflow: 1x1 convs and Gemms get a grid on which each such pair stays within 128 levels together,
    depthwise convs (a kernel that does not saturate) all 8 bits, other convs 7 bits ([-64, 64]); see
    ``npukit.quant.cpu.schemes``.
    ``pair_channels`` reorders channels so that each large weight shares its kernel pair with a small one, which
    lowers the pair-bounded scales (exact in float; per channel and without bias correction only, where it pays:
    see ``npukit.quant.cpu.pair_channels``).
    ``float_stem`` leaves the Convs that read the model's float input with a short reduction (at most
    ``schemes.STEM_MAX_K`` = input channels x kernel taps, e.g. a 3x3 RGB stem: 27) in float, so the input is never
    quantized: on x86 CPUs, with VNNI or without, that stem runs faster in float (see ``npukit.quant.cpu.schemes``).
    The convolutions that follow the stem in a chain (at most three) stay in float too as far as that is timed
    fastest on this machine (``npukit.quant.cpu.float_head``; ties go to float, the more accurate).
    ``float_head_macs`` > 0 chooses that head instead by accuracy, for a runtime this machine cannot time as it
    will run (XNNPACK on a phone): of the prefixes of each stem's chain whose convs take at most that share of the
    model's MACs, the one whose model scores best on the last calibration samples, on ``score_on``'s arithmetic
    (``npukit.quant.precision.scored_head``); not with ``float_stem``.
    ``float_joins`` leaves a join of tensors on very different scales (a Concat of box coordinates and class scores)
    and every node after it in float, so that each input keeps its own grid (``npukit.quant.precision.joins``).
    ``float_squares`` leaves a square that a root, logarithm or division reads back (a spectrogram's magnitude, a
    LayerNorm's variance) in float with the nodes between (``npukit.quant.precision.squares``).
    ``float_fragile`` leaves a depthwise (grouped) conv whose output falls below ``precision.fragile.FRAGILE_DB``
    SQNR with its input alone rounded to its 8-bit grid in float, with the conv that writes that input (measured on
    the model as equalized, on the first calibration samples; ``npukit.quant.precision.fragile``).
    ``gemm_convs`` times each int8 Conv of the built model on ONNX Runtime's two int8 conv kernels (its symmetric-conv
    kernel, taken when the weights' zero points are 0, and its general int8 GEMM, AMX tiles on CPUs with AMX) and
    moves those faster on the GEMM there by shifting their weight integers and zero point by one: the same
    dequantized weights, the same outputs (see ``npukit.quant.cpu.conv_kernel``). This CPU's scheme turns it on where
    both kernels accumulate in 32 bits (x86 with VNNI or AMX).
    ``activation_equalization`` scales the channels of linear streams (residual Adds, Relu) towards equal ranges,
    ``activation_equalization_alpha`` the strength (0: off, 1: every channel full range; see
    ``npukit.quant.algorithms.stream_equalize``).
    ``adaround`` learns each Conv/Gemm weight's rounding on the calibration data (``adaround_iterations`` Adam steps
    per layer; it needs symmetric weights). Measured on MobileNetV2 (42 calibration crops, 2 cores, 300 steps, with
    CLE, activation equalization, reduce_range and the float stem alone; AMD EPYC without VNNI,
    benchmarks/results/quant_vs_anchors_avx2.md): per-channel (channels paired) 6.6 min, 89.4% top-1 agreement /
    19.2 dB against 84.1% / 19.5 dB with bias correction instead; per-tensor 6.7 min, 84.6% / 17.3 dB against
    85.1% / 16.6 dB. On an Intel Xeon with VNNI, full-range weights and the float head
    (benchmarks/results/quant_vs_anchors.md): per-channel 3.3 min, 90.4% / 19.6 dB against 91.3% / 20.5 dB with
    bias correction instead (AdaRound no longer pays there); per-tensor 85.1% / 17.8 dB against 83.7% / 18.0 dB.
    Agreement on those 208 crops of 13 photos has a photo-level 95% interval about +-5 to +-9 points wide
    (benchmarks/agreement_noise.py).
    ``method="auto"`` calibrates once with one histogram per tensor, derives every method's ranges from it, and
    keeps the method whose QDQ model's outputs are closest (SQNR) to the float model's on held-out samples
    (see ``npukit.quant.calibration.auto``).
    ``range_search`` runs last: on the built QDQ model it moves each activation grid (scaled about zero, or its
    larger side alone) where that raises the output SQNR against the float model on the calibration samples, for at
    most ``range_search_passes`` walks over the grids, and builds the model again on the new ranges (see
    ``npukit.quant.algorithms.range_search``). Measured on MobileNetV2 (per-channel, auto + CLE + activation equalization +
    bias correction, reduce_range, 42 calibration crops, 2 cores, AMD EPYC, stem alone in float): 5 min, 757
    trials, five grids moved (the two 160-channel residual Adds and two projection outputs narrowed, one stem
    projection cut on its positive side); 208 evaluation crops of other photos 85.6% / 18.8 dB -> 88.0% / 19.6 dB.
    On the Xeon with VNNI and the float head, full-range weights: 2.6 min, 91.3% / 20.5 dB -> 90.9% / 22.0 dB
    (benchmarks/results/quant_vs_anchors.md).
    ``choose_recipe`` compares the recipes of ``npukit.quant.recipe.CANDIDATES`` (plain; CLE + activation
    equalization + bias correction) on held-out calibration samples and keeps the better, each candidate after the
    first only while the time spent stays within ``recipe_budget_s`` seconds; it sets those flags itself, so none of
    them (nor AdaRound, range search or a 16-bit budget, which choose on a stand-in recipe) may be given with it.
    ``score_on`` is the arithmetic those choices (the method under "auto", the recipe, range search) score candidate
    models on: "ort-cpu" (ONNX Runtime's integer kernels on this CPU, as ``quantize`` ships the model) or
    "reference" (the Q/DQ graph's own arithmetic, what XNNPACK and other runtimes with 32-bit accumulators compute;
    the plans carried to ExecuTorch and LiteRT use it; see ``npukit.quant.scoring``).
    """

    per_channel: bool = True
    symmetric_weights: bool = True
    activation_dtype: ActivationDtype = "uint8"
    symmetric_activations: bool = False
    method: Method = "minmax"
    percentile: float = 99.99
    num_bins: int = 2048
    int16_nodes: tuple[str, ...] = ()
    int16_tensors: tuple[str, ...] = ()
    int16_budget: float = 0.0
    exclude: tuple[str, ...] = ()
    cle: bool = False
    activation_equalization: bool = False
    activation_equalization_alpha: float = 0.5
    bias_correction: bool = False
    calib_samples: int | None = None
    reduce_range: bool = False
    pair_channels: bool = True
    float_stem: bool = False
    float_head_macs: float = 0.0
    float_joins: bool = True
    float_squares: bool = True
    float_fragile: bool = True
    gemm_convs: bool = False
    adaround: bool = False
    adaround_iterations: int = 300
    range_search: bool = False
    range_search_passes: int = 2
    choose_recipe: bool = False
    recipe_budget_s: float = 60.0
    score_on: ScoreOn = "ort-cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "int16_nodes", tuple(self.int16_nodes))
        object.__setattr__(self, "int16_tensors", tuple(self.int16_tensors))
        object.__setattr__(self, "exclude", tuple(self.exclude))
        _require(self.activation_dtype in typing.get_args(ActivationDtype),
                 f"unknown activation dtype {self.activation_dtype!r}", "use uint8 or int8")
        _require(self.method in METHODS, f"unknown calibration method {self.method!r}",
                 f"use {', '.join(METHODS)}")
        _require(50.0 < self.percentile <= 100.0, f"percentile {self.percentile} must be in (50, 100]",
                 "typical values are 99.9 to 99.999")
        _require(self.num_bins >= 128 and self.num_bins % 4 == 0,
                 f"num_bins {self.num_bins} must be a multiple of 4 and at least 128", "the default is 2048")
        _require(self.calib_samples is None or self.calib_samples >= 1, "calib_samples must be at least 1")
        _require(0.0 <= self.activation_equalization_alpha <= 1.0,
                 f"activation_equalization_alpha {self.activation_equalization_alpha} must be in [0, 1]",
                 "0.5 is the measured default")
        _require(self.adaround_iterations >= 1, f"adaround_iterations {self.adaround_iterations} must be at least 1",
                 "1000 to 2000 is typical")
        _require(not (self.adaround and not self.symmetric_weights), "AdaRound needs symmetric weights",
                 "drop symmetric_weights=False or adaround")
        _require(0.0 <= self.int16_budget <= 1.0, f"int16_budget {self.int16_budget} must be in [0, 1]",
                 "the latency the 16-bit tensors may add, as a fraction of the int8 model's, e.g. 0.1; 0 turns it off")
        _require(0.0 <= self.float_head_macs <= 1.0, f"float_head_macs {self.float_head_macs} must be in [0, 1]",
                 "the share of the model's MACs the float head may take, e.g. 0.1; 0 turns it off")
        _require(not (self.float_stem and self.float_head_macs > 0), "float_stem times the float head on this CPU; "
                 "float_head_macs chooses it by accuracy: give one of them", "turn float_stem or float_head_macs off")
        _require(self.range_search_passes >= 1, f"range_search_passes {self.range_search_passes} must be at least 1",
                 "2 is the default")
        _require(not (self.gemm_convs and self.reduce_range),
                 "gemm_convs shifts weight integers by one, which can push reduce_range's pair-bounded weights into "
                 "the saturation they avoid", "turn one of them off (--gemm-convs off or --reduce-range off)")
        given = [f for f in ("cle", "activation_equalization", "bias_correction", "adaround", "range_search")
                 if getattr(self, f)] + (["int16_budget"] if self.int16_budget > 0 else [])
        _require(not (self.choose_recipe and given), f"choose_recipe picks the recipe itself; {', '.join(given)} "
                 "cannot be given with it", "drop choose_recipe to run exactly the recipe given")
        _require(self.recipe_budget_s > 0, f"recipe_budget_s {self.recipe_budget_s} must be positive",
                 "60 is the default")
        _require(self.score_on in OPTIMIZATION, f"unknown score_on {self.score_on!r}",
                 f"use {' or '.join(OPTIMIZATION)}")
        overlap = set(self.int16_nodes) & set(self.exclude)
        _require(not overlap, f"nodes {sorted(overlap)} are both excluded and marked 16-bit",
                 "name each node in only one of int16_nodes and exclude")

    @property
    def activation_signed(self) -> bool:
        return self.activation_dtype == "int8"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
