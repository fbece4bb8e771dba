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
)

# ONNX ops with a TFLite builtin that XNNPACK's delegate does not take, as litert-torch lowers them: comparisons and
# selects (ELU lowers to one), gathers by index tensors (a single constant index is a slice), casts, arg-reductions, shape ops, broadcasts, recurrent ops.
_LEFT_TO_LITERT = frozenset({
    "Elu", "Where", "Equal", "Less", "Greater", "GatherND", "Cast", "ArgMax", "ArgMin", "Shape", "Tile",
    "Expand", "LSTM", "ReduceMin", "ReduceProd", "Sign", "Pow", "Log", "Sin", "Cos",
})
# torch ops the ONNX exporter writes with ops TFLite has no builtin for, which litert-torch lowers to delegated
# builtins (LayerNorm to MEAN/SQUARED_DIFFERENCE/RSQRT, hardsigmoid * x to HARD_SWISH, instance and group norms to
# means and rsqrt)
_DECOMPOSED = ("LayerNormalization", "HardSigmoid", "InstanceNormalization", "GroupNormalization")



def _single_constant_index(node: NodeInfo) -> bool:
    indices = node.inputs[1] if len(node.inputs) > 1 else None
    return indices is not None and indices.constant and indices.rank == 0


def _unit_steps(node: NodeInfo) -> bool:
    steps = node.inputs[4] if len(node.inputs) > 4 else None
    return steps is None or (steps.values is not None and all(s == 1 for s in steps.values))


OPS = {op: rule for op, rule in BUILTIN_OPS.items() if op not in _LEFT_TO_LITERT} | {
    op: OpRule(op, notes="decomposed by litert-torch into builtins XNNPACK takes") for op in _DECOMPOSED} | {
    "Gather": OpRule("Gather", constraints=(AttrPredicate(_single_constant_index, "only a constant single index "
                                                                                  "(x[i], lowered to a slice)"),)),
    "Slice": OpRule("Slice", constraints=(ConstantInput(1, "starts"), ConstantInput(2, "ends"),
                                          AttrPredicate(_unit_steps, "only step 1 (a strided slice stays on "
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
                  "arg-reductions stay on LiteRT's kernels",),
    substitutions=("fix_input_shape",),
    qdq_units=True,
    fusions=(Fusion("erf_gelu", "Gelu", ERF_GELU_PATTERNS, notes="torch's gelu: litert-torch lowers it to GELU"),),
)
