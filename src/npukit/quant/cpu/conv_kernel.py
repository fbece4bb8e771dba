"""Which of ONNX Runtime's two int8 convolution kernels each QLinearConv runs on, chosen by timing on this CPU.

ORT's QLinearConv takes MLAS's symmetric-conv kernel (``ConvSym``: VNNI dot products, requantization fused) when the
weights are int8 with every zero point 0, and its general int8 GEMM otherwise (im2col or the input in place, an
int32 product, a separate requantization pass). On an x86 CPU with AMX, MLAS's U8S8 GEMM runs on AMX tiles, which
pays where the reduction is long: measured on an Intel Xeon with AVX-512 VNNI and AMX (ORT 1.32, 1 thread, single
NHWC QLinearConv nodes of MobileNetV2's shapes, 300 interleaved runs, medians), 1x1 convs 576 -> 160 channels at 7 x 7
run in 0.69x the ConvSym time, 960 -> 320 in 0.65x, 384 -> 96 at 14 x 14 in 0.76x, while short reductions lose:
24 -> 144 at 56 x 56 takes 2.25x, 96 -> 576 1.3x, and depthwise 3x3 convs 1.6-2.1x (MLAS's generic depthwise path).
On the demo recipe's MobileNetV2 the timing moves twelve 1x1 convs (the projections from 192 channels up and the
320 -> 1280 one): 0.946x the time of the model as built (side measurement: 400 runs in 40 rounds of rotating order,
median of the per-round ratios), with the same outputs to the bit.

Nothing numerical changes: a weight tensor whose integers leave room (not both -128 and 127 present) moves by one,
``q + s`` with zero point ``s`` (s = -1 when no integer is -128, else +1), which dequantizes to exactly the same
values, and both kernels accumulate in 32 bits (with VNNI or AMX; ``schemes.cpu_int8_scheme`` turns this on only
there, and ``require_exact_move`` refuses it wherever ``runtime.int8_paths`` measures either kernel inexact with
full-range weights: on x86 without VNNI both saturate, each differently). Which convs move is timed, not modelled: each candidate as a single NHWC QLinearConv (ORT's own form after
its layout transform) at its shape, both ways, interleaved; the ones at least ``MARGIN`` faster on the GEMM move, and
the whole model is then timed both ways and the move kept only if that is faster too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.measure.latency import paired_ratio, time_sessions_interleaved
from npukit.quant.cpu.schemes import is_depthwise
from npukit.runtime.int8_paths import Int8Path, full_range_exact, probe_int8_paths
from npukit.runtime.ort import make_session

MARGIN = 0.05  # a node moves when the GEMM takes at most 95% of ConvSym's time alone
NODE_TIMING = {"threads": 1, "warmup": 5, "runs": 120, "rounds": 12}
MODEL_TIMING = {"threads": 1, "warmup": 5, "runs": 160, "rounds": 16}


@dataclasses.dataclass(frozen=True)
class _Candidate:
    node: str
    weight: str  # the int8 initializer
    zero_point: str  # its zero point initializer (all zeros)
    shift: int  # -1 or +1
    conv: onnx.ModelProto  # the node alone as ORT runs it (NHWC QLinearConv), ConvSym form
    input_shape: tuple[int, ...]  # NHWC


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """``model``: the QDQ model with ``moved`` on the GEMM path (the input model when none pays). ``node_ratios``:
    each candidate's GEMM / ConvSym time alone; ``model_ratio``: the whole model's, moved / as built (None when no
    node was worth timing the model for)."""

    model: onnx.ModelProto
    moved: tuple[str, ...]
    node_ratios: dict[str, float]
    model_ratio: float | None

    def summary(self) -> dict:
        return {"moved_to_gemm": list(self.moved), "margin": MARGIN,
                "gemm_over_convsym_alone": {k: round(v, 4) for k, v in self.node_ratios.items()},
                "model_ratio": None if self.model_ratio is None else round(self.model_ratio, 4)}


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Inferred static shapes; a symbolic batch (first) dimension is timed as 1, other symbolic dimensions leave
    the tensor out (its conv is not timed, so it stays where it is)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims[1:]):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
    return shapes


def _shift(q: np.ndarray) -> int | None:
    """-1 or +1 if every integer of ``q`` stays in int8 shifted by it, else None."""
    if q.min() > -128:
        return -1
    if q.max() < 127:
        return 1
    return None


def _eight_bit(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """Whether a QuantizeLinear / DequantizeLinear ``node`` has an 8-bit zero point initializer."""
    zp = inits.get(node.input[2]) if len(node.input) > 2 else None
    return zp is not None and zp.data_type in (onnx.TensorProto.UINT8, onnx.TensorProto.INT8)


def candidates(model: onnx.ModelProto) -> list[_Candidate]:
    """The Convs that ORT fuses into a ConvSym QLinearConv (input from an 8-bit DequantizeLinear, output to one 8-bit
    QuantizeLinear, int8 weight initializer with zero points 0, not depthwise, 2-D) whose weights can shift."""
    index = GraphIndex(model.graph)
    inits = index.initializers
    shapes = _shapes(model)
    found = []
    for node in index.nodes:
        if node.op_type != "Conv" or len(node.input) < 2:
            continue
        x_dq, w_dq = index.producer_node(node.input[0]), index.producer_node(node.input[1])
        users = index.consumer_nodes(node.output[0])
        if x_dq is None or x_dq.op_type != "DequantizeLinear" or w_dq is None or w_dq.op_type != "DequantizeLinear":
            continue
        if len(users) != 1 or users[0].op_type != "QuantizeLinear" or len(w_dq.input) < 3:
            continue
        if not all(_eight_bit(n, inits) for n in (x_dq, users[0])):
            continue  # a 16-bit activation: ORT runs no QLinearConv there
        weight, zp = inits.get(w_dq.input[0]), inits.get(w_dq.input[2])
        if weight is None or zp is None or weight.data_type != onnx.TensorProto.INT8 or len(weight.dims) != 4:
            continue
        if any(len(index.consumer_nodes(name)) != 1 for name in (weight.name, zp.name)):
            continue  # shared: moving it would move another node too
        q = numpy_helper.to_array(weight)
        if np.any(numpy_helper.to_array(zp) != 0) or is_depthwise(node, q.shape):
            continue  # not ConvSym already, or depthwise (slower on MLAS's generic depthwise path: measured)
        shift = _shift(q)
        shape = shapes.get(node.input[0])
        if shift is None or shape is None or len(shape) != 4:
            continue
        nhwc = (shape[0], shape[2], shape[3], shape[1])
        found.append(_Candidate(node.name, weight.name, zp.name, shift,
                                _single_conv(node, x_dq, w_dq, users[0], index), nhwc))
    return found


def _single_conv(node: onnx.NodeProto, x_dq: onnx.NodeProto, w_dq: onnx.NodeProto, y_q: onnx.NodeProto,
                 index: GraphIndex) -> onnx.ModelProto:
    """``node`` alone as ORT runs it after its QDQ fusion and NHWC transform: com.microsoft QLinearConv with
    channels_last, the real weights, scales and zero points (constant inputs, so ORT prepacks the weights)."""
    inits = index.initializers

    def const(name: str, new: str) -> onnx.TensorProto:
        if name in inits:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(inits[name])
            tensor.name = new
            return tensor
        constant = index.producer_node(name)  # a Constant node
        return numpy_helper.from_array(numpy_helper.to_array(constant.attribute[0].t), new)

    tensors = [const(x_dq.input[1], "xs"), const(x_dq.input[2], "xz"), const(w_dq.input[0], "w"),
               const(w_dq.input[1], "ws"), const(w_dq.input[2], "wz"), const(y_q.input[1], "ys"),
               const(y_q.input[2], "yz")]
    inputs = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if len(node.input) > 2 and node.input[2]:
        b_dq = index.producer_node(node.input[2])
        if b_dq is not None and b_dq.op_type == "DequantizeLinear" and b_dq.input[0] in inits:
            tensors.append(const(b_dq.input[0], "b"))
            inputs.append("b")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs["channels_last"] = 1
    conv = helper.make_node("QLinearConv", inputs, ["y"], domain="com.microsoft", **attrs)
    x_type = tensors[1].data_type  # the activation zero point's type
    graph = helper.make_graph([conv], "conv", [helper.make_tensor_value_info("x", x_type, None)],
                              [helper.make_tensor_value_info("y", x_type, None)], tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft",
                                                                                                     1)])


def _moved_weights(model: onnx.ModelProto, shifts: list[tuple[str, str, int]]) -> onnx.ModelProto:
    """A copy of ``model`` with each (weight, zero point, shift)'s integers and zero point moved by the shift (the
    same dequantized values)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = GraphIndex(out.graph).initializers
    for weight, zero_point, shift in shifts:
        for name in (weight, zero_point):
            moved = numpy_helper.to_array(inits[name]).astype(np.int16) + shift
            inits[name].CopyFrom(numpy_helper.from_array(moved.astype(np.int8), name))
    return out


def move_to_gemm(model: onnx.ModelProto, chosen: list[_Candidate]) -> onnx.ModelProto:
    """``model`` with each of ``chosen``'s weights shifted off ConvSym (onto ORT's general int8 GEMM path)."""
    return _moved_weights(model, [(c.weight, c.zero_point, c.shift) for c in chosen])


def _time_node(c: _Candidate) -> float:
    """GEMM / ConvSym time of ``c`` alone (paired ratio of interleaved runs)."""
    gemm = _moved_weights(c.conv, [("w", "wz", c.shift)])
    zp = numpy_helper.to_array(next(i for i in c.conv.graph.initializer if i.name == "xz"))
    rng = np.random.default_rng(0)
    info = np.iinfo(zp.dtype)
    feeds = {"x": rng.integers(info.min, info.max, c.input_shape, endpoint=True).astype(zp.dtype)}
    sessions = {"sym": make_session(c.conv), "gemm": make_session(gemm)}
    times = time_sessions_interleaved(sessions, feeds=feeds, **NODE_TIMING)
    return paired_ratio(times["sym"], times["gemm"], rounds=NODE_TIMING["rounds"])


def require_exact_move(paths: tuple[Int8Path, ...] | None = None) -> None:
    """Raise InputError unless both of ORT's int8 conv kernels compute full-range int8 weights exactly on this CPU
    (``paths``: the measured ``runtime.int8_paths``, probed here when None): only then is the move exact. Without
    32-bit accumulation (x86 without VNNI) both saturate, each differently, so a moved conv changes its outputs."""
    paths = probe_int8_paths() if paths is None else paths
    if full_range_exact(paths):
        return
    worst = max(p.steps_off for p in paths if p.name == "1x1 conv" and p.weights == "full 8-bit")
    raise InputError("gemm_convs moves int8 convs between ONNX Runtime's two int8 conv kernels, which is exact only "
                     "where both accumulate u8 x s8 products in 32 bits; on this CPU they saturate (measured: "
                     f"1x1 convs with full-range weights off by up to {worst} output steps)",
                     hint="leave --gemm-convs at auto (off on this CPU) or off; `npukit devices` lists the int8 "
                          "paths that are exact here")


def choose_conv_kernels(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> KernelChoice:
    """Move the Convs of the QDQ ``model`` that ORT runs faster on its general int8 GEMM there (module docstring),
    timing the whole model on ``feeds`` to confirm. Refused (InputError) on a CPU where the move is not exact
    (``require_exact_move``)."""
    require_exact_move()
    found = candidates(model)
    ratios = {c.node: _time_node(c) for c in found}
    chosen = [c for c in found if ratios[c.node] <= 1.0 - MARGIN]
    if not chosen:
        return KernelChoice(model=model, moved=(), node_ratios=ratios, model_ratio=None)
    moved = move_to_gemm(model, chosen)
    sessions = {"built": make_session(model), "moved": make_session(moved)}
    times = time_sessions_interleaved(sessions, feeds=feeds, **MODEL_TIMING)
    whole = paired_ratio(times["built"], times["moved"], rounds=MODEL_TIMING["rounds"])
    if whole >= 1.0:
        return KernelChoice(model=model, moved=(), node_ratios=ratios, model_ratio=whole)
    return KernelChoice(model=moved, moved=tuple(c.node for c in chosen), node_ratios=ratios, model_ratio=whole)
