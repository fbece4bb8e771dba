"""Qualcomm HTP (Hexagon NPU) through ONNX Runtime's QNN execution provider, as data.

Written from the QNN EP source that onnxruntime-qnn 2.7.0 (QNN SDK 2.51.0) is built from: the op list is
``onnxruntime/core/providers/qnn/builder/op_builder_factory.cc`` and the constraints are the checks in
``builder/opbuilder/*_op_builder.cc`` (repository onnxruntime/onnxruntime-qnn, commit cee6c0d, 2026-03-13), and
ORT's QNN EP documentation (docs/execution-providers/QNN-ExecutionProvider.md). Checked against the installed
onnxruntime-qnn 2.7.0 HTP emulator with single-op models: a float Conv is taken (run in fp16), a Conv with a
symbolic batch dimension is not ("Cannot get shape"), Erf is not, HardSwish, Softmax, Resize(cubic) and int64 Add
are. SoC ids are the ``QNN_SOC_MODEL_*`` values of the QNN SDK's QnnTypes.h.
"""

from __future__ import annotations

import dataclasses

from npukit.targets.profile import (
    ERF_GELU_PATTERNS,
    FLOAT_DTYPES,
    INDEX_DTYPES,
    QUANT_DTYPES,
    AllAttrValuesAtMost,
    AttrIn,
    AttrPredicate,
    ConstantInput,
    DocSource,
    Fusion,
    Hazard,
    HazardSite,
    InputRank,
    NodeInfo,
    OpRule,
    PatternStep,
    Quantization,
    TargetProfile,
    rules,
    with_rules,
)

SOURCES = (
    DocSource("onnxruntime-qnn QNN EP op builders (op_builder_factory.cc, opbuilder/*.cc)",
              "https://github.com/onnxruntime/onnxruntime-qnn/tree/main/onnxruntime/core/providers/qnn/builder",
              "onnxruntime-qnn 2.7.0 / QNN SDK 2.51.0 (source at commit cee6c0d)"),
    DocSource("ONNX Runtime QNN Execution Provider",
              "https://onnxruntime.ai/docs/execution-providers/QNN-ExecutionProvider.html", "ORT 1.32"),
)


@dataclasses.dataclass(frozen=True)
class Soc:
    """A Snapdragon SoC: its marketing name, HTP architecture (``htp_arch`` provider option) and ``soc_model`` id."""

    part: str
    name: str
    htp_arch: int
    soc_model: int
    fp16: bool


# QNN_SOC_MODEL_* ids from QnnTypes.h. HTP v68 has no floating point unit: only quantized models run there.
SOCS: dict[str, Soc] = {s.part: s for s in (
    Soc("SM8350", "Snapdragon 888", 68, 30, False),
    Soc("SM8450", "Snapdragon 8 Gen 1", 69, 36, True),
    Soc("SM8475", "Snapdragon 8+ Gen 1", 69, 42, True),
    Soc("SM8550", "Snapdragon 8 Gen 2", 73, 43, True),
    Soc("SM8650", "Snapdragon 8 Gen 3", 75, 57, True),
    Soc("SM8750", "Snapdragon 8 Elite", 79, 69, True),
    Soc("SM8850", "Snapdragon 8 Elite Gen 5", 81, 87, True),
)}

_DTYPES = frozenset(FLOAT_DTYPES - {"float64"}) | QUANT_DTYPES | INDEX_DTYPES
_AUTO_PAD = AttrIn("auto_pad", ("NOTSET", "SAME_LOWER", "SAME_UPPER", "VALID"), "NOTSET")


def _resize_nearest_ok(node: NodeInfo) -> bool | None:
    """The nearest_mode / coordinate_transformation_mode pairs the HTP takes: rank 4 is ResizeNearestNeighbor, other
    ranks the generic Resize; None where the rank is unknown here and the two answers differ."""
    if node.attr("mode", "nearest") != "nearest":
        return True
    nearest = node.attr("nearest_mode", "round_prefer_floor")
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    rank = node.inputs[0].rank if node.inputs and node.inputs[0] is not None else None
    as_4d = not (nearest in ("ceil", "round_prefer_floor") and coord == "asymmetric")  # ResizeNearestNeighbor
    generic = (nearest == "round_prefer_ceil" and coord == "align_corners") or (
        nearest == "floor" and coord != "pytorch_half_pixel")
    if rank is None:
        return as_4d if as_4d == generic else None
    return as_4d if rank == 4 else generic


def _resize_roi_ok(node: NodeInfo) -> bool:
    roi = node.inputs[1] if len(node.inputs) > 1 else None
    if roi is None or roi.dtype not in QUANT_DTYPES or roi.shape is None:
        return True
    return all(not isinstance(d, int) or d > 0 for d in roi.shape)


def _group_norm_per_channel(node: NodeInfo) -> bool:
    x, scale = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if x is None or scale is None or x.shape is None or scale.shape is None or len(x.shape) < 2:
        return True
    return tuple(scale.shape) == (x.shape[1],)


_SIMPLE = (
    "Abs Add And ArgMax ArgMin Asin Atan BatchNormalization Cast Ceil Concat Cos CumSum DepthToSpace Div Einsum "
    "Elu Equal Exp Expand Floor Gather GatherElements GatherND Gelu Greater GreaterOrEqual GRU HardSigmoid HardSwish "
    "Identity If InstanceNormalization IsNaN LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax LRN LSTM "
    "MatMul Max Mean Min Mod Mul Neg NonZero Not Or Pad Pow PRelu RandomNormalLike RandomUniformLike Reciprocal "
    "ReduceL2 ReduceMax ReduceMean ReduceMin ReduceSum Relu Reshape Flatten Squeeze Unsqueeze RMSNormalization "
    "RoiAlign Round ScatterElements ScatterND Selu Sigmoid Sign Sin Slice Softmax Softplus SpaceToDepth Split Sqrt "
    "STFT Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Upsample Where Xor GridSample Inverse Clip "
    "QuantizeLinear DequantizeLinear"
)

def _batch_norm_dtypes_ok(node: NodeInfo) -> bool:
    """The QNN EP's BatchNormalization check on the HTP (batch_norm_op_builder.cc CheckHtpDataTypes): a 16-bit or
    8-bit unsigned input takes a uint8 or int32 bias, an int8 input an int8 bias."""
    if not node.quantized or len(node.inputs) < 3 or node.inputs[0] is None or node.inputs[2] is None:
        return True
    x, bias = node.inputs[0].dtype, node.inputs[2].dtype
    if x in ("uint16", "uint8"):
        return bias in ("uint8", "int32", None)
    if x == "int8":
        return bias in ("int8", None)
    return True


def _not_empty(node: NodeInfo) -> bool:
    x = node.inputs[0] if node.inputs else None
    return x is None or x.shape is None or all(not isinstance(d, int) or d > 0 for d in x.shape)


def _layer_norm_bias_ok(node: NodeInfo) -> bool:
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    return not (node.quantized and bias is not None and bias.dtype == "int32")


OPS = with_rules(
    rules(_SIMPLE),
    # Rank-6 Reshape / Transpose (Swin's window partition) are taken: seen on the onnxruntime-qnn 2.7.0 emulator.
    OpRule("Reshape", max_rank=6),
    OpRule("Transpose", max_rank=6),
    # A quantized LayerNorm with an int32 bias fails the HTP's op validation with error 3110 ("Failed to add
    # node"); with a uint8 bias it passes (int8 weights either way): seen on the emulator in vit_b_16 and swin_t.
    OpRule("LayerNormalization", constraints=(
        AttrPredicate(_layer_norm_bias_ok, "quantized with an int32 bias is rejected by the HTP (QNN error 3110); "
                                           "quantize the LayerNorm bias like an activation (uint8/uint16)"),)),
    # Int8 weights per channel with a non-zero zero point (npukit quantize's ORT integer-GEMM convs on a VNNI CPU):
    # the QNN EP claims the Conv, then the HTP refuses it and the session is not created ("Failed to add node").
    # The rank is the data input's (InputRank): a bias read through a DequantizeLinear is 1-D and taken.
    OpRule("Conv", max_rank=5, constraints=(_AUTO_PAD, InputRank(0, 3, 5), AttrPredicate(
        lambda n: len(n.inputs) < 2 or n.inputs[1] is None or not n.inputs[1].shifted_zero_points,
        "its int8 weights are dequantized per channel with a non-zero zero point, which the HTP does not take (the "
        "QNN EP claims the Conv, then the session fails): quantize again with --gemm-convs off, or compile the "
        "float model for the HTP"))),
    OpRule("ConvTranspose", max_rank=5, constraints=(
        _AUTO_PAD, InputRank(0, 3, 5), AllAttrValuesAtMost("dilations", 1))),
    OpRule("Gemm", constraints=(
        AttrIn("alpha", (1.0,), 1.0), AttrIn("beta", (1.0,), 1.0))),
    *(OpRule(op, constraints=(InputRank(0, 3, 5), AllAttrValuesAtMost("dilations", 1), _AUTO_PAD,
                              AttrPredicate(lambda n: n.op_type not in ("MaxPool", "GlobalMaxPool")
                                            or (n.inputs[0] is None or n.inputs[0].rank != 5),
                                            "3D max pooling not supported on the NPU"),
                              AttrPredicate(lambda n: len(n.outputs) == 1, "only one output (no indices)")))
      for op in ("AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool")),
    OpRule("Resize", constraints=(
        AttrIn("mode", ("nearest", "linear", "cubic"), "nearest"),
        AttrIn("coordinate_transformation_mode", ("half_pixel", "pytorch_half_pixel", "align_corners",
                                                  "asymmetric"), "half_pixel"),
        AttrIn("antialias", (0,), 0),
        InputRank(0, 3, 5),
        ConstantInput(2, "scales"),
        AttrPredicate(_resize_nearest_ok, "this nearest_mode / coordinate_transformation_mode pair is not "
                                          "supported on the NPU", "the input's rank is unknown here, so whether "
                                          "this nearest_mode / coordinate_transformation_mode pair is taken (it "
                                          "depends on rank 4) cannot be told"),
        AttrPredicate(_resize_roi_ok, "its empty roi input is quantized (Q/DQ on a 0-element tensor): the HTP "
                                      "cannot create it (QNN error 7004 when the graph is composed); make "
                                      "constants initializers before quantizing"))),
    OpRule("ReduceProd", constraints=(AttrPredicate(lambda n: False, "ReduceProd is not supported on the NPU"),)),
    OpRule("LpNormalization", constraints=(AttrIn("p", (2,), 2),)),
    OpRule("GroupNormalization", constraints=(
        AttrPredicate(_group_norm_per_channel, "scale and bias must be per channel (opset 21 form)"),)),
    OpRule("Softmax", constraints=(AttrPredicate(lambda n: not (n.inputs and n.inputs[0] is not None
                                                                  and n.inputs[0].constant),
                                                 "input must not be a constant"),)),
    # Seen on the emulator with PP-OCRv4's detector quantized from Constant nodes (its BatchNorm parameters became
    # uint16 activations): "QNN Batchnorm unsupported datatype on HTP."
    # Its scale, bias, mean and variance must be constants ("QNN BatchNorm doesn't support dynamic scale": seen on
    # the emulator with CenterFace, whose IR-4 model lists its initializers as graph inputs).
    OpRule("BatchNormalization", constraints=(
        *(ConstantInput(i, label) for i, label in enumerate(("scale", "bias", "mean", "variance"), start=1)),
        AttrPredicate(_batch_norm_dtypes_ok, "quantized with this bias dtype the HTP rejects it (\"QNN Batchnorm "
                                             "unsupported datatype on HTP\": a uint8/uint16 input needs a uint8 or "
                                             "int32 bias); fold it into the Conv before it or make its parameters "
                                             "initializers before quantizing"),)),
    # A Q/DQ pair on an empty tensor (Resize's unused roi when it is a Constant node the quantizer took for an
    # activation) passes validation, then composing the graph fails: "Failed to create tensor for node: ..._
    # DequantizeLinear ... error code: 7004", "Failed to compose Qnn graph" (seen with PP-OCRv4's detector).
    OpRule("DequantizeLinear", constraints=(
        AttrPredicate(_not_empty, "an empty (0-element) tensor: the HTP cannot create it (QNN error 7004 when the "
                                  "graph is composed); make constants initializers before quantizing"),)),
)

# Ops the QNN EP asks ORT's layout transformer to run in NHWC (QNNExecutionProvider::GetPreferredLayout users).
LAYOUT_OPS = frozenset({
    "AveragePool", "BatchNormalization", "Conv", "ConvTranspose", "DepthToSpace", "GlobalAveragePool",
    "GlobalMaxPool", "GridSample", "InstanceNormalization", "LRN", "MaxPool", "Resize", "SpaceToDepth",
})

# The QNN EP's own node-group fusions (builder/qnn_node_group/*_fusion.cc): checked as the fused QNN op.
_S = PatternStep
FUSIONS = (
    Fusion("hardsigmoid_mul_to_hardswish", "HardSwish", (
        (_S("HardSigmoid", ("x",), {"alpha": 1 / 6, "beta": 0.5}), _S("Mul", ("x", 0))),
    ), notes="x * HardSigmoid<alpha=1/6, beta=0.5>(x) (hardsigmoid_mul_fusion.cc)"),
    Fusion("erf_gelu", "Gelu", ERF_GELU_PATTERNS,
           notes="x * 0.5 * (1 + Erf(x / sqrt(2))) in its exported orders (gelu_fusion.cc)"),
)

def _swish_tile_band(site: HazardSite) -> bool:
    """Where the HTP's fused Swish computes wrongly: NCHW height 9..12, or height >= 9 with width <= 8."""
    shape = site.input.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[2:]):
        return False
    height, width = shape[2], shape[3]
    return height >= 9 and (height <= 12 or width <= 8)


# Measured on the onnxruntime-qnn 2.7.0 HTP emulator (QNN SDK 2.51), same result for htp_arch 68, 69, 73, 75, 79 and
# 81 and every htp_graph_finalization_optimization_mode: x * Sigmoid(x) with uint16 activations, x written by a
# Conv (3x3 or 1x1, any stride, any channel count, depthwise too), ConvTranspose, MaxPool, AveragePool, Resize or a
# Concat of Convs (also through a Relu or Clip the HTP folds into the Conv), is wrong where the output height is
# 9..12 (any width) or >= 9 with width <= 8: part of the map is garbage (at 10x10: rows 8-9, and columns 4-9 of
# rows 0-1; up to 2.4 on values of 4.8). YOLOv8n at 320x320 has 16 such SiLUs at its 10x10 stride-32 level: 3.8 off
# on values of 6.6 after model.7, and its box outputs differ from run to run by up to 210 px, since the garbage is
# whatever the memory held (HTP vs float 16.6 dB SQNR; rewritten: 41-42 dB, as the QDQ model on the CPU, and the
# same every run). Heights 1..8, 13+ with width 9+, and
# uint8 activations are right; so are x * Sigmoid(x) after an Add, a Tanh, a Transpose or on a graph input. The
# product read through Mul(x, 1) is right everywhere (it stops the HTP fusing Sigmoid and Mul into its Swish).
HAZARDS = (
    Hazard(
        "swish_16bit_tile", patterns=((PatternStep("Sigmoid", ("x",)), PatternStep("Mul", ("x", 0))),),
        applies=_swish_tile_band,
        reason="x * Sigmoid(x) on 16-bit activations after a Conv/pool/Resize, output height 9..12 (or >= 9 with "
               "width <= 8): the HTP's fused Swish returns garbage for part of the map, different from run to run",
        producers=tuple(sorted(LAYOUT_OPS | {"Concat"})), transparent=("Relu", "Clip", "Mul"),
        activation_dtypes=("uint16", "int16"), float_as="uint16", fix="silu_split_input",
        evidence="onnxruntime-qnn 2.7.0 HTP emulator: single-op QDQ models (Conv, depthwise Conv, ConvTranspose, "
                 "MaxPool, AveragePool, Resize, Concat of Convs, Conv+Relu/Clip/Mul-by-constant producers; heights "
                 "1..49 and 56..200, widths 1..300) and YOLOv8n; the other NHWC layout ops are assumed to behave "
                 "like the measured ones"),
)

KNOWN_LIMITS = (
    "every shape must be static: a symbolic dimension makes nodes fail with 'Cannot get shape'",
    "float32 models run in fp16 (enable_htp_fp16_precision) on HTP v69 and newer; v68 (Snapdragon 888) runs "
    "quantized models only",
    "a partition made of a single QuantizeLinear or DequantizeLinear stays on the CPU",
    "a standalone Q or DQ with per-channel scales is not supported; per-channel weights must be axis 0 "
    "(ConvTranspose: axis 1)",
    "Erf has no QNN builder; the QNN EP fuses the x*0.5*(1+Erf(x/sqrt(2))) pattern into Gelu by itself",
    "Shape has no QNN builder: with static shapes ORT folds Shape subgraphs before partitioning",
    "ReduceProd is not supported on the NPU; ReduceL2 needs a float input",
    "x * Sigmoid(x) (SiLU) with 16-bit activations after a Conv, pool or Resize is wrong at output height 9..12 "
    "(or >= 9 with width <= 8): compile and analyze --fix read the product through Mul(x, 1)",
    "a quantized BatchNormalization needs a uint8 or int32 bias, and a Q/DQ pair on an empty tensor (Resize's unused "
    "roi quantized from a Constant node) fails when the graph is composed (QNN error 7004): compile folds constants "
    "and makes Constant nodes initializers before quantizing",
)


def profile(soc: str | None = None) -> TargetProfile:
    """The QNN HTP profile; with ``soc`` (a key of SOCS) its float support follows that SoC's HTP architecture."""
    chip = SOCS[soc] if soc is not None else None
    accepts_float = chip.fp16 if chip is not None else True
    suffix = f"@{chip.part}" if chip is not None else ""
    return TargetProfile(
        name="qnn-htp" + suffix,
        display_name="Qualcomm HTP (QNN EP)" + (f", {chip.name} (v{chip.htp_arch})" if chip else ""),
        sources=SOURCES,
        ops=OPS,
        quantization=Quantization(
            weights="int8 symmetric per-channel (axis 0) or uint8 per-tensor; int32 bias",
            activations=("uint8", "uint16"),
            accepts_float=accepts_float,
            float_note="float32 runs as fp16 on HTP v69+" if accepts_float else
            "HTP v68 has no float unit: quantize the model (QDQ) first",
        ),
        layout="NHWC",
        requires_static_shapes=True,
        dtypes=_DTYPES,
        max_rank=5,
        known_limits=KNOWN_LIMITS,
        substitutions=("fix_input_shape", "groupnorm_decompose", "hardswish_to_hardsigmoid"),
        qdq_units=True,
        drops_lone_qdq_partitions=True,
        graph_io_qdq_on_cpu=True,  # provider option offload_graph_io_quantization, on by default
        layout_ops=LAYOUT_OPS,
        fusions=FUSIONS,
        graph_optimizations="ort-basic",
        variants={part: f"{s.name}, HTP v{s.htp_arch}, soc_model {s.soc_model}" for part, s in SOCS.items()},
        hazards=HAZARDS,
    )


PROFILE = profile()
