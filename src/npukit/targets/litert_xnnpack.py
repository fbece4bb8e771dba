"""LiteRT's default CPU path: a torch model converted by litert-torch and run with the XNNPACK delegate LiteRT
applies by default, as data over the ONNX ops the same torch model exports to.

The ``litert`` profile says which ONNX ops have a TFLite builtin; this one says which of them end up inside LiteRT's
XNNPACK delegate when litert-torch converts the torch program (``npukit compile --target litert``), where the rest
run on LiteRT's own kernels between delegate partitions. Written from the XNNPACK delegate's operator list
(tensorflow/lite/delegates/xnnpack, README "Supported operators"), the builtins litert-torch lowers each torch op to,
and validated node for node against the real delegate on a zoo of torchvision models
(benchmarks/mobile_partition.py --backend litert: each ONNX node and each .tflite operator traced back to the torch
op it came from). Float only, as there: npukit's INT8 .tflite comes from its plan.
"""

from __future__ import annotations

from npukit.targets.litert import CONVT_BN
from npukit.targets.litert import OPS as BUILTIN_OPS
from npukit.targets.profile import (
    ERF_GELU_PATTERNS,
    STEPS_UNKNOWN,
    AttrPredicate,
    ConstantInput,
    DocSource,
    Fusion,
    InputRank,
    NodeInfo,
    OpRule,
    PatternStep,
    Quantization,
    TargetProfile,
    unit_steps,
)

# ONNX ops with a TFLite builtin that XNNPACK's delegate does not take, as litert-torch lowers them: comparisons and
# selects (ELU lowers to one), casts, arg-reductions, shape ops, broadcasts, recurrent ops. (The delegate's
# Subgraph::VisitNode, tensorflow/lite/delegates/xnnpack/xnnpack_delegate.cc, switches over the builtins it takes;
# any other builtin stays on LiteRT's kernels.)
_LEFT_TO_LITERT = frozenset({
    "Elu", "Where", "Equal", "Less", "Greater", "GatherND", "Cast", "ArgMax", "ArgMin", "Shape", "Tile",
    "Expand", "LSTM", "ReduceMin", "ReduceProd", "Sign", "Log", "Sin", "Cos",
})
# torch ops the ONNX exporter writes with ops TFLite has no builtin for, which litert-torch lowers to delegated
# builtins (LayerNorm to MEAN/SQUARED_DIFFERENCE/RSQRT, instance and group norms to means and rsqrt, einsum to
# transposes and BATCH_MATMUL); HardSigmoid, decomposed the same way, has its own rule below
_DECOMPOSED = ("LayerNormalization", "InstanceNormalization", "GroupNormalization", "Einsum")


def _gather_taken(node: NodeInfo) -> bool:
    """x[i] with one constant index (lowered to a slice), or shape arithmetic on integers (folded away)."""
    data, indices = (node.inputs + (None, None))[:2]
    if data is not None and data.dtype in ("int64", "int32"):
        return True
    return indices is not None and indices.constant and indices.rank == 0


def _same_or_valid(node: NodeInfo) -> bool | None:
    """The pool's padding is none, or what TFLite's SAME padding gives (the converter writes any other as a PADV2):
    k - 1 in all along a stride-1 axis, whatever its size; along a strided one it depends on the size, and where
    that is unknown here (a symbolic or computed size), None."""
    pads = list(node.attr("pads") or ())
    if not any(pads):
        return True
    shape = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    kernel = list(node.attr("kernel_shape") or ())
    strides = list(node.attr("strides") or [1] * len(kernel))
    if len(pads) != 2 * len(kernel) or (shape is not None and len(shape) != len(kernel) + 2):
        return False
    open_size = False
    for i, (size, k, st) in enumerate(zip(shape[2:] if shape is not None else [None] * len(kernel), kernel, strides)):
        before, after = pads[i], pads[i + len(kernel)]
        if st == 1 or isinstance(size, int):
            total = k - 1 if st == 1 else max((-(-size // st) - 1) * st + k - size, 0)  # type: ignore[operator]
            out_ok = st == 1 or (size + before + after - k) // st + 1 == -(-size // st)  # type: ignore[operator]
            if not out_ok or (before, after) != (total // 2, total - total // 2):
                return False
        else:
            open_size = True
    return None if open_size else True


def _scalar(node: NodeInfo, index: int) -> float | None:
    """The value of input ``index`` where it is a one-element constant, else None."""
    tensor = node.inputs[index] if index < len(node.inputs) else None
    values = tensor.values if tensor is not None else None
    return float(values[0]) if values is not None and len(values) == 1 else None


def _not_relu_0_to_1(node: NodeInfo) -> bool:
    """Clip(x, 0, 1) (torch.clamp(x, 0, 1), hardtanh(x, 0, 1), a port's clamp(a * x + b, 0, 1) hard sigmoid) is one
    op for the converter: it writes RELU_0_TO_1, a builtin the XNNPACK delegate has no case for in
    Subgraph::VisitNode (it takes RELU, RELU6 and RELU_N1_TO_1, and the MINIMUM/MAXIMUM other bounds become), so it
    runs on LiteRT's kernels (measured: PP-OCR's classifier, 9 of them). Bounds as inputs (opset >= 11) or as
    attributes (opset 6)."""
    low = _scalar(node, 1) if len(node.inputs) > 1 else node.attr("min")
    high = _scalar(node, 2) if len(node.inputs) > 2 else node.attr("max")
    return not (low == 0 and high == 1)


def _torch_hardsigmoid(node: NodeInfo) -> bool:
    """HardSigmoid as torch's hardsigmoid exports it (alpha 1/6, beta 0.5), which litert-torch lowers to builtins
    the delegate takes (MobileNetV3, measured). Another slope (Paddle's 0.2) is no torch op: a port writes it as
    clamp(alpha * x + beta, 0, 1), which the converter makes RELU_0_TO_1, outside XNNPACK (onnx2torch does so;
    written as relu6(6 * alpha * x + 6 * beta) / 6 it stays inside)."""
    return abs(float(node.attr("alpha", 0.2)) - 1 / 6) < 1e-6 and abs(float(node.attr("beta", 0.5)) - 0.5) < 1e-6


def _square_or_sqrt(node: NodeInfo) -> bool:
    """Pow with a constant exponent 2 or 0.5: litert-torch lowers aten.pow through jnp.power (torchax's _aten_pow)
    and the conversion writes x ** 2 as MUL(x, x) and x ** 0.5 as SQRT, which the delegate takes; any other exponent
    stays a POW, which VisitNode has no case for (measured, litert-torch 0.10 / ai-edge-litert 2.3: 2, 2.0, a
    constant tensor 2 and torch.square delegated; 3 and -1 left)."""
    return _scalar(node, 1) in (2.0, 0.5)


def _one_output_channel(node: NodeInfo) -> bool | None:
    """One output channel (None where the output's channel count is unknown here)."""
    shape = node.outputs[0].shape if node.outputs and node.outputs[0] is not None else None
    if shape is None or (len(shape) == 4 and not isinstance(shape[1], int)):
        return None
    return len(shape) == 4 and shape[1] == 1


def _zero_padded(node: NodeInfo) -> bool | None:
    """A max pool of a ReLU without ceil_mode: npukit pads it with zeros; with ceil_mode, as any max pool."""
    return True if not node.attr("ceil_mode", 0) else _same_or_valid(node)


# Relu -> MaxPool: npukit's lowering pads a max pool of a ReLU with zeros (a PAD, which the delegate takes, and an
# unpadded MAX_POOL_2D: runtime.litert._zero_padded_max_pools), whatever its padding; not with ceil_mode, whose
# windows past the end the converter pads itself (taken where that padding is TFLite's SAME, as GoogLeNet's)
RELU_MAXPOOL = Fusion("relu_maxpool", "Relu+MaxPool", ((PatternStep("Relu", ("x",)), PatternStep("MaxPool", (0,))),),
                      notes="a max pool of a ReLU: npukit pads it with zeros (PAD), taken", input_ranks=(4,))


# ConvTranspose -> BatchNormalization (-> Relu) (litert.CONVT_BN): LiteRT's converter folds the BatchNorm into the
# TRANSPOSE_CONV with its per-channel constants' shape, a 4-D bias [1, 1, 1, C] (and the Relu into its fused
# activation), and the delegate's VisitTransposeConvNode takes only a 1-D bias (CheckTensorShape(bias_tensor, 1)):
# the op, and the Relu with it, stay on LiteRT's kernels. With one output channel the bias is written 1-D and is
# taken. (A ConvTranspose with only its own bias is taken: litert-torch adds it from a [C] vector. Measured on
# DBNet's head, PP-OCR det.)

OPS = {op: rule for op, rule in BUILTIN_OPS.items() if op not in _LEFT_TO_LITERT} | {
    op: OpRule(op, notes="decomposed by litert-torch into builtins XNNPACK takes") for op in _DECOMPOSED} | {
    "Gather": OpRule("Gather", constraints=(AttrPredicate(_gather_taken, "only a constant single index (x[i], "
                                                                         "lowered to a slice)"),)),
    "Concat": OpRule("Concat", constraints=(AttrPredicate(lambda n: len(n.inputs) <= 5, "at most 5 inputs"),)),
    "MaxPool": OpRule("MaxPool", constraints=(*BUILTIN_OPS["MaxPool"].constraints,
                                              AttrPredicate(_same_or_valid, "padding other than TFLite's SAME is a "
                                                                            "PADV2 (-inf) outside XNNPACK",
                                                            "the input's spatial size is unknown here, so whether "
                                                            "its padding is TFLite's SAME cannot be told"))),
    "Relu+MaxPool": OpRule("Relu+MaxPool", constraints=(InputRank(0, 4, 4), AttrPredicate(
        _zero_padded, "with ceil_mode, padding other than TFLite's SAME is a PADV2 (-inf) outside XNNPACK",
        "the input's spatial size is unknown here, so whether its padding is TFLite's SAME cannot be told")),
        notes="PAD (zeros) and MAX_POOL_2D: a ReLU's output is never negative"),
    "Slice": OpRule("Slice", constraints=(ConstantInput(1, "starts"), ConstantInput(2, "ends"),
                                          AttrPredicate(unit_steps, "only step 1 (a strided slice stays on "
                                                                     "LiteRT's kernels)", STEPS_UNKNOWN))),
    "Clip": OpRule("Clip", constraints=(AttrPredicate(_not_relu_0_to_1, "bounds 0 and 1 make it RELU_0_TO_1, which "
                                                                        "XNNPACK's delegate does not take"),),
                   notes=BUILTIN_OPS["Clip"].notes),
    "HardSigmoid": OpRule("HardSigmoid", constraints=(AttrPredicate(
        _torch_hardsigmoid, "only torch's slope (alpha 1/6, beta 0.5); another, written clamp(alpha * x + beta, 0, "
                            "1), becomes RELU_0_TO_1, outside XNNPACK (relu6(...) / 6 stays inside)"),),
        notes="decomposed by litert-torch into builtins XNNPACK takes"),
    "Pow": OpRule("Pow", constraints=(AttrPredicate(_square_or_sqrt, "only a constant exponent 2 (MUL) or 0.5 "
                                                                     "(SQRT); any other stays a POW, outside "
                                                                     "XNNPACK"),)),
    # upsample_nearest2d: litert-torch writes it as a tfl.resize_nearest_neighbor composite
    # (_convert/fx_passes/build_aten_composite_pass.py), or as a gather of indices (its .default overload, and
    # nearest-exact); neither is a builtin the delegate's VisitNode takes. Bilinear is RESIZE_BILINEAR, taken.
    "Resize": OpRule("Resize", constraints=(InputRank(0, 4, 4), AttrPredicate(
        lambda n: n.attr("mode", "nearest") == "linear",
        "only bilinear (nearest becomes RESIZE_NEAREST_NEIGHBOR, outside XNNPACK)")), notes="RESIZE_BILINEAR"),
    "ConvTranspose+BatchNormalization": OpRule(
        "ConvTranspose+BatchNormalization",
        constraints=(InputRank(0, 4, 4), AttrPredicate(_one_output_channel, "the BatchNorm folds into TRANSPOSE_CONV "
                                                                            "as a 4-D bias, which XNNPACK's delegate "
                                                                            "rejects (1-D only)",
                                                            "the output's channel count is unknown here, so whether "
                                                            "the folded bias is written 1-D cannot be told")),
        notes="TRANSPOSE_CONV with the BatchNorm folded (and a Relu fused)")}

PROFILE = TargetProfile(
    name="litert-xnnpack",
    display_name="LiteRT XNNPACK delegate",
    sources=(DocSource("XNNPACK backend for TensorFlow Lite: supported operators",
                       "https://github.com/tensorflow/tensorflow/blob/master/tensorflow/lite/delegates/xnnpack/"
                       "README.md", "ai-edge-litert 2.3, litert-torch 0.10"),),
    ops=OPS,
    quantization=Quantization(
        weights="int8 symmetric per-channel, from npukit's plan carried as PT2E (compile --target litert)",
        activations=("int8",),
        accepts_float=True,
        float_note="what XNNPACK does not take runs on LiteRT's own CPU kernels, between delegate partitions",
    ),
    layout="NHWC",
    requires_static_shapes=False,
    dtypes=frozenset({"float32", "float16", "int8", "uint8", "int32", "int64"}),
    max_rank=6,
    known_limits=("comparisons, selects (ELU), gathers of a tensor of indices, strided slices, casts and "
                  "arg-reductions stay on LiteRT's kernels",
                  "a max pool padded other than TFLite's SAME runs its padding (PADV2) outside XNNPACK, unless it "
                  "reads a ReLU (npukit pads that with zeros: ResNet's stem); a concatenation of more than 5 "
                  "tensors (nested ones flattened by the converter) stays outside",
                  "F.normalize becomes L2_NORMALIZATION, outside XNNPACK (not predicted: swin_v2_t)",
                  "clamp(x, 0, 1) (hardtanh, a port's hard sigmoid) becomes RELU_0_TO_1 and a nearest upsample "
                  "RESIZE_NEAREST_NEIGHBOR: both stay on LiteRT's kernels; so does clamp(max=1) of a ReLU's "
                  "output, which the converter fuses into RELU_0_TO_1 (not predicted: the Clip alone is taken)",
                  "a ConvTranspose followed by a BatchNorm stays outside (the folded BatchNorm is a 4-D bias "
                  "XNNPACK rejects), as is predicted where the ONNX model keeps the BatchNorm; torch's ONNX export "
                  "folds it into the ConvTranspose first, and the folded node looks like any ConvTranspose with a "
                  "bias (not predicted: DBNet's head)"),
    substitutions=("fix_input_shape",),
    qdq_units=True,
    fusions=(Fusion("erf_gelu", "Gelu", ERF_GELU_PATTERNS, notes="torch's gelu: litert-torch lowers it to GELU"),
             CONVT_BN, RELU_MAXPOOL),
)
