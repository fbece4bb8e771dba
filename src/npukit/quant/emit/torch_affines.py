"""Fold into a torch program's convolutions the constant scales and shifts ONNX Runtime folded into the ONNX model's.

npukit plans on the ONNX model after ORT's quantization pre-processing, whose basic optimizations fuse a Conv with a
Mul or an Add by a per-channel (or scalar) constant after it (ConvMulFusion, ConvAddFusion): the conv's own output
is then no tensor of the planned model, only the scaled one is, and the plan has a grid for that one alone. The torch
program of the same module still computes ``conv(x) * c + b`` as separate ops; XNNPACK's quantizer wants a grid on
the conv's output, which the plan does not have. This rewrite makes the torch program compute what the planned model
computes: where a conv's output matches no ONNX tensor while the constant op reading it matches a tensor an ONNX
Conv writes, the constant is folded into the conv's weights and bias (``W * c``, ``b * c``; ``b + c``) and the op
removed. What is folded is read off the two graphs' values, not assumed: a fold ORT did not make is not made.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

_CONVS = ("conv1d.default", "conv2d.default")
_FOLDABLE = ("mul.Tensor", "div.Tensor", "add.Tensor", "sub.Tensor")


def _op(node: torch.fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target))


def _tensor(model: torch.fx.GraphModule, node: Any) -> torch.Tensor | None:
    """The constant value of ``node``: a Python number, or a tensor the program holds (get_attr)."""
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return torch.tensor(float(node))
    if isinstance(node, torch.fx.Node) and node.op == "get_attr":
        value = operator.attrgetter(str(node.target))(model)  # as pt2e reads a weight
        return value.detach() if isinstance(value, torch.Tensor) else None
    return None


def _per_channel(value: torch.Tensor, channels: int, rank: int) -> torch.Tensor | None:
    """``value`` as one number per output channel, where it broadcasts that way over a conv output of ``rank``
    (a scalar, [C], [C,1,...] or [1,C,1,...]); else None."""
    if value.numel() == 1 and value.dim() <= rank:
        return value.reshape(1).expand(channels).to(torch.float32)
    if value.dim() > rank or value.numel() != channels:
        return None
    shape = (1,) * (rank - value.dim()) + tuple(value.shape)
    if shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return value.reshape(channels).to(torch.float32)


def _constant_operand(model: torch.fx.GraphModule, source: torch.fx.Node, user: torch.fx.Node, shape: Any
                      ) -> tuple[str, torch.Tensor] | None:
    """(how ``user`` combines ``source``, a conv's output of ``shape`` or a constant op on it, with a per-channel
    constant: "scale" or "shift", the constant as a multiplier or an addend per channel), or None where it is not
    such an op."""
    op = _op(user)
    if op not in _FOLDABLE or len(user.args) != 2 or user.kwargs.get("alpha", 1) != 1:
        return None
    first, second = user.args
    if op in ("div.Tensor", "sub.Tensor") and first is not source:
        return None  # c / conv and c - conv are not affine in the conv's weights
    value = _tensor(model, second if first is source else first)
    per = _per_channel(value, int(shape[1]), len(shape)) if value is not None else None
    if per is None:
        return None
    return {"mul.Tensor": ("scale", per), "div.Tensor": ("scale", 1.0 / per),
            "add.Tensor": ("shift", per), "sub.Tensor": ("shift", -per)}[op]


def _chain(model: torch.fx.GraphModule, conv: torch.fx.Node, matched: dict[Any, str],
           conv_written: Callable[[str], bool]) -> list[tuple[torch.fx.Node, str, torch.Tensor]]:
    """The constant ops after ``conv`` (each the only reader of the one before) up to the first whose output is a
    tensor an ONNX Conv writes, with how each combines (``_constant_operand``); empty where the chain ends before
    such a tensor (nothing ORT folded)."""
    val = conv.meta.get("val")
    if val is None:
        return []
    chain, node = [], conv
    while len(node.users) == 1:
        user = next(iter(node.users))
        operand = _constant_operand(model, node, user, tuple(val.shape))
        if operand is None:
            return []
        chain.append((user, *operand))
        if user in matched:
            return chain if conv_written(matched[user]) else []
        node = user
    return []


def _set(model: torch.fx.GraphModule, conv: torch.fx.Node, index: int, value: torch.Tensor, suffix: str) -> None:
    """Argument ``index`` of ``conv`` (its weight or bias) set to ``value``, a new attribute of ``model``."""
    name = f"_npukit_folded_{conv.name}_{suffix}"
    model.register_buffer(name, value.contiguous())
    with model.graph.inserting_before(conv):
        attr = model.graph.get_attr(name)
    attr.meta["val"] = value
    args = list(conv.args) + [None] * (3 - len(conv.args))
    args[index] = attr
    conv.args = tuple(args)


def _fold(model: torch.fx.GraphModule, conv: torch.fx.Node, chain: list[tuple[torch.fx.Node, str, torch.Tensor]]
          ) -> bool:
    """The ops of ``chain`` folded into ``conv``'s weight and bias and removed; False (nothing changed) where a
    weight or bias another op reads too would have to change."""
    weight_node = conv.args[1]
    bias_node = conv.args[2] if len(conv.args) > 2 else None
    weight = _tensor(model, weight_node)
    channels = int(conv.meta["val"].shape[1])
    bias = _tensor(model, bias_node) if bias_node is not None else torch.zeros(channels)
    if weight is None or bias is None or len(weight_node.users) != 1 \
            or (isinstance(bias_node, torch.fx.Node) and len(bias_node.users) != 1):
        return False
    scale, shift = torch.ones(channels, dtype=weight.dtype), bias.to(weight.dtype)
    for _, kind, per in chain:  # y = conv(x) * s + t, op after op
        per = per.to(weight.dtype)
        if kind == "scale":
            scale, shift = scale * per, shift * per
        else:
            shift = shift + per
    _set(model, conv, 1, weight * scale.reshape(-1, *([1] * (weight.dim() - 1))), "weight")
    _set(model, conv, 2, shift, "bias")
    for user, _, _ in chain:
        user.replace_all_uses_with(conv)
        model.graph.erase_node(user)
    return True


def fold_buffer_computations(model: torch.fx.GraphModule) -> None:
    """The program's ops that compute from its constants alone (a frozen BatchNorm's ``weight * (var + eps).rsqrt()``
    and ``bias - mean * scale``, reshaped) replaced by their values, in place (torchao's PT2E constant folding), as
    the ONNX exporter folds them: the scale and shift after a conv are then constants ``fold_matched_affines`` can
    fold, and no quantizer annotates a tensor that only the torch program computes."""
    from torchao.quantization.pt2e.constant_fold import constant_fold

    constant_fold(model)
    model.recompile()


def fold_matched_affines(model: torch.fx.GraphModule, match: Callable[[torch.fx.GraphModule], dict[Any, str]],
                         conv_written: Callable[[str], bool]) -> tuple[list[str], dict[Any, str]]:
    """Fold into ``model``'s convs the constant ops ORT folded (the module docstring), in place. ``match``: torch
    node -> the ONNX tensor equal to it; ``conv_written``: whether an ONNX Conv writes that tensor. Returns the
    folded ops' names and ``match`` of the program as it is then."""
    folded: list[str] = []
    while True:
        matched = match(model)
        done = False
        for conv in [n for n in model.graph.nodes if n.op == "call_function" and _op(n) in _CONVS]:
            chain = _chain(model, conv, matched, conv_written) if conv not in matched else []
            names = [user.name for user, _, _ in chain]
            if chain and _fold(model, conv, chain):
                folded.extend(names)
                done = True
        if not done:
            return folded, matched
        model.graph.eliminate_dead_code()
        model.recompile()
