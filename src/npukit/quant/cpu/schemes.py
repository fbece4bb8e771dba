"""The INT8 scheme that ONNX Runtime's CPU integer kernels run accurately and fast, chosen from the CPU's features.

Evidence (ORT 1.32 MLAS; MobileNetV2, official weights, 42 calibration / 208 evaluation photo crops, entropy
calibration + CLE + bias correction, per-channel; "simulated" = the same QDQ model with graph optimizations off, so
ORT computes it in float exactly as the Q/DQ nodes say; AMD EPYC with AVX2 and no VNNI):

- u8 activations x s8 weights, full 8-bit range: 8.8 dB logits SQNR on integer kernels against 14.5 dB simulated,
  71.6% against 85.6% top-1 agreement. Without VNNI, MLAS's AVX2 U8S8 kernel multiplies with vpmaddubsw, which adds
  pairs of u8 x s8 products into saturating 16-bit lanes: 2 x 255 x 127 overflows int16.
- u8 x s8 with 7-bit weights ([-64, 64], ``reduce_range``): 14.1 dB against 14.2 dB simulated: no saturation
  (2 x 255 x 64 < 32768), at the cost of one bit of weight precision.
- s8 activations x s8 weights: 8.8 dB (the same saturation), and only 72% of the convolutions on integer kernels
  (1.04x FP32 latency): MLAS sets no S8S8 GEMM dispatch on x86 unless the CPU has AVX-VNNI-INT8.
Depthwise convolutions are the exception: MLAS's depthwise U8S8 kernel (one input and one output channel per group)
widens to 16-bit values and accumulates 16-bit products in 32 bits, so full-range int8 weights are exact there on
every CPU (measured: a 3x3 depthwise QLinearConv with weights over all of [-127, 127] and inputs up to 255 gives the
simulated output exactly; a pointwise one is off by up to 53 quantization steps on 29% of its outputs).
``reduce_range`` therefore keeps the full 8 bits for depthwise weights (``reduced_weight_range``).
The saturation is a pair's: vpmaddubsw adds the products of input channels 2j and 2j + 1 (MLAS packs the K dimension
of a 1x1 conv or a Gemm in input-channel order and pairs it from 0: measured, weights [127, 1, 127, 1, ...] with
inputs at 255 are exact, [127, 127, 1, 1, ...] are not, [1, 127, 127, 1, ...] are). So where K is the input channel
order (1x1 convs with one group, Gemm), the grid need not cap every weight at 64: it is enough that
|q_2j| + |q_2j+1| <= 128 (255 x 128 = 32640 < 32768). ``pair_bounded_scale`` sets each channel's scale from its
largest pair instead of twice its largest weight: on MobileNetV2's pointwise weights the scale is 0.69x the 7-bit
one (median), and the weights-only SQNR of the logits (nearest rounding, CLE) rises from 11.5 to 15.0 dB
(full 8 bits everywhere: 17.7 dB), on the same fast u8s8 kernels.
With VNNI (AVX-512 VNNI, AVX-VNNI) or AMX, MLAS switches the U8S8 kernels to vpdpbusd / tile instructions that
accumulate in 32 bits, so full-range int8 weights are exact. On Arm64, MLAS's NEON kernels widen to 16-bit products
and accumulate in 32 bits (and UDOT/SDOT/SMMLA where present), so full range is safe; with I8MM MLAS prefers signed
activations.

The stem: a Conv that reads the model's float input with a short reduction (K = input channels x kernel taps, 27 for a
3x3 RGB stem) runs faster in float on AVX2 without VNNI: ORT profile of MobileNetV2's stem, 1.1 ms as an int8
QLinearConv against 0.77 ms in float (the int8 path also quantizes the input first; we did not dig further). Side
measurements (not a committed benchmark; 1 thread, interleaved medians, per-channel reduce_range): MobileNetV2 (auto +
CLE + AE + BC) 0.766x -> 0.745x FP32 with its stem (K = 27) in float, RegNetY-400MF (minmax) 1.164x -> 1.145x (K =
27); ResNet18's 7x7 stem (minmax; K = 147, 64 outputs) is the opposite, 0.544x -> 0.657x. Leaving the stem in float
also spares the input its rounding: MobileNetV2 per-channel auto + CLE + AE + BC, 18.8 -> 19.5 dB logits SQNR on 208
held-out crops (top-1 agreement 85.6% -> 84.1%: three crops, within that set's noise), 0.75x -> 0.73x FP32
(benchmarks/results/quant_vs_anchors_avx2.md). With VNNI the stem is no better in int8: on an Intel Xeon with
AVX-512 VNNI, AVX-VNNI and AMX (ORT profiles, benchmarks/results/int8_kernels_vnni.md) ORT's int8 stem takes 2x
as long as the float one (0.62 against 0.33 ms, 0.47 against 0.24 ms in a later run), while the pointwise convs run
2.5-2.7x faster than float; side measurement there (not a
committed benchmark; 1 thread, two interleaved repetitions, medians; per-channel auto + CLE + AE + BC, full-range
weights): 0.516x / 0.521x FP32 with the stem quantized, 0.508x / 0.509x with it in float, 18.5 -> 19.5 dB logits
SQNR. ``float_stem`` is therefore on for every x86 CPU with AVX2 (``stem_convs``, K <= ``STEM_MAX_K``). The convs
chained after the stem join it in float as far as that is timed fastest on the machine at hand
(``npukit.quant.cpu.float_head``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from npukit.quant.config import FloatHead, QuantConfig
from npukit.quant.nodes import node_attr
from npukit.quant.plan import Decision
from npukit.runtime.devices import CpuInfo

X86_32BIT_ACCUMULATE = ("avx512_vnni", "avx_vnni", "amx_int8")


STEM_MAX_K = 32  # longest stem reduction measured faster in float on x86: 27 (3x3 RGB); 147 was not (AVX2)


def cpu_int8_scheme(cpu: CpuInfo) -> dict:
    """{"activation_dtype", "reduce_range", "float_stem", "gemm_convs", "reason"}: the QuantConfig fields for ``cpu``
    and why."""
    features = cpu.int8_features
    if "asimd" in features:  # Arm (read_cpu_info lists the Arm flags there)
        signed = bool(features.get("i8mm"))
        return {"activation_dtype": "int8" if signed else "uint8", "reduce_range": False, "float_stem": False,
                "gemm_convs": False, "reason": "Arm NEON kernels accumulate in 32 bits: full-range int8 weights"
                          + (" (I8MM: MLAS prefers signed activations)" if signed else "")}
    present = [f for f in X86_32BIT_ACCUMULATE if features.get(f)]
    if present:
        return {"activation_dtype": "uint8", "reduce_range": False, "float_stem": True, "gemm_convs": True,
                "reason": f"{', '.join(present)}: u8 x s8 products accumulate in 32 bits, full-range weights are "
                          "exact on both int8 conv kernels (each conv timed on both); a short stem still runs "
                          "faster in float"}
    if features.get("avx2"):
        return {"activation_dtype": "uint8", "reduce_range": True, "float_stem": True, "gemm_convs": False,
                "reason": "AVX2 without VNNI: vpmaddubsw adds u8 x s8 product pairs in saturating 16-bit lanes; "
                          "7-bit weights keep the sums in range; a short stem runs faster in float"}
    return {"activation_dtype": "uint8", "reduce_range": True, "float_stem": False, "gemm_convs": False,
            "reason": "no known int8 dot-product instructions: 7-bit weights are the safe choice"}


def config_for_cpu(config: QuantConfig, cpu: CpuInfo) -> QuantConfig:
    """``config`` with the activation type, weight range, stem precision and conv kernel choice that ``cpu`` runs
    best."""
    return apply_scheme(config, cpu_int8_scheme(cpu))


def apply_scheme(config: QuantConfig, scheme: dict) -> QuantConfig:
    """``config`` with the fields of a ``cpu_int8_scheme`` dict set: the activation type, the weight range, the float
    head timed on the CPU (or none) and the conv kernel choice."""
    return (config.with_scheme(activation_dtype=scheme["activation_dtype"])
            .with_precision(float_head=FloatHead() if scheme["float_stem"] else None)
            .with_cpu(reduce_range=scheme["reduce_range"], gemm_convs=scheme["gemm_convs"]))


def stem_convs(model: onnx.ModelProto) -> list[str]:
    """Names of the Convs that read a float graph input directly and reduce over at most ``STEM_MAX_K`` values
    (input channels per group x kernel taps), with a constant weight: the ones ``float_stem`` leaves in float."""
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    inputs = {i.name for i in model.graph.input if i.name not in inits
              and i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    found = []
    for node in model.graph.node:
        if node.op_type != "Conv" or not node.input or node.input[0] not in inputs or len(node.input) < 2:
            continue
        shape = inits.get(node.input[1])
        if shape is not None and len(shape) > 2 and int(np.prod(shape[1:])) <= STEM_MAX_K:
            found.append(node.name)
    return found


def is_depthwise(node: onnx.NodeProto, weight_shape: Sequence[int]) -> bool:
    """A Conv with one input and one output channel per group: ORT runs it on MLAS's depthwise kernel."""
    group = node_attr(node, "group", 1)
    return node.op_type == "Conv" and group > 1 and len(weight_shape) > 1 and weight_shape[1] == 1 \
        and weight_shape[0] == group


def reduced_weight_range(node: onnx.NodeProto, weight_shape: Sequence[int], config: QuantConfig) -> bool:
    """Whether ``node``'s weight is capped at 7 bits ([-64, 64]): under ``reduce_range``, every weight that is neither
    depthwise (full 8 bits) nor ``pair_bounded``."""
    return (config.cpu.reduce_range and not is_depthwise(node, weight_shape)
            and not pair_bounded(node, weight_shape, config))


PAIR_LIMIT = 128  # |q_2j| + |q_2j+1| at most this: 255 * 128 fits vpmaddubsw's int16 lane
# The plan's record of a pair-bounded weight: the steps that round weights themselves (AdaRound) read it to keep the
# bound with room for their rounding.
PAIR_BOUNDED = Decision("cpu_scheme", "pair-bounded: each pair of input channels' products stays within 128 levels "
                                      "(no 16-bit saturation)")


def pair_bounded(node: onnx.NodeProto, weight_shape: Sequence[int], config: QuantConfig) -> bool:
    """Whether ``node``'s weight takes the pair-bounded grid: under ``reduce_range`` with symmetric weights, a Gemm or
    a 1x1 Conv with one group (K is the input-channel order there)."""
    if not (config.cpu.reduce_range and config.scheme.symmetric_weights):
        return False
    if node.op_type == "Gemm":
        return len(weight_shape) == 2
    group = node_attr(node, "group", 1)
    return node.op_type == "Conv" and group == 1 and len(weight_shape) > 2 and all(k == 1 for k in weight_shape[2:])


def weight_rows(node: onnx.NodeProto, w: np.ndarray) -> np.ndarray:
    """A Gemm's or 1x1 Conv's weight as (output channels, K) rows, K in the order the integer GEMM runs it."""
    if node.op_type == "Gemm":
        return w if node_attr(node, "transB", 0) else w.T
    return w.reshape(w.shape[0], -1)


def largest_pair_sums(rows: np.ndarray) -> np.ndarray:
    """|w_2j| + |w_2j+1| at its largest along the last axis of (..., K) ``rows``, in float64 (an odd K's last weight
    pairs with nothing)."""
    a = np.abs(np.asarray(rows, np.float64))
    if a.shape[-1] % 2:
        a = np.concatenate([a, np.zeros(a.shape[:-1] + (1,))], axis=-1)
    return (a[..., 0::2] + a[..., 1::2]).max(axis=-1)


def pair_bounded_scale(rows: np.ndarray, *, per_channel: bool, headroom: int = 1) -> np.ndarray:
    """Scales for (..., K) weight rows such that rounded weights keep |q_2j| + |q_2j+1| <= PAIR_LIMIT: one per row
    (shape rows.shape[:-1]), or per tensor one value in an array of as many dimensions, all of size 1. The largest
    pair sum maps to PAIR_LIMIT - headroom, where ``headroom`` is how far rounding can push a pair's sum up (1 for
    nearest rounding, 2 for AdaRound's floor-or-ceil). No single weight exceeds that either: the int8 range holds."""
    pair = largest_pair_sums(rows)
    if not per_channel:
        pair = pair.max(keepdims=True)
    scale = pair / (PAIR_LIMIT - headroom)
    return np.where(scale > 0, scale, 1.0).astype(np.float32)
