"""An ONNX graph as a torch module: the nodes run in graph order on torch tensors (``npukit.quant.qat.ops``), float
initializers that hold weights become parameters, and ``FakeQuant`` nodes (domain ``npukit.qat``, written by
``npukit.quant.qat.twin``) run the quantizer their ``key`` names. Without FakeQuant nodes it is the float model,
differentiable: the teacher of distillation and the check that the graph was read right (tests compare it with
ONNX Runtime on the same input).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.measure.summary import value_types
from npukit.quant.qat.fake_quant import BiasQuant
from npukit.quant.qat.ops import OPS

DOMAIN = "npukit.qat"
# ops whose float initializer inputs (beyond the data input) are trained
WEIGHTED = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "InstanceNormalization",
                      "LayerNormalization", "PRelu", "Einsum"})


@dataclasses.dataclass(frozen=True)
class _Node:
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    name: str


def _attr(value: Any) -> Any:
    if isinstance(value, onnx.TensorProto):
        return torch.from_numpy(numpy_helper.to_array(value).copy())
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value


def unsupported_ops(model: onnx.ModelProto) -> list[str]:
    """The op types of ``model`` this program cannot run (sorted)."""
    return sorted({n.op_type for n in model.graph.node if n.domain == DOMAIN and n.op_type != "FakeQuant"
                   or n.domain not in ("", "ai.onnx", DOMAIN) or (n.domain != DOMAIN and n.op_type not in OPS)})


class OnnxProgram(nn.Module):
    """``model`` (float, with or without FakeQuant nodes) as a module; ``quant``: key -> quantizer module.
    ``forward(feeds)`` takes a dict of input name -> tensor (or tensors in input order) and returns the graph's
    outputs in order. ``constants``: the initializers that are not trained are plain tensors, not buffers, for
    ``torch.export``, which lifts them as constants whose values the ops can read (a Reshape's shape, a Clip's
    bounds); a buffer it traces as a tensor of unknown values. ``use``: what the program is for and ``hint`` what to
    do instead, said where the graph has an op or an op's form npukit cannot run in torch."""

    def __init__(self, model: onnx.ModelProto, quant: Mapping[str, nn.Module] | None = None, *,
                 constants: bool = False, use: str = "training",
                 hint: str = "quantize it post-training (npukit quantize)") -> None:
        super().__init__()
        self.use, self.hint = use, hint
        missing = unsupported_ops(model)
        if missing:
            raise InputError(f"{use} runs the model's graph in torch, which has no {', '.join(missing)} here",
                             hint=f"{hint}, or export the model without them")
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        trained = self._trained(model, inits)
        self.input_names = tuple(i.name for i in model.graph.input if i.name not in inits)
        self.output_names = tuple(o.name for o in model.graph.output)
        self.nodes = tuple(_Node(n.op_type if n.domain != DOMAIN else "FakeQuant", tuple(n.input), tuple(n.output),
                                 {a.name: _attr(helper.get_attribute_value(a)) for a in n.attribute}
                                 | ({"_outputs": len(n.output)} if n.op_type == "Split" else {}), n.name)
                           for n in model.graph.node)
        if constants:
            self.nodes = _linear_layers(self.nodes, inits, set(self.output_names))
            # a linear layer's weight is [out, in] and its bias a parameter, as torch holds them
            linear = [n for n in self.nodes if n.op_type == "Gemm" and n.attrs.get("_linear")]
            inits = {**inits, **{n.inputs[1]: inits[n.inputs[1]].T for n in linear}}
            trained |= {n.inputs[2] for n in linear if len(n.inputs) > 2}
        self.keys: dict[str, str] = {}  # initializer name -> parameter / buffer key
        self.params = nn.ParameterDict()
        self.constants: dict[str, torch.Tensor] = {}  # initializer name -> plain tensor (``constants``)
        self.folds = constants  # what is computed from constants alone is computed outside tracing (``run``)
        for index, (name, value) in enumerate(inits.items()):
            key = f"i{index}"
            self.keys[name] = key
            tensor = torch.from_numpy(np.array(value, copy=True))
            if name in trained:
                self.params[key] = nn.Parameter(tensor)
            elif constants:
                self.constants[name] = tensor
            else:
                self.register_buffer(f"c_{key}", tensor, persistent=True)
        self.quant = nn.ModuleDict({k: m for k, m in (quant or {}).items()})

    @staticmethod
    def _trained(model: onnx.ModelProto, inits: Mapping[str, np.ndarray]) -> set[str]:
        trained = set()
        for node in model.graph.node:
            if node.domain == DOMAIN and helper.get_attribute_value(
                    next(a for a in node.attribute if a.name == "kind")) in (b"weight", b"bias", "weight", "bias"):
                trained.add(node.input[0])
            elif node.op_type in WEIGHTED and node.domain != DOMAIN:
                trained |= {name for name in node.input[1:] if name in inits and inits[name].dtype == np.float32
                            and inits[name].ndim >= 1}
        if any(n.op_type == "BatchNormalization" for n in model.graph.node):  # running statistics stay frozen
            trained -= {n.input[i] for n in model.graph.node if n.op_type == "BatchNormalization" for i in (3, 4)}
        return trained

    def initializer(self, name: str) -> torch.Tensor:
        if name in self.constants:
            return self.constants[name]
        key = self.keys[name]
        return self.params[key] if key in self.params else getattr(self, f"c_{key}")

    def trained_initializers(self) -> dict[str, torch.Tensor]:
        """Initializer name -> its parameter, for the trained ones."""
        return {name: self.params[key] for name, key in self.keys.items() if key in self.params}

    def forward(self, *feeds: Any) -> list[torch.Tensor]:
        env = self.run(*feeds)
        return [env[name] for name in self.output_names]

    def run(self, *feeds: Any, forced: Mapping[str, torch.Tensor] | None = None,
            seen: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Every tensor the graph computes, by name. ``forced``: tensors taken from elsewhere (another runtime's
        values of the same graph) in place of the computed ones, each computed value first put into ``seen``."""
        if len(feeds) == 1 and isinstance(feeds[0], Mapping):
            env = {name: feeds[0][name] for name in self.input_names}
        else:
            env = dict(zip(self.input_names, feeds))
        for name in self.keys:
            env[name] = self.initializer(name)
        static = set(self.constants)  # the tensors computed from constants alone (``folds``)
        for node in self.nodes:
            args = [env[name] if name else None for name in node.inputs]
            # what constants alone compute (``folds``) is computed outside any tracing: a constant in the exported
            # program (torch.export lifts it) rather than nodes that compute one (a detector's anchor grid:
            # ConstantOfShape, Add), which the ONNX export of the program folds away and the plan has no tensor for
            folded = self.folds and node.op_type != "FakeQuant" and all(name in static for name in node.inputs if name)
            if folded:
                static.update(name for name in node.outputs if name)
            if node.op_type == "FakeQuant":
                outs = [self._fake_quant(node, args[0], env)]
            else:
                try:
                    with _disable_current_modes() if folded else contextlib.nullcontext():
                        outs = OPS[node.op_type](args, node.attrs, self.opset)
                except NotImplementedError as exc:
                    raise InputError(f"node {node.name or node.op_type}: {exc} is not supported for {self.use}",
                                     hint=self.hint) from None
            for name, value in zip(node.outputs, outs):
                if name and forced is not None and name in forced:
                    if seen is not None:
                        seen[name] = value
                    value = forced[name]
                if name:
                    env[name] = value
        return env

    def _fake_quant(self, node: _Node, x: torch.Tensor, env: Mapping[str, torch.Tensor]) -> torch.Tensor:
        module = self.quant[node.attrs["key"]]
        if isinstance(module, BiasQuant):
            weight_quant = self.quant[module.weight_key]
            scale = BiasQuant.grid(self.quant[module.input_key].scale(), weight_quant.scale(env[module.weight]))
            return module(x, scale)
        return module(x)


def _linear_layers(nodes: tuple[_Node, ...], inits: Mapping[str, np.ndarray], outputs: set[str]
                   ) -> tuple[_Node, ...]:
    """``nodes`` with each MatMul by a constant matrix, and the Add of a constant vector that alone reads it, as one
    linear layer (a Gemm node: ``F.linear`` in torch), as torch writes one: what ONNX Runtime fuses into a Gemm
    (a transformer's projections over [N, L, C]) and the plan quantizes as one, torch.export then sees as a linear
    (the values are the same; the float rounding of one fused product-and-sum)."""
    readers: dict[str, list[_Node]] = {}
    for node in nodes:
        for name in node.inputs:
            readers.setdefault(name, []).append(node)
    fused: dict[int, _Node] = {}  # id(the Add folded into a linear) -> the linear
    out: list[_Node] = []
    for node in nodes:
        if id(node) in fused:
            out.append(fused.pop(id(node)))
            continue
        weight = inits.get(node.inputs[1]) if node.op_type == "MatMul" and len(node.inputs) == 2 else None
        if weight is None or weight.ndim != 2 or weight.dtype != np.float32 or len(readers[node.inputs[1]]) > 1:
            out.append(node)
            continue
        (product,) = node.outputs
        add = readers.get(product, [])
        bias = None
        if len(add) == 1 and add[0].op_type == "Add" and product not in outputs:
            other = next((n for n in add[0].inputs if n != product), None)
            value = inits.get(other) if other is not None else None
            if value is not None and value.dtype == np.float32 and value.shape == (weight.shape[1],) \
                    and len(readers[other]) == 1:
                bias = other
        linear = {"transB": 1, "_linear": True}  # the weight transposed to [out, in] where it becomes a parameter
        if bias is None:
            out.append(_Node("Gemm", node.inputs, node.outputs, linear, node.name))
        else:
            fused[id(add[0])] = _Node("Gemm", (*node.inputs, bias), add[0].outputs, linear, node.name)
    return tuple(out)


def with_trained_weights(model: onnx.ModelProto, program: OnnxProgram) -> onnx.ModelProto:
    """``model`` (the float graph ``program`` was built from) with the program's trained weights in place of its
    initializers."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    trained = {name: t.detach().cpu().numpy() for name, t in program.trained_initializers().items()}
    for init in out.graph.initializer:
        if init.name in trained:
            value = trained[init.name].astype(numpy_helper.to_array(init).dtype)
            init.CopyFrom(numpy_helper.from_array(value, init.name))
    return out


_VIEWS = ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze")  # the same values in another shape


def with_logits(model: onnx.ModelProto, output: int) -> onnx.ModelProto:
    """``model`` with graph output ``output`` replaced by the logits its Softmax (over the last axis, or per sample)
    reads (``logits_of``); else ``model`` itself. Distillation on the logits keeps its gradients where a confident
    Softmax rounds its probabilities to 0 (and the softened targets are what they should be)."""
    logits = logits_of(model, output)
    if logits is None:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output[output].CopyFrom(helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT, None))
    return out


def logits_of(model: onnx.ModelProto, output: int) -> str | None:
    """The tensor a Softmax (over the last axis, or per sample) reads when graph output ``output`` is that Softmax's,
    directly or through ops that only change its shape (opset conversion writes an opset-11 Softmax as Flatten ->
    Softmax -> Reshape, a Paddle export ends in Identity) or put it on a grid (a training twin's ``FakeQuant``: a
    quantized model's probabilities are its uint8 output, whose small values are exactly 0); else None."""
    index = GraphIndex(model.graph)
    node = index.producer_node(model.graph.output[output].name)
    while node is not None and (node.op_type in _VIEWS and node.domain in ("", "ai.onnx") or node.domain == DOMAIN):
        node = index.producer_node(node.input[0])
    if node is None or node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
        return None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
    per_sample = opset < 13 and axis == 1  # before opset 13: a softmax over everything after the batch axis
    if not per_sample:
        rank = _rank(model, node.input[0])
        if rank is None or axis not in (-1, rank - 1):
            return None
    return node.input[0]


def _rank(model: onnx.ModelProto, name: str) -> int | None:
    """The rank of tensor ``name`` as declared or as ONNX shape inference finds it (None: unknown); a training twin's
    ``FakeQuant`` output (which shape inference cannot follow) has the rank of the tensor it reads."""
    index = GraphIndex(model.graph)
    node = index.producer_node(name)
    while node is not None and node.domain == DOMAIN:
        name = node.input[0]
        node = index.producer_node(name)
    shape = value_types(model.graph)[0].get(name)
    if shape is None:
        try:
            shape = value_types(onnx.shape_inference.infer_shapes(model).graph)[0].get(name)
        except Exception:  # noqa: BLE001 - a model inference cannot follow: the rank stays unknown
            return None
    return None if shape is None else len(shape)
