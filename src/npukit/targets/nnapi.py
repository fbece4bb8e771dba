"""Android NNAPI through ONNX Runtime's NNAPI execution provider, by Android API level (NNAPI feature level), as data.

Op list and constraints: ORT's NNAPI EP supported-op table (onnxruntime/tools/mobile_helpers/nnapi_supported_ops.md,
onnxruntime 1.32.0, in sync with docs/execution-providers/NNAPI-ExecutionProvider.md). The API level an op needs is
the level of the NNAPI operation the EP lowers it to, from the Android NDK Neural Networks reference
(developer.android.com/ndk/reference/group/neural-networks, "Available since NNAPI feature level N / API level M"):
API 27 = NNAPI 1.0, 28 = 1.1, 29 = 1.2, 30 = 1.3, 31 = feature level 5.
"""

from __future__ import annotations

import functools

from npukit.targets.profile import (
    AttrIn,
    AttrPredicate,
    ConstantInput,
    DocSource,
    InputRank,
    NodeInfo,
    OpRule,
    Quantization,
    TargetProfile,
)

API_LEVELS = (27, 28, 29, 30, 31)
DEFAULT_API_LEVEL = 29

_2D = InputRank(0, 4, 4)


def _no_dilation(node: NodeInfo) -> bool:
    return all(d == 1 for d in node.attr("dilations") or ())


# op -> (API level it needs, constraints, note)
_OPS: dict[str, tuple[int, tuple, str]] = {
    "Add": (27, (), ""), "Mul": (27, (), ""), "Concat": (27, (), ""), "Relu": (27, (), ""),
    "Sigmoid": (27, (), ""), "Tanh": (27, (), ""), "Softmax": (27, (), ""), "Reshape": (27, (), ""),
    "Flatten": (27, (), ""), "Floor": (27, (), ""), "Identity": (27, (), ""), "LRN": (27, (), ""),
    "DepthToSpace": (27, (AttrIn("mode", ("DCR",), "DCR"),), ""),
    "Conv": (27, (_2D, ConstantInput(1, "weight"), ConstantInput(2, "bias")), "2D only"),
    "AveragePool": (27, (_2D,), "2D only"), "MaxPool": (27, (_2D,), "2D only"),
    "GlobalAveragePool": (27, (_2D,), "2D only"), "GlobalMaxPool": (27, (_2D,), "2D only"),
    "Gemm": (27, (AttrPredicate(lambda n: bool(n.inputs[1] and n.inputs[1].constant) or n.attr("transB", 0) == 1,
                                "transB must be 1 when input B is not constant"),), ""),
    "MatMul": (27, (), ""), "BatchNormalization": (27, (), "lowered to Mul + Add"),
    "Clip": (27, (), "NNAPI 1.0 has only RELU1/RELU6-style clips; other bounds use MIN/MAX (API 29)"),
    "Resize": (27, (_2D,), "2D only; nearest needs API 29"),
    "QuantizeLinear": (27, (ConstantInput(1, "scale"), ConstantInput(2, "zero point")), ""),
    "DequantizeLinear": (27, (ConstantInput(1, "scale"), ConstantInput(2, "zero point")), ""),
    "QLinearConv": (27, (_2D, ConstantInput(3, "weight")), ""), "QLinearMatMul": (27, (), ""),
    "Sub": (28, (), ""), "Div": (28, (), ""), "Transpose": (28, (), ""), "ReduceMean": (28, (), ""),
    "Slice": (28, (), ""), "Squeeze": (28, (ConstantInput(1, "axes"),), ""),
    "Unsqueeze": (27, (ConstantInput(1, "axes"),), ""),
    "Pad": (28, (AttrIn("mode", ("constant",), "constant"), ConstantInput(1, "pads"),
                 ConstantInput(2, "constant_value")), ""),
    "Abs": (29, (), ""), "Exp": (29, (), ""), "Log": (29, (), ""), "Neg": (29, (), ""), "Sin": (29, (), ""),
    "Sqrt": (29, (), ""), "Max": (29, (), ""), "Min": (29, (), ""), "Pow": (29, (), ""), "PRelu": (29, (), ""),
    "LeakyRelu": (29, (), "lowered to PRELU"), "Cast": (29, (), ""), "Gather": (29, (), ""),
    "Split": (29, (ConstantInput(1, "split"),), ""), "Elu": (30, (), ""),
}


@functools.cache
def profile(api_level: int = DEFAULT_API_LEVEL) -> TargetProfile:
    """The NNAPI profile at Android API level ``api_level`` (one of API_LEVELS)."""
    if api_level not in API_LEVELS:
        raise ValueError(f"NNAPI API level must be one of {API_LEVELS}, got {api_level}")
    ops: dict[str, OpRule] = {}
    for op, (level, constraints, note) in _OPS.items():
        if level > api_level:
            continue
        extra = ()
        if op == "Conv" and api_level < 29:
            extra = (AttrPredicate(_no_dilation, "dilations need NNAPI feature level 3 (API 29)"),)
        if op == "Resize" and api_level < 29:
            extra = (AttrIn("mode", ("linear",), "nearest"),)
        ops[op] = OpRule(op, constraints=tuple(constraints) + extra, notes=note)
    activations = ("uint8",) if api_level < 30 else ("uint8", "int8")
    weights = ("uint8 asymmetric per-tensor" if api_level < 29 else
               "uint8 per-tensor or int8 symmetric per-channel (API 29+)")
    dtypes = {"float32", "float16", "uint8", "int32", "int64", "bool"} | ({"int8"} if api_level >= 30 else set())
    return TargetProfile(
        name="nnapi" if api_level == DEFAULT_API_LEVEL else f"nnapi@{api_level}",
        display_name=f"Android NNAPI (API {api_level})",
        sources=(
            DocSource("ONNX Runtime NNAPI EP: supported operators",
                      "https://onnxruntime.ai/docs/execution-providers/NNAPI-ExecutionProvider.html",
                      "onnxruntime 1.32.0 (tools/mobile_helpers/nnapi_supported_ops.md)"),
            DocSource("Android NDK: Neural Networks API reference (operation feature levels)",
                      "https://developer.android.com/ndk/reference/group/neural-networks", "NNAPI feature level 1-5"),
        ),
        ops=ops,
        quantization=Quantization(weights=weights, activations=activations, accepts_float=True,
                                  float_note="float32 runs; many NPU drivers only accelerate quantized graphs"),
        layout="NHWC",
        requires_static_shapes=True,
        dtypes=frozenset(dtypes),
        max_rank=4,
        known_limits=(
            "the ORT NNAPI EP needs static input shapes",
            "NNAPI is deprecated from Android 15; vendor drivers decide what runs on the NPU",
            "tensors of rank > 4 are not supported by most operations",
        ),
        substitutions=("fix_input_shape", "hardswish_to_clip", "hardsigmoid_to_clip", "gelu_tanh_decompose",
                       "groupnorm_decompose"),
        qdq_units=True,
        graph_optimizations="ort-basic",  # ORT optimizes at its basic level before the NNAPI EP partitions
    )


PROFILE = profile()
