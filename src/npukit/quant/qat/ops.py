"""ONNX operators as torch functions, with ONNX's semantics (padding, broadcasting, opset differences), so that a
float ONNX graph can be trained with autograd: ``OPS[op_type](inputs, attrs, opset) -> outputs``.

Inputs that ONNX passes as tensors but that are really attributes (a Reshape's shape, a Slice's starts, a Resize's
scales, a Clip's bounds) are read as Python numbers; in the graphs npukit trains or exports they are constants
(static shapes, constants folded), read outside any tracing (``_values``): under ``torch.export`` they stay numbers
in the program, not data-dependent reads of a traced tensor. An operator not in ``OPS`` is refused by name when the
program is built, not when it first runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

Op = Callable[[list[Any], dict[str, Any], int], list[Any]]
OPS: dict[str, Op] = {}
DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32, 7: torch.int64,
          9: torch.bool, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}


def op(*names: str) -> Callable[[Op], Op]:
    def register(fn: Op) -> Op:
        for name in names:
            OPS[name] = fn
        return fn
    return register


def _values(value: Any) -> list[Any]:
    """A constant input's values as a flat Python list, read with torch's dispatch modes off: while torch.export
    traces the program (fake tensors, a proxy tracer), a constant tensor is read as the numbers it holds and the
    read leaves no node in the program (a computed tensor cannot be read so: export fails on it, as it should)."""
    if not torch.is_tensor(value):
        return list(value)
    with _disable_current_modes():
        return value.reshape(-1).tolist()


def _ints(value: Any) -> list[int]:
    return [int(v) for v in _values(value)]


def _floats(value: Any) -> list[float]:
    return [float(v) for v in _values(value)]


def _given(inputs: list[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index and inputs[index] is not None else None


# ------------------------------------------------------------------------------------------------- elementwise
_BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Pow": torch.pow, "Equal": torch.eq,
           "Less": torch.lt, "Greater": torch.gt, "LessOrEqual": torch.le, "GreaterOrEqual": torch.ge,
           "And": torch.logical_and, "Or": torch.logical_or}
_UNARY = {"Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Sqrt": torch.sqrt, "Exp": torch.exp,
          "Log": torch.log, "Neg": torch.neg, "Abs": torch.abs, "Erf": torch.erf, "Reciprocal": torch.reciprocal,
          "Floor": torch.floor, "Ceil": torch.ceil, "Round": torch.round, "Not": torch.logical_not,
          "Sin": torch.sin, "Cos": torch.cos, "Softplus": F.softplus, "Sign": torch.sign}


for _name, _fn in _BINARY.items():
    OPS[_name] = (lambda fn: lambda inputs, attrs, opset: [fn(inputs[0], inputs[1])])(_fn)
for _name, _fn in _UNARY.items():
    OPS[_name] = (lambda fn: lambda inputs, attrs, opset: [fn(inputs[0])])(_fn)


@op("Div")
def _div(inputs, attrs, opset):
    a, b = inputs
    if not a.is_floating_point() and not b.is_floating_point():
        return [torch.div(a, b, rounding_mode="trunc")]
    return [a / b]


@op("Identity", "Dropout")
def _identity(inputs, attrs, opset):
    return [inputs[0]] if len(inputs) == 1 else [inputs[0], torch.ones_like(inputs[0], dtype=torch.bool)]


@op("LeakyRelu")
def _leaky_relu(inputs, attrs, opset):
    return [F.leaky_relu(inputs[0], attrs.get("alpha", 0.01))]


@op("Elu")
def _elu(inputs, attrs, opset):
    return [F.elu(inputs[0], attrs.get("alpha", 1.0))]


@op("PRelu")
def _prelu(inputs, attrs, opset):
    x, slope = inputs
    return [torch.where(x >= 0, x, x * slope)]


@op("HardSigmoid")
def _hard_sigmoid(inputs, attrs, opset):
    return [torch.clamp(inputs[0] * attrs.get("alpha", 0.2) + attrs.get("beta", 0.5), 0.0, 1.0)]


@op("HardSwish")
def _hard_swish(inputs, attrs, opset):
    return [F.hardswish(inputs[0])]


@op("Gelu")
def _gelu(inputs, attrs, opset):
    return [F.gelu(inputs[0], approximate="tanh" if attrs.get("approximate", "none") == "tanh" else "none")]


@op("Clip")
def _clip(inputs, attrs, opset):
    x = inputs[0]
    if opset < 11:
        lo, hi = attrs.get("min", -math.inf), attrs.get("max", math.inf)
    else:
        lo = _floats(inputs[1])[0] if _given(inputs, 1) is not None else -math.inf
        hi = _floats(inputs[2])[0] if _given(inputs, 2) is not None else math.inf
    return [torch.clamp(x, lo, hi)]


def _fold(fn):
    def run(inputs, attrs, opset):
        out = inputs[0]
        for other in inputs[1:]:
            out = fn(out, other)
        return [out]
    return run


OPS["Min"], OPS["Max"], OPS["Sum"] = _fold(torch.minimum), _fold(torch.maximum), _fold(torch.add)
OPS["Mean"] = lambda inputs, attrs, opset: [_fold(torch.add)(inputs, attrs, opset)[0] / len(inputs)]


@op("Where")
def _where(inputs, attrs, opset):
    return [torch.where(inputs[0].bool(), inputs[1], inputs[2])]


@op("Cast")
def _cast(inputs, attrs, opset):
    to = int(attrs["to"])
    if to not in DTYPES:
        raise NotImplementedError(f"Cast to ONNX type {to}")
    return [inputs[0].to(DTYPES[to])]


def _softmax_kind(log: bool):
    def run(inputs, attrs, opset):
        x = inputs[0]
        axis = attrs.get("axis", 1 if opset < 13 else -1)
        fn = torch.log_softmax if log else torch.softmax
        if opset < 13:  # softmax over the flattened dims from axis on
            axis = axis % x.dim()
            flat = x.reshape(*x.shape[:axis], -1)
            return [fn(flat, dim=-1).reshape(x.shape)]
        return [fn(x, dim=axis)]
    return run


OPS["Softmax"], OPS["LogSoftmax"] = _softmax_kind(False), _softmax_kind(True)


# ------------------------------------------------------------------------------------------------- linear
def _spatial_pads(attrs: dict, x: torch.Tensor, kernel: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int]) -> list[int]:
    """ONNX pads (begin..., end...) for the spatial dims, auto_pad resolved."""
    dims = x.dim() - 2
    auto = attrs.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * dims)
        for i in range(dims):
            size = x.shape[2 + i]
            out = -(-size // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size)
            small, large = total // 2, total - total // 2
            pads[i], pads[dims + i] = (small, large) if auto == "SAME_UPPER" else (large, small)
        return pads
    return list(attrs.get("pads", [0] * (2 * dims)))


def _torch_pad(pads: Sequence[int]) -> list[int]:
    """ONNX (begin..., end...) spatial pads -> F.pad's order (last dim first)."""
    dims = len(pads) // 2
    out: list[int] = []
    for i in reversed(range(dims)):
        out += [pads[i], pads[dims + i]]
    return out


@op("Conv")
def _conv(inputs, attrs, opset):
    x, w, b = inputs[0], inputs[1], _given(inputs, 2)
    dims = x.dim() - 2
    kernel = list(attrs.get("kernel_shape", w.shape[2:]))
    strides = list(attrs.get("strides", [1] * dims))
    dilations = list(attrs.get("dilations", [1] * dims))
    pads = _spatial_pads(attrs, x, kernel, strides, dilations)
    fn = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
    group = int(attrs.get("group", 1))
    if pads[:dims] == pads[dims:]:
        return [fn(x, w, b, stride=strides, padding=pads[:dims], dilation=dilations, groups=group)]
    return [fn(F.pad(x, _torch_pad(pads)), w, b, stride=strides, dilation=dilations, groups=group)]


@op("ConvTranspose")
def _conv_transpose(inputs, attrs, opset):
    x, w, b = inputs[0], inputs[1], _given(inputs, 2)
    dims = x.dim() - 2
    strides = list(attrs.get("strides", [1] * dims))
    dilations = list(attrs.get("dilations", [1] * dims))
    output_padding = list(attrs.get("output_padding", [0] * dims))
    if "output_shape" in attrs or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        raise NotImplementedError("ConvTranspose with output_shape or auto_pad")
    pads = list(attrs.get("pads", [0] * (2 * dims)))
    fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[dims - 1]
    if pads[:dims] == pads[dims:]:  # torch's padding crops as much from both ends: one op, as torch writes it
        return [fn(x, w, b, stride=strides, padding=pads[:dims], output_padding=output_padding,
                   groups=int(attrs.get("group", 1)), dilation=dilations)]
    out = fn(x, w, b, stride=strides, padding=0, output_padding=output_padding, groups=int(attrs.get("group", 1)),
             dilation=dilations)
    index = [slice(None), slice(None)] + [slice(pads[i], out.shape[2 + i] - pads[dims + i]) for i in range(dims)]
    return [out[tuple(index)]]


@op("Gemm")
def _gemm(inputs, attrs, opset):
    a, b, c = inputs[0], inputs[1], _given(inputs, 2)
    if not attrs.get("transA", 0) and attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 \
            and (c is None or c.dim() == 1):
        # a linear layer, as torch writes one (torch.export and the mobile runtimes' lowering see a linear)
        return [F.linear(a, b if attrs.get("transB", 0) else b.t(), c)]
    a = a.t() if attrs.get("transA", 0) else a
    b = b.t() if attrs.get("transB", 0) else b
    out = attrs.get("alpha", 1.0) * (a @ b)
    if c is not None:
        out = out + attrs.get("beta", 1.0) * c
    return [out]


@op("MatMul")
def _matmul(inputs, attrs, opset):
    return [torch.matmul(inputs[0], inputs[1])]


@op("Einsum")
def _einsum(inputs, attrs, opset):
    equation = attrs["equation"]
    return [torch.einsum(equation.decode() if isinstance(equation, bytes) else equation, *inputs)]


# ------------------------------------------------------------------------------------------------- normalization
@op("BatchNormalization")
def _batch_norm(inputs, attrs, opset):  # inference: the running statistics are frozen
    x, scale, bias, mean, var = inputs[:5]
    return [F.batch_norm(x, mean, var, scale, bias, training=False, eps=attrs.get("epsilon", 1e-5))]


@op("InstanceNormalization")
def _instance_norm(inputs, attrs, opset):
    x, scale, bias = inputs
    return [F.instance_norm(x, weight=scale, bias=bias, eps=attrs.get("epsilon", 1e-5))]


@op("LayerNormalization")
def _layer_norm(inputs, attrs, opset):
    x, scale, bias = inputs[0], inputs[1], _given(inputs, 2)
    axis = attrs.get("axis", -1) % x.dim()
    return [F.layer_norm(x, x.shape[axis:], scale, bias, eps=attrs.get("epsilon", 1e-5))]


# ------------------------------------------------------------------------------------------------- pooling
@op("GlobalAveragePool")
def _global_avg(inputs, attrs, opset):
    x = inputs[0]
    return [x.mean(dim=tuple(range(2, x.dim())), keepdim=True)]


@op("GlobalMaxPool")
def _global_max(inputs, attrs, opset):
    x = inputs[0]
    return [x.amax(dim=tuple(range(2, x.dim())), keepdim=True)]


def _pool_args(x, attrs):
    dims = x.dim() - 2
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides", [1] * dims))
    dilations = list(attrs.get("dilations", [1] * dims))
    return dims, kernel, strides, dilations, _spatial_pads(attrs, x, kernel, strides, dilations)


@op("MaxPool")
def _max_pool(inputs, attrs, opset):
    x = inputs[0]
    dims, kernel, strides, dilations, pads = _pool_args(x, attrs)
    fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[dims - 1]
    ceil = bool(attrs.get("ceil_mode", 0))
    if pads[:dims] != pads[dims:] or any(2 * p > k for p, k in zip(pads[:dims], kernel)):
        x, pads = F.pad(x, _torch_pad(pads), value=-math.inf), [0] * (2 * dims)
    return [fn(x, kernel, strides, pads[:dims], dilations, ceil_mode=ceil)]


@op("AveragePool")
def _avg_pool(inputs, attrs, opset):
    x = inputs[0]
    dims, kernel, strides, _, pads = _pool_args(x, attrs)
    fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[dims - 1]
    include = bool(attrs.get("count_include_pad", 0))
    ceil = bool(attrs.get("ceil_mode", 0))
    if pads[:dims] != pads[dims:]:
        if not include:
            raise NotImplementedError("AveragePool with uneven pads and count_include_pad=0")
        x, pads = F.pad(x, _torch_pad(pads)), [0] * (2 * dims)
    return [fn(x, kernel, strides, pads[:dims], ceil, count_include_pad=include)]


# ------------------------------------------------------------------------------------------------- reductions
def _reduce(fn_name: str):
    def run(inputs, attrs, opset):
        x = inputs[0]
        axes = attrs.get("axes")
        if axes is None and _given(inputs, 1) is not None:
            axes = _ints(inputs[1])
        keep = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.dim()))
        dims = tuple(int(a) % x.dim() for a in axes)
        if fn_name == "mean":
            return [x.mean(dim=dims, keepdim=keep)]
        if fn_name == "sum":
            return [x.sum(dim=dims, keepdim=keep)]
        if fn_name == "max":
            return [x.amax(dim=dims, keepdim=keep)]
        if fn_name == "min":
            return [x.amin(dim=dims, keepdim=keep)]
        if fn_name == "l2":
            return [x.pow(2).sum(dim=dims, keepdim=keep).sqrt()]
        raise AssertionError(fn_name)
    return run


for _name, _kind in (("ReduceMean", "mean"), ("ReduceSum", "sum"), ("ReduceMax", "max"), ("ReduceMin", "min"),
                     ("ReduceL2", "l2")):
    OPS[_name] = _reduce(_kind)


# ------------------------------------------------------------------------------------------------- shapes
@op("Reshape")
def _reshape(inputs, attrs, opset):
    x = inputs[0]
    shape = _ints(inputs[1]) if opset >= 5 else list(attrs["shape"])
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


@op("Flatten")
def _flatten(inputs, attrs, opset):
    x = inputs[0]
    axis = attrs.get("axis", 1) % (x.dim() or 1) if x.dim() else 0
    return [x.reshape(int(math.prod(x.shape[:axis])), -1)]


@op("Transpose")
def _transpose(inputs, attrs, opset):
    x = inputs[0]
    perm = attrs.get("perm", list(reversed(range(x.dim()))))
    return [x.permute(*perm)]


def _axes(inputs, attrs, opset, since: int) -> list[int] | None:
    if opset >= since:
        return _ints(inputs[1]) if _given(inputs, 1) is not None else None
    return list(attrs["axes"]) if "axes" in attrs else None


@op("Squeeze")
def _squeeze(inputs, attrs, opset):
    x = inputs[0]
    axes = _axes(inputs, attrs, opset, 13)
    if axes is None:
        return [x.squeeze()]
    return [x.squeeze(tuple(a % x.dim() for a in axes))]


@op("Unsqueeze")
def _unsqueeze(inputs, attrs, opset):
    x = inputs[0]
    axes = sorted(a % (x.dim() + len(_axes(inputs, attrs, opset, 13))) for a in _axes(inputs, attrs, opset, 13))
    for a in axes:
        x = x.unsqueeze(a)
    return [x]


@op("Concat")
def _concat(inputs, attrs, opset):
    return [torch.cat([t for t in inputs if t is not None], dim=attrs["axis"])]


@op("Split")
def _split(inputs, attrs, opset):
    x = inputs[0]
    axis = attrs.get("axis", 0)
    sizes = _ints(inputs[1]) if opset >= 13 and _given(inputs, 1) is not None else attrs.get("split")
    if sizes is None:
        count = attrs.get("num_outputs") or attrs["_outputs"]
        step = -(-x.shape[axis] // count)
        sizes = [min(step, x.shape[axis] - i * step) for i in range(count)]
    return list(torch.split(x, list(sizes), dim=axis))


@op("Slice")
def _slice(inputs, attrs, opset):
    x = inputs[0]
    if opset < 10:
        starts, ends = attrs["starts"], attrs["ends"]
        axes, steps = attrs.get("axes", list(range(len(starts)))), [1] * len(starts)
    else:
        starts, ends = _ints(inputs[1]), _ints(inputs[2])
        axes = _ints(inputs[3]) if _given(inputs, 3) is not None else list(range(len(starts)))
        steps = _ints(inputs[4]) if _given(inputs, 4) is not None else [1] * len(starts)
    index = [slice(None)] * x.dim()
    for start, end, axis, step in zip(starts, ends, axes, steps):
        size = x.shape[axis]
        if step < 0:  # torch slices forward only: flip, slice, and the result is already reversed
            rng = range(size)[slice(start, end, step)]
            idx = torch.tensor(list(rng), dtype=torch.long, device=x.device)
            x = x.index_select(axis % x.dim(), idx)
            continue
        index[axis % x.dim()] = slice(max(-size, min(start, size)) if start < 0 else min(start, size),
                                      max(-size - 1, min(end, size)) if end < 0 else min(end, size), step)
    return [x[tuple(index)]]


@op("Gather")
def _gather(inputs, attrs, opset):
    x, idx = inputs
    axis = attrs.get("axis", 0) % x.dim()
    idx = idx.long()
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    out = x.index_select(axis, idx.reshape(-1))
    return [out.reshape(*x.shape[:axis], *idx.shape, *x.shape[axis + 1:])]


@op("Expand")
def _expand(inputs, attrs, opset):
    x, shape = inputs[0], _ints(inputs[1])
    target = torch.broadcast_shapes(tuple(x.shape), tuple(shape))
    return [x.expand(target)]


@op("Tile")
def _tile(inputs, attrs, opset):
    return [inputs[0].repeat(*_ints(inputs[1]))]


@op("Pad")
def _pad(inputs, attrs, opset):
    x = inputs[0]
    if opset < 11:
        pads, value = list(attrs["pads"]), attrs.get("value", 0.0)
    else:
        pads = _ints(inputs[1])
        value = (_floats(inputs[2]) or [0.0])[0] if _given(inputs, 2) is not None else 0.0
        if _given(inputs, 3) is not None:
            axes = [a % x.dim() for a in _ints(inputs[3])]
            full = [0] * (2 * x.dim())
            for i, a in enumerate(axes):
                full[a], full[x.dim() + a] = pads[i], pads[len(axes) + i]
            pads = full
    mode = attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    torch_pads: list[int] = []
    for i in reversed(range(x.dim())):
        torch_pads += [pads[i], pads[x.dim() + i]]
    while len(torch_pads) > 2 and torch_pads[-2:] == [0, 0]:  # F.pad's non-constant modes pad only trailing dims
        torch_pads = torch_pads[:-2]
    torch_mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}[mode]
    return [F.pad(x, torch_pads, mode=torch_mode, value=value) if torch_mode == "constant"
            else F.pad(x, torch_pads, mode=torch_mode)]


@op("Shape")
def _shape(inputs, attrs, opset):
    shape = torch.tensor(list(inputs[0].shape), dtype=torch.int64)
    return [shape[attrs.get("start", 0):attrs.get("end", None)]]


@op("Size")
def _size(inputs, attrs, opset):
    return [torch.tensor(inputs[0].numel(), dtype=torch.int64)]


@op("ConstantOfShape")
def _constant_of_shape(inputs, attrs, opset):
    value = attrs.get("value")
    fill = value.reshape(-1)[0] if torch.is_tensor(value) else torch.tensor(0.0)
    return [torch.full(_ints(inputs[0]), fill.item(), dtype=fill.dtype)]


@op("Range")
def _range(inputs, attrs, opset):
    start, limit, delta = inputs
    return [torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)]


@op("Constant")
def _constant(inputs, attrs, opset):
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in attrs:
            value = attrs[key]
            return [value if torch.is_tensor(value) else torch.tensor(value)]
    raise NotImplementedError("Constant without a numeric value")


@op("Resize", "Upsample")
def _resize(inputs, attrs, opset):
    x = inputs[0]
    mode = attrs.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    transform = attrs.get("coordinate_transformation_mode", "half_pixel" if opset >= 11 else "asymmetric")
    transform = transform.decode() if isinstance(transform, bytes) else transform
    if opset < 10 or len(inputs) == 2:  # Upsample / Resize-10: (x, scales)
        scales, sizes = _floats(inputs[1]), None
    else:
        scales = _floats(inputs[2]) if _given(inputs, 2) is not None and inputs[2].numel() else None
        sizes = _ints(inputs[3]) if _given(inputs, 3) is not None and inputs[3].numel() else None
    spatial = x.dim() - 2
    if sizes is not None:
        out = sizes[-spatial:]
    else:
        if scales[:2] != [1.0, 1.0]:
            raise NotImplementedError("Resize over the batch or channel dims")
        out = [int(math.floor(x.shape[2 + i] * scales[2 + i])) for i in range(spatial)]
    if mode == "nearest":
        nearest = attrs.get("nearest_mode", "round_prefer_floor")
        nearest = nearest.decode() if isinstance(nearest, bytes) else nearest
        if transform == "asymmetric" and (nearest == "floor" or opset < 11):
            return [F.interpolate(x, size=out, mode="nearest")]
        if transform in ("half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn") and all(
                o % s == 0 for o, s in zip(out, x.shape[2:])):
            return [F.interpolate(x, size=out, mode="nearest-exact")]
        if transform == "asymmetric" and all(o % s == 0 for o, s in zip(out, x.shape[2:])):
            return [F.interpolate(x, size=out, mode="nearest")]  # integer factors: every mode picks the same
        raise NotImplementedError(f"Resize nearest with {transform} / {nearest}")
    if mode == "linear":
        torch_mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[spatial]
        if transform == "align_corners":
            return [F.interpolate(x, size=out, mode=torch_mode, align_corners=True)]
        if transform in ("half_pixel", "pytorch_half_pixel"):
            return [F.interpolate(x, size=out, mode=torch_mode, align_corners=False)]
        raise NotImplementedError(f"Resize linear with {transform}")
    raise NotImplementedError(f"Resize mode {mode}")


@op("DepthToSpace")
def _depth_to_space(inputs, attrs, opset):
    x = inputs[0]
    mode = attrs.get("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    block = attrs["blocksize"]
    if mode == "CRD":
        return [F.pixel_shuffle(x, block)]
    n, c, h, w = x.shape
    y = x.reshape(n, block, block, c // block ** 2, h, w).permute(0, 3, 4, 1, 5, 2)
    return [y.reshape(n, c // block ** 2, h * block, w * block)]


@op("SpaceToDepth")
def _space_to_depth(inputs, attrs, opset):
    x = inputs[0]
    block = attrs["blocksize"]
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // block, block, w // block, block).permute(0, 3, 5, 1, 2, 4)
    return [y.reshape(n, c * block * block, h // block, w // block)]
