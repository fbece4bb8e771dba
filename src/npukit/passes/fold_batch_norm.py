"""BatchNormalization(Conv | ConvTranspose | Gemm) -> the producer alone, with the normalization folded into its weights."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npukit.passes._rewrite import add_initializer, constant_array, producer_of, replace_with_node, sole_consumer
from npukit.passes.base import NpukitPass

_PRODUCERS = ("Conv", "ConvTranspose", "Gemm")


class FoldBatchNormPass(NpukitPass):
    """Fold inference-mode BatchNormalization into the Conv, ConvTranspose (any group) or 2-D Gemm that feeds it.

    With f = scale / sqrt(var + eps) per channel: W' = W * f along the output-channel axis and
    b' = (b - mean) * f + bias. Arithmetic is done in float64 and stored in the weight's dtype; new initializers are
    created, so weights shared with other nodes stay as they were. ``producers``: the op types folded into (default
    all three); ``folded``: the names of the BatchNormalizations folded, in order.
    """

    def __init__(self, producers: tuple[str, ...] = _PRODUCERS) -> None:
        super().__init__()
        self.producers = producers
        self.folded: list[str] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.rewrites = 0
        self.folded = []
        for bn in [n for n in ir.traversal.RecursiveGraphIterator(model.graph)
                   if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx")]:
            name = bn.name or bn.outputs[0].name or "BatchNormalization"
            why = self._try_fold(bn)
            if why is None:
                self.rewrites += 1
                self.folded.append(name)
            else:
                self.note(f"BatchNormalization {bn.name!r} is kept: {why}")
        return ir.passes.PassResult(model, modified=self.rewrites > 0)

    def _try_fold(self, bn: ir.Node) -> str | None:
        x = bn.inputs[0]
        producer = next((p for op in self.producers if (p := producer_of(x, op)) is not None), None)
        if producer is None:
            source = x.producer() if x is not None else None
            return f"its input comes from {source.op_type if source else 'a graph input'}, not Conv/ConvTranspose/Gemm"
        if bn.attributes.get_int("training_mode", 0):
            return "training_mode=1"
        if any(o.uses() or o.is_graph_output() for o in bn.outputs[1:]):
            return "its running mean/var outputs are used"
        if sole_consumer(x) is not bn:  # type: ignore[arg-type]
            return f"the {producer.op_type} output has other consumers or is a graph output"
        params = [constant_array(v) for v in bn.inputs[1:5]]
        if len(params) < 4 or any(p is None for p in params):
            return "its scale/bias/mean/var are not all constant"
        scale, shift, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params)  # type: ignore[arg-type]
        factor = scale / np.sqrt(var + bn.attributes.get_float("epsilon", 1e-5))
        offset = shift - mean * factor
        weight_value = producer.inputs[1]
        weight = constant_array(weight_value)
        if weight is None:
            return f"the {producer.op_type} weight is not constant"
        if weight.dtype.kind != "f":
            return f"the {producer.op_type} weight is {weight.dtype}, not floating point"
        if producer.op_type == "Gemm":
            return self._fold_into_gemm(producer, bn, weight, factor, offset)
        return fold_channel_affine(producer, bn, weight, factor, offset, tag="bnfold")

    @staticmethod
    def _fold_into_gemm(gemm: ir.Node, bn: ir.Node, weight: np.ndarray, factor: np.ndarray,
                        offset: np.ndarray) -> str | None:
        if weight.ndim != 2:
            return f"the Gemm weight has rank {weight.ndim}"
        trans_b = gemm.attributes.get_int("transB", 0)
        out_features = weight.shape[0] if trans_b else weight.shape[1]
        if factor.size != out_features:
            return f"it normalizes {factor.size} channels but Gemm has {out_features} outputs"
        has_c = len(gemm.inputs) > 2 and gemm.inputs[2] is not None
        c = constant_array(gemm.inputs[2]) if has_c else np.zeros(1)
        if c is None:
            return "the Gemm bias C is not constant"
        beta = gemm.attributes.get_float("beta", 1.0) if has_c else 0.0
        w = weight.astype(np.float64)
        new_w = w * factor[:, None] if trans_b else w * factor[None, :]
        new_c = beta * c.astype(np.float64) * factor + offset
        graph = gemm.graph
        assert isinstance(graph, ir.Graph)
        w_value = add_initializer(graph, new_w.astype(weight.dtype), name_hint=f"{gemm.inputs[1].name or 'weight'}_bnfold")
        c_value = add_initializer(graph, new_c.astype(weight.dtype), name_hint=f"{gemm.name or 'gemm'}_bias_bnfold")
        attributes = {name: attr for name, attr in gemm.attributes.items() if name != "beta"}
        replace_with_node([gemm, bn], bn.outputs[0], "Gemm", [gemm.inputs[0], w_value, c_value], attributes)
        return None


def fold_channel_affine(conv: ir.Node, follower: ir.Node, weight: np.ndarray, factor: np.ndarray, offset: np.ndarray,
                    *, tag: str) -> str | None:
    """Replace ``conv`` (a Conv or ConvTranspose, any group) and ``follower``, the per-output-channel affine
    y * factor + offset after it, with one ``conv``: W' = W * factor along the output channels, b' = b * factor +
    offset (float64, stored in the weight's dtype, as new initializers named with ``tag``); the new node keeps
    ``conv``'s name, its output ``follower``'s. None when done, else why not."""
    group = conv.attributes.get_int("group", 1)
    if weight.ndim < 3:
        return f"the {conv.op_type} weight has rank {weight.ndim}"
    if conv.op_type == "Conv":
        out_channels = weight.shape[0]
        per_channel_shape = (out_channels,) + (1,) * (weight.ndim - 1)
    else:  # ConvTranspose weight: [C_in, C_out / group, k...]; output channel g * C_out/group + j
        if weight.shape[0] % group:
            return f"ConvTranspose weight dim 0 ({weight.shape[0]}) is not divisible by group {group}"
        out_channels = weight.shape[1] * group
    if factor.size != out_channels or offset.size != out_channels:
        return f"it normalizes {factor.size} channels but {conv.op_type} has {out_channels}"
    bias = constant_array(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None
    if len(conv.inputs) > 2 and conv.inputs[2] is not None and bias is None:
        return f"the {conv.op_type} bias is not constant"
    w = weight.astype(np.float64)
    if conv.op_type == "Conv":
        new_w = w * factor.reshape(per_channel_shape)
    else:
        cin, cout_g = weight.shape[0], weight.shape[1]
        grouped = w.reshape((group, cin // group, cout_g) + weight.shape[2:])
        f = factor.reshape((group, 1, cout_g) + (1,) * (weight.ndim - 2))
        new_w = (grouped * f).reshape(weight.shape)
    b = np.zeros(out_channels) if bias is None else bias.astype(np.float64).reshape(-1)
    new_b = b * factor + offset
    graph = conv.graph
    assert isinstance(graph, ir.Graph)
    w_value = add_initializer(graph, new_w.astype(weight.dtype), name_hint=f"{conv.inputs[1].name or 'weight'}_{tag}")
    b_value = add_initializer(graph, new_b.astype(weight.dtype), name_hint=f"{conv.name or 'conv'}_bias_{tag}")
    replace_with_node([conv, follower], follower.outputs[0], conv.op_type, [conv.inputs[0], w_value, b_value],
                      {name: attr for name, attr in conv.attributes.items()})
    return None
