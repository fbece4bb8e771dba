"""ONNX Runtime's XNNPACK execution provider (Arm/x86 CPU kernels in NHWC), as data.

Written from the kernels the XNNPACK EP registers (onnxruntime/core/providers/xnnpack/xnnpack_execution_provider.cc
at onnxruntime-qnn commit cee6c0d, the ORT code base of 2026-03) and ORT's XNNPACK EP documentation. QDQ node units
around Conv, ConvTranspose, pooling, Softmax, Resize and MatMul/Gemm are taken as quantized ops.
"""

from __future__ import annotations

from npukit.targets.profile import (
    AllAttrValuesAtMost,
    AttrIn,
    ConstantInput,
    DocSource,
    InputRank,
    OpRule,
    Quantization,
    TargetProfile,
    with_rules,
)

_2D = InputRank(0, 4, 4)

OPS = with_rules(
    {},
    OpRule("Conv", constraints=(_2D, ConstantInput(1, "weight"), ConstantInput(2, "bias")), notes="2D only"),
    OpRule("ConvTranspose", constraints=(_2D, ConstantInput(1, "weight"), ConstantInput(2, "bias"))),
    OpRule("MaxPool", constraints=(_2D, AttrIn("storage_order", (0,), 0))),
    OpRule("AveragePool", constraints=(_2D, AllAttrValuesAtMost("dilations", 1))),
    OpRule("Softmax"),
    OpRule("Resize", constraints=(InputRank(0, 4, 4), AttrIn("mode", ("nearest", "linear"), "nearest"))),
    OpRule("Gemm", constraints=(ConstantInput(1, "input B"), ConstantInput(2, "input C"))),
    OpRule("MatMul", constraints=(ConstantInput(1, "input B"),)),
    OpRule("QuantizeLinear"),
    OpRule("DequantizeLinear"),
)

PROFILE = TargetProfile(
    name="xnnpack",
    display_name="XNNPACK EP",
    sources=(DocSource("ONNX Runtime XNNPACK Execution Provider",
                       "https://onnxruntime.ai/docs/execution-providers/Xnnpack-ExecutionProvider.html",
                       "onnxruntime 1.32 (xnnpack_execution_provider.cc kernel list)"),),
    ops=OPS,
    quantization=Quantization(
        weights="int8 symmetric per-channel or uint8/int8 per-tensor (QDQ)",
        activations=("uint8", "int8"),
        accepts_float=True,
    ),
    layout="NHWC",
    requires_static_shapes=False,
    dtypes=frozenset({"float32", "float16", "uint8", "int8", "int32", "int64"}),
    max_rank=4,
    known_limits=(
        "only convolutions, pooling, Softmax, Resize, Gemm/MatMul and Q/DQ: element-wise ops stay on the CPU EP",
        "activations after Conv (Relu, Clip) are fused by ORT into the Conv before partitioning",
    ),
    substitutions=("fix_input_shape", "global_pool_to_pool"),
    qdq_units=True,
    graph_optimizations="ort-basic",  # ORT optimizes at its basic level before the XNNPACK EP partitions
)
