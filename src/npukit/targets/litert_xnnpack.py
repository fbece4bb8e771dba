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

from npukit.targets.litert import OPS as BUILTIN_OPS
from npukit.targets.profile import (
    ERF_GELU_PATTERNS,
    AttrPredicate,
    ConstantInput,
    DocSource,
    Fusion,
    NodeInfo,
    OpRule,
    Quantization,
    TargetProfile,
    unit_steps,
)

# ONNX ops with a TFLite builtin that XNNPACK's delegate does not take, as litert-torch lowers them: comparisons and
# selects (ELU lowers to one), casts, arg-reductions, shape ops, broadcasts, recurrent ops.
_LEFT_TO_LITERT = frozenset({
    "Elu", "Where", "Equal", "Less", "Greater", "GatherND", "Cast", "ArgMax", "ArgMin", "Shape", "Tile",
    "Expand", "LSTM", "ReduceMin", "ReduceProd", "Sign", "Pow", "Log", "Sin", "Cos",
})
# torch ops the ONNX exporter writes with ops TFLite has no builtin for, which litert-torch lowers to delegated
# builtins (LayerNorm to MEAN/SQUARED_DIFFERENCE/RSQRT, hardsigmoid * x to HARD_SWISH, instance and group norms to
# means and rsqrt, einsum to transposes and BATCH_MATMUL)
_DECOMPOSED = ("LayerNormalization", "HardSigmoid", "InstanceNormalization", "GroupNormalization", "Einsum")


def _gather_taken(node: NodeInfo) -> bool:
    """x[i] with one constant index (lowered to a slice), or shape arithmetic on integers (folded away)."""
    data, indices = (node.inputs + (None, None))[:2]
    if data is not None and data.dtype in ("int64", "int32"):
        return True
    return indices is not None and indices.constant and indices.rank == 0


def _same_or_valid(node: NodeInfo) -> bool:
    """The pool's padding is none, or what TFLite's SAME padding gives (the converter writes any other as a PADV2)."""
    pads = list(node.attr("pads") or ())
    if not any(pads):
        return True
    shape = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    kernel = list(node.attr("kernel_shape") or ())
    strides = list(node.attr("strides") or [1] * len(kernel))
    if shape is None or len(shape) != len(kernel) + 2 or len(pads) != 2 * len(kernel):
        return False
    for i, (size, k, st) in enumerate(zip(shape[2:], kernel, strides)):
        if not isinstance(size, int):
            return False
        before, after = pads[i], pads[i + len(kernel)]
        out = (size + before + after - k) // st + 1
        total = max((out - 1) * st + k - size, 0)
        if out != -(-size // st) or (before, after) != (total // 2, total - total // 2):
            return False
    return True


OPS = {op: rule for op, rule in BUILTIN_OPS.items() if op not in _LEFT_TO_LITERT} | {
    op: OpRule(op, notes="decomposed by litert-torch into builtins XNNPACK takes") for op in _DECOMPOSED} | {
    "Gather": OpRule("Gather", constraints=(AttrPredicate(_gather_taken, "only a constant single index (x[i], "
                                                                         "lowered to a slice)"),)),
    "Concat": OpRule("Concat", constraints=(AttrPredicate(lambda n: len(n.inputs) <= 5, "at most 5 inputs"),)),
    "MaxPool": OpRule("MaxPool", constraints=(*BUILTIN_OPS["MaxPool"].constraints,
                                              AttrPredicate(_same_or_valid, "padding other than TFLite's SAME is a "
                                                                            "PADV2 (-inf) outside XNNPACK"))),
    "Slice": OpRule("Slice", constraints=(ConstantInput(1, "starts"), ConstantInput(2, "ends"),
                                          AttrPredicate(unit_steps, "only step 1 (a strided slice stays on "
                                                                     "LiteRT's kernels)")))}

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
                  "a max pool padded other than TFLite's SAME runs its padding (PADV2) outside XNNPACK (ResNet's "
                  "3x3/2 pool on an even input); a concatenation of more than 5 "
                  "tensors (nested ones flattened by the converter) stays outside",
                  "F.normalize becomes L2_NORMALIZATION, outside XNNPACK (not predicted: swin_v2_t)"),
    substitutions=("fix_input_shape",),
    qdq_units=True,
    fusions=(Fusion("erf_gelu", "Gelu", ERF_GELU_PATTERNS, notes="torch's gelu: litert-torch lowers it to GELU"),),
)
