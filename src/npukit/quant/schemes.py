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
With VNNI (AVX-512 VNNI, AVX-VNNI) or AMX, MLAS switches the U8S8 kernels to vpdpbusd / tile instructions that
accumulate in 32 bits, so full-range int8 weights are exact. On Arm64, MLAS's NEON kernels widen to 16-bit products
and accumulate in 32 bits (and UDOT/SDOT/SMMLA where present), so full range is safe; with I8MM MLAS prefers signed
activations.
"""

from __future__ import annotations

import dataclasses

from npukit.quant.config import QuantConfig
from npukit.runtime.devices import CpuInfo

X86_32BIT_ACCUMULATE = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_int8_scheme(cpu: CpuInfo) -> dict:
    """{"activation_dtype", "reduce_range", "reason"}: the QuantConfig fields for ``cpu`` and why."""
    features = cpu.int8_features
    if "asimd" in features:  # Arm (read_cpu_info lists the Arm flags there)
        signed = bool(features.get("i8mm"))
        return {"activation_dtype": "int8" if signed else "uint8", "reduce_range": False,
                "reason": "Arm NEON kernels accumulate in 32 bits: full-range int8 weights"
                          + (" (I8MM: MLAS prefers signed activations)" if signed else "")}
    present = [f for f in X86_32BIT_ACCUMULATE if features.get(f)]
    if present:
        return {"activation_dtype": "uint8", "reduce_range": False,
                "reason": f"{', '.join(present)}: u8 x s8 products accumulate in 32 bits, full-range weights are exact"}
    if features.get("avx2"):
        return {"activation_dtype": "uint8", "reduce_range": True,
                "reason": "AVX2 without VNNI: vpmaddubsw adds u8 x s8 product pairs in saturating 16-bit lanes; "
                          "7-bit weights keep the sums in range"}
    return {"activation_dtype": "uint8", "reduce_range": True,
            "reason": "no known int8 dot-product instructions: 7-bit weights are the safe choice"}


def config_for_cpu(config: QuantConfig, cpu: CpuInfo) -> QuantConfig:
    """``config`` with the activation type and weight range that ``cpu`` runs accurately."""
    scheme = cpu_int8_scheme(cpu)
    return dataclasses.replace(config, activation_dtype=scheme["activation_dtype"],
                               reduce_range=scheme["reduce_range"])
