"""ONNX Runtime's CPU execution provider, as data: every default-domain op the installed onnxruntime has a CPU
kernel for (read at run time from ``onnxruntime.capi._pybind_state.get_all_opkernel_def``), plus the ONNX ops
defined as functions, which ORT inlines (GroupNormalization, Gelu before opset 20, ...).

Source: the installed onnxruntime's kernel registry (docs/OperatorKernels.md lists the same table).
"""

from __future__ import annotations

import functools

import onnx
import onnxruntime

from npukit.targets.profile import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    QUANT_DTYPES,
    DocSource,
    Quantization,
    TargetProfile,
    rules,
)


@functools.cache
def _cpu_ops() -> tuple[str, ...]:
    from onnxruntime.capi import _pybind_state

    names = {k.op_name for k in _pybind_state.get_all_opkernel_def()
             if k.provider == "CPUExecutionProvider" and k.domain in ("", "ai.onnx")}
    names |= {s.name for s in onnx.defs.get_all_schemas()
              if s.domain in ("", "ai.onnx") and (s.has_function or s.has_context_dependent_function)}
    return tuple(sorted(names))


@functools.cache
def profile() -> TargetProfile:
    return TargetProfile(
        name="cpu",
        display_name="ONNX Runtime CPU EP",
        sources=(DocSource("ONNX Runtime CPU kernel registry (docs/OperatorKernels.md)",
                           "https://github.com/microsoft/onnxruntime/blob/main/docs/OperatorKernels.md",
                           f"onnxruntime {onnxruntime.__version__}"),),
        ops=rules(_cpu_ops()),
        quantization=Quantization(
            weights="int8/uint8, per-tensor or per-channel (QDQ or QOperator)",
            activations=("uint8", "int8", "uint16", "int16"),
            accepts_float=True,
        ),
        layout="NCHW",
        requires_static_shapes=False,
        dtypes=FLOAT_DTYPES | QUANT_DTYPES | INDEX_DTYPES | {"string", "uint32", "uint64", "int16"},
        known_limits=("the reference: every node runs here, so everything is 'delegated'",),
        substitutions=(),
        qdq_units=True,
    )
