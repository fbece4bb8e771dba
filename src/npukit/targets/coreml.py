"""Apple Core ML (ML Program format, Neural Engine / GPU / CPU) through ONNX Runtime's CoreML EP, as data.

Written from ORT's CoreML EP supported-op list for MLProgram (onnxruntime/tools/mobile_helpers/
coreml_supported_mlprogram_ops.md, shipped with onnxruntime 1.32.0, kept in sync with
docs/execution-providers/CoreML-ExecutionProvider.md). The EP takes float32/float16 graphs; QDQ nodes are not in its
list, so a QDQ model leaves its Q/DQ nodes (and the graph between them) on the CPU. The constraints the list leaves
out (PRelu's slope) are those of the EP's op builders (onnxruntime/core/providers/coreml/builders/impl/).
"""

from __future__ import annotations

import math

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
    rules,
    with_rules,
)

_OPS = (
    "Add And ArgMax Cast Clip Concat Cos DepthToSpace Ceil Div Elu Erf Exp GatherND Gelu GridSample "
    "GroupNormalization HardSigmoid Identity InstanceNormalization LayerNormalization LeakyRelu Max Mul Pow "
    "Reciprocal ReduceSum ReduceMean ReduceMax Relu Reshape Resize Round Shape Sin Softplus Split Sub Sigmoid "
    "Softmax Sqrt Squeeze Tanh Tile Transpose Unsqueeze Where"
)
_POOL_2D = (InputRank(0, 4, 4),)


def _channel_slope(node: NodeInfo) -> bool | None:
    """PRelu's slope as the EP's activation builder takes it (IsPReluOpSupported, the same for NeuralNetwork and ML
    Program): one value per channel shaped [C, 1, 1], or a single value where X has more than one channel (None
    where X's rank is unknown here)."""
    x, slope = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if slope is None or slope.shape is None:
        return False
    shape = slope.shape
    if len(shape) == 3 and shape[1:] == (1, 1):
        return True
    if not (all(isinstance(d, int) for d in shape) and math.prod(shape) == 1):  # type: ignore[arg-type]
        return False
    if x is None or x.shape is None:
        return None
    return len(x.shape) >= 3 and x.shape[-3] != 1


OPS = with_rules(
    rules(_OPS),
    OpRule("Conv", constraints=(InputRank(0, 3, 4), ConstantInput(2, "bias")), notes="1D/2D only"),
    OpRule("ConvTranspose", constraints=(
        ConstantInput(1, "weight"), ConstantInput(2, "bias"),
        AttrIn("auto_pad", ("NOTSET", "VALID"), "NOTSET"), AttrIn("output_shape", (None,), None))),
    OpRule("Gemm", constraints=(ConstantInput(1, "input B"),)),
    OpRule("MatMul"),
    OpRule("PRelu", constraints=(InputRank(0, 3, 4), ConstantInput(1, "slope"),
                                 AttrPredicate(_channel_slope, "slope must have shape [C, 1, 1] or a single value "
                                                               "(over more than one channel)",
                                               "the input's rank is unknown here, so whether a single slope value "
                                               "falls on more than one channel cannot be told"))),
    OpRule("Slice", constraints=tuple(ConstantInput(i, n) for i, n in
                                      ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps")))),
    *(OpRule(op, constraints=_POOL_2D, notes="2D pooling only")
      for op in ("AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool")),
)

PROFILE = TargetProfile(
    name="coreml",
    display_name="Apple Core ML (ML Program, ANE)",
    sources=(DocSource("ONNX Runtime CoreML EP: supported operators (MLProgram)",
                       "https://onnxruntime.ai/docs/execution-providers/CoreML-ExecutionProvider.html",
                       "onnxruntime 1.32.0 (tools/mobile_helpers/coreml_supported_mlprogram_ops.md)"),),
    ops=OPS,
    quantization=Quantization(
        weights="float16 (linear int8 / palettized weights come from coremltools, not from ONNX QDQ)",
        activations=("float16",),
        accepts_float=True,
        float_note="the Neural Engine computes in float16",
    ),
    layout="NCHW",
    requires_static_shapes=False,
    dtypes=frozenset({"float32", "float16", "int32", "int64", "bool"}),
    max_rank=5,
    known_limits=(
        "the Neural Engine needs static shapes; dynamic shapes fall back to GPU/CPU inside Core ML",
        "QuantizeLinear/DequantizeLinear are not taken: QDQ models run their Q/DQ on the ORT CPU EP",
        "tensors of rank > 5 are not supported",
    ),
    substitutions=("fix_input_shape", "hardswish_to_hardsigmoid", "global_avgpool_to_reducemean",
                   "prelu_channel_form"),
    qdq_units=False,
    graph_optimizations="ort-basic",  # ORT optimizes at its basic level before the CoreML EP partitions
)
