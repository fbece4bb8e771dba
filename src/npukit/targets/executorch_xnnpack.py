"""ExecuTorch's XNNPACK delegate (``XnnpackPartitioner``), as data over the ONNX ops a torch model exports to.

Written from the partitioner configs of executorch 1.5.1 (``backends/xnnpack/partition/config``: one config per
edge op, each with its checks) and validated node for node against the real partitioner on a zoo of torchvision
models (benchmarks/mobile_partition.py --backend executorch: each ONNX node is traced back to the torch op it came
from, and that op's edge nodes are looked up inside or outside XNNPACK's delegate calls). Float only here: a
quantized program is lowered from npukit's plan (``compile --target executorch-xnnpack``), where the same ops take int8.

What the rules encode, by edge op: convolutions 1D/2D with parameter weights; linear/mm with a parameter weight,
bmm (a MatMul of two activations of one rank >= 3 without broadcasting: the expand_copy aten.matmul writes before it
has its input's shape, which npukit's edge pass ``executorch_views`` removes); element-wise add/sub/mul/div/min/max
on float tensors (a mul by a Python number too: npukit's ``executorch_scalar`` makes it a mul by a constant);
relu, hardtanh/clamp, hardswish, sigmoid, tanh, gelu, leaky_relu, prelu (parameter slope), abs, neg, exp, log, sqrt,
ceil, floor, sin, cos, pow with an int exponent 2; avg_pool2d without ceil mode and without padding counted in the
average; max_pool2d with stride <= kernel; mean over H and W of a 4D tensor (with keepdim; without it, npukit's edge
pass ``executorch_mean`` makes it one with keepdim and a view); cat of two tensors or more; permute; view; squeeze,
unsqueeze and select (x[i]) on static shapes (npukit's ``executorch_views``: views, a select a one-wide slice and a
view; unsqueeze on the trailing dim only where the shape is symbolic); slice with step 1; split (npukit's edge pass
``executorch_split`` makes its pieces slices); softmax over the last dim (scaled_dot_product_attention's safe-softmax
guard on unmasked scores dropped by npukit's ``executorch_softmax``); layer norm over the last dim (npukit's
``executorch_layer_norm``: two one-output linear layers and element-wise ops, fp32 in an int8 program too); upsample
bilinear 2D; constant pad without cropping; batch norm (fused into its conv or decomposed). Nothing else: no ELU
(disabled in 1.5.1), no nearest upsampling, no log_softmax, no broadcasting expand, no gather of an index tensor, no
dtype casts, no roll, no layer norm over more than the last dim; hardsigmoid decomposed, the dtype copies of its
scalar constants left out (on constants: they do not split the graph).
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


def _unsqueeze_taken(node: NodeInfo) -> bool | None:
    """On a static shape, any axis: npukit's edge pass (``runtime.executorch_views``) makes it a view; on a
    symbolic one, XNNPACK's own UnsqueezeCopyConfig takes the trailing dim only."""
    if _static(node.inputs[0] if node.inputs else None) is not None:
        return True
    rank, axes = _rank(node), _axes(node)
    if axes is None:
        return None if _given_but_unknown(node, 1) else False
    if len(axes) != 1:
        return False
    if int(axes[0]) == -1:
        return True
    return None if rank is None else int(axes[0]) == rank


def _static_input(node: NodeInfo) -> bool | None:
    """Whether the input's shape is static (npukit's view passes rewrite only those); None where it is unknown."""
    tensor = node.inputs[0] if node.inputs else None
    if tensor is None or tensor.shape is None:
        return None
    return _static(tensor) is not None


def _scalar_index(node: NodeInfo) -> bool | None:
    """A Gather of one constant index (rank-0 indices: ``x[i]``, aten.select), of a static shape: a one-wide slice
    and a view (npukit's edge pass, ``runtime.executorch_views``). Other gathers (index tensors) stay out."""
    indices = node.inputs[1] if len(node.inputs) > 1 else None
    if indices is None or not indices.constant or indices.rank != 0:
        return False
    return _static_input(node)


def _expand_to_its_shape(node: NodeInfo) -> bool | None:
    """An Expand to its input's own shape (no broadcasting): npukit's edge pass removes it; a real broadcast stays
    on the portable kernels (no config)."""
    shape, target = _static(node.inputs[0] if node.inputs else None), _values(node, 1)
    if shape is None or target is None:
        return None
    if len(target) > len(shape):
        return False
    return all(int(t) in (1, d) for t, d in zip(target[::-1], shape[::-1]))


def _layer_norm_last_axis(node: NodeInfo) -> bool | None:
    """Over the last axis alone of a static shape: npukit's edge pass (``runtime.executorch_layer_norm``) computes it
    with two one-output linear layers (mean, variance) and element-wise ops XNNPACK takes; XNNPACK has none."""
    rank, axis = _rank(node), int(node.attr("axis", -1))
    if rank is None:
        return None
    if axis % rank != rank - 1:
        return False
    return _static_input(node)


def _no_cropping(node: NodeInfo) -> bool | None:
    pads = node.attr("pads") or _values(node, 1)  # an attribute below opset 11, an input from opset 11
    if pads is None:
        return None
    return all(p >= 0 for p in pads)


def _squared(node: NodeInfo) -> bool:
    return _values(node, 1) == (2.0,)  # an int 2 compares equal


def _static(tensor: object) -> tuple[int, ...] | None:
    """The shape of ``tensor`` (a TensorInfo) where every dim is a known int, or None."""
    shape = getattr(tensor, "shape", None)
    return None if shape is None or not all(isinstance(d, int) for d in shape) else tuple(shape)


def _bmm_operands(node: NodeInfo) -> bool | None:
    """A MatMul of two activations is XNNPACK's bmm where both have one rank of 3 or more and the same batch dims
    (all but the last two): aten.matmul decomposes it into an expand_copy of each operand, views and a bmm
    (BMMConfig), and with no broadcasting each expand_copy has its input's shape, which npukit's edge pass
    (``runtime.executorch_views``) removes (attention's q @ k^T and a @ v, rank 4). Broadcasting batch dims keep
    a real expand_copy, which no config of ALL_PARTITIONER_CONFIGS (backends/xnnpack/partition/config/__init__.py)
    takes: it runs on the portable kernels and splits the graph there; two rank-2 activations are an mm, which no
    config takes either. Such a MatMul counts as left (split, as benchmarks/mobile_partition.py counts it). None
    where an operand's shape is unknown here."""
    operands = node.inputs[:2]
    ranks = [None if t is None else t.rank for t in operands]
    if any(r is not None and r < 3 for r in ranks) or (None not in ranks and ranks[0] != ranks[1]):
        return False
    shapes = [_static(t) for t in operands]
    if None in shapes:
        return None
    return shapes[0][:-2] == shapes[1][:-2]


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
    OpRule("MatMul", constraints=(AttrPredicate(_matmul_supported, "two activations of rank 2, of different ranks "
                                                                   "or broadcasting batch dims: XNNPACK takes no mm, "
                                                                   "and a broadcasting expand_copy stays on the "
                                                                   "portable kernels and splits the graph here (a "
                                                                   "parameter weight, or operands of one rank >= 3 "
                                                                   "and the same batch dims, keep it whole)",
                                                  "an operand's rank is unknown here (or its batch dims), so whether "
                                                  "they broadcast (an expand_copy left out) cannot be told"),)),
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
           constraints=(AttrPredicate(_unsqueeze_taken, "only on the trailing dimension where its shape is symbolic",
                                      "the input's rank or the axes are unknown here, so whether it is on the "
                                      "trailing dimension (the only one taken on a symbolic shape) cannot be "
                                      "told"),),
           notes="on a static shape a view (npukit's edge pass, runtime.executorch_views)"),
    OpRule("Squeeze", dtypes=_WITH_INDICES,
           constraints=(AttrPredicate(_static_input, "only on a static shape (XNNPACK has no squeeze; npukit's "
                                                     "edge pass makes a static one a view)",
                                      "the input's shape is unknown here, so whether it is static (a squeeze is "
                                      "taken as a view only then) cannot be told"),),
           notes="a view (npukit's edge pass, runtime.executorch_views)"),
    OpRule("Gather", dtypes=_WITH_INDICES,
           constraints=(AttrPredicate(_scalar_index, "only one constant index (x[i]) of a static shape: XNNPACK has "
                                                     "no gather; npukit's edge pass makes x[i] a slice and a view",
                                      "the input's shape is unknown here, so whether it is static (x[i] is taken "
                                      "as a slice and a view only then) cannot be told"),),
           notes="x[i] (aten.select) as a one-wide slice and a view (npukit's edge pass, runtime.executorch_views)"),
    OpRule("Expand", dtypes=_WITH_INDICES,
           constraints=(AttrPredicate(_expand_to_its_shape, "only an expand to its input's own shape (npukit's edge "
                                                            "pass removes it): XNNPACK has no expand",
                                      "the input's shape or the target shape is unknown here, so whether it "
                                      "broadcasts (not taken) cannot be told"),)),
    OpRule("LayerNormalization",
           constraints=(AttrPredicate(_layer_norm_last_axis, "only over the last axis alone, of a static shape",
                                      "the input's rank or shape is unknown here, so whether it is normalized over "
                                      "the last axis of a static shape (the only one taken) cannot be told"),),
           notes="two one-output linear layers of weight 1/C (mean, variance) and element-wise ops, fp32 (in an "
                 "int8 program too, between converts: npukit's edge pass, runtime.executorch_layer_norm); XNNPACK "
                 "has no layer norm"),
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
        "no ELU, nearest upsampling, log_softmax, broadcasting expand, gather of an index tensor or dtype casts: "
        "they run on ExecuTorch's portable kernels, and each splits the delegated graph",
        "layer norm over the last dim only (npukit's edge pass: two one-output linear layers of weight 1/C and "
        "element-wise ops, equal to float rounding; fp32 inside the delegate in an int8 program, between converts)",
        "squeeze, unsqueeze, select (x[i]) and an expand to the same shape only on static shapes (npukit's edge "
        "pass makes them views, a select a slice and a view); on a symbolic shape unsqueeze on the trailing dim only",
        "scaled_dot_product_attention: its safe-softmax guard (all -inf rows to 0) is dropped on unmasked scores "
        "(npukit's edge pass; exact wherever a row has a finite score); with a mask it stays on the portable kernels "
        "and splits the graph (not predicted: the ONNX export writes no guard)",
        "mean only over H and W of a 4D tensor (without keepdim too: npukit computes it with keepdim and a view); "
        "softmax only over the last dim",
        "a split is taken as one slice per piece (npukit's edge pass; XNNPACK has no split of its own), int8 in an "
        "int8 program (a piece on another grid, a concatenation's, requantized after its slice by XNNPACK's converts)",
        "hardsigmoid: its decomposition leaves two dtype copies of its scalar constants to the portable kernels; "
        "they run before the delegate call and do not split the graph (MobileNetV3: one delegate call, measured)",
        "a MatMul of two activations whose batch dims broadcast, or of rank 2, is split: a bmm in XNNPACK (no mm), "
        "the broadcasting expand_copy on the portable kernels; counted as left, with its MACs",
        "pow takes only an int exponent 2 (x ** 2, x.pow(2), torch.square); x.pow(2.0) and a tensor exponent stay "
        "out (PowConfig), but the ONNX export writes all of them Pow(x, 2.0): not predicted",
    ),
    substitutions=("fix_input_shape",),
    qdq_units=True,
    fusions=FUSIONS,
)
