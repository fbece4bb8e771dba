"""A QDQ model's training twin and back: ``split`` replaces every Q -> DQ pair on an activation and every DQ of an
integer weight or bias by one ``FakeQuant`` node (domain ``npukit.qat``) on the same grid, the integers by float
initializers (their dequantized values), and keeps the rest of the graph as it is; ``write_back`` puts the trained
float weights, rounded on the quantizers' grids, and the grids themselves back into the QDQ model, so the exported
model computes what training simulated (tested: ONNX Runtime's integer outputs within one step of the torch
simulation).

Which rule a weight's grid follows is read from the model and the scheme that built it: zero points other than 0
keep the model's grid fixed; under ``reduce_range`` a 1x1 conv or Gemm takes the pair-bounded rule
(``npukit.quant.cpu.schemes``); otherwise the scale is the channel's largest |w| over the largest integer the model
stores (127, or 64 for 7-bit weights).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.quant.config import CpuKernels, QuantConfig
from npukit.quant.cpu.schemes import pair_bounded
from npukit.quant.nodes import dequantized, node_attr
from npukit.quant.qat.fake_quant import ActivationQuant, BiasQuant, WeightQuant
from npukit.quant.qat.program import DOMAIN, OnnxProgram

INT_TYPES = {onnx.TensorProto.INT8: (-128, 127), onnx.TensorProto.UINT8: (0, 255), onnx.TensorProto.INT16:
             (-32768, 32767), onnx.TensorProto.UINT16: (0, 65535), onnx.TensorProto.INT4: (-8, 7),
             onnx.TensorProto.UINT4: (0, 15), onnx.TensorProto.INT32: (-2 ** 31, 2 ** 31 - 1)}


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where a quantizer's grid lives in the QDQ model: its kind (activation, weight, bias), the initializers of its
    integers (weights, biases), scale and zero point, and the twin's float tensor."""

    kind: str
    tensor: str
    integers: str | None
    scales: tuple[str, ...]
    zero_points: tuple[str, ...]


@dataclasses.dataclass
class Twin:
    """The training graph (float + FakeQuant nodes), its quantizers by key, and where each grid goes back."""

    model: onnx.ModelProto
    quant: dict[str, torch.nn.Module]
    slots: dict[str, Slot]

    def program(self) -> OnnxProgram:
        return OnnxProgram(self.model, self.quant)

    def weights(self) -> dict[str, WeightQuant]:
        return {k: m for k, m in self.quant.items() if isinstance(m, WeightQuant)}


def _qrange(arrays: Mapping[str, np.ndarray], inits: Mapping[str, onnx.TensorProto], zero: str | None,
            integers: str | None) -> tuple[int, int]:
    name = zero if zero and zero in inits else integers
    if name is None or name not in inits:
        return (0, 255)
    return INT_TYPES[inits[name].data_type]


def split(qdq: onnx.ModelProto, *, reduce_range: bool, learn_scales: bool = False) -> Twin:
    """The training twin of ``qdq`` (see the module docstring)."""
    lookup = GraphIndex(qdq.graph)
    arrays = {name: numpy_helper.to_array(t) for name, t in lookup.initializers.items()}
    found, biases = _weight_and_activation_quantizers(lookup, arrays, _RuleConfig(reduce_range), learn_scales)
    found += _bias_quantizers(biases, lookup, arrays, found)
    return Twin(_twin_model(qdq, found), {q.key: q.module for q in found}, {q.key: q.slot for q in found})


@dataclasses.dataclass(frozen=True)
class _Quantizer:
    """One quantizer of the twin as ``split`` finds it: its key, its module and slot, the FakeQuant node that takes
    the place of the DequantizeLinear ``replaces`` (and of the QuantizeLinear ``drops`` before an activation's), and
    the float initializer the FakeQuant reads (a weight's or bias's dequantized values; None for an activation)."""

    key: str
    module: torch.nn.Module
    slot: Slot
    node: onnx.NodeProto
    replaces: onnx.NodeProto
    drops: onnx.NodeProto | None = None
    initializer: onnx.TensorProto | None = None


def _dequantizers(lookup: GraphIndex) -> Iterator[tuple[str, onnx.NodeProto]]:
    """Each DequantizeLinear of the QDQ model, in graph order, with its quantizer's key (``q<n>``, n its rank among
    them); a block-quantized one is refused when reached, since ``WeightQuant`` has no per-block grid."""
    for index, dq in enumerate(n for n in lookup.nodes if n.op_type == "DequantizeLinear"):
        if node_attr(dq, "block_size", 0):
            raise InputError("block-quantized weights are not trained yet", hint="quantize per channel")
        yield f"q{index}", dq


def _weight_and_activation_quantizers(lookup: GraphIndex, arrays: Mapping[str, np.ndarray], rule: _RuleConfig,
                                      learn_scales: bool) -> tuple[list[_Quantizer], list[tuple[str, onnx.NodeProto]]]:
    """The quantizer of each DequantizeLinear of an integer weight or of an activation, in graph order, and the
    DequantizeLinears of int32 biases with their keys, left for ``_bias_quantizers``: a bias's grid is its input's
    and weight's, which must all be known first."""
    found: list[_Quantizer] = []
    biases: list[tuple[str, onnx.NodeProto]] = []
    for key, dq in _dequantizers(lookup):
        source = lookup.initializers.get(dq.input[0])
        if source is not None and source.data_type == onnx.TensorProto.INT32:
            biases.append((key, dq))
        elif source is not None:
            found.append(_weight_quantizer(key, dq, lookup, arrays, rule, learn_scales))
        else:
            found.append(_activation_quantizer(key, dq, lookup, arrays, learn_scales))
    return found, biases


def _fake_quant_node(kind: str, key: str, source: str, output: str) -> onnx.NodeProto:
    """The FakeQuant node (domain ``npukit.qat``) that computes ``output`` from the float ``source`` on quantizer
    ``key``'s grid, in the place of the DequantizeLinear that wrote ``output``."""
    return helper.make_node("FakeQuant", [source], [output], name=f"fq_{key}", domain=DOMAIN, kind=kind, key=key)


def _zero_point(node: onnx.NodeProto) -> str | None:
    """The zero point a QuantizeLinear or DequantizeLinear names (None where it names none: zero)."""
    return node.input[2] if len(node.input) > 2 and node.input[2] else None


def _weight_quantizer(key: str, dq: onnx.NodeProto, lookup: GraphIndex, arrays: Mapping[str, np.ndarray],
                      rule: _RuleConfig, learn_scales: bool) -> _Quantizer:
    """The quantizer of an integer weight that ``dq`` dequantizes: the weight becomes a float initializer of its
    dequantized values (``<integers>__float``), and its grid the rule (``_RuleConfig``) that reproduces it from the
    values, so that training the float weight keeps it on a grid the model's scheme would have chosen."""
    source, zero = dq.input[0], _zero_point(dq)
    float_name = f"{source}__float"
    value = dequantized(dq, arrays)
    initializer = numpy_helper.from_array(value, float_name)
    reader = next(iter(lookup.consumer_nodes(dq.output[0])), None)
    scale = arrays[dq.input[1]]
    zp = arrays[zero] if zero else np.zeros_like(scale, dtype=np.int64)
    per_axis = int(node_attr(dq, "axis", 1)) % value.ndim if scale.size > 1 else None
    qmin, qmax = _qrange(arrays, lookup.initializers, zero, source)
    module = rule.weight_quant(reader, arrays[source], value, scale, zp, per_axis, qmin, qmax, learn_scales)
    slot = Slot("weight", float_name, source, (dq.input[1],), (zero,) if zero else ())
    return _Quantizer(key, module, slot, _fake_quant_node("weight", key, float_name, dq.output[0]), dq,
                      initializer=initializer)


def _activation_quantizer(key: str, dq: onnx.NodeProto, lookup: GraphIndex, arrays: Mapping[str, np.ndarray],
                          learn_scales: bool) -> _Quantizer:
    """The quantizer of an activation's QuantizeLinear -> ``dq`` pair, on the QuantizeLinear's grid: both nodes give
    way to one FakeQuant reading the float tensor the QuantizeLinear read. A DequantizeLinear no QuantizeLinear feeds,
    or a float weight quantized at run time, is refused: npukit's quantizer writes neither."""
    source, zero = dq.input[0], _zero_point(dq)
    q = lookup.producer_node(source)
    if q is None or q.op_type != "QuantizeLinear":
        raise InputError(f"DequantizeLinear {dq.name} reads {source}, which no QuantizeLinear writes",
                         hint="train a model written by npukit quantize")
    q_zero = _zero_point(q)
    scale = arrays[q.input[1]]
    zp = arrays[q_zero] if q_zero else np.zeros_like(scale, dtype=np.int64)
    qmin, qmax = _qrange(arrays, lookup.initializers, q_zero, None)
    per_axis = int(node_attr(dq, "axis", 1)) if scale.size > 1 else None
    module = ActivationQuant(scale, zp, qmin, qmax, axis=per_axis, learn_scale=learn_scales)
    if q.input[0] in lookup.initializers:  # a float weight quantized in the graph (Q and DQ both there)
        raise InputError("the model quantizes a float weight at run time; train a model with integer weights",
                         hint="npukit quantize writes integer weights")
    slot = Slot("activation", q.input[0], None, (q.input[1], dq.input[1]), tuple(n for n in (q_zero, zero) if n))
    return _Quantizer(key, module, slot, _fake_quant_node("activation", key, q.input[0], dq.output[0]), dq, drops=q)


def _bias_quantizers(biases: list[tuple[str, onnx.NodeProto]], lookup: GraphIndex,
                     arrays: Mapping[str, np.ndarray], found: list[_Quantizer]) -> list[_Quantizer]:
    """The quantizers of the int32 biases (``biases``: key and DequantizeLinear), each on the grid of its Conv's or
    Gemm's input and weight quantizers among ``found`` (scale input_scale * weight_scale, as the integer kernels
    need): the bias becomes a float initializer of its dequantized values. A bias whose node has no quantized input
    or weight to take the grid from is refused."""
    weight_of = {q.slot.tensor: q.key for q in found if q.slot.kind == "weight"}
    activation_of = {q.node.output[0]: q.key for q in found if q.slot.kind == "activation"}  # DQ output -> key
    quantizers = []
    for key, dq in biases:
        reader = next(iter(lookup.consumer_nodes(dq.output[0])), None)
        if reader is None or len(reader.input) < 3:
            raise InputError(f"int32 tensor {dq.input[0]} is not a Conv/Gemm bias", hint="train a model npukit wrote")
        w_dq = lookup.producer_node(reader.input[1])
        w_name = f"{w_dq.input[0]}__float" if w_dq is not None and w_dq.op_type == "DequantizeLinear" else None
        x_key, w_key = activation_of.get(reader.input[0]), weight_of.get(w_name)
        if x_key is None or w_key is None:
            raise InputError(f"bias {dq.input[0]} of {reader.name} has no quantized input or weight to take its grid "
                             "from", hint="train a model npukit quantize wrote")
        float_name = f"{dq.input[0]}__float"
        initializer = numpy_helper.from_array(dequantized(dq, arrays), float_name)
        slot = Slot("bias", float_name, dq.input[0], (dq.input[1],), (dq.input[2],) if _zero_point(dq) else ())
        quantizers.append(_Quantizer(key, BiasQuant(x_key, w_key, w_name), slot,
                                     _fake_quant_node("bias", key, float_name, dq.output[0]), dq,
                                     initializer=initializer))
    return quantizers


def _twin_model(qdq: onnx.ModelProto, quantizers: list[_Quantizer]) -> onnx.ModelProto:
    """A copy of ``qdq`` with each quantizer's FakeQuant node in the place of its DequantizeLinear (an activation's
    QuantizeLinear dropped), the initializers no node reads any more (the integers, scales and zero points) left out
    and the float ones the FakeQuant nodes read added, and the ``npukit.qat`` domain imported."""
    replaced: dict[int, onnx.NodeProto | None] = {}  # id(node) -> its replacement (None: dropped)
    for quantizer in quantizers:
        replaced[id(quantizer.replaces)] = quantizer.node
        if quantizer.drops is not None:
            replaced[id(quantizer.drops)] = None
    new_inits = {q.initializer.name: q.initializer for q in quantizers if q.initializer is not None}
    graph = qdq.graph
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    del model.graph.node[:]
    for node in graph.node:
        new = replaced.get(id(node), node)
        if new is not None:
            model.graph.node.append(new)
    used = {name for n in model.graph.node for name in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept + list(new_inits.values()))
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return model


@dataclasses.dataclass(frozen=True)
class _RuleConfig:
    reduce_range: bool

    def weight_quant(self, reader: onnx.NodeProto | None, integers: np.ndarray, value: np.ndarray, scale: np.ndarray,
                     zp: np.ndarray, axis: int | None, qmin: int, qmax: int, learn: bool) -> WeightQuant:
        """The rule that reproduces this weight's grid from its values (the module docstring)."""
        fixed = WeightQuant("fixed", levels=qmax, axis=axis, scale=scale, zero_point=zp, qmin=qmin, qmax=qmax,
                            learn_scale=learn)
        if np.any(zp != 0) or reader is None:
            return fixed
        transpose = reader.op_type == "Gemm" and not node_attr(reader, "transB", 0)
        if self.reduce_range and pair_bounded(reader, integers.shape, _PAIR_BOUNDED):
            return WeightQuant("pair", levels=127, axis=axis, scale=scale, zero_point=zp, qmin=-127, qmax=127,
                               transpose_rows=transpose, learn_scale=learn)
        top = np.abs(integers.astype(np.int64))
        levels = int(top.max()) if top.size else 0
        if levels <= 0:
            return fixed
        return WeightQuant("absmax", levels=levels, axis=axis, scale=scale, zero_point=zp, qmin=-levels,
                           qmax=levels, learn_scale=learn)


_PAIR_BOUNDED = QuantConfig(cpu=CpuKernels(reduce_range=True))  # symmetric weights on 7 bits: schemes.pair_bounded


def write_back(qdq: onnx.ModelProto, twin: Twin, program: OnnxProgram, *, int4_storage: bool = True
               ) -> onnx.ModelProto:
    """``qdq`` with the trained weights (rounded on their grids), biases and grids of ``program`` (built from
    ``twin``). Weights lowered to 4 bits are stored as int4 where ``int4_storage`` (the model needs opset 21),
    else as int8 integers in [-7, 7]; float initializers trained outside any grid (a layer kept in float) are
    written as they are."""
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    inits = GraphIndex(model.graph).initializers  # rewritten in place below: no node or initializer is added
    trained = program.trained_initializers()
    env = {name: program.initializer(name).detach() for name in program.keys}
    for key, slot in twin.slots.items():
        module = program.quant[key]
        if slot.kind == "activation":
            scale, _ = module.exported()
            for name in slot.scales:  # a kept float conv's own DequantizeLinear repeats the scale per channel
                shape = numpy_helper.to_array(inits[name]).shape  # (``quant.emit.ort_float``): broadcast to it
                _put(inits, name, np.broadcast_to(scale.reshape(()) if scale.size == 1 else scale.reshape(shape),
                                                  shape))
        elif slot.kind == "weight":
            q, scale, zp = module.exported(env[slot.tensor])
            dtype = inits[slot.integers].data_type
            if module.qmax <= 7 and int4_storage:
                dtype = onnx.TensorProto.INT4
            _put(inits, slot.integers, q, dtype=dtype)
            _put(inits, slot.scales[0], scale.reshape(numpy_helper.to_array(inits[slot.scales[0]]).shape))
            for name in slot.zero_points:
                _put(inits, name, zp.reshape(numpy_helper.to_array(inits[name]).shape).astype(np.int64), dtype=dtype)
        else:
            weight_quant = program.quant[module.weight_key]
            grid = BiasQuant.grid(program.quant[module.input_key].scale(), weight_quant.scale(env[module.weight]))
            q, scale = BiasQuant.exported(env[slot.tensor], grid)
            _put(inits, slot.integers, q, dtype=onnx.TensorProto.INT32)
            _put(inits, slot.scales[0], scale.reshape(numpy_helper.to_array(inits[slot.scales[0]]).shape))
    quantized_tensors = {slot.tensor for slot in twin.slots.values()}
    for name, value in trained.items():
        if name not in quantized_tensors and name in inits:
            _put(inits, name, value.detach().numpy().astype(np.float32))
    return model


def _put(inits: Mapping[str, onnx.TensorProto], name: str, value: Any, *, dtype: int | None = None) -> None:
    old = inits[name]
    dtype = old.data_type if dtype is None else dtype
    array = np.asarray(value)
    if dtype in INT_TYPES:
        lo, hi = INT_TYPES[dtype]
        array = np.clip(np.round(array), lo, hi).astype(np.int64)
    if dtype in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):  # packed two per byte in raw_data (int32_data
        import ml_dtypes  # would take up to twice that)

        four_bit = ml_dtypes.int4 if dtype == onnx.TensorProto.INT4 else ml_dtypes.uint4
        new = numpy_helper.from_array(array.astype(four_bit), name)
    else:
        np_type = helper.tensor_dtype_to_np_dtype(dtype)
        new = numpy_helper.from_array(array.astype(np_type), name)
    old.CopyFrom(new)
