"""ExecuTorch's XNNPACK delegate (``XnnpackPartitioner``), as data over the ONNX ops a torch model exports to.

Written from the partitioner configs of executorch 1.5.1 (``backends/xnnpack/partition/config``: one config per
edge op, each with its checks) and validated node for node against the real partitioner on a zoo of torchvision
models (benchmarks/mobile_partition.py --backend executorch: each ONNX node is traced back to the torch op it came
from, and that op's edge nodes are looked up inside or outside XNNPACK's delegate calls). Float only here: a
quantized program is lowered from npukit's plan (``compile --target executorch-xnnpack``), where the same ops take int8.

What the rules encode, by edge op: convolutions 1D/2D with parameter weights; linear/mm with a parameter weight,
bmm on rank-3 operands; element-wise add/sub/mul/div/min/max on float tensors; relu, hardtanh/clamp, hardswish,
sigmoid, tanh, gelu, leaky_relu, prelu (parameter slope), abs, neg, exp, log, sqrt, ceil, floor, sin, cos, pow with
an int exponent 2; avg_pool2d without ceil mode and without padding counted in the average; max_pool2d with stride <=
kernel; mean over H and W of a 4D tensor (with keepdim; without it, npukit's edge pass ``executorch_mean`` makes it
one with keepdim and a view); cat of two tensors or more; permute; view; unsqueeze on the trailing dim only; slice
with step 1; split (npukit's edge pass ``executorch_split`` makes its pieces slices); softmax over the last dim;
upsample bilinear 2D; constant pad without cropping; batch norm (fused into its conv or decomposed). Nothing else:
no layer norm, no ELU (disabled in 1.5.1), no nearest upsampling, no squeeze, no log_softmax, no expand, no dtype
casts, no roll; hardsigmoid decomposed, the dtype copies of its scalar constants left out (on constants: they do
not split the graph).
"""

from __future__ import annotations

from npukit.targets.profile import (
    ERF_GELU_PATTERNS,
    STEPS_UNKNOWN,
    AttrIn,
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
    rules,
    unit_steps,
    with_rules,
)

_FLOAT = frozenset({"float32", "float16", "int8", "uint8"})  # int8/uint8: a quantized unit's dtypes
_WITH_INDICES = _FLOAT | {"int64", "int32"}  # ops whose shape/axes/pads inputs are integer constants


def _values(node: NodeInfo, index: int) -> tuple[float, ...] | None:
    tensor = node.inputs[index] if index < len(node.inputs) else None
    return tensor.values if tensor is not None else None


def _rank(node: NodeInfo) -> int | None:
    return node.inputs[0].rank if node.inputs and node.inputs[0] is not None else None


def _pool_stride_within_kernel(node: NodeInfo) -> bool:
    kernel = node.attr("kernel_shape") or ()
    strides = node.attr("strides") or (1,) * len(kernel)
    return all(s <= k for s, k in zip(strides, kernel))


def _no_padding_in_average(node: NodeInfo) -> bool:
    return not (node.attr("count_include_pad", 0) and any(node.attr("pads") or ()))


def _axes(node: NodeInfo) -> tuple[float, ...] | None:
    """The axes attribute, or the axes input's values (None where that input is absent or not a small constant)."""
    return node.attr("axes") or _values(node, 1)


def _given_but_unknown(node: NodeInfo, index: int) -> bool:
    """Whether input ``index`` is given but its values are not known here (not a small constant)."""
    return index < len(node.inputs) and node.inputs[index] is not None and _values(node, index) is None


# The predicates below answer None where the input's rank (or an axes/pads input computed from Shape nodes) is
# unknown in the model as given and the answer depends on it: the refusal then says so (profile.unchecked) and
# analyze names the shape fixes, instead of a rule the node may well satisfy once the sizes are folded.
def _mean_over_hw(node: NodeInfo) -> bool | None:
    """With keepdims or without: npukit's edge pass (``runtime.executorch_mean``) computes a mean over H and W
    without keepdim as one with keepdim and a view, which XNNPACK takes (fp32 and int8)."""
    rank, axes = _rank(node), _axes(node)
    if axes is None:  # computed axes, or none (the mean over every axis, never H and W alone)
        return None if _given_but_unknown(node, 1) else False
    if len(axes) != 2:
        return False
    if rank is None:
        return None
    return rank == 4 and sorted(int(a) % 4 for a in axes) == [2, 3]


def _softmax_last_axis(node: NodeInfo) -> bool | None:
    rank = _rank(node)
    axis = node.attr("axis", -1)
    if axis == -1:
        return True
    return None if rank is None else axis == rank - 1


def _unsqueeze_trailing(node: NodeInfo) -> bool | None:
    rank, axes = _rank(node), _axes(node)
    if axes is None:
        return None if _given_but_unknown(node, 1) else False
    if len(axes) != 1:
        return False
    if int(axes[0]) == -1:
        return True
    return None if rank is None else int(axes[0]) == rank


def _no_cropping(node: NodeInfo) -> bool | None:
    pads = node.attr("pads") or _values(node, 1)  # an attribute below opset 11, an input from opset 11
    if pads is None:
        return None
    return all(p >= 0 for p in pads)


def _squared(node: NodeInfo) -> bool:
    return _values(node, 1) == (2.0,)  # an int 2 compares equal


def _bmm_operands(node: NodeInfo) -> bool | None:
    """A MatMul of two activations is XNNPACK's bmm alone only on rank-3 operands. On rank 4 (attention's q @ k^T,
    a @ v) aten.matmul decomposes into an expand_copy of each operand, views and a bmm: BMMConfig takes the bmm
    (the MACs), but ALL_PARTITIONER_CONFIGS (backends/xnnpack/partition/config/__init__.py) has no config for
    expand_copy, so both run on the portable kernels before it and split the delegated graph there. The MatMul
    counts as left (split, as benchmarks/mobile_partition.py counts it): that places the split right (measured: a
    4-head attention, 2 MatMuls, 4 expand_copy outside, 4 delegate calls predicted and made). None where an
    operand's rank is unknown here."""
    ranks = [None if t is None else t.rank for t in node.inputs[:2]]
    if any(r is not None and r != 3 for r in ranks):
        return False
    return None if None in ranks else True


def _matmul_supported(node: NodeInfo) -> bool | None:
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    return True if weight is not None and weight.constant else _bmm_operands(node)


_2D = InputRank(0, 4, 4)
_CONV = InputRank(0, 3, 4)  # 1D and 2D

OPS = with_rules(
    rules("Relu Sigmoid Tanh HardSwish LeakyRelu Gelu Abs Neg Exp Log Sqrt Ceil Floor Sin Cos Transpose Flatten "
          "BatchNormalization Add Sub Mul Div"),
    OpRule("Max", constraints=(AttrPredicate(lambda n: len(n.inputs) == 2, "only two operands (maximum)"),)),
    OpRule("Min", constraints=(AttrPredicate(lambda n: len(n.inputs) == 2, "only two operands (minimum)"),)),
    OpRule("Conv", constraints=(_CONV, ConstantInput(1, "weight"), ConstantInput(2, "bias")), notes="1D and 2D"),
    OpRule("ConvTranspose", constraints=(_CONV, ConstantInput(1, "weight"), ConstantInput(2, "bias"))),
    OpRule("Einsum", notes="decomposed into permute, view and bmm (maxvit_t's attention, measured)"),
    OpRule("Gemm", constraints=(ConstantInput(1, "weight"), ConstantInput(2, "bias")), notes="linear / addmm"),
    OpRule("MatMul", constraints=(AttrPredicate(_matmul_supported, "two activations of rank other than 3: XNNPACK "
                                                                   "takes the bmm, but the expand_copy of each "
                                                                   "operand stays on the portable kernels and splits "
                                                                   "the graph here (a parameter weight or rank-3 "
                                                                   "operands keep it whole)",
                                                  "an operand's rank is unknown here, so whether it is a rank-3 "
                                                  "bmm (taken whole) cannot be told"),)),
    OpRule("PRelu", constraints=(ConstantInput(1, "slope"),)),
    OpRule("HardSigmoid", notes="decomposed (add, clamp, div): its scalars' dtype copies run on the portable kernels "
                                "before the delegate call, on constants, without splitting the graph"),
    OpRule("Clip", dtypes=_WITH_INDICES, constraints=(ConstantInput(1, "min"), ConstantInput(2, "max")),
           notes="hardtanh / clamp"),
    OpRule("Pow", dtypes=_WITH_INDICES, constraints=(AttrPredicate(_squared, "only exponent 2"),)),
    OpRule("AveragePool", constraints=(_2D, AttrIn("ceil_mode", (0,), 0),
                                       AttrPredicate(_no_padding_in_average,
                                                     "padding counted in the average is not supported"))),
    OpRule("GlobalAveragePool", constraints=(_2D,), notes="mean over H, W"),
    OpRule("ReduceMean", dtypes=_WITH_INDICES,
           constraints=(AttrPredicate(_mean_over_hw, "only the mean of a 4D tensor over H and W",
                                      "the input's rank or the axes are unknown here, so whether it is the mean "
                                      "over H and W (the only one taken) cannot be told"),)),
    OpRule("MaxPool", constraints=(_2D, AttrPredicate(_pool_stride_within_kernel,
                                                      "stride must not exceed the kernel"))),
    OpRule("Concat", constraints=(AttrPredicate(lambda n: len(n.inputs) >= 2, "needs two inputs or more"),)),
    OpRule("Reshape", dtypes=_WITH_INDICES, constraints=(ConstantInput(1, "shape"),)),
    OpRule("Unsqueeze", dtypes=_WITH_INDICES,
           constraints=(AttrPredicate(_unsqueeze_trailing, "only on the trailing dimension",
                                      "the input's rank or the axes are unknown here, so whether it is on the "
                                      "trailing dimension (the only one taken) cannot be told"),)),
    OpRule("Slice", dtypes=_WITH_INDICES, constraints=(AttrPredicate(unit_steps, "only step 1", STEPS_UNKNOWN),)),
    OpRule("Split", dtypes=_WITH_INDICES, constraints=(ConstantInput(1, "split"),),
           notes="its pieces as slices (npukit's edge pass, runtime.executorch_split): XNNPACK has no split"),
    OpRule("Softmax", constraints=(AttrPredicate(_softmax_last_axis, "only over the last axis",
                                                 "the input's rank is unknown here, so whether its axis is the "
                                                 "last (the only one taken) cannot be told"),)),
    OpRule("Resize", dtypes=_WITH_INDICES, constraints=(_2D, AttrIn("mode", ("linear",), "nearest")),
           notes="upsample bilinear 2D"),
    OpRule("Pad", dtypes=_WITH_INDICES,
           constraints=(AttrIn("mode", ("constant",), "constant"),
                        AttrPredicate(_no_cropping, "negative pads (cropping) are not supported",
                                      "its pads are not a constant here, so whether any is negative "
                                      "(cropping, not taken) cannot be told"))),
)

# Ops of the torch program the ONNX exporter writes as several ONNX nodes: checked as the one op ExecuTorch sees.
# torch.roll exports as two Slices of its input joined by a Concat per rolled dim; "Roll" has no rule (ExecuTorch
# leaves aten.roll to its portable kernels).
_ROLL = tuple((PatternStep("Slice", ("x", *"*" * extra)), PatternStep("Slice", ("x", *"*" * extra)),
               PatternStep("Concat", (0, 1))) for extra in (3, 4))
FUSIONS = (
    Fusion("erf_gelu", "Gelu", ERF_GELU_PATTERNS, notes="torch's gelu, exported without a Gelu op"),
    Fusion("slices_concat_roll", "Roll", _ROLL, notes="torch.roll: two slices of one input joined in swapped order"),
)

PROFILE = TargetProfile(
    name="executorch-xnnpack",
    display_name="ExecuTorch XNNPACK",
    sources=(DocSource("ExecuTorch XNNPACK backend: partitioner configs (backends/xnnpack/partition/config)",
                       "https://docs.pytorch.org/executorch/stable/backends-xnnpack.html", "executorch 1.5.1"),),
    ops=OPS,
    quantization=Quantization(
        weights="int8 symmetric per-channel (full range -127..127 here), from npukit's plan carried as PT2E",
        activations=("int8",),
        accepts_float=True,
        float_note="what XNNPACK does not take runs on ExecuTorch's portable CPU kernels, between delegate calls",
    ),
    layout="NHWC",
    requires_static_shapes=False,
    dtypes=_FLOAT,
    known_limits=(
        "no layer norm, ELU, nearest upsampling, squeeze, log_softmax, expand, select (x[i], a Gather in ONNX) or "
        "dtype casts: they run on ExecuTorch's portable kernels, and each splits the delegated graph",
        "mean only over H and W of a 4D tensor (without keepdim too: npukit computes it with keepdim and a view); "
        "softmax only over the last dim",
        "a split is taken as one slice per piece (npukit's edge pass; XNNPACK has no split of its own), int8 in an "
        "int8 program (a piece on another grid, a concatenation's, requantized after its slice by XNNPACK's converts)",
        "hardsigmoid: its decomposition leaves two dtype copies of its scalar constants to the portable kernels; "
        "they run before the delegate call and do not split the graph (MobileNetV3: one delegate call, measured)",
        "a Python int operand (16 * x) gets a dtype copy outside XNNPACK; the ONNX export folds that cast, so it is "
        "not predicted (swin_v2_t's 12 muls; write 16.0 * x)",
        "a MatMul of two rank-4 activations (attention written out) is split: its bmm runs in XNNPACK, the "
        "expand_copy of each operand on the portable kernels; counted as left, with its MACs",
        "pow takes only an int exponent 2 (x ** 2, x.pow(2), torch.square); x.pow(2.0) and a tensor exponent stay "
        "out (PowConfig), but the ONNX export writes all of them Pow(x, 2.0): not predicted",
    ),
    substitutions=("fix_input_shape",),
    qdq_units=True,
    fusions=FUSIONS,
)
