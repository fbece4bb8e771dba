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
from collections.abc import Mapping
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
    graph = qdq.graph
    lookup = GraphIndex(graph)
    inits = lookup.initializers
    arrays = {name: numpy_helper.to_array(t) for name, t in inits.items()}
    quant: dict[str, torch.nn.Module] = {}
    slots: dict[str, Slot] = {}
    replaced: dict[int, onnx.NodeProto | None] = {}  # id(node) -> its replacement (None: dropped)
    new_inits: dict[str, onnx.TensorProto] = {}
    activation_keys: dict[str, str] = {}  # DQ output -> its quantizer key
    biases: list[tuple[onnx.NodeProto, str]] = []
    config = _RuleConfig(reduce_range)

    def fq_node(kind: str, key: str, source: str, output: str) -> onnx.NodeProto:
        return helper.make_node("FakeQuant", [source], [output], name=f"fq_{key}", domain=DOMAIN, kind=kind, key=key)

    for index, dq in enumerate(n for n in lookup.nodes if n.op_type == "DequantizeLinear"):
        if node_attr(dq, "block_size", 0):
            raise InputError("block-quantized weights are not trained yet", hint="quantize per channel")
        key = f"q{index}"
        zero = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
        axis = int(node_attr(dq, "axis", 1))
        source = dq.input[0]
        if source in inits:
            if inits[source].data_type == onnx.TensorProto.INT32:
                biases.append((dq, key))
                continue
            float_name = f"{source}__float"
            value = dequantized(dq, arrays)
            new_inits[float_name] = numpy_helper.from_array(value, float_name)
            reader = next(iter(lookup.consumer_nodes(dq.output[0])), None)
            scale = arrays[dq.input[1]]
            zp = arrays[zero] if zero else np.zeros_like(scale, dtype=np.int64)
            per_axis = axis % value.ndim if scale.size > 1 else None
            qmin, qmax = _qrange(arrays, inits, zero, source)
            quant[key] = config.weight_quant(reader, arrays[source], value, scale, zp, per_axis, qmin, qmax,
                                             learn_scales)
            slots[key] = Slot("weight", float_name, source, (dq.input[1],), (zero,) if zero else ())
            replaced[id(dq)] = fq_node("weight", key, float_name, dq.output[0])
            continue
        q = lookup.producer_node(source)
        if q is None or q.op_type != "QuantizeLinear":
            raise InputError(f"DequantizeLinear {dq.name} reads {source}, which no QuantizeLinear writes",
                             hint="train a model written by npukit quantize")
        scale = arrays[q.input[1]]
        zp = arrays[q.input[2]] if len(q.input) > 2 and q.input[2] else np.zeros_like(scale, dtype=np.int64)
        qmin, qmax = _qrange(arrays, inits, q.input[2] if len(q.input) > 2 else None, None)
        per_axis = axis if scale.size > 1 else None
        quant[key] = ActivationQuant(scale, zp, qmin, qmax, axis=per_axis, learn_scale=learn_scales)
        if q.input[0] in inits:  # a float weight quantized in the graph (Q and DQ both there)
            raise InputError("the model quantizes a float weight at run time; train a model with integer weights",
                             hint="npukit quantize writes integer weights")
        slots[key] = Slot("activation", q.input[0], None, (q.input[1], dq.input[1]),
                          tuple(n for n in (q.input[2] if len(q.input) > 2 else "", zero) if n))
        replaced[id(dq)] = fq_node("activation", key, q.input[0], dq.output[0])
        activation_keys[dq.output[0]] = key
        replaced[id(q)] = None

    weight_of = {slots[k].tensor: k for k in slots if slots[k].kind == "weight"}
    dq_out = {n.output[0]: n for n in graph.node if n.op_type == "DequantizeLinear"}
    for dq, key in biases:
        reader = next(iter(lookup.consumer_nodes(dq.output[0])), None)
        if reader is None or len(reader.input) < 3:
            raise InputError(f"int32 tensor {dq.input[0]} is not a Conv/Gemm bias", hint="train a model npukit wrote")
        x_key = activation_keys.get(reader.input[0])
        w_dq = dq_out.get(reader.input[1])
        w_key = weight_of.get(f"{w_dq.input[0]}__float") if w_dq is not None else None
        if x_key is None or w_key is None:
            raise InputError(f"bias {dq.input[0]} of {reader.name} has no quantized input or weight to take its grid "
                             "from", hint="train a model npukit quantize wrote")
        float_name = f"{dq.input[0]}__float"
        new_inits[float_name] = numpy_helper.from_array(dequantized(dq, arrays), float_name)
        quant[key] = BiasQuant(x_key, w_key, slots[w_key].tensor)
        slots[key] = Slot("bias", float_name, dq.input[0], (dq.input[1],),
                          (dq.input[2],) if len(dq.input) > 2 and dq.input[2] else ())
        replaced[id(dq)] = fq_node("bias", key, float_name, dq.output[0])

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
    return Twin(model, quant, slots)


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
    inits = {i.name: i for i in model.graph.initializer}
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
