"""Substitutions that let a target take ops it lacks, as rewrite passes, each checked numerically.

``apply_fixes(model, target)`` picks, from the target profile's ``substitutions``, the fixes whose source op the
target does not take and whose products it does, runs them, and compares the result with the original on ORT CPU
(seeded random inputs; max |fixed - original| / max |original| <= rtol, 1e-5 by default: every rewrite a target
profile names is exact algebra, so only float32 rounding of a different evaluation order separates the two).

The inexact substitutions (``FixRule.exact`` False: HardSwish -> ReLU6, GroupNorm -> InstanceNorm, as in the seeds'
MobileNetV3 port) change what the model computes. No profile applies them: ``analyze`` names one where a node has no
exact fix for the target, and ``substitute(model, rules)`` applies those a user asks for, measuring the change; the
``substitute`` verb then recovers the loss by distillation fine-tuning from the original model.

``substitute(model, rules, blend=True)`` keeps each rewritten node beside its substitute and adds their outputs in
shares the model holds as two scalar initializers (``BLEND``: the original's share, then the substitute's; 1 and 0
as built, the original function): fine-tuning moves the shares from the original to the substitute step by step
(``npukit.quant.qat.blend``) so the network adapts all the way instead of restarting from a changed function.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.measure.compare import OutputErrors
from npukit.passes._rewrite import add_initializer, onnx_nodes
from npukit.passes.base import NpukitPass, PassManager
from npukit.passes.pipeline import verify_equivalent
from npukit.targets.profile import TargetProfile


BLEND = ("npukit_blend_original", "npukit_blend_substitute")  # a blended model's two shares (see the docstring)


def _opset(model: ir.Model) -> int:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))


class _Builder:
    """Inserts nodes before ``anchor`` and finally swaps ``anchor``'s first output for the value built; with
    ``blend`` (the two share initializers), for the shares' sum of the anchor's output and the value built."""

    def __init__(self, anchor: ir.Node, blend: tuple[ir.Value, ir.Value] | None = None) -> None:
        self.anchor, self.blend = anchor, blend
        self.graph = anchor.graph
        assert isinstance(self.graph, ir.Graph)
        self.taken = {n.name for n in self.graph if n.name}
        x = anchor.inputs[0]
        self.dtype = np.dtype(x.dtype.numpy()) if x is not None and x.dtype is not None else np.dtype(np.float32)

    def const(self, value: float | list | np.ndarray, *, hint: str, dtype: np.dtype | None = None) -> ir.Value:
        array = np.asarray(value, dtype=dtype if dtype is not None else self.dtype)
        return add_initializer(self.graph, array, name_hint=f"{self.anchor.name or self.anchor.op_type}_{hint}")

    def _fresh(self, suffix: str) -> str:
        base = f"{self.anchor.name or self.anchor.op_type}/{suffix}"
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def op(self, op_type: str, inputs: list[ir.Value | None], attributes: dict | None = None) -> ir.Value:
        node = ir.node(op_type, inputs, dict(attributes or {}), name=self._fresh(op_type))
        self.graph.insert_before(self.anchor, node)
        return node.outputs[0]

    def finish(self, result: ir.Value) -> None:
        old = self.anchor.outputs[0]
        name = old.name
        result.type, result.shape = old.type, old.shape
        if self.blend is not None:
            self._blend(old, result)
            return
        old.replace_all_uses_with(result, replace_graph_outputs=True)
        self.graph.remove(self.anchor, safe=True)
        result.name = name

    def _blend(self, old: ir.Value, new: ir.Value) -> None:
        """Every reader of ``old`` reads share_original x old + share_substitute x new instead (the anchor stays)."""
        kept, taken = self.blend  # type: ignore[misc]
        scaled_old = ir.node("Mul", [old, kept], name=self._fresh("blend_original"))
        scaled_new = ir.node("Mul", [new, taken], name=self._fresh("blend_substitute"))
        mixed = ir.node("Add", [scaled_old.outputs[0], scaled_new.outputs[0]], name=self._fresh("blend"))
        for value in (scaled_old.outputs[0], scaled_new.outputs[0], mixed.outputs[0]):
            value.type, value.shape = old.type, old.shape
        self.graph.insert_after(self.anchor, [scaled_old, scaled_new, mixed])
        old.replace_all_uses_with(mixed.outputs[0], replace_graph_outputs=True)
        scaled_old.replace_input_with(0, old)
        name = old.name
        old.name, mixed.outputs[0].name = f"{name}/original", name  # a graph output keeps its name


class _OpRewritePass(NpukitPass):
    """Rewrites every ONNX-domain node of ``op_type`` with ``rewrite(builder, node)``; a str result is a note."""

    op_type = ""
    blend = False  # keep each node beside its substitute, in shares (see the module docstring)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.rewrites = 0
        self.opset = _opset(model)
        shares = _blend_shares(model.graph) if self.blend else None
        for node in onnx_nodes(model, self.op_type):
            builder = _Builder(node, shares)
            why = self.rewrite(builder, node)
            if isinstance(why, str):
                self.note(f"{node.op_type} {node.name!r} is kept: {why}")
            else:
                builder.finish(why)
                self.rewrites += 1
        return ir.passes.PassResult(model, modified=self.rewrites > 0)

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        raise NotImplementedError


def _blend_shares(graph: ir.Graph) -> tuple[ir.Value, ir.Value]:
    """The graph's two share initializers (``BLEND``), registered as 1 and 0 where it has none yet."""
    shares = []
    for name, start in zip(BLEND, (1.0, 0.0)):
        if name not in graph.initializers:
            tensor = ir.tensor(np.asarray(start, dtype=np.float32), name=name)
            graph.register_initializer(ir.Value(name=name, shape=ir.Shape(()), type=ir.TensorType(tensor.dtype),
                                                const_value=tensor))
        shares.append(graph.initializers[name])
    return shares[0], shares[1]


class HardSwishToHardSigmoidPass(_OpRewritePass):
    """HardSwish(x) -> x * HardSigmoid(x, alpha=1/6, beta=0.5)."""

    op_type = "HardSwish"

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        x = node.inputs[0]
        return b.op("Mul", [x, b.op("HardSigmoid", [x], {"alpha": 1 / 6, "beta": 0.5})])


class HardSwishToClipPass(_OpRewritePass):
    """HardSwish(x) -> x * Clip(x + 3, 0, 6) / 6."""

    op_type = "HardSwish"

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        x = node.inputs[0]
        clipped = b.op("Clip", [b.op("Add", [x, b.const(3.0, hint="three")]), b.const(0.0, hint="zero"),
                                b.const(6.0, hint="six")])
        return b.op("Div", [b.op("Mul", [x, clipped]), b.const(6.0, hint="six")])


class HardSigmoidToClipPass(_OpRewritePass):
    """HardSigmoid(x, alpha, beta) -> Clip(x * alpha + beta, 0, 1)."""

    op_type = "HardSigmoid"

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        alpha = node.attributes.get_float("alpha", 0.2)
        beta = node.attributes.get_float("beta", 0.5)
        x = node.inputs[0]
        affine = b.op("Add", [b.op("Mul", [x, b.const(alpha, hint="alpha")]), b.const(beta, hint="beta")])
        return b.op("Clip", [affine, b.const(0.0, hint="zero"), b.const(1.0, hint="one")])


def _channel_affine(b: _Builder, node: ir.Node, channels: int) -> tuple[np.ndarray, np.ndarray] | str:
    """A GroupNormalization's scale and bias per channel (an opset-18 scale per group repeated over its channels),
    or why there are none."""
    groups = node.attributes.get_int("num_groups", 0)
    if groups <= 0 or channels % groups:
        return f"num_groups {groups} does not divide the {channels} channels"
    arrays = [None if v is None else ir.convenience.get_const_tensor(v) for v in (list(node.inputs) + [None] * 2)[1:3]]
    if any(a is None for a in arrays):
        return "scale and bias must be constant"
    scale_c, bias_c = (np.asarray(a.numpy(), dtype=b.dtype).reshape(-1) for a in arrays)  # type: ignore[union-attr]
    if scale_c.size == groups and groups != channels:
        scale_c, bias_c = np.repeat(scale_c, channels // groups), np.repeat(bias_c, channels // groups)
    if scale_c.size != channels or bias_c.size != channels:
        return f"scale/bias of {scale_c.size} elements fit neither {groups} groups nor {channels} channels"
    return scale_c, bias_c


class DecomposeGroupNormPass(_OpRewritePass):
    """GroupNormalization(x, scale, bias) -> Reshape(N, G, -1) -> InstanceNormalization -> Reshape(N, C, ...)
    -> * scale + bias (per channel; an opset-18 per-group scale is repeated over its channels)."""

    op_type = "GroupNormalization"

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        x = node.inputs[0]
        if x is None or x.shape is None or len(x.shape) < 3:
            return "the input rank is unknown or below 3"
        dims = list(x.shape)[1:]
        if not all(isinstance(d, int) for d in dims):
            return f"channel and spatial dims must be static, got {dims}: fix the input shape first"
        groups, channels = node.attributes.get_int("num_groups", 0), dims[0]
        affine = _channel_affine(b, node, channels)
        if isinstance(affine, str):
            return affine
        scale_c, bias_c = affine
        eps = node.attributes.get_float("epsilon", 1e-5)
        grouped = b.op("Reshape", [x, b.const([0, groups, -1], hint="group_shape", dtype=np.dtype(np.int64))])
        normed = b.op("InstanceNormalization", [grouped, b.const(np.ones(groups), hint="ones"),
                                                b.const(np.zeros(groups), hint="zeros")], {"epsilon": eps})
        restored = b.op("Reshape", [normed, b.const([0, *dims], hint="shape", dtype=np.dtype(np.int64))])
        per_channel = (channels,) + (1,) * (len(dims) - 1)
        scaled = b.op("Mul", [restored, b.const(scale_c.reshape(per_channel), hint="scale")])
        return b.op("Add", [scaled, b.const(bias_c.reshape(per_channel), hint="bias")])


class HardSwishToRelu6Pass(_OpRewritePass):
    """HardSwish(x) -> Clip(x, 0, 6) (ReLU6), the function MobileNetV2 uses. NOT the same function: below 3 it
    passes x where HardSwish passes x * (x + 3) / 6, and it caps at 6. Every int8 runtime fuses it into the conv
    before it."""

    op_type = "HardSwish"

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        return b.op("Clip", [node.inputs[0], b.const(0.0, hint="zero"), b.const(6.0, hint="six")])


class GroupNormToInstanceNormPass(_OpRewritePass):
    """GroupNormalization(x, scale, bias) -> InstanceNormalization(x, scale, bias) per channel (one op, no
    reshapes). NOT the same function unless every group is one channel: statistics over each channel instead of
    over each group of channels."""

    op_type = "GroupNormalization"

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        x = node.inputs[0]
        if x is None or x.shape is None or len(x.shape) < 3 or not isinstance(x.shape[1], int):
            return "the input rank or channel count is unknown"
        affine = _channel_affine(b, node, x.shape[1])
        if isinstance(affine, str):
            return affine
        scale_c, bias_c = affine
        return b.op("InstanceNormalization", [x, b.const(scale_c, hint="scale"), b.const(bias_c, hint="bias")],
                    {"epsilon": node.attributes.get_float("epsilon", 1e-5)})

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """GroupNormalization nodes, then GroupNorms written out as torch's exporter writes them at opset 18:
        Reshape(x, [N, G, -1]) -> InstanceNormalization(ones(G), zeros(G)) -> Reshape back to x's shape (-> Mul ->
        Add, the affine, kept), whose three nodes become InstanceNormalization(x, ones(C), zeros(C))."""
        super().call(model)
        shares = _blend_shares(model.graph) if self.blend else None
        for back in onnx_nodes(model, "Reshape"):
            found = _written_out_group_norm(back)
            if found is None:
                continue
            x, channels, eps, norm, grouped = found
            constants = [v for n in (back, norm, grouped) for v in n.inputs if v is not None and v.is_initializer()]
            b = _Builder(back, shares)
            b.finish(b.op("InstanceNormalization", [x, b.const(np.ones(channels), hint="ones"),
                                                    b.const(np.zeros(channels), hint="zeros")], {"epsilon": eps}))
            for dead in (norm, grouped):  # the group statistics nothing reads any more (kept where blended)
                if not any(len(v.uses()) for v in dead.outputs) and dead.graph is not None:
                    dead.graph.remove(dead, safe=True)
            for value in constants:  # the shapes, ones and zeros nothing else reads
                if not value.uses() and model.graph.initializers.get(value.name) is value:
                    del model.graph.initializers[value.name]
            self.rewrites += 1
        return ir.passes.PassResult(model, modified=self.rewrites > 0)


def _restores(back: ir.Node, x: ir.Value) -> bool:
    """Whether the Reshape ``back`` gives ``x``'s shape back: by its output's inferred shape, or by its constant
    target shape (0 copies a dimension; the batch may be -1)."""
    if back.outputs[0].shape is not None and all(isinstance(d, int) for d in back.outputs[0].shape):
        return list(back.outputs[0].shape) == list(x.shape)  # type: ignore[arg-type]
    target = ir.convenience.get_const_tensor(back.inputs[1]) if len(back.inputs) > 1 else None
    if target is None:
        return False
    dims = [int(d) for d in target.numpy().reshape(-1)]
    return len(dims) == len(x.shape) and dims[0] in (0, -1, x.shape[0]) and all(  # type: ignore[arg-type]
        d in (0, want) for d, want in zip(dims[1:], list(x.shape)[1:]))  # type: ignore[arg-type]


def _written_out_group_norm(back: ir.Node) -> tuple[ir.Value, int, float, ir.Node, ir.Node] | None:
    """(x, its channels, epsilon, the InstanceNormalization, the grouping Reshape) where ``back`` ends a GroupNorm
    written out (``GroupNormToInstanceNormPass.call``) over groups of more than one channel, else None."""
    norm = back.inputs[0].producer() if back.inputs and back.inputs[0] is not None else None
    if norm is None or norm.op_type != "InstanceNormalization" or len(norm.outputs[0].uses()) != 1:
        return None
    grouped = norm.inputs[0].producer() if norm.inputs[0] is not None else None
    if grouped is None or grouped.op_type != "Reshape" or len(grouped.outputs[0].uses()) != 1:
        return None
    x = grouped.inputs[0]
    affine = [None if v is None else ir.convenience.get_const_tensor(v) for v in list(norm.inputs)[1:3]]
    shape = ir.convenience.get_const_tensor(grouped.inputs[1]) if len(grouped.inputs) > 1 else None
    if x is None or x.shape is None or len(x.shape) < 3 or not all(isinstance(d, int) for d in x.shape[1:]) \
            or shape is None or any(a is None for a in affine):
        return None
    groups, channels = [int(d) for d in shape.numpy().reshape(-1)], int(x.shape[1])
    scale, bias = (np.asarray(a.numpy()).reshape(-1) for a in affine)  # type: ignore[union-attr]
    if len(groups) != 3 or not 1 < groups[1] < channels or channels % groups[1] or not np.all(scale == 1) \
            or not np.all(bias == 0) or not _restores(back, x):
        return None
    return x, channels, norm.attributes.get_float("epsilon", 1e-5), norm, grouped


def _as_channel_slope(slope: np.ndarray, rank: int) -> np.ndarray | None:
    """``slope`` as a [C, 1, 1] array where, broadcast against an input of ``rank`` 3 or 4, it holds one value per
    channel (axis -3) and is not a single value; else None."""
    if rank not in (3, 4) or slope.ndim > rank or slope.size < 2:
        return None
    shape = (1,) * (rank - slope.ndim) + slope.shape
    if shape[-2:] != (1, 1) or any(d != 1 for d in shape[:-3]):
        return None
    return slope.reshape(-1, 1, 1)


class PReluChannelFormPass(_OpRewritePass):
    """PRelu in the form Core ML's activation builder takes: a per-channel slope reshaped to [C, 1, 1] (torch
    exports nn.PReLU(C) before a 4D input as [1, C, 1, 1]); a PRelu no such slope can express (an input of rank
    below 3, a slope that varies along other axes, one that is not constant) -> Relu(x) - s * Relu(-x), which is
    exact (each side is x, or s * x, or zero, with no rounding of its own)."""

    op_type = "PRelu"

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        x, slope = node.inputs[0], node.inputs[1]
        if x is None or x.shape is None or slope is None:
            return "the input rank is unknown"
        const = ir.convenience.get_const_tensor(slope)
        rank = len(x.shape)
        if const is not None and rank in (3, 4):
            array = np.asarray(const.numpy())
            if array.shape == (array.size, 1, 1) and array.size > 1 or (array.size == 1 and x.shape[-3] != 1):
                return "its slope is already in the form Core ML takes"
            channels = _as_channel_slope(array, rank)
            if channels is not None:
                return b.op("PRelu", [x, b.const(channels.astype(array.dtype), hint="slope_c11")])
        minus_one = b.const(-1.0, hint="minus_one")
        negative_part = b.op("Relu", [b.op("Mul", [x, minus_one])])
        return b.op("Sub", [b.op("Relu", [x]), b.op("Mul", [slope, negative_part])])


class GlobalAveragePoolToReduceMeanPass(_OpRewritePass):
    """GlobalAveragePool(x) -> ReduceMean(x, axes=spatial axes, keepdims=1)."""

    op_type = "GlobalAveragePool"

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        x = node.inputs[0]
        if x is None or x.shape is None:
            return "the input rank is unknown"
        axes = list(range(2, len(x.shape)))
        if self.opset >= 18:
            return b.op("ReduceMean", [x, b.const(axes, hint="axes", dtype=np.dtype(np.int64))], {"keepdims": 1})
        return b.op("ReduceMean", [x], {"axes": axes, "keepdims": 1})


class GlobalPoolToPoolPass(_OpRewritePass):
    """GlobalAveragePool / GlobalMaxPool(x) -> AveragePool / MaxPool with kernel = the (static) spatial size."""

    op_type = ("GlobalAveragePool", "GlobalMaxPool")  # type: ignore[assignment]

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        x = node.inputs[0]
        if x is None or x.shape is None or len(x.shape) < 3:
            return "the input rank is unknown"
        spatial = list(x.shape)[2:]
        if not all(isinstance(d, int) for d in spatial):
            return f"spatial dims {spatial} are not static: fix the input shape first"
        op = "AveragePool" if node.op_type == "GlobalAveragePool" else "MaxPool"
        return b.op(op, [x], {"kernel_shape": spatial})


class GeluToErfPass(_OpRewritePass):
    """Gelu(x, approximate='none') -> x * 0.5 * (1 + Erf(x / sqrt(2))); tanh-approximate Gelu is left alone."""

    op_type = "Gelu"

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        if node.attributes.get_string("approximate", "none") != "none":
            return "approximate='tanh': only the exact Gelu becomes the Erf form"
        x = node.inputs[0]
        erf = b.op("Erf", [b.op("Div", [x, b.const(math.sqrt(2.0), hint="sqrt2")])])
        half_x = b.op("Mul", [x, b.const(0.5, hint="half")])
        return b.op("Mul", [half_x, b.op("Add", [erf, b.const(1.0, hint="one")])])


class GeluTanhDecomposePass(_OpRewritePass):
    """Gelu(x, approximate='tanh') -> 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))); exact Gelu is kept."""

    op_type = "Gelu"

    def rewrite(self, b: _Builder, node: ir.Node) -> ir.Value | str:
        if node.attributes.get_string("approximate", "none") != "tanh":
            return "exact Gelu: replacing it with the tanh approximation would change the results"
        x = node.inputs[0]
        cube = b.op("Mul", [b.op("Mul", [x, x]), x])
        inner = b.op("Add", [x, b.op("Mul", [cube, b.const(0.044715, hint="c")])])
        tanh = b.op("Tanh", [b.op("Mul", [inner, b.const(math.sqrt(2.0 / math.pi), hint="k")])])
        half_x = b.op("Mul", [x, b.const(0.5, hint="half")])
        return b.op("Mul", [half_x, b.op("Add", [tanh, b.const(1.0, hint="one")])])


@dataclasses.dataclass(frozen=True)
class FixRule:
    """A named substitution: the op types it removes, the op types it introduces, and its pass. ``exact`` False:
    the substitute computes a different function (never applied by a target profile; see the module docstring)."""

    name: str
    source_ops: tuple[str, ...]
    produces: tuple[str, ...]
    description: str
    make_pass: Callable[[], NpukitPass] | None  # None: the input-shape fix, done on the protobuf
    exact: bool = True
    refusal: bool = False  # serves an op the target has but refuses in some forms; the pass rewrites only those

    def helps(self, target: TargetProfile) -> bool:
        """True when the target lacks a source op (or, for a fix of a refusal, has one) and takes every op the fix
        introduces."""
        lacks = any(target.rule_for(op) is None for op in self.source_ops)
        return (lacks or self.refusal) and all(target.rule_for(op) is not None for op in self.produces)


FIXES: dict[str, FixRule] = {f.name: f for f in (
    FixRule("fix_input_shape", (), (), "fix symbolic input dims to the given input shape", None),
    FixRule("fold_constants", (), (), "fold the shapes and values computed from constants (with the input shape "
            "static), so every tensor's size is known, as a target needing static shapes asks", None),
    FixRule("initializers_as_constants", (), (), "make the initializers also listed as graph inputs constants "
            "(ONNX Runtime lets a caller override those, so its execution providers treat them as inputs)", None),
    FixRule("hardswish_to_hardsigmoid", ("HardSwish",), ("Mul", "HardSigmoid"),
            "HardSwish(x) -> x * HardSigmoid(x)", HardSwishToHardSigmoidPass),
    FixRule("hardswish_to_clip", ("HardSwish",), ("Add", "Clip", "Mul", "Div"),
            "HardSwish(x) -> x * Clip(x + 3, 0, 6) / 6", HardSwishToClipPass),
    FixRule("hardsigmoid_to_clip", ("HardSigmoid",), ("Mul", "Add", "Clip"),
            "HardSigmoid(x) -> Clip(alpha * x + beta, 0, 1)", HardSigmoidToClipPass),
    FixRule("groupnorm_decompose", ("GroupNormalization",), ("Reshape", "InstanceNormalization", "Mul", "Add"),
            "GroupNormalization -> Reshape / InstanceNormalization / Reshape / Mul / Add", DecomposeGroupNormPass),
    FixRule("global_avgpool_to_reducemean", ("GlobalAveragePool",), ("ReduceMean",),
            "GlobalAveragePool -> ReduceMean over the spatial axes", GlobalAveragePoolToReduceMeanPass),
    FixRule("global_pool_to_pool", ("GlobalAveragePool", "GlobalMaxPool"), ("AveragePool", "MaxPool"),
            "GlobalAveragePool/GlobalMaxPool -> AveragePool/MaxPool with a fixed kernel", GlobalPoolToPoolPass),
    FixRule("gelu_to_erf", ("Gelu",), ("Div", "Erf", "Mul", "Add"),
            "Gelu (exact) -> x * 0.5 * (1 + Erf(x / sqrt(2)))", GeluToErfPass),
    FixRule("gelu_tanh_decompose", ("Gelu",), ("Mul", "Add", "Tanh"),
            "Gelu (approximate='tanh') -> 0.5 * x * (1 + Tanh(...))", GeluTanhDecomposePass),
    FixRule("prelu_channel_form", ("PRelu",), ("PRelu", "Relu", "Mul", "Sub"),
            "PRelu whose slope the target refuses -> its slope as [C, 1, 1], else Relu(x) - s * Relu(-x)",
            PReluChannelFormPass, refusal=True),
    FixRule("hardswish_to_relu6", ("HardSwish",), ("Clip",), "HardSwish(x) -> ReLU6(x) = Clip(x, 0, 6) (inexact)",
            HardSwishToRelu6Pass, exact=False),
    FixRule("groupnorm_to_instancenorm", ("GroupNormalization",), ("InstanceNormalization",),
            "GroupNormalization -> InstanceNormalization per channel (inexact unless groups == channels)",
            GroupNormToInstanceNormPass, exact=False),
)}
INEXACT = tuple(name for name, rule in FIXES.items() if not rule.exact)


def fix_for(op_type: str, target: TargetProfile, *, exact: bool = True) -> FixRule | None:
    """The first fix in the target's preference order that removes ``op_type`` using only ops the target takes;
    with ``exact`` False, the first inexact substitution that would (for a node no exact fix serves)."""
    for name in target.substitutions if exact else INEXACT:
        rule = FIXES[name]
        if op_type in rule.source_ops and all(target.rule_for(op) is not None for op in rule.produces):
            return rule
    return None


def fix_for_refusal(op_type: str, target: TargetProfile) -> FixRule | None:
    """The first fix in the target's preference order that rewrites ``op_type`` into a form the target takes,
    where the target has the op but refuses it in some forms (``FixRule.refusal``)."""
    for name in target.substitutions:
        rule = FIXES[name]
        if rule.refusal and op_type in rule.source_ops and rule.helps(target):
            return rule
    return None


@dataclasses.dataclass(frozen=True)
class FixResult:
    """The fixed model, the fixes applied (with their pass notes) and the numerical check against the original."""

    model: onnx.ModelProto
    applied: list[dict]
    errors: OutputErrors | None

    @property
    def changed(self) -> bool:
        """Whether the fixes changed the model: a rewrite checked against it, or its input shape fixed."""
        return self.errors is not None or any(a["rewrites"] for a in self.applied)

    def as_dict(self) -> dict:
        return {"applied": self.applied, "errors": None if self.errors is None else self.errors.as_dict()}


def _unresolved_sizes(model: onnx.ModelProto) -> bool:
    """Whether ONNX shape inference leaves the size of some tensor a node computes from the graph's inputs open."""
    from npukit.measure.summary import value_types

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    shapes, _ = value_types(inferred.graph)
    index = GraphIndex(inferred.graph)
    for node in index.nodes:
        if index.is_folded(node):
            continue
        if any(o and (shapes.get(o) is None or not all(isinstance(d, int) and d > 0 for d in shapes[o]))
               for o in node.output):
            return True
    return False


def _fold_constants(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with its constant subgraphs folded (``passes.fold_constants``) and shapes inferred again."""
    from npukit.passes.fold_constants import FoldConstantsPass

    fold = FoldConstantsPass()
    folded = ir.serde.serialize_model(fold(ir.serde.deserialize_model(model)).model)
    notes = [f"{fold.rewrites} nodes folded"] + ([] if not _unresolved_sizes(folded) else
                                                 ["some sizes stay open: they depend on the input's values"])
    return onnx.shape_inference.infer_shapes(folded, strict_mode=False, data_prop=True), notes


def _symbolic_inputs(model: onnx.ModelProto) -> list[str]:
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers and any(
        not d.HasField("dim_value") for d in i.type.tensor_type.shape.dim)]


def apply_fixes(
    model: onnx.ModelProto,
    target: TargetProfile,
    *,
    input_shape: tuple[int, ...] | None = None,
    rtol: float = 1e-5,
) -> FixResult:
    """Apply the substitutions ``target`` wants and lacks, verify against ``model`` (raises NumericCheckError)."""
    for name in target.substitutions:
        if name not in FIXES or not FIXES[name].exact:
            raise InputError(f"profile {target.name} names an unknown or inexact fix {name!r}",
                             hint=f"exact fixes: {', '.join(n for n, r in FIXES.items() if r.exact)}")
    applied: list[dict] = []
    reference = _shapes_fixed(model, target, input_shape, applied)
    shape_fixed = reference is not model
    # exact (no value changes): the checks below compare against the original made so too, which ORT then
    # optimizes as it does the fixed model (a Conv + BatchNorm folded, CenterFace: 9e-6 off unfolded)
    reference, made = _overridable_made_constant(reference, target, applied)
    original = model if not made else reference if not shape_fixed else \
        _overridable_made_constant(model, target, [])[0]
    fixed, modified = _rewritten(reference, target, applied)
    if target.hazards:  # patterns the target takes but computes wrongly: rewritten to a form it computes right
        fixed, guarded = _hazards_guarded(fixed, target, applied)
        modified = modified or guarded
    if not shape_fixed:
        return FixResult(fixed, applied, verify_equivalent(original, fixed, rtol=rtol) if modified else None)
    # the input shape fixed: checked too, against the original model fed inputs of that shape, or where it declares
    # other static sizes (CenterFace's 10x3x32x32), against the model with the shape fixed (run at it once when fixed)
    from npukit.frontend.shapes import input_dims
    from npukit.runtime.ort import make_session, random_feeds

    session = make_session(reference)
    feeds = [random_feeds(session, seed=i) for i in range(2)]
    declared = input_dims(original)
    fits = all(declared.get(name) is None or all(not isinstance(d, int) or d == n
                                                 for d, n in zip(declared[name], np.shape(value)))
               for name, value in feeds[0].items())
    return FixResult(fixed, applied, verify_equivalent(original if fits else reference, fixed, rtol=rtol, feeds=feeds))


def _shapes_fixed(model: onnx.ModelProto, target: TargetProfile, input_shape: tuple[int, ...] | None,
                  applied: list[dict]) -> onnx.ModelProto:
    """``model`` with ``input_shape`` fixed in and the sizes computed from it folded, where the target fixes shapes;
    what was done (or why not) appended to ``applied``."""
    from npukit.frontend.shapes import fix_input_shape

    reference = model
    if "fix_input_shape" in target.substitutions and input_shape is not None:
        reference = fix_input_shape(model, tuple(input_shape), dynamic_batch=False)
        applied.append({"fix": "fix_input_shape", "description": FIXES["fix_input_shape"].description,
                        "rewrites": 1, "notes": [f"input shape fixed to {list(input_shape)}"]})
    elif target.requires_static_shapes and _symbolic_inputs(model):
        applied.append({"fix": "fix_input_shape", "description": FIXES["fix_input_shape"].description,
                        "rewrites": 0, "notes": [f"inputs {', '.join(_symbolic_inputs(model))} have symbolic "
                                                 "dims: pass --input-shape to fix them"]})
    if "fix_input_shape" in target.substitutions and not _symbolic_inputs(reference) \
            and _unresolved_sizes(reference):  # sizes computed from the (now static) shape: folded as ORT would
        reference, notes = _fold_constants(reference)
        applied.append({"fix": "fold_constants", "description": FIXES["fold_constants"].description,
                        "rewrites": 1, "notes": notes})
    return reference


def _overridable_made_constant(model: onnx.ModelProto, target: TargetProfile,
                               applied: list[dict]) -> tuple[onnx.ModelProto, bool]:
    """``model`` with the initializers it also lists as graph inputs made constants, where the target's runtime is
    ONNX Runtime (which lets a caller override those, so its execution providers treat them as inputs); and whether
    any was. Recorded in ``applied``."""
    from npukit.passes.initializers_as_constants import InitializersAsConstantsPass
    from npukit.targets.graph_match import overridable_initializers

    if target.graph_optimizations != "ort-basic" or not overridable_initializers(model):
        return model, False
    result = PassManager([InitializersAsConstantsPass()])(ir.serde.deserialize_model(model))
    record = result.records[0]
    applied.append({"fix": "initializers_as_constants", "description": FIXES["initializers_as_constants"].description,
                    "rewrites": record.rewrites, "notes": list(record.notes)})
    return ir.serde.serialize_model(result.model), True


def _rewritten(reference: onnx.ModelProto, target: TargetProfile,
               applied: list[dict]) -> tuple[onnx.ModelProto, bool]:
    """``reference`` after the target's substitutions for the ops it has (one fix per source op: the first in the
    target's order wins), and whether any rewrote a node; each fix's record appended to ``applied``."""
    present = {n.op_type for n in reference.graph.node}
    chosen = [FIXES[name] for name in target.substitutions
              if FIXES[name].make_pass is not None and FIXES[name].helps(target)
              and any(op in present for op in FIXES[name].source_ops)]
    taken: set[str] = set()
    passes: list[tuple[FixRule, NpukitPass]] = []
    for rule in chosen:
        if taken.issuperset(rule.source_ops):
            continue
        taken.update(rule.source_ops)
        passes.append((rule, rule.make_pass()))  # type: ignore[misc]
    if not passes:
        return reference, False
    # the passes read input ranks and sizes: inferred on a copy where the model carries none for a tensor
    ir_model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(reference, strict_mode=False))
    result = PassManager([p for _, p in passes])(ir_model)
    for (rule, _), record in zip(passes, result.records):
        applied.append({"fix": rule.name, "description": rule.description, "rewrites": record.rewrites,
                        "notes": list(record.notes)})
    if result.modified:
        return ir.serde.serialize_model(result.model), True
    return reference, False


def _hazards_guarded(fixed: onnx.ModelProto, target: TargetProfile,
                     applied: list[dict]) -> tuple[onnx.ModelProto, bool]:
    """``fixed`` with the target's hazards rewritten to a form it computes right, and whether any was; each hazard's
    record (rewritten, or kept and why) appended to ``applied``."""
    from npukit.targets.hazards import guard_hazards

    guarded = guard_hazards(fixed, target)
    for name in dict.fromkeys(m.hazard.fix or m.hazard.name for m in (*guarded.rewritten,
                                                                       *(m for m, _ in guarded.left))):
        done = [m for m in guarded.rewritten if (m.hazard.fix or m.hazard.name) == name]
        left = [(m, why) for m, why in guarded.left if (m.hazard.fix or m.hazard.name) == name]
        applied.append({"fix": name, "description": (done or [m for m, _ in left])[0].hazard.reason,
                        "rewrites": len(done),
                        "notes": [f"{' + '.join(m.nodes)}: rewritten" for m in done]
                        + [f"{' + '.join(m.nodes)}: kept ({why})" for m, why in left]})
    return (guarded.model, True) if guarded.rewritten else (fixed, False)


HARDSWISH_FORMS = ("clip", "hardswish")  # the canonical forms a written-out HardSwish is read through


def _written_out_hardswish(model: onnx.ModelProto, rules: Sequence[FixRule]) -> tuple[onnx.ModelProto, list[dict]]:
    """For a rule that rewrites HardSwish, on a model that writes it out (x * Clip(x + 3, 0, 6) / 6, or
    x * HardSigmoid(x), as exporters below opset 14 must): the model with each made one HardSwish node (exact,
    ``passes.canonicalize_activation``), converted to opset 14 first where it imports less (verified on seeded inputs,
    ``frontend.opset.ensure_opset``); and what was done, as entries of ``FixResult.applied``. Otherwise the model as
    it is and no entry."""
    from npukit.frontend.opset import ensure_opset, onnx_opset
    from npukit.passes.canonicalize_activation import HARDSWISH_OPSET, CanonicalizeActivationPass

    if not any("HardSwish" in r.source_ops for r in rules) or any(n.op_type == "HardSwish" for n in model.graph.node):
        return model, []
    applied = []
    if onnx_opset(model) < HARDSWISH_OPSET:
        probe = CanonicalizeActivationPass(forms=HARDSWISH_FORMS)
        PassManager([probe])(ir.serde.deserialize_model(model))  # on a copy: a HardSwish only the opset keeps back?
        if not probe.held_by_opset:
            return model, []
        model, upgrade = ensure_opset(model, HARDSWISH_OPSET,
                                      reason="HardSwish (the substitution reads the written-out HardSwish as one node)")
        applied.append({"fix": "opset", "description": f"opset {upgrade.from_opset} -> {upgrade.to_opset} so that "
                        "the written-out HardSwish can be one node (verified)", "rewrites": 1, "notes": [],
                        "exact": True})
    canonical = CanonicalizeActivationPass(forms=HARDSWISH_FORMS)  # not the model's other spellings: not asked for
    result = PassManager([canonical])(ir.serde.deserialize_model(model))
    hardswish = ir.serde.serialize_model(result.model)
    formed = sum(n.op_type == "HardSwish" for n in hardswish.graph.node)
    if not formed:
        return model, applied
    applied.append({"fix": "canonicalize_activation", "description": "written-out activations made single ops "
                    f"(exact): {formed} HardSwish", "rewrites": canonical.rewrites, "notes": list(canonical.notes),
                    "exact": True})
    return hardswish, applied


def substitute(model: onnx.ModelProto, names: Sequence[str], *, rtol: float = 1e-5, blend: bool = False
               ) -> FixResult:
    """Apply the fixes ``names`` asks for, exact or not, to every node they serve, whatever the target takes.

    Raises InputError for an unknown name or when no node was rewritten. Exact fixes alone are verified as in
    ``apply_fixes``; with an inexact one ``errors`` is None: the change is the caller's to measure on real data.
    ``blend``: each rewritten node kept beside its substitute in shares (see the module docstring); its ``errors``
    compare the model as built (the original's share whole) with the original."""
    unknown = [n for n in names if n not in FIXES or FIXES[n].make_pass is None]
    if unknown or not names:
        raise InputError(f"unknown substitution {', '.join(unknown) or '(none given)'}",
                         hint=f"one of: {', '.join(n for n, r in FIXES.items() if r.make_pass is not None)}")
    rules = [FIXES[n] for n in dict.fromkeys(names)]
    clash = [op for op in {o for r in rules for o in r.source_ops} if sum(op in r.source_ops for r in rules) > 1]
    if clash:
        raise InputError(f"two substitutions given for {', '.join(sorted(clash))}", hint="give one per op type")
    model, applied = _written_out_hardswish(model, rules)
    passes = [r.make_pass() for r in rules]  # type: ignore[misc]
    for rewrite in passes:
        rewrite.blend = blend  # type: ignore[attr-defined]
    result = PassManager(passes)(ir.serde.deserialize_model(model))
    applied += [{"fix": r.name, "description": r.description, "rewrites": rec.rewrites, "notes": list(rec.notes),
                 "exact": r.exact} for r, rec in zip(rules, result.records)]
    idle = [r for r, rec in zip(rules, result.records) if not rec.rewrites]
    if idle:  # each rule asked for must rewrite something: a rule that did nothing is a mistake to say
        present = sorted({n.op_type for n in model.graph.node})
        ops = " or ".join(sorted({o for r in idle for o in r.source_ops}))
        decomposed = ("; its InstanceNormalization nodes are no GroupNorm written out as torch's exporter writes one "
                      "(Reshape(N, G, -1) -> InstanceNormalization(ones, zeros) -> Reshape back, static channels), "
                      "which the rule also reads" if "GroupNormalization" in ops
                      and "InstanceNormalization" in present else "")
        raise InputError(f"nothing to substitute for {', '.join(r.name for r in idle)}: the model has no node {ops} "
                         "that it could rewrite" + decomposed
                         + "".join(f" ({'; '.join(a['notes'])})" for a in applied if a["notes"] and any(
                             a["fix"] == r.name for r in idle)),
                         hint=f"drop that rule; the model's op types: {', '.join(present)}")
    fixed = ir.serde.serialize_model(result.model)
    errors = verify_equivalent(model, fixed, rtol=rtol) if blend or all(r.exact for r in rules) else None
    return FixResult(fixed, applied, errors)
