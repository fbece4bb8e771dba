"""Activation spellings -> the ops ORT's fused kernels and NPU converters expect (Relu, Clip, HardSwish, GlobalAveragePool)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from npukit.passes._rewrite import (
    add_initializer,
    constant_array,
    is_float,
    onnx_nodes,
    producer_of,
    rank,
    replace_with_node,
    scalar_constant,
    sole_consumer,
)
from npukit.passes.base import NpukitPass

_SIXTH_TOL = 1e-6  # 1/6 stored as float32 is off by ~5e-9
HARDSWISH_OPSET = 14  # the first opset with HardSwish


@dataclasses.dataclass(frozen=True)
class _Operand:
    """A binary node split into its variable input and its one-element constant input."""

    variable: ir.Value
    constant: float
    dtype: np.dtype


def _split_constant(node: ir.Node | None) -> _Operand | None:
    if node is None or len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return None
    a, b = node.inputs
    for variable, other in ((a, b), (b, a)):
        value = scalar_constant(other, like=variable)
        if value is not None and constant_array(variable) is None:
            return _Operand(variable, value, constant_array(other).dtype)  # type: ignore[arg-type, union-attr]
    return None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _SIXTH_TOL * max(1.0, abs(b))


class CanonicalizeActivationPass(NpukitPass):
    """Rewrite activation spellings into single ops, in this order:

    1. Min(Max(x, a), b), Max(Min(x, b), a), Min(Relu(x), b) with constants a <= b -> Clip(x, a, b)
    2. x * Clip(x + 3, 0, 6) / 6 (or * 1/6, in any association) -> HardSwish(x)
    3. x * HardSigmoid(x, alpha=1/6, beta=0.5) -> HardSwish(x)
    4. Max(x, 0) -> Relu(x); Clip(x, min=0, max absent or +inf) -> Relu(x)
    5. ReduceMean(x, axes=all spatial axes, keepdims=1) -> GlobalAveragePool(x)

    Clip bounds become scalar initializers. A partly matching candidate gets a note saying what did not match.
    ``forms`` (of ``FORMS``) limits the pass to some of them: ``substitute`` forms only the HardSwish it rewrites.

    Why not onnxscript's rules (``rules.common`` HardSwishFusion, HardSwishFusionFromHardSigmoid, FuseMaxMinToClip,
    FuseMinMaxToClip; checked with onnxscript 0.7.2 on this pass's test forms): they rewrite 3 of the 9 forms above
    (Min(Max), x * Clip(x + 3, 0, 6) / 6, x * HardSigmoid); they miss HardSigmoid with beta left at its default 0.5,
    Min(Relu), Max(Min(b, x), a) with the constant first, and the 1/6-multiplied forms; and they write ops the model's opset
    lacks (HardSwish into opset 13, Clip with min/max inputs into opset 10), which onnx.checker rejects. Their
    tracer records why a match failed but then applies nothing, so the near-miss notes would need a second run.
    """

    FORMS = ("clip", "hardswish", "relu", "global_average_pool")  # rules 1, 2 and 3, 4, 5

    def __init__(self, forms: tuple[str, ...] = FORMS) -> None:
        super().__init__()
        unknown = set(forms) - set(self.FORMS)
        if unknown:
            raise ValueError(f"unknown forms {sorted(unknown)}: choose among {self.FORMS}")
        self.forms = forms

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.rewrites = 0
        self.held_by_opset = 0  # written-out HardSwish matches left as they are because the opset lacks HardSwish
        self.opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
        rules: tuple[tuple[str, str | tuple[str, ...], Callable[[ir.Node], bool | str | None]], ...] = (
            ("clip", ("Min", "Max"), self._clip_from_min_max), ("hardswish", ("Mul", "Div"), self._hardswish_from_clip),
            ("hardswish", "Mul", self._hardswish_from_hardsigmoid), ("relu", ("Max", "Clip"), self._relu),
            ("global_average_pool", "ReduceMean", self._global_average_pool))
        for form, ops, rule in rules:
            if form in self.forms:
                for node in onnx_nodes(model, ops):
                    self._attempt(node, rule)
        return ir.passes.PassResult(model, modified=self.rewrites > 0)

    def _attempt(self, node: ir.Node, rule: Callable[[ir.Node], bool | str | None]) -> None:
        if node.graph is None:  # removed by an earlier rewrite in this pass
            return
        why = rule(node)
        if why is True:
            self.rewrites += 1
        elif isinstance(why, str):
            self.note(f"{node.op_type} {node.name!r} is kept: {why}")

    # 1. Clip
    def _clip_from_min_max(self, outer: ir.Node) -> bool | str | None:
        top = _split_constant(outer)
        if top is None or top.dtype.kind != "f":
            return None
        inner_op = "Max" if outer.op_type == "Min" else "Min"
        inner = producer_of(top.variable, inner_op)
        relu = producer_of(top.variable, "Relu") if outer.op_type == "Min" else None
        if inner is None and relu is None:
            return None
        if relu is not None:
            x, bound = relu.inputs[0], 0.0
            inner = relu
        else:
            low = _split_constant(inner)
            if low is None:
                return None
            x, bound = low.variable, low.constant
        lo, hi = (bound, top.constant) if outer.op_type == "Min" else (top.constant, bound)
        if lo > hi:
            return f"Clip needs min <= max, got min {lo} and max {hi}"
        if sole_consumer(top.variable) is not outer:
            return f"the inner {inner.op_type} output has other consumers"
        if self.opset < 11:
            return f"Clip with min/max inputs needs opset 11, the model imports opset {self.opset}"
        graph = outer.graph
        assert isinstance(graph, ir.Graph)
        lo_value = add_initializer(graph, np.array(lo, dtype=top.dtype), name_hint="clip_min")
        hi_value = add_initializer(graph, np.array(hi, dtype=top.dtype), name_hint="clip_max")
        replace_with_node([inner, outer], outer.outputs[0], "Clip", [x, lo_value, hi_value])
        return True

    # 2. and 3. HardSwish
    def _hardswish_from_clip(self, top: ir.Node) -> bool | str | None:
        sixth = self._divided_by_six(top)
        if sixth is not None:  # (x * R) / 6
            product = producer_of(sixth, "Mul")
            if product is not None and sole_consumer(sixth) is top:
                for x, r in (tuple(product.inputs), tuple(reversed(product.inputs))):
                    chain = self._relu6_of_x_plus_3(r, x, product)
                    if isinstance(chain, list):
                        return self._to_hardswish(x, [*chain, product, top])  # type: ignore[arg-type]
                    if isinstance(chain, str):
                        return chain
        if top.op_type == "Mul" and len(top.inputs) == 2:  # x * (R / 6)
            for x, scaled in (tuple(top.inputs), tuple(reversed(top.inputs))):
                scale = scaled.producer() if scaled is not None else None
                if scale is None or scale.op_type not in ("Mul", "Div") or sole_consumer(scaled) is not top:
                    continue
                r = self._divided_by_six(scale)
                chain = self._relu6_of_x_plus_3(r, x, scale) if r is not None else None
                if isinstance(chain, list):
                    return self._to_hardswish(x, [*chain, scale, top])  # type: ignore[arg-type]
                if isinstance(chain, str):
                    return chain
        return None

    @staticmethod
    def _divided_by_six(node: ir.Node) -> ir.Value | None:
        """v when ``node`` is Div(v, 6) or Mul(v, 1/6)."""
        if node.op_type == "Div" and len(node.inputs) == 2:
            six = scalar_constant(node.inputs[1], like=node.inputs[0])
            return node.inputs[0] if six is not None and _close(six, 6.0) else None
        operand = _split_constant(node) if node.op_type == "Mul" else None
        return operand.variable if operand is not None and _close(operand.constant, 1 / 6) else None

    @staticmethod
    def _relu6_of_x_plus_3(r: ir.Value | None, x: ir.Value | None, user: ir.Node) -> list[ir.Node] | str | None:
        """[Add, Clip] when r = Clip(x + 3, 0, 6) feeding only ``user``; a reason when it nearly is; else None."""
        clip = producer_of(r, "Clip")
        if clip is None or len(clip.inputs) != 3 or x is None:
            return None
        add = producer_of(clip.inputs[0], "Add")
        shift = _split_constant(add)
        if add is None or shift is None or shift.variable is not x:
            return None
        lo = scalar_constant(clip.inputs[1], like=clip.inputs[0])
        hi = scalar_constant(clip.inputs[2], like=clip.inputs[0])
        if shift.constant != 3.0 or lo != 0.0 or hi != 6.0:
            return f"x * Clip(x + {shift.constant}, {lo}, {hi}) is not x * Clip(x + 3, 0, 6): not a HardSwish"
        if sole_consumer(clip.inputs[0]) is not clip or sole_consumer(r) is not user:  # type: ignore[arg-type]
            return "an intermediate of x * Clip(x + 3, 0, 6) / 6 has other consumers"
        return [add, clip]

    def _hardswish_from_hardsigmoid(self, mul: ir.Node) -> bool | str | None:
        if len(mul.inputs) != 2:
            return None
        for x, h in (tuple(mul.inputs), tuple(reversed(mul.inputs))):
            hs = producer_of(h, "HardSigmoid")
            if hs is None or hs.inputs[0] is not x:
                continue
            alpha = hs.attributes.get_float("alpha", 0.2)
            beta = hs.attributes.get_float("beta", 0.5)
            if not (_close(alpha, 1 / 6) and _close(beta, 0.5)):
                return f"HardSigmoid alpha={alpha:g}, beta={beta:g} is not x/6 + 0.5: not a HardSwish"
            if sole_consumer(h) is not mul:  # type: ignore[arg-type]
                return "the HardSigmoid output has other consumers"
            return self._to_hardswish(x, [hs, mul])  # type: ignore[arg-type]
        return None

    def _to_hardswish(self, x: ir.Value, nodes: list[ir.Node]) -> bool | str:
        if self.opset < HARDSWISH_OPSET:
            self.held_by_opset += 1
            return f"HardSwish needs opset {HARDSWISH_OPSET}, the model imports opset {self.opset}"
        replace_with_node(nodes, nodes[-1].outputs[0], "HardSwish", [x])
        return True

    # 4. Relu
    def _relu(self, node: ir.Node) -> bool | str | None:
        if node.op_type == "Max":
            operand = _split_constant(node)
            if operand is None or operand.dtype.kind != "f":
                return None
            if operand.constant != 0.0:
                return f"Max with {operand.constant:g}, not 0: not a Relu"
            replace_with_node([node], node.outputs[0], "Relu", [operand.variable])
            return True
        inputs = list(node.inputs) + [None] * (3 - len(node.inputs))
        x, low, high = inputs[:3]
        if (low is not None and constant_array(low) is None) or (high is not None and constant_array(high) is None):
            return "its min/max are not constant, so ORT cannot fuse it into the Conv before it"
        if low is None:
            return None
        if constant_array(low).dtype.kind != "f":  # type: ignore[union-attr]
            return None
        lo = scalar_constant(low, like=x)
        hi = None if high is None else scalar_constant(high, like=x)
        if lo != 0.0 or (high is not None and hi != float("inf")):
            return None
        replace_with_node([node], node.outputs[0], "Relu", [x])
        return True

    # 5. GlobalAveragePool
    def _global_average_pool(self, node: ir.Node) -> bool | str | None:
        x = node.inputs[0]
        if not is_float(x):
            return None
        x_rank = rank(x)
        if x_rank is None or x_rank < 3:
            return f"input rank {x_rank if x_rank is not None else 'unknown'}: GlobalAveragePool needs rank >= 3"
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            axes_array = constant_array(node.inputs[1])
            if axes_array is None:
                return "its axes are not constant"
            axes = axes_array.reshape(-1).tolist()
        elif "axes" in node.attributes:
            axes = list(node.attributes.get_ints("axes", ()))
        else:
            return "it reduces over all axes, including batch and channel"
        spatial = sorted(a + x_rank if a < 0 else a for a in axes)
        if spatial != list(range(2, x_rank)):
            return f"axes {axes} are not exactly the spatial axes {list(range(2, x_rank))}"
        if not node.attributes.get_int("keepdims", 1):
            return "keepdims=0, while GlobalAveragePool keeps the reduced axes"
        replace_with_node([node], node.outputs[0], "GlobalAveragePool", [x])
        return True
