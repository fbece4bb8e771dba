"""Quantization for the QNN HTP: the float model's last preparation, ONNX Runtime's QDQ quantizer with npukit's QNN
rules (``npukit.runtime.qnn.HTP_QDQ_RULES``), then the int8 weights' rounding compensated and the 16-bit activation
grids given headroom.

Why each step. Measured on third-party models (benchmarks/zoo_models.py; SQNR of the outputs against the float
model over all calibration / all evaluation inputs; RetinaFace-MobileNet0.25 480x640, 20 / 16 photos, loc;
PP-OCRv4 det 640x640, 8 / 7 pages, the logits before its Sigmoid; PP-LCNet orientation 224x224, 20 / 20 documents,
logits), the QDQ graph on ORT CPU unless said otherwise:

===============================================  ===============  ===============  ===============
                                                 RetinaFace loc   PP-OCRv4 det     PP-LCNet
===============================================  ===============  ===============  ===============
ORT's quantizer with the QNN rules alone         14.4 / 14.6 dB   28.4 / 26.8 dB   39.6 / 46.0 dB
+ BatchNorm folded, bias correction              24.4 / 22.0 dB   33.9 / 31.6 dB
+ GPTQ rounding                                  29.4 / 25.6 dB   43.4 / 32.4 dB
+ 1.5x headroom on the 16-bit grids (all steps)  29.3 / 28.8 dB   43.2 / 38.4 dB   50.1 / 53.4 dB
the same on the HTP emulator (4 / 6, 3 / 3)      28.6 / 28.3 dB   35.8 / 41.5 dB
float weights, ORT's 16-bit grids                50.5 / 28.4 dB   57.0 / 32.8 dB
===============================================  ===============  ===============  ===============

- **The int8 weights are the error** (``gptq_weights``, ``correct_weight_rounding_bias``). With uint16 activations
  (steps of 0.002% of a tensor's range) nearest rounding of the int8 weights is nearly all of the error, and most of
  it is a per-channel offset: rounding moves each output channel's kernel sum a little, and the layer's input
  (after a Relu, LeakyRelu or HardSwish: mostly positive, a large mean) turns that into a shift of the whole output
  channel. RetinaFace's first depthwise conv alone: weight SQNR 43.6 dB, output 31.9 dB, 46.8 dB without the
  per-channel mean of its error; PP-OCRv4 det's 384x384 1x1 conv: 27.5 dB, 35.3 dB without it. Compounded over
  50-60 layers the outputs land at 15-18 dB. uint8 activations hid it (their own rounding noise is larger).
  GPTQ (Frantar et al. 2022) re-rounds each Conv / Gemm weight column by column on ORT's own grid, spreading each
  rounding error over the columns not yet rounded through the layer input's Hessian (measured on the calibration
  samples), so the layer's output error, offset included, is minimised (3.5-15 dB lower per RetinaFace layer); bias
  correction then removes the per-channel mean of what is left (and is the whole treatment of ConvTranspose). The
  int8 scales, zero points (0) and the HTP's layout do not change, only integers.
- **Headroom** (``widen_activation_grids``). Calibrated min/max grids clip inputs unlike the calibration samples
  (the last row: with float weights the QDQ graphs lose 22-24 dB from calibration to evaluation inputs; PP-OCRv4
  det's SE blocks' pooled activations are clipped). On ORT CPU 16 bits would afford a wide margin (6 dB of ~80 per
  doubling), but the HTP's uint16 arithmetic is ~20 dB noisier than 16-bit rounding (one conv: 60 dB from its QDQ
  graph, 55 dB with the grids twice as wide, 49 dB at 4x), so the margin is moderate: 1.5x (RetinaFace on the
  HTP, calibration / evaluation photos: 29.0 / 26.2 dB without, 28.6 / 28.3 dB at 1.5x, 27.6 / 27.7 dB at 2x).
- **BatchNormalization** (``fold_conv_transpose_affine``, ``batchnorm_to_mul_add``). QNN's BatchNorm requantizes
  scale / sqrt(var + eps) on one int8 grid for all channels: PP-LCNet with its 27 BatchNorms unfolded ran on the
  HTP 3.0 dB from the float model (top-1 agreement 0.50; the QDQ graph on CPU 31.8 dB), PP-OCRv4 det's head
  (ConvTranspose, bias Add, BatchNorm, which the float passes do not fold: they fold BatchNorm into Conv) 21.8 dB
  from its QDQ graph. After a ConvTranspose the Add and BatchNorm fold into its weight (per output channel, axis 1)
  and bias; any other BatchNorm becomes Mul + Add with per-channel constants. Both exact in float.
- Every Conv / ConvTranspose / Gemm with an initializer weight gets a bias (zeros where it had none), so the
  correction has an int32 bias to move (ORT quantizes it with scale input_scale * weight_scale).
- **int4 weights** (``QnnQdqRules(weight_type="int4")``, ``compile --weight-bits 4``: W4A16). The same steps on
  ORT's symmetric int4 grid ([-8, 7], scale max|w| / 7.5). GPTQ matters more there (a test conv: nearest 3.2 dB,
  GPTQ 19.2 dB), yet MobileNetV2's pointwise convs do not survive it: 7.5 dB on the HTP against 32.6 dB with int8
  weights (benchmarks/results/htp_w4a16.json).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from npukit._logging import quiet_root_logger
from npukit._threads import torch_threads
from npukit.frontend.graph_index import GraphIndex
from npukit.quant.algorithms.gptq import POSITIONS, input_rows, reround, row_limit
from npukit.quant.nodes import dequantized, node_attr
from npukit.runtime.qnn import HTP_QDQ_RULES, QnnQdqRules, qnn_quant_config

_WEIGHTED = ("Conv", "ConvTranspose", "Gemm")


@dataclasses.dataclass(frozen=True)
class HtpQuantResult:
    """The QDQ model for the HTP and what was done to get it."""

    model: onnx.ModelProto
    folded: tuple[str, ...]  # nodes folded into a ConvTranspose (BatchNormalization, bias Add)
    batchnorms_rewritten: tuple[str, ...]  # other BatchNormalizations, now Mul + Add
    biases_added: int  # Conv/ConvTranspose/Gemm that got a zero bias before quantization
    rerounded: dict[str, float]  # node -> GPTQ's gain in the layer's output error on the calibration inputs (dB)
    corrected: dict[str, float]  # node -> largest mean shift removed, in steps of its int32 bias
    correction_samples: int
    widened: int  # 16-bit activation grids given headroom beyond the calibrated range
    float_model: onnx.ModelProto | None = None  # the float model quantized (folded, zero biases added)

    def as_dict(self) -> dict[str, Any]:
        return {"folded": list(self.folded), "batchnorms_rewritten": list(self.batchnorms_rewritten),
                "biases_added": self.biases_added, "gptq_nodes": len(self.rerounded),
                "bias_corrected_nodes": len(self.corrected), "correction_samples": self.correction_samples,
                "widened_grids": self.widened}


def quantize_for_htp(
    model: onnx.ModelProto,
    samples: Sequence[dict[str, np.ndarray]],
    *,
    rules: QnnQdqRules = HTP_QDQ_RULES,
    uint16_tensors: tuple[str, ...] = (),
    float_nodes: tuple[str, ...] = (),
) -> HtpQuantResult:
    """QDQ as the HTP needs it (``rules``: int8 (or int4) symmetric per-channel weights, uint16 activations), ONNX
    Runtime's quantizer doing the mechanics. ``float_nodes`` stay float: their weights float32, their inputs dequantized
    and their outputs quantized by the nodes around them; the HTP runs them in float16 (``enable_htp_fp16_precision``,
    which ``npukit.runtime.compile.soc_provider_options`` sets). On the float model first:
    ``fold_conv_transpose_affine``, ``batchnorm_to_mul_add``, ``add_zero_biases``; on ORT's QDQ model after it, with
    ``samples`` (which also calibrate the activations): ``gptq_weights`` (``rules.gptq``),
    ``correct_weight_rounding_bias`` (``rules.bias_correction``), ``widen_activation_grids``
    (``rules.activation_headroom``)."""
    from onnxruntime.quantization import quantize as ort_quantize

    from npukit.quant.emit.ort_qdq import FeedsReader, own_biases

    samples = list(samples)
    work, folded = fold_conv_transpose_affine(model)
    work, rewritten = batchnorm_to_mul_add(work)
    work, added = add_zero_biases(work)
    with quiet_root_logger():  # ORT's quantizer warns on the root logger about steps npukit has done
        with tempfile.TemporaryDirectory(prefix="npukit-htp-") as tmp:
            source, out = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
            onnx.save(own_biases(work), str(source))  # shared biases copied under names of npukit's own
            config = qnn_quant_config(str(source), FeedsReader(samples), rules=rules, uint16_tensors=uint16_tensors)
            config.nodes_to_exclude = list(float_nodes)
            ort_quantize(str(source), str(out), config)
            qdq = onnx.load(str(out))
    rerounded: dict[str, float] = {}
    if rules.gptq and samples:
        qdq, rerounded = gptq_weights(work, qdq, samples)
    corrected: dict[str, float] = {}
    if rules.bias_correction and samples:
        qdq, corrected = correct_weight_rounding_bias(work, qdq, samples)
    qdq, widened = widen_activation_grids(work, qdq, rules.activation_headroom)
    return HtpQuantResult(model=qdq, folded=tuple(folded), batchnorms_rewritten=tuple(rewritten),
                          biases_added=added, rerounded=rerounded, corrected=corrected,
                          correction_samples=len(samples) if corrected or rerounded else 0, widened=widened,
                          float_model=work)


# ----------------------------------------------------------------------------------------------------------------
# Float preparation


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _drop_unused(model: onnx.ModelProto) -> None:
    """Remove initializers no node reads (and their graph inputs: a model of IR version 3 or less lists every
    initializer as an input too, which ONNX Runtime would then ask to be fed) and value_info of tensors no node
    writes."""
    used = {t for n in model.graph.node for t in n.input} | {o.name for o in model.graph.output}
    dropped = {i.name for i in model.graph.initializer if i.name not in used}
    for init in [i for i in model.graph.initializer if i.name in dropped]:
        model.graph.initializer.remove(init)
    for value in [v for v in model.graph.input if v.name in dropped]:
        model.graph.input.remove(value)
    written = {t for n in model.graph.node for t in n.output}
    kept = [v for v in model.graph.value_info if v.name in written]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def fold_conv_transpose_affine(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` where the constant per-channel scales and shifts (Mul, Add, Sub, Div) and the inference
    BatchNormalizations that follow a ConvTranspose (each the sole reader of the tensor before it, which is no graph
    output) are folded into its weight (per output channel: axis 1 of the weight, per group) and bias, by the graph
    passes ``FoldConvAffinePass`` and ``FoldBatchNormPass`` on ConvTransposes only, in turn until neither folds
    more; returns the model and the folded nodes' names. Exact in float."""
    import onnx_ir as ir

    from npukit.passes.fold_batch_norm import FoldBatchNormPass
    from npukit.passes.fold_conv_affine import FoldConvAffinePass

    work = ir.serde.deserialize_model(_copy(model))
    folded: list[str] = []
    while True:
        affine, batch_norm = FoldConvAffinePass(producers=("ConvTranspose",)), FoldBatchNormPass(("ConvTranspose",))
        affine(work)
        batch_norm(work)
        if not affine.folded and not batch_norm.folded:
            break
        folded += [name for name, _ in affine.folded] + batch_norm.folded
    if not folded:
        return _copy(model), []
    out = ir.serde.serialize_model(work)
    _drop_unused(out)
    return out, folded


def batchnorm_to_mul_add(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` where every inference BatchNormalization with constant parameters becomes
    Mul(x, scale) then Add(., shift), both per channel (shape (C, 1, ..., 1)): exact in float, and on the HTP two
    elementwise ops with 16-bit constants instead of QNN's BatchNorm, which requantizes the folded scale on one int8
    grid for all channels (a BatchNorm after an Add: 42.6 dB from the float model on the HTP, Mul + Add 76.6 dB;
    after a ConvTranspose 4.7 dB). Returns the model and the rewritten nodes' names (input rank unknown: left)."""
    out = _copy(model)
    graph = out.graph
    inits = GraphIndex(graph).initializers
    candidates = [n for n in graph.node if n.op_type == "BatchNormalization" and len(n.output) == 1
                  and not node_attr(n, "training_mode", 0) and all(t in inits for t in n.input[1:5])]
    if not candidates:
        return out, []
    try:
        inferred = onnx.shape_inference.infer_shapes(out)
    except Exception:  # noqa: BLE001 - shape inference of third-party graphs fails in many ways
        inferred = out
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
             if v.type.tensor_type.HasField("shape")}
    rewritten = []
    for node in candidates:
        rank = ranks.get(node.input[0])
        if not rank or rank < 2:
            continue
        gamma, beta, mean, var = (numpy_helper.to_array(inits[t]).astype(np.float64).reshape(-1)
                                  for t in node.input[1:5])
        scale = gamma / np.sqrt(var + float(node_attr(node, "epsilon", 1e-5)))
        shift = beta - mean * scale
        shape = (scale.size, *([1] * (rank - 2)))
        base = node.name or node.output[0]
        names = (f"{base}_htp_scale", f"{base}_htp_shift", f"{base}_htp_scaled")
        graph.initializer.extend([numpy_helper.from_array(scale.reshape(shape).astype(np.float32), names[0]),
                                  numpy_helper.from_array(shift.reshape(shape).astype(np.float32), names[1])])
        mul = helper.make_node("Mul", [node.input[0], names[0]], [names[2]], name=f"{base}_htp_mul")
        add = helper.make_node("Add", [names[2], names[1]], [node.output[0]], name=f"{base}_htp_add")
        position = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(position, add)
        graph.node.insert(position, mul)
        rewritten.append(base)
    if rewritten:
        _drop_unused(out)
    return out, rewritten


def add_zero_biases(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` where every Conv / ConvTranspose / Gemm with an initializer weight and no bias gets a zero
    bias (exact), so that ORT's quantizer gives it an int32 bias the correction can move; returns it and the count."""
    out = _copy(model)
    inits = GraphIndex(out.graph).initializers
    added = 0
    for node in out.graph.node:
        if node.op_type not in _WEIGHTED or len(node.input) < 2 or node.input[1] not in inits:
            continue
        if len(node.input) > 2 and node.input[2]:
            continue
        dims = list(inits[node.input[1]].dims)
        if node.op_type == "Conv":
            channels = dims[0]
        elif node.op_type == "ConvTranspose":
            channels = dims[1] * int(node_attr(node, "group", 1))
        else:
            if node_attr(node, "transA", 0) or len(dims) != 2:
                continue
            channels = dims[0] if node_attr(node, "transB", 0) else dims[1]
        name = f"{node.name or node.output[0]}_bias_htp_zero"
        out.graph.initializer.append(numpy_helper.from_array(np.zeros(channels, np.float32), name))
        if len(node.input) > 2:
            node.input[2] = name
        else:
            node.input.append(name)
        added += 1
    return out, added


# ----------------------------------------------------------------------------------------------------------------
# Where the QDQ model keeps each float node's weight and bias


def _qdq_counterparts(float_model: onnx.ModelProto, qdq: onnx.ModelProto,
                      ops: Sequence[str]) -> dict[int, onnx.NodeProto]:
    """Index of a float node in its graph -> the node ORT's quantizer made of it in ``qdq``, for the ``ops`` nodes:
    by name (ORT keeps node names), else by output tensor (kept too, except a graph output, which ORT renames).
    Indices, not the node objects: protobuf hands out a new wrapper object on each access."""
    by_name: dict[str, list[onnx.NodeProto]] = {}
    by_output = {}
    for n in qdq.graph.node:
        if n.op_type in ops:
            by_name.setdefault(n.name, []).append(n)
            by_output[n.output[0]] = n
    found = {}
    for index, node in enumerate(float_model.graph.node):
        if node.op_type not in ops:
            continue
        named = by_name.get(node.name, []) if node.name else []
        target = named[0] if len(named) == 1 else by_output.get(node.output[0])
        if target is not None and target.op_type == node.op_type:
            found[index] = target
    return found


def _dequantized_weight(node: onnx.NodeProto, index: GraphIndex) -> np.ndarray | None:
    """The weight ``node`` of a QDQ model (``index``) reads, dequantized as DequantizeLinear does, when it is
    DQ(integer initializer); else None."""
    inits = index.initializers
    dq = index.producer_node(node.input[1]) if len(node.input) > 1 else None
    if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits or dq.input[1] not in inits:
        return None
    arrays = {name: numpy_helper.to_array(inits[name]) for name in dq.input if name in inits}
    if arrays[dq.input[0]].dtype not in (np.int8, np.uint8, np.int16, np.uint16, ml_dtypes.int4):
        return None
    return dequantized(dq, arrays)


def _int32_bias(node: onnx.NodeProto, index: GraphIndex) -> tuple[onnx.TensorProto, np.ndarray] | None:
    """(int32 initializer, per-element scale) of the DQ(int32, zero point 0) bias of a node of the QDQ model
    ``index`` indexes, else None."""
    if len(node.input) < 3 or not node.input[2]:
        return None
    inits = index.initializers
    dq = index.producer_node(node.input[2])
    if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits or dq.input[1] not in inits:
        return None
    q = inits[dq.input[0]]
    if q.data_type != onnx.TensorProto.INT32:
        return None
    if len(dq.input) > 2 and dq.input[2] in inits and numpy_helper.to_array(inits[dq.input[2]]).any():
        return None
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64).reshape(-1)
    size = int(np.prod(q.dims))
    return q, (np.full(size, scale[0]) if scale.size == 1 else scale)


# ----------------------------------------------------------------------------------------------------------------
# Error-compensating rounding (GPTQ)

# integer type -> ORT's symmetric weight range (get_qmin_qmax_for_qType): int8 drops -128, int4 keeps -8
_SYMMETRIC_RANGE = {onnx.TensorProto.INT8: (-127, 127), onnx.TensorProto.INT4: (-8, 7)}


@dataclasses.dataclass(frozen=True)
class _WeightSite:
    """One Conv / Gemm of the QDQ model whose int8 or int4 weight GPTQ may re-round."""

    node: onnx.NodeProto  # the float model's node
    tensor: onnx.TensorProto  # the QDQ model's integer weight initializer (rewritten in place)
    weight: np.ndarray  # float weight, (groups, rows, K)
    scale: np.ndarray  # (groups, rows)
    layout: Callable[[np.ndarray], np.ndarray]  # integers (groups, rows, K) -> the initializer's shape
    qmin: int = -127  # ORT's symmetric range (_SYMMETRIC_RANGE)
    qmax: int = 127


def _weight_sites(float_model: onnx.ModelProto, qdq: onnx.ModelProto) -> list[_WeightSite]:
    f_inits = GraphIndex(float_model.graph).initializers
    q_index = GraphIndex(qdq.graph)
    q_inits = q_index.initializers
    match = _qdq_counterparts(float_model, qdq, ("Conv", "Gemm"))
    sites = []
    for index, node in enumerate(float_model.graph.node):
        target = match.get(index)
        if target is None or len(node.input) < 2 or node.input[1] not in f_inits:
            continue
        dq = q_index.producer_node(target.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in q_inits or dq.input[1] not in q_inits:
            continue
        tensor = q_inits[dq.input[0]]
        if tensor.data_type not in _SYMMETRIC_RANGE:
            continue
        if len(dq.input) > 2 and dq.input[2] in q_inits and numpy_helper.to_array(q_inits[dq.input[2]]).any():
            continue  # symmetric weights only
        w = numpy_helper.to_array(f_inits[node.input[1]]).astype(np.float64)
        if tuple(tensor.dims) != w.shape:
            continue
        scale = numpy_helper.to_array(q_inits[dq.input[1]]).astype(np.float64).reshape(-1)
        axis = int(node_attr(dq, "axis", 1)) % w.ndim if scale.size > 1 else None
        if node.op_type == "Conv":
            if axis not in (None, 0) or w.ndim < 3:
                continue
            groups = int(node_attr(node, "group", 1))
            rows = w.shape[0] // groups
            weight = w.reshape(groups, rows, -1)
            scale = np.broadcast_to(scale, (w.shape[0],)).reshape(groups, rows)

            def layout(q: np.ndarray, shape: tuple[int, ...] = w.shape) -> np.ndarray:
                return q.reshape(shape)
        else:
            if node_attr(node, "transA", 0) or w.ndim != 2:
                continue
            trans_b = bool(node_attr(node, "transB", 0))
            rows_w = w if trans_b else w.T  # (N, K)
            if axis is not None and axis != (0 if trans_b else 1):
                continue
            weight = rows_w[None]
            scale = np.broadcast_to(scale, (rows_w.shape[0],))[None]

            def layout(q: np.ndarray, trans_b: bool = trans_b) -> np.ndarray:
                return q[0] if trans_b else q[0].T
        qmin, qmax = _SYMMETRIC_RANGE[tensor.data_type]
        sites.append(_WeightSite(node=node, tensor=tensor, weight=weight, scale=np.array(scale, np.float64),
                                 layout=layout, qmin=qmin, qmax=qmax))
    return sites


def _input_rows(node: onnx.NodeProto, x: np.ndarray, kernel: tuple[int, ...], groups: int,
                rng: np.random.Generator, limit: int) -> np.ndarray:
    """The node's input as (groups, positions, K) float32 rows (im2col of a 2-D Conv, at most ``limit`` random
    positions; the rows of a Gemm), K in the weight's flattened order. ValueError for what it cannot lay out."""
    if node.op_type == "Gemm":
        return np.asarray(x, np.float32).reshape(x.shape[0], -1)[None]
    if len(kernel) != 2 or node_attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise ValueError("2-D convolutions with explicit pads only")
    return input_rows(x, kernel=kernel, pads=list(node_attr(node, "pads", [0, 0, 0, 0])),
                      strides=list(node_attr(node, "strides", [1, 1])),
                      dilations=list(node_attr(node, "dilations", [1, 1])), groups=groups, rng=rng, limit=limit)


def gptq_weights(
    float_model: onnx.ModelProto,
    qdq: onnx.ModelProto,
    samples: Sequence[dict[str, np.ndarray]],
    *,
    positions: int = POSITIONS,
    seed: int = 0,
) -> tuple[onnx.ModelProto, dict[str, float]]:
    """``qdq`` (built by ORT from ``float_model``) with the int8 (or int4) weights of its Conv and Gemm nodes re-rounded
    by GPTQ on their own scales (the scales, zero points and layout stay as ORT chose them), each node's Hessian
    measured on its float input over ``samples``. A layer is changed only where the re-rounded weight reconstructs its
    output better than nearest rounding on those inputs; layers with fewer than ``gptq.MIN_ROWS_PER_WEIGHT`` input rows
    per weight of an output channel are left alone. Returns the model and, per re-rounded node, the gain in the layer's
    output error (dB) on the calibration inputs."""
    import torch

    from npukit.runtime.ort import make_session

    qdq = _copy(qdq)
    sites = _weight_sites(float_model, qdq)
    if not sites or not samples:
        return qdq, {}
    probe = _copy(float_model)
    del probe.graph.output[:]
    feeds_names = {i.name for i in probe.graph.input}
    wanted: list[str] = []
    for site in sites:
        if site.node.input[0] not in feeds_names and site.node.input[0] not in wanted:
            wanted.append(site.node.input[0])
    for name in wanted:
        probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = make_session(probe, optimization="disable") if wanted else None
    rng = np.random.default_rng(seed)
    hessians: dict[int, np.ndarray] = {}
    counts: dict[int, int] = {}
    with torch_threads(1):
        for sample in samples:
            values = dict(sample)
            if session is not None:
                values.update(zip(wanted, session.run(wanted, {k: v for k, v in sample.items() if k in feeds_names})))
            for index, site in enumerate(sites):
                if counts.get(index) == -1:
                    continue
                groups, k = site.weight.shape[0], site.weight.shape[2]
                kernel = tuple(int(d) for d in site.tensor.dims[2:]) if site.node.op_type == "Conv" else ()
                limit = row_limit(groups, k, positions)
                try:
                    rows = _input_rows(site.node, values[site.node.input[0]], kernel, groups, rng, limit)
                except (ValueError, KeyError):
                    counts[index] = -1
                    continue
                if rows.shape[2] != k:
                    counts[index] = -1
                    continue
                t = torch.from_numpy(np.ascontiguousarray(rows, np.float32))  # sums of at most `limit` products
                product = torch.bmm(t.transpose(1, 2), t).numpy().astype(np.float64)
                hessians[index] = hessians.get(index, 0.0) + product
                counts[index] = counts.get(index, 0) + rows.shape[1]
        gains: dict[str, float] = {}
        for index, site in enumerate(sites):
            n = counts.get(index, 0)
            found = reround(site.weight, hessians[index], n, site.scale, site.qmin, site.qmax) if n > 0 else None
            if found is None:
                continue
            q, gain = found
            dtype = ml_dtypes.int4 if site.tensor.data_type == onnx.TensorProto.INT4 else np.int8
            site.tensor.CopyFrom(numpy_helper.from_array(site.layout(q).astype(dtype), site.tensor.name))
            gains[site.node.name or site.node.output[0]] = gain
    return qdq, gains


# ----------------------------------------------------------------------------------------------------------------
# Bias correction


def correct_weight_rounding_bias(
    float_model: onnx.ModelProto,
    qdq: onnx.ModelProto,
    samples: Sequence[dict[str, np.ndarray]],
) -> tuple[onnx.ModelProto, dict[str, float]]:
    """``qdq`` (built by ORT from ``float_model``) with each Conv / ConvTranspose / Gemm bias corrected for the mean
    output shift its weight rounding causes: per output channel, the mean over ``samples`` (and positions) of
    op(x, DQ(Q(W)) - W), x the node's input in ``float_model``, is subtracted from the bias. A node is corrected when
    the QDQ model reads its weight as DQ(integer initializer) and its bias as DQ(int32 initializer, zero point 0) or
    a float initializer; the weights' integers are left as they are. Returns the corrected model and, per corrected
    node, the largest shift removed in steps of its bias (int32) or in the bias's units (float)."""
    qdq = _copy(qdq)
    q_index = GraphIndex(qdq.graph)
    probe, shifts = _rounding_shift_probe(float_model, qdq, q_index)
    if not shifts:
        return qdq, {}
    means = _mean_outputs(probe, samples)
    return qdq, _subtract_shifts(shifts, means, q_index)


def _rounding_shift_probe(float_model: onnx.ModelProto, qdq: onnx.ModelProto, q_index: GraphIndex
                          ) -> tuple[onnx.ModelProto, list[tuple[onnx.NodeProto, str]]]:
    """``float_model`` with its outputs replaced by one per correctable Conv / ConvTranspose / Gemm (see
    ``_rounding_error``): the per-channel mean of op(x, DQ(Q(W)) - W) over the batch and positions, x the node's float
    input, which is what the weight's rounding adds to its output. Returns the probe and, per node, (its node in
    ``qdq``, the probe's output holding its shift)."""
    match = _qdq_counterparts(float_model, qdq, _WEIGHTED)
    f_inits = GraphIndex(float_model.graph).initializers
    probe = _copy(float_model)
    del probe.graph.output[:]
    new_reduce = next((o.version for o in probe.opset_import if o.domain in ("", "ai.onnx")), 1) >= 18
    shifts: list[tuple[onnx.NodeProto, str]] = []
    for k, node in enumerate(float_model.graph.node):
        target = match.get(k)
        delta = None if target is None else _rounding_error(node, target, f_inits, q_index)
        if delta is not None:
            shifts.append((target, _add_mean_shift_output(probe, node, delta, k, new_reduce)))
    return probe, shifts


def _rounding_error(node: onnx.NodeProto, target: onnx.NodeProto, f_inits: dict[str, onnx.TensorProto],
                    q_index: GraphIndex) -> np.ndarray | None:
    """DQ(Q(W)) - W for the float ``node`` whose counterpart in the QDQ model is ``target``, as float32, where the
    bias can take the correction: the float weight an initializer, the quantized one DQ(integer initializer) of the
    same shape, and the bias DQ(int32, zero point 0) or a float initializer; None otherwise, and for a Gemm with
    transA (left alone)."""
    if len(node.input) < 2 or node.input[1] not in f_inits:
        return None
    if node.op_type == "Gemm" and node_attr(node, "transA", 0):
        return None
    wq = _dequantized_weight(target, q_index)
    w = numpy_helper.to_array(f_inits[node.input[1]]).astype(np.float32)
    if wq is None or wq.shape != w.shape:
        return None
    if _int32_bias(target, q_index) is None and not (
            len(target.input) > 2 and target.input[2] in q_index.initializers):
        return None
    return (wq - w).astype(np.float32)


def _add_mean_shift_output(probe: onnx.ModelProto, node: onnx.NodeProto, delta: np.ndarray, k: int,
                           new_reduce: bool) -> str:
    """Adds to ``probe`` the float ``node`` (k-th of the graph) run on its input with weight ``delta`` and no bias
    (a Gemm's beta dropped), then its mean over every axis but the output channel's (ReduceMean's axes an input from
    opset 18, ``new_reduce``, an attribute before), as a new output; returns that output's name."""
    delta_name, twin_out, mean_out = (f"npukit_htp_bc_{tag}_{k}" for tag in ("delta", "twin", "mean"))
    probe.graph.initializer.append(numpy_helper.from_array(delta, delta_name))
    twin = helper.make_node(node.op_type, [node.input[0], delta_name], [twin_out])
    twin.attribute.extend(a for a in node.attribute if a.name != "beta")
    axes = [0] if node.op_type == "Gemm" else [0, *range(2, delta.ndim)]
    if new_reduce:
        probe.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), f"{mean_out}_axes"))
        reduce = helper.make_node("ReduceMean", [twin_out, f"{mean_out}_axes"], [mean_out], keepdims=0)
    else:
        reduce = helper.make_node("ReduceMean", [twin_out], [mean_out], axes=axes, keepdims=0)
    probe.graph.node.extend([twin, reduce])
    probe.graph.output.append(helper.make_tensor_value_info(mean_out, onnx.TensorProto.FLOAT, None))
    return mean_out


def _mean_outputs(probe: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each output of ``probe`` averaged over ``samples`` (in float64), run by ONNX Runtime with its graph
    optimizations off; each sample is fed only the inputs the probe takes."""
    from npukit.runtime.ort import make_session

    session = make_session(probe, optimization="disable")
    names = [o.name for o in session.get_outputs()]
    feeds_names = {i.name for i in session.get_inputs()}
    sums: dict[str, np.ndarray] = {}
    for sample in samples:
        for name, value in zip(names, session.run(None, {k: v for k, v in sample.items() if k in feeds_names})):
            sums[name] = sums.get(name, 0.0) + np.asarray(value, np.float64)
    return {name: total / len(samples) for name, total in sums.items()}


def _subtract_shifts(shifts: list[tuple[onnx.NodeProto, str]], means: dict[str, np.ndarray], q_index: GraphIndex
                     ) -> dict[str, float]:
    """Subtracts each node's measured output shift (``means`` of its probe output; a Gemm's divided by its beta, which
    scales its bias) from its bias in place, in its int32 steps or in float; a bias that two nodes share is moved
    once, by the first, and one whose size is not the shift's is left. Returns, per corrected node, the largest shift
    removed."""
    corrected: dict[str, float] = {}
    done: set[str] = set()
    for target, mean_out in shifts:
        shift = means[mean_out]
        if target.op_type == "Gemm":
            shift = shift / float(node_attr(target, "beta", 1.0))
        int_bias = _int32_bias(target, q_index)
        tensor = int_bias[0] if int_bias is not None else q_index.initializers[target.input[2]]
        if tensor.name in done:
            continue
        removed = _subtract_from_float_bias(tensor, shift) if int_bias is None \
            else _subtract_from_int32_bias(tensor, int_bias[1], shift)
        if removed is not None:
            done.add(tensor.name)
            corrected[target.name or target.output[0]] = removed
    return corrected


def _subtract_from_int32_bias(tensor: onnx.TensorProto, step: np.ndarray, shift: np.ndarray) -> float | None:
    """Subtracts ``shift`` from the int32 bias ``tensor`` (``step``: its scale per element) in place, rounded to its
    integers and clipped to int32; returns the largest shift in steps, or None where the sizes differ."""
    if step.size != shift.size:
        return None
    q = numpy_helper.to_array(tensor).astype(np.float64)
    new = np.clip(np.rint(q.reshape(-1) - shift / step), -(2**31), 2**31 - 1).astype(np.int32)
    tensor.CopyFrom(numpy_helper.from_array(new.reshape(q.shape), tensor.name))
    return float(np.max(np.abs(shift / step)))


def _subtract_from_float_bias(tensor: onnx.TensorProto, shift: np.ndarray) -> float | None:
    """Subtracts ``shift`` from the float bias ``tensor`` in place; returns the largest shift in the bias's units, or
    None where the sizes differ."""
    bias = numpy_helper.to_array(tensor).astype(np.float64)
    if bias.size != shift.size:
        return None
    tensor.CopyFrom(numpy_helper.from_array((bias - shift.reshape(bias.shape)).astype(np.float32), tensor.name))
    return float(np.max(np.abs(shift)))


# ----------------------------------------------------------------------------------------------------------------
# Headroom on the 16-bit activation grids

_BOUNDED = frozenset({"Sigmoid", "HardSigmoid", "Softmax", "Tanh", "LogSoftmax"})


def _clip_bounds(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> tuple[float, float] | None:
    """(min, max) of a Clip with constant bounds (inputs or, before opset 11, attributes); None when computed."""
    bounds = [float(node_attr(node, "min", -np.inf)), float(node_attr(node, "max", np.inf))]
    for position in (1, 2):
        if len(node.input) > position and node.input[position]:
            if node.input[position] not in inits:
                return None
            bounds[position - 1] = float(numpy_helper.to_array(inits[node.input[position]]).reshape(-1)[0])
    return bounds[0], bounds[1]


def widen_activation_grids(
    float_model: onnx.ModelProto,
    qdq: onnx.ModelProto,
    factor: float,
) -> tuple[onnx.ModelProto, int]:
    """``qdq`` with each 16-bit activation grid that calibration set (ORT names it ``<tensor>_scale``) widened by
    ``factor`` about zero, within what the tensor's producer allows: a Relu's lower end stays 0, a Clip's ends stay
    within its constant bounds (ORT drops a Relu or Clip whose output grid clamps as it would), and the grids of
    Sigmoid, HardSigmoid, Softmax, Tanh and LogSoftmax outputs (bounded by the op; QNN fixes the 16-bit Sigmoid's)
    are left alone, as are grids of tensors the float model does not name. Zero points stay exact integers; each
    int32 bias whose input grid widened keeps the scale input_scale x weight_scale (its integers rescaled). Returns
    the model and the number of grids widened."""
    if factor <= 1.0:
        return qdq, 0
    qdq = _copy(qdq)
    q_index = GraphIndex(qdq.graph)  # the grids and biases change in place: no node or initializer is added
    ratio = _widen_uint16_grids(qdq, q_index.initializers, GraphIndex(float_model.graph), factor)
    _rescale_int32_biases(qdq, q_index, ratio)
    return qdq, len(ratio)


def _widen_uint16_grids(qdq: onnx.ModelProto, inits: dict[str, onnx.TensorProto], f_index: GraphIndex,
                        factor: float) -> dict[str, float]:
    """Widens in place each calibrated 16-bit activation grid of ``qdq`` (``_calibrated_uint16_grid``) as
    ``_widened_grid`` allows, each scale initializer once however many QuantizeLinears share it; returns, per scale
    initializer widened, its new scale over its old, which the int32 biases computed from it must follow."""
    ratio: dict[str, float] = {}  # scale initializer -> new / old
    for node in qdq.graph.node:
        grid = _calibrated_uint16_grid(node, inits)
        if grid is None or grid[0] in ratio:
            continue
        scale_name, zero_name, scale, zero = grid
        s = float(scale.reshape(-1)[0])
        widened = _widened_grid(scale_name[: -len("_scale")], s, float(zero.reshape(-1)[0]), factor, f_index)
        if widened is None:
            continue
        new_s, new_z = widened
        inits[scale_name].CopyFrom(numpy_helper.from_array(np.array(new_s, scale.dtype).reshape(scale.shape),
                                                           scale_name))
        inits[zero_name].CopyFrom(numpy_helper.from_array(np.array(new_z, np.uint16).reshape(zero.shape), zero_name))
        ratio[scale_name] = new_s / s
    return ratio


def _calibrated_uint16_grid(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]
                            ) -> tuple[str, str, np.ndarray, np.ndarray] | None:
    """(scale name, zero point name, scale, zero point) where ``node`` quantizes an activation (no initializer) onto
    one uint16 grid per tensor that calibration set (its scale an initializer named ``<tensor>_scale`` by ORT), else
    None: only those grids stand for a calibrated range that inputs unlike the samples may leave."""
    if node.op_type != "QuantizeLinear" or node.input[0] in inits or len(node.input) < 3:
        return None
    scale_name, zero_name = node.input[1], node.input[2]
    if scale_name not in inits or zero_name not in inits or not scale_name.endswith("_scale"):
        return None
    zero, scale = numpy_helper.to_array(inits[zero_name]), numpy_helper.to_array(inits[scale_name])
    if zero.dtype != np.uint16 or scale.size != 1:
        return None
    return scale_name, zero_name, scale, zero


def _widened_grid(tensor: str, s: float, z: float, factor: float, f_index: GraphIndex) -> tuple[float, int] | None:
    """The scale and zero point of the uint16 grid (``s``, ``z``) of ``tensor`` widened by ``factor`` about zero,
    kept within what its producer in the float model (``f_index``) can write: a Relu's lower end at 0, a Clip's ends
    within its constant bounds. None where the grid stays: ``tensor`` unknown to the float model, written by an op
    bounded by itself (``_BOUNDED``) or by a Clip with computed bounds, or not wider once kept within them."""
    producer = f_index.producer_node(tensor)
    if (producer is None and tensor not in f_index.inputs) or (producer is not None and producer.op_type in _BOUNDED):
        return None
    lo, hi = min(-z * s * factor, 0.0), max((65535.0 - z) * s * factor, 0.0)
    if producer is not None and producer.op_type == "Relu":
        lo = 0.0
    elif producer is not None and producer.op_type == "Clip":
        bounds = _clip_bounds(producer, f_index.initializers)
        if bounds is None:
            return None
        lo, hi = min(max(lo, bounds[0]), 0.0), max(min(hi, bounds[1]), 0.0)
    new_s = (hi - lo) / 65535.0
    if not new_s > s:
        return None
    return new_s, int(np.clip(np.rint(-lo / new_s), 0, 65535))


def _rescale_int32_biases(qdq: onnx.ModelProto, q_index: GraphIndex, ratio: dict[str, float]) -> None:
    """Rescales in place each int32 bias (once, however many nodes read it) of a Conv / ConvTranspose / Gemm whose
    input grid widened by ``ratio``: its scale grows by the same ratio, so it stays input_scale x weight_scale as the
    integer kernels take it, and its integers shrink by it, so its value stays to within rounding."""
    inits = q_index.initializers
    done: set[str] = set()
    for node in qdq.graph.node:
        found = _bias_of_widened_input(node, q_index, inits, ratio)
        if found is None or found[0].input[0] in done:
            continue
        b_dq, grown = found
        done.add(b_dq.input[0])
        q, bias_scale = inits[b_dq.input[0]], inits[b_dq.input[1]]
        ints = numpy_helper.to_array(q).astype(np.float64)
        q.CopyFrom(numpy_helper.from_array(np.clip(np.rint(ints / grown), -(2**31), 2**31 - 1).astype(np.int32),
                                           q.name))
        scaled = numpy_helper.to_array(bias_scale).astype(np.float64) * grown
        bias_scale.CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), b_dq.input[1]))


def _bias_of_widened_input(node: onnx.NodeProto, q_index: GraphIndex, inits: dict[str, onnx.TensorProto],
                           ratio: dict[str, float]) -> tuple[onnx.NodeProto, float] | None:
    """(the DequantizeLinear of its int32 bias, the ratio its input's scale grew by) where ``node`` is a Conv /
    ConvTranspose / Gemm reading DQ(input) and DQ(int32 bias initializer with an initializer scale) and its input's
    grid widened; else None."""
    if node.op_type not in _WEIGHTED or len(node.input) < 3:
        return None
    x_dq, b_dq = q_index.producer_node(node.input[0]), q_index.producer_node(node.input[2])
    if x_dq is None or b_dq is None or x_dq.op_type != "DequantizeLinear" or b_dq.op_type != "DequantizeLinear":
        return None
    grown = ratio.get(x_dq.input[1])
    if grown is None or b_dq.input[0] not in inits or b_dq.input[1] not in inits:
        return None
    if inits[b_dq.input[0]].data_type != onnx.TensorProto.INT32:
        return None
    return b_dq, grown
