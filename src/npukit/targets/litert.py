"""LiteRT (TensorFlow Lite) builtin operators, mapped from ONNX ops, as data.

Written from the LiteRT builtin operator list (tensorflow/lite/builtin_ops.h; ai.google.dev/edge/litert) and the
TFLite 8-bit quantization specification (ai.google.dev/edge/litert/models/quantization_spec), LiteRT 1.x / TF 2.18.
Each ONNX op here has a builtin it converts to (named in the rule's notes); an ONNX op without one needs a
substitution or a Flex (TF select) op, which NPU delegates do not take.
"""

from __future__ import annotations

from npukit.targets.profile import (
    AttrIn,
    ConstantInput,
    DocSource,
    Fusion,
    InputRank,
    OpRule,
    PatternStep,
    Quantization,
    TargetProfile,
)

# ONNX op -> the TFLite builtin(s) it lowers to
_BUILTINS = {
    "Conv": "CONV_2D / DEPTHWISE_CONV_2D / CONV_3D", "ConvTranspose": "TRANSPOSE_CONV",
    "Gemm": "FULLY_CONNECTED", "MatMul": "FULLY_CONNECTED / BATCH_MATMUL", "AveragePool": "AVERAGE_POOL_2D",
    "MaxPool": "MAX_POOL_2D", "GlobalAveragePool": "MEAN", "GlobalMaxPool": "REDUCE_MAX", "Relu": "RELU",
    "Clip": "RELU6 / RELU_N1_TO_1 / RELU_0_TO_1 / MINIMUM+MAXIMUM", "Sigmoid": "LOGISTIC", "Tanh": "TANH",
    "HardSwish": "HARD_SWISH", "LeakyRelu": "LEAKY_RELU", "PRelu": "PRELU", "Elu": "ELU", "Gelu": "GELU",
    "Add": "ADD", "Sub": "SUB", "Mul": "MUL", "Div": "DIV", "Pow": "POW", "Sqrt": "SQRT", "Exp": "EXP",
    "Log": "LOG", "Abs": "ABS", "Neg": "NEG", "Max": "MAXIMUM", "Min": "MINIMUM", "Sin": "SIN", "Cos": "COS",
    "Floor": "FLOOR", "Ceil": "CEIL", "Round": "ROUND", "Sign": "SIGN", "Reciprocal": "DIV",
    "Concat": "CONCATENATION", "Reshape": "RESHAPE", "Flatten": "RESHAPE", "Squeeze": "SQUEEZE",
    "Unsqueeze": "EXPAND_DIMS", "Transpose": "TRANSPOSE", "Slice": "STRIDED_SLICE", "Split": "SPLIT / SPLIT_V",
    "Pad": "PAD / PADV2 / MIRROR_PAD", "Resize": "RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR",
    "Softmax": "SOFTMAX", "LogSoftmax": "LOG_SOFTMAX", "ReduceMean": "MEAN", "ReduceMax": "REDUCE_MAX",
    "ReduceMin": "REDUCE_MIN", "ReduceSum": "SUM", "ReduceProd": "REDUCE_PROD", "Gather": "GATHER",
    "GatherND": "GATHER_ND", "Cast": "CAST", "DepthToSpace": "DEPTH_TO_SPACE", "SpaceToDepth": "SPACE_TO_DEPTH",
    "ArgMax": "ARG_MAX", "ArgMin": "ARG_MIN", "Where": "SELECT_V2", "Equal": "EQUAL", "Less": "LESS",
    "Greater": "GREATER", "Tile": "TILE", "Expand": "BROADCAST_TO", "BatchNormalization": "MUL + ADD (folded)",
    "QuantizeLinear": "QUANTIZE", "DequantizeLinear": "DEQUANTIZE", "LSTM": "UNIDIRECTIONAL_SEQUENCE_LSTM",
    "Identity": "(removed)", "Shape": "SHAPE", "Softplus": "(decomposed)", "Erf": "(no builtin: Flex)",
}
# A 1-D convolution (rank 3) is written as the 2-D builtin between RESHAPEs (measured, litert-torch 0.10: Conv1d and
# ConvTranspose1d convert so and run inside the XNNPACK delegate).
_SPECIAL = {
    "Conv": (InputRank(0, 3, 5), ConstantInput(1, "weight")),
    "ConvTranspose": (InputRank(0, 3, 4), ConstantInput(1, "weight")),
    "Resize": (InputRank(0, 4, 4), AttrIn("mode", ("nearest", "linear"), "nearest")),
    "AveragePool": (InputRank(0, 4, 4),), "MaxPool": (InputRank(0, 4, 4),),
    "Pad": (ConstantInput(1, "pads"),),
}
OPS = {op: OpRule(op, constraints=_SPECIAL.get(op, ()), notes=f"TFLite {builtin}")
       for op, builtin in _BUILTINS.items() if not builtin.startswith("(no builtin")}

# ConvTranspose -> BatchNormalization (-> Relu) on a 4-D input: the converter folds the BatchNorm into the
# TRANSPOSE_CONV (its scale into the weights, its shift into the bias) and the Relu into its fused activation: one
# operator, taken or left as one (measured, litert-torch 0.10: ConvTranspose2d -> BatchNorm2d -> ReLU converts to a
# single TRANSPOSE_CONV; after a ConvTranspose1d, written with reshapes, the BatchNorm stays a MUL and an ADD).
CONVT_BN_PATTERNS = tuple(
    (PatternStep("ConvTranspose", conv), PatternStep("BatchNormalization", (0, "*", "*", "*", "*")), *relu)
    for conv in (("x", "*", "*"), ("x", "*")) for relu in ((PatternStep("Relu", (1,)),), ()))
CONVT_BN = Fusion("convtranspose_batchnorm", "ConvTranspose+BatchNormalization", CONVT_BN_PATTERNS,
                  notes="the converter folds the BatchNorm (and fuses a Relu) into TRANSPOSE_CONV", input_ranks=(4,))
OPS["ConvTranspose+BatchNormalization"] = OpRule(
    "ConvTranspose+BatchNormalization", constraints=(InputRank(0, 4, 4),),
    notes="TFLite TRANSPOSE_CONV with the BatchNorm folded into its weights and bias (and a Relu fused)")

PROFILE = TargetProfile(
    name="litert",
    display_name="LiteRT (TFLite builtins)",
    sources=(
        DocSource("LiteRT builtin operators (tensorflow/lite/builtin_ops.h)",
                  "https://ai.google.dev/edge/litert/models/ops_compatibility", "LiteRT 1.x / TensorFlow 2.18"),
        DocSource("LiteRT 8-bit quantization specification",
                  "https://ai.google.dev/edge/litert/models/quantization_spec", "LiteRT 1.x"),
    ),
    ops=OPS,
    quantization=Quantization(
        weights="int8 symmetric (zero point 0), per-channel for Conv/DepthwiseConv (axis of output channels), "
                "per-tensor for FullyConnected; int32 bias with scale = input_scale * weight_scale",
        activations=("int8", "int16"),
        accepts_float=True,
        float_note="float runs on the CPU/GPU delegates; NPU delegates (Edge TPU, vendor NPUs) need full int8",
    ),
    layout="NHWC",
    requires_static_shapes=False,
    dtypes=frozenset({"float32", "float16", "int8", "int16", "uint8", "int32", "int64", "bool"}),
    max_rank=5,
    known_limits=(
        "activations are asymmetric int8 per-tensor (or int16 with int8 weights, '16x8' mode)",
        "ops without a builtin (Erf, HardSigmoid, GroupNormalization, InstanceNormalization, LayerNormalization) "
        "need substitutions or Flex ops, which NPU delegates do not take",
        "NPU delegates need static shapes",
    ),
    substitutions=("fix_input_shape", "hardsigmoid_to_clip", "groupnorm_decompose",
                   "hardswish_to_clip"),
    qdq_units=True,
    fusions=(CONVT_BN,),
)
