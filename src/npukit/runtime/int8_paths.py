"""Which of ONNX Runtime's int8 convolution paths compute exactly on this CPU: measured, not read from the flags.

Each path is one small QLinearConv (the com.microsoft NHWC form ORT runs after its layout transform) with random
uint8 inputs over the full range and int8 weights of the grid under test, run on ORT's CPU EP and compared with the
same integer arithmetic in float64 (accumulate, requantize with round-half-to-even, clip). The output scale is a
power of two times the product of the input and weight scales, so the reference has no rounding ambiguity: an exact
kernel matches it to the bit, and a kernel that adds u8 x s8 product pairs in saturating 16-bit lanes (MLAS on x86
without VNNI: ``vpmaddubsw``) misses it by several output steps.

Measured on an AMD EPYC with AVX2 and no VNNI (ORT 1.32): 1x1 convs with full-range weights are off by up to 22-23
steps on 60% of their outputs on both of ORT's int8 conv kernels (the symmetric-conv kernel and the general GEMM), a
3x3 one by up to 19 steps, while depthwise convs with full-range weights, and 1x1 convs with 7-bit or pair-bounded weights (npukit's
``reduce_range`` grids), are exact. Where the CPU accumulates u8 x s8 products in 32 bits (AVX-512 VNNI, AVX-VNNI,
AMX, Arm NEON) every path is exact.

The probe takes a few milliseconds; ``probe_int8_paths`` caches it per process.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CHANNELS, OUTPUTS, SIDE = 64, 32, 6  # one probe conv: 64 -> 32 channels on a 6 x 6 map (several MLAS blocks)


@dataclasses.dataclass(frozen=True)
class Int8Path:
    """One int8 conv path as ORT runs it on this CPU. ``steps_off``: the largest difference from exact integer
    arithmetic, in output quantization steps; ``share_off``: the share of outputs that differ."""

    name: str
    kernel: str  # ORT / MLAS kernel that runs it
    weights: str  # the weight grid
    exact: bool
    steps_off: int
    share_off: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _weights(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """int8 weights of ``kind``: "full" ([-127, 127]), "7-bit" ([-64, 64]) or "pair-bounded" (|q_2j| + |q_2j+1|
    <= 128 along the input channels, as ``schemes.pair_bounded_scale`` makes them)."""
    if kind == "full":
        return rng.integers(-127, 128, shape).astype(np.int8)
    if kind == "7-bit":
        return rng.integers(-64, 65, shape).astype(np.int8)
    paired = rng.integers(-127, 128, shape)
    room = 128 - np.abs(paired[:, 0::2])[:, :paired[:, 1::2].shape[1]]
    paired[:, 1::2] = np.clip(paired[:, 1::2], -room, room)
    return paired.astype(np.int8)


def _conv_model(w: np.ndarray, zero_point: int, group: int, out_scale: float) -> onnx.ModelProto:
    """x (NHWC uint8, zero point 0, scale 1) -> QLinearConv(w, weight zero point, weight scale 1) -> y (uint8, zero
    point 128, scale ``out_scale``)."""
    pad = w.shape[2] // 2
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "xs"),
             numpy_helper.from_array(np.array(0, np.uint8), "xz"),
             numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.ones(w.shape[0], np.float32), "ws"),
             numpy_helper.from_array(np.full(w.shape[0], zero_point, np.int8), "wz"),
             numpy_helper.from_array(np.array(out_scale, np.float32), "ys"),
             numpy_helper.from_array(np.array(128, np.uint8), "yz")]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"],
                            domain="com.microsoft", channels_last=1, group=group, pads=[pad] * 4)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", TensorProto.UINT8, None)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _exact(x: np.ndarray, w: np.ndarray, zero_point: int, group: int, out_scale: float) -> np.ndarray:
    """The QLinearConv's output in exact integer arithmetic (float64 holds every sum), NHWC uint8."""
    n, h, wd, c = x.shape
    k = w.shape[2]
    pad = k // 2
    padded = np.zeros((n, h + 2 * pad, wd + 2 * pad, c), np.float64)
    padded[:, pad:pad + h, pad:pad + wd] = x
    weights = w.astype(np.float64) - zero_point  # (O, C / group, k, k)
    per_group_in, per_group_out = c // group, w.shape[0] // group
    acc = np.zeros((n, h, wd, w.shape[0]), np.float64)
    for g in range(group):
        xs = padded[..., g * per_group_in:(g + 1) * per_group_in]
        ws = weights[g * per_group_out:(g + 1) * per_group_out]
        for dy in range(k):
            for dx in range(k):
                acc[..., g * per_group_out:(g + 1) * per_group_out] += \
                    xs[:, dy:dy + h, dx:dx + wd] @ ws[:, :, dy, dx].T
    return np.clip(np.rint(acc / out_scale) + 128, 0, 255).astype(np.uint8)


def _measure(name: str, kernel: str, weights: str, w: np.ndarray, zero_point: int, group: int,
             x: np.ndarray) -> Int8Path:
    from npukit.runtime.ort import make_session

    reduction = int(np.prod(w.shape[1:]))
    # a power of two near the accumulators' spread, so most outputs land inside [0, 255] without ties to guess
    spread = np.sqrt(reduction) * 128.0 * 80.0
    out_scale = float(2.0 ** np.ceil(np.log2(spread / 60.0)))
    got = make_session(_conv_model(w, zero_point, group, out_scale), threads=1).run(None, {"x": x})[0]
    want = _exact(x, w, zero_point, group, out_scale)
    off = np.abs(got.astype(np.int32) - want.astype(np.int32))
    return Int8Path(name=name, kernel=kernel, weights=weights, exact=bool(off.max() == 0),
                    steps_off=int(off.max()), share_off=round(float(np.mean(off > 0)), 4))


@functools.lru_cache(maxsize=1)
def probe_int8_paths() -> tuple[Int8Path, ...]:
    """Every int8 conv path npukit relies on, measured on this CPU (cached per process)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, SIDE, SIDE, CHANNELS)).astype(np.uint8)
    pointwise = (OUTPUTS, CHANNELS, 1, 1)
    full = _weights(rng, "full", pointwise)
    shifted = (full.astype(np.int16) - 1).astype(np.int8)  # zero point -1: the same weights off the symmetric kernel
    paired = _weights(rng, "pair-bounded", pointwise)
    seven = _weights(rng, "7-bit", (OUTPUTS, CHANNELS, 3, 3))
    spatial = _weights(rng, "full", (OUTPUTS, CHANNELS, 3, 3))
    depthwise = _weights(rng, "full", (CHANNELS, 1, 3, 3))
    sym, gemm = "symmetric conv (ConvSym)", "int8 GEMM"
    return (
        _measure("1x1 conv", sym, "full 8-bit", full, 0, 1, x),
        _measure("1x1 conv", gemm, "full 8-bit", shifted, -1, 1, x),
        _measure("1x1 conv", sym, "pair-bounded", paired, 0, 1, x),
        _measure("1x1 conv", gemm, "pair-bounded", (paired.astype(np.int16) - 1).astype(np.int8), -1, 1, x),
        _measure("3x3 conv", sym, "full 8-bit", spatial, 0, 1, x),
        _measure("3x3 conv", sym, "7-bit", seven, 0, 1, x),
        _measure("3x3 depthwise conv", "depthwise (ConvSym)", "full 8-bit", depthwise, 0, CHANNELS, x),
    )


ROUNDING_STEPS = 1  # a requantization tie may round either way; saturating kernels miss by many steps


def full_range_exact(paths: tuple[Int8Path, ...]) -> bool:
    """Whether full-range int8 weights are computed without saturation on both of ORT's int8 conv kernels (so both
    accumulate in 32 bits and moving a conv from one to the other, ``quant.conv_kernel``, changes no output): every
    full-range 1x1 path within ``ROUNDING_STEPS`` of exact integer arithmetic."""
    return all(p.steps_off <= ROUNDING_STEPS for p in paths if p.weights == "full 8-bit" and p.name == "1x1 conv")


def inexact_summary(paths: tuple[Int8Path, ...]) -> str:
    """One clause naming the paths that are not exact here and how far off they are (empty when all are)."""
    off = [f"{p.name} on the {p.kernel} with {p.weights} weights off by up to {p.steps_off} steps" for p in paths
           if not p.exact]
    return "; ".join(off)
