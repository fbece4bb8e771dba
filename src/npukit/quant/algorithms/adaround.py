"""AdaRound (Nagel et al. 2020): learn whether each Conv/Gemm weight rounds up or down, layer by layer, on
calibration data, instead of rounding to nearest.

For a weight W on its int8 grid (scale s per output channel or per tensor, as ONNX Runtime derives it from W's
range; 7-bit [-64, 64] with ``reduce_range``), the rounded weight is W~ = s * clip(floor(W / s) + h(V), qmin, qmax),
h(V) = clip(sigmoid(V) * 1.2 - 0.1, 0, 1) the rectified sigmoid. V starts where h(V) equals the fractional part and
Adam (lr 1e-2 by default: the paper's 1e-3 is meant for 10-20k iterations, and barely moves V in the
~1000 we can afford on a CPU) minimises, over random batches of rows,

    mean_rows sum_channels (f(W x + b) - f(W~ x~ + b))^2  +  lambda * sum (1 - |2 h(V) - 1|^beta)

where x is the layer's input in the unmodified float model and x~ its input in a fake-quantized copy (every
calibrated activation through Q/DQ, every earlier layer already rounded): asymmetric reconstruction, so each layer
also absorbs the error that reaches it. f is the Relu or ReLU6 (constant-bound Clip) that alone reads the layer's
output, identity otherwise: what the activation cuts away never reaches the next layer, and fitting it would spend
the rounding on it. Measured on MobileNetV2 (ReLU6, 300 iterations, 42 calibration crops, 208 evaluation crops):
without f and with a target from the already-rounded model, AdaRound lowered the logits SQNR from 10.4 to 8.2 dB;
with both, it raises it to 18.2 dB (87.0% top-1 agreement) on 7-bit weights. On the pair-bounded grid that
``reduce_range`` now gives 1x1 convs (``npukit.quant.cpu.schemes``) nearest rounding with bias correction is as good
per-channel (18.8 dB either way); per-tensor AdaRound still adds 1.5 dB and 6 points of agreement.

The regulariser is off for the first 20% of the iterations (warm start), then beta anneals linearly from 20 to 2 and
drives h to 0 or 1; the final rounding is h = [V >= 0], kept only where it reconstructs the layer better than
nearest rounding on all collected rows. A row is one output position: an im2col column of a Conv (positions sampled
at random per calibration sample, per group for grouped convolutions), a whole input row of a Gemm.

The element that sets each channel's range (|W| = max) keeps nearest rounding, so the grid is unchanged. The rounded
weights are written back as floats exactly on the grid, and their scales and zero points are returned as the
quantization plan's weight specs (``npukit.quant.plan``), so ONNX Runtime's quantizer reproduces the learned integers. A layer with fewer
rows than weights per output channel is skipped (learned rounding would fit noise), with that reason.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

from npukit._threads import torch_threads
from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.quant.calibration.calibrate import iter_samples, with_outputs
from npukit.quant.cpu.schemes import PAIR_BOUNDED, pair_bounded_scale
from npukit.quant.grids import spec_qparams, weight_axis
from npukit.quant.nodes import node_attr
from npukit.quant.plan import QuantPlan, TensorSpec
from npukit.runtime.ort import make_session

ZETA, GAMMA = 1.1, -0.1  # stretch of the rectified sigmoid
BETA_START, BETA_END = 20.0, 2.0
WARM_START = 0.2
REG_WEIGHT = 0.01


@dataclasses.dataclass(frozen=True)
class WeightGrid:
    """The int8 grid of one weight, laid out as (groups, out per group, in per group): w = scale * (q - zero)."""

    scale: np.ndarray  # float32, broadcastable to the (g, o, k) weight
    qmin: int
    qmax: int


@dataclasses.dataclass(frozen=True)
class AdaRoundResult:
    """``model``: the input model with learned on-grid weights; ``weight_specs``: weight name -> its grid (scales,
    zero points 0, axis) for the quantization plan, which makes ORT reproduce the learned integers; ``layers``: per rounded
    layer {"node", "rows", "iterations", "mse_nearest", "mse_adaround", "flipped", "seconds"} (MSE of the layer
    output on all collected rows, against the float output); ``skipped``: {"node", "reason"}."""

    model: onnx.ModelProto
    weight_specs: dict[str, TensorSpec]
    layers: list[dict]
    skipped: list[dict]
    seconds: float

    def summary(self) -> dict:
        gain = [r["mse_nearest"] / r["mse_adaround"] for r in self.layers if r["mse_adaround"] > 0]
        return {"layers": len(self.layers), "skipped": len(self.skipped),
                "iterations": self.layers[0]["iterations"] if self.layers else 0,
                "median_mse_ratio_nearest_to_adaround": float(np.median(gain)) if gain else None,
                "seconds": round(self.seconds, 1)}


def _grouped(node: onnx.NodeProto, w: np.ndarray) -> tuple[np.ndarray, int]:
    """The weight as (groups, out per group, in per group) and the group count."""
    if node.op_type == "Gemm":
        mat = w if node_attr(node, "transB", 0) else w.T
        return mat[None], 1
    groups = node_attr(node, "group", 1)
    return w.reshape(groups, w.shape[0] // groups, -1), groups


def _ungrouped(node: onnx.NodeProto, wg: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Gemm":
        return wg[0] if node_attr(node, "transB", 0) else wg[0].T
    return wg.reshape(shape)


def weight_grid(wg: np.ndarray, spec: TensorSpec, *, pairs: bool = False) -> WeightGrid:
    """ONNX Runtime's symmetric grid for a (g, o, k) weight on the levels of its ``spec``, per channel when the spec
    has an axis: scale = 2 max|w| / (qmax - qmin), zero point 0; ``pairs``: the pair-bounded grid of
    ``npukit.quant.cpu.schemes`` (room for floor-or-ceil rounding of both weights)."""
    per_channel = spec.axis is not None
    if pairs:
        scale = pair_bounded_scale(wg, per_channel=per_channel, headroom=2)[..., None]
        return WeightGrid(scale=scale, qmin=-127, qmax=127)
    qmin, qmax = spec.quant_min, spec.quant_max
    absmax = np.abs(wg).max(axis=2, keepdims=True) if per_channel else np.abs(wg).max(keepdims=True)
    scale = (2.0 * absmax.astype(np.float64) / (qmax - qmin)).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    return WeightGrid(scale=np.broadcast_to(scale, wg.shape[:2] + (1,)).copy() if per_channel else scale,
                      qmin=qmin, qmax=qmax)


def _conv_geometry(node: onnx.NodeProto, kernel: tuple[int, ...]) -> tuple[list[int], ...]:
    """kernel, strides, dilations, pads (begin..., end...) of a Conv; ``kernel`` from its weight's shape."""
    kernel = list(kernel)
    return (kernel, list(node_attr(node, "strides", [1] * len(kernel))),
            list(node_attr(node, "dilations", [1] * len(kernel))), list(node_attr(node, "pads", [0] * 2 * len(kernel))))


def _rows(node: onnx.NodeProto, x: np.ndarray, groups: int, positions: np.ndarray | None,
          kernel: tuple[int, ...]) -> np.ndarray:
    """Layer input rows (n, g, k): im2col columns of a Conv at ``positions``, or the input rows of a Gemm."""
    if node.op_type == "Gemm":
        mat = x.reshape(x.shape[0], -1)
        return (mat.T if node_attr(node, "transA", 0) else mat)[:, None, :].astype(np.float32)
    kernel, strides, dilations, pads = _conv_geometry(node, kernel)
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    t = F.pad(t, (pads[1], pads[3], pads[0], pads[2]))
    cols = F.unfold(t, kernel_size=kernel, dilation=dilations, stride=strides)  # (1, C*kh*kw, L)
    cols = cols[0].numpy()
    if positions is not None:
        cols = cols[:, positions]
    return cols.T.reshape(cols.shape[1], groups, -1)


def _positions(node: onnx.NodeProto, x_shape: tuple[int, ...], per_sample: int, rng: np.random.Generator,
               kernel: tuple[int, ...]) -> np.ndarray | None:
    if node.op_type == "Gemm":
        return None
    kernel, strides, dilations, pads = _conv_geometry(node, kernel)
    count = 1
    for i, k in enumerate(kernel):
        size = x_shape[2 + i] + pads[i] + pads[i + len(kernel)]
        count *= (size - dilations[i] * (k - 1) - 1) // strides[i] + 1
    return np.sort(rng.choice(count, size=min(count, per_sample), replace=False))


def fake_quantized_model(model: onnx.ModelProto, plan: QuantPlan) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of ``model`` in which each activation the plan puts on an 8-bit grid goes through QuantizeLinear ->
    DequantizeLinear with that grid's parameters before any node reads it; returns it and tensor -> its
    fake-quantized name."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    renamed: dict[str, str] = {}
    extra_nodes, extra_inits = [], []
    for k, (name, spec) in enumerate(plan.activation_grids(bits=8).items()):
        scale, zero = spec_qparams(spec)
        extra_inits += [numpy_helper.from_array(scale, f"npukit_ar_s{k}"), numpy_helper.from_array(zero, f"npukit_ar_z{k}")]
        extra_nodes += [helper.make_node("QuantizeLinear", [name, f"npukit_ar_s{k}", f"npukit_ar_z{k}"], [f"npukit_ar_q{k}"]),
                        helper.make_node("DequantizeLinear", [f"npukit_ar_q{k}", f"npukit_ar_s{k}", f"npukit_ar_z{k}"],
                                         [f"npukit_ar_dq{k}"])]
        renamed[name] = f"npukit_ar_dq{k}"
    for node in out.graph.node:
        for i, t in enumerate(node.input):
            if t in renamed:
                node.input[i] = renamed[t]
    index = GraphIndex(out.graph)
    # place each Q/DQ pair right after its producer so the graph stays topologically sorted
    after: dict[int, list[onnx.NodeProto]] = {}
    for q, dq in zip(extra_nodes[::2], extra_nodes[1::2]):
        source = q.input[0]
        after.setdefault(-1 if source in index.inputs else index.producer[source], []).extend([q, dq])
    ordered = after.get(-1, [])
    for i, n in enumerate(index.nodes):
        ordered.append(n)
        ordered.extend(after.get(i, []))
    del out.graph.node[:]
    out.graph.node.extend(ordered)
    out.graph.initializer.extend(extra_inits)
    return out, renamed


def _needed(model: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """A copy of ``model`` cut down to the nodes ``output`` depends on, with ``output`` as its only output."""
    index = GraphIndex(model.graph)
    keep: set[int] = set()
    stack = [output]
    seen: set[str] = set()
    while stack:
        t = stack.pop()
        if t in seen or t not in index.producer:
            continue
        seen.add(t)
        keep.add(index.producer[t])
        stack.extend(i for i in index.nodes[index.producer[t]].input if i)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [n for i, n in enumerate(index.nodes) if i in keep]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    del out.graph.output[:]
    used = {i for n in kept for i in n.input}
    inits = [i for i in out.graph.initializer if i.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    return with_outputs(out, [output])


def _collect(model: onnx.ModelProto, tensor: str, samples: Iterable[object]) -> list[np.ndarray]:
    # no graph optimizations: even ORT's basic level rewrites Q/DQ pairs (measured: 35 dB apart on the tiny test
    # CNN), and the fake-quantized model must compute exactly what its Q/DQ nodes say
    session = make_session(_needed(model, tensor), optimization="disable")
    return [session.run(None, feeds)[0] for feeds in iter_samples(model, samples)]


def _h(v: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def _learn(w: np.ndarray, grid: WeightGrid, xf: np.ndarray, xq: np.ndarray, bias: np.ndarray, *,
           per_channel: bool, iterations: int, batch_rows: int, learning_rate: float, seed: int,
           clip: tuple[float, float] | None = None) -> tuple[np.ndarray, dict]:
    """Learned integer weights (g, o, k) and the layer's MSE with nearest and with learned rounding. ``clip``: the
    bounds of the activation that follows the layer (Relu: (0, inf), ReLU6: (0, 6)); the error is measured after it,
    since what the activation cuts away never reaches the next layer."""
    lo, hi = clip if clip is not None else (-math.inf, math.inf)

    def act(t: torch.Tensor) -> torch.Tensor:
        return t.clamp(lo, hi) if clip is not None else t

    gen = torch.Generator().manual_seed(seed)
    wt = torch.from_numpy(w.astype(np.float32))
    scale = torch.from_numpy(grid.scale)
    xf_t, xq_t = torch.from_numpy(xf), torch.from_numpy(xq)
    b = torch.from_numpy(bias.astype(np.float32)).reshape(1, *w.shape[:2])
    with torch.no_grad():
        target = act(torch.einsum("ngk,gok->ngo", xf_t, wt) + b)
    ratio = wt / scale
    floor = torch.floor(ratio)
    rest = ratio - floor
    absmax = wt.abs().amax(dim=2, keepdim=True) if per_channel else wt.abs().max()
    frozen = wt.abs() >= absmax  # the element(s) setting the range keep nearest rounding: the grid stays put
    nearest = torch.clamp(torch.round(ratio), grid.qmin, grid.qmax)
    p = ((rest - GAMMA) / (ZETA - GAMMA)).clamp(1e-4, 1 - 1e-4)
    v = torch.log(p / (1 - p)).requires_grad_(True)
    moment1, moment2 = torch.zeros_like(v), torch.zeros_like(v)
    rows = xq_t.shape[0]
    warm = int(WARM_START * iterations)

    def rounded(h: torch.Tensor) -> torch.Tensor:
        q = torch.where(frozen, nearest, torch.clamp(floor + h, grid.qmin, grid.qmax))
        return q * scale

    for it in range(iterations):
        idx = torch.randint(rows, (min(batch_rows, rows),), generator=gen)
        h = _h(v)
        pred = act(torch.einsum("ngk,gok->ngo", xq_t[idx], rounded(h)) + b)
        loss = (pred - target[idx]).pow(2).sum(dim=(1, 2)).mean()
        if it >= warm:
            rel = (it - warm) / max(1, iterations - warm)
            beta = BETA_START + (BETA_END - BETA_START) * rel
            reg = (1 - (2 * h[~frozen] - 1).abs().pow(beta)).sum()
            loss = loss + REG_WEIGHT * reg
        (grad,) = torch.autograd.grad(loss, v)
        with torch.no_grad():  # Adam (betas 0.9, 0.999)
            moment1.mul_(0.9).add_(grad, alpha=0.1)
            moment2.mul_(0.999).addcmul_(grad, grad, value=0.001)
            step = (moment1 / (1 - 0.9 ** (it + 1))) / ((moment2 / (1 - 0.999 ** (it + 1))).sqrt() + 1e-8)
            v.sub_(learning_rate * step)
    with torch.no_grad():
        hard = (v >= 0).to(wt.dtype)
        q = torch.where(frozen, nearest, torch.clamp(floor + hard, grid.qmin, grid.qmax))

        def mse(qint: torch.Tensor) -> float:
            err = act(torch.einsum("ngk,gok->ngo", xq_t, qint * scale) + b) - target
            return float(err.pow(2).sum(dim=(1, 2)).mean())

        before, after = mse(nearest), mse(q)
        if after > before:  # the relaxation did not settle to a better hard rounding: keep nearest
            q, after = nearest, before
        stats = {"mse_nearest": before, "mse_adaround": after, "flipped": float((q != nearest).float().mean())}
    return q.numpy().astype(np.int64), stats


def adaround(model: onnx.ModelProto, samples: Iterable[object], *, plan: QuantPlan, iterations: int = 300,
             limit: int | None = None, rows: int = 8192, batch_rows: int = 512, learning_rate: float = 1e-2,
             seed: int = 0) -> AdaRoundResult:
    """Learned rounding for every Conv/Gemm of ``model`` with an initializer weight that ``plan`` quantizes, in graph
    order, over the first ``limit`` samples (all when None).

    The plan gives each weight its grid (``QuantPlan.weight_spec``; a weight it bounds pair by pair,
    ``PAIR_BOUNDED``, takes the pair-bounded grid with room for rounding up) and the activations' 8-bit grids, for
    the fake-quantized inputs x~; ``iterations``: per layer; ``rows``: input rows kept per layer over all samples;
    ``batch_rows``: rows per Adam step; ``learning_rate``: Adam's.
    """
    if not plan.symmetric_weights:
        raise InputError("AdaRound needs symmetric weights", hint="drop symmetric_weights=False or adaround")
    if iterations < 1 or rows < 1 or batch_rows < 1:
        raise InputError("AdaRound iterations, rows and batch_rows must be at least 1")
    start = time.perf_counter()
    samples = list(iter_samples(model, samples, limit=limit))
    with torch_threads(1):  # small matrices: one thread is several times faster than two on a busy machine
        return _adaround(model, samples, plan=plan, iterations=iterations, rows=rows, batch_rows=batch_rows,
                         learning_rate=learning_rate, seed=seed, start=start)


def _adaround(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]], *, plan: QuantPlan, iterations: int,
              rows: int, batch_rows: int, learning_rate: float, seed: int, start: float) -> AdaRoundResult:
    work = onnx.ModelProto()
    work.CopyFrom(model)
    work_index = GraphIndex(work.graph)  # the weights change in place below: no node or initializer is added
    inits = work_index.initializers
    targets, skipped = [], []
    for node in work_index.nodes:
        if node.op_type not in ("Conv", "Gemm"):
            continue
        if node.name in plan.float_nodes:
            skipped.append({"node": node.name, "reason": "excluded from quantization"})
        elif len(node.input) < 2 or node.input[1] not in inits or len(work_index.consumer_nodes(node.input[1])) != 1:
            skipped.append({"node": node.name, "reason": "weight is not an initializer of this node alone"})
        elif node.op_type == "Conv" and len(inits[node.input[1]].dims) != 4:
            skipped.append({"node": node.name, "reason": "only 2-D convolutions are supported"})
        else:
            targets.append(node)
    fq, renamed = fake_quantized_model(work, plan)
    fq_inits = GraphIndex(fq.graph).initializers
    rng = np.random.default_rng(seed)
    overrides: dict[str, TensorSpec] = {}
    layers = []
    for index, node in enumerate(targets):
        t0 = time.perf_counter()
        w = numpy_helper.to_array(inits[node.input[1]])
        wg, groups = _grouped(node, w)
        if node.op_type == "Gemm" and node_attr(node, "transA", 0):
            skipped.append({"node": node.name, "reason": "Gemm with transA is not supported"})
            continue
        xs_float = _collect(model, node.input[0], samples)  # the float model's input: the true target
        x_name = renamed.get(node.input[0], node.input[0])
        xs_quant = _collect(fq, x_name, samples)
        per_sample = max(1, math.ceil(rows / len(samples)))
        xf_parts, xq_parts = [], []
        for xf, xq in zip(xs_float, xs_quant):
            pos = _positions(node, xf.shape, per_sample, rng, w.shape[2:])
            xf_parts.append(_rows(node, xf, groups, pos, w.shape[2:]))
            xq_parts.append(_rows(node, xq, groups, pos, w.shape[2:]))
        xf_rows, xq_rows = np.concatenate(xf_parts), np.concatenate(xq_parts)
        if xf_rows.shape[0] < wg.shape[2]:
            skipped.append({"node": node.name, "reason": f"{xf_rows.shape[0]} input rows for {wg.shape[2]} weights "
                            "per output channel: learned rounding would fit noise (give more calibration samples)"})
            continue
        bias = np.zeros(wg.shape[:2], np.float32)
        if len(node.input) > 2 and node.input[2] in inits:
            b = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32)
            if node.op_type == "Gemm":
                b = b * node_attr(node, "beta", 1.0)
            bias = np.broadcast_to(b.reshape(-1), (wg.shape[0] * wg.shape[1],)).reshape(wg.shape[:2])
        spec = plan.weight_spec(node.input[1], weight_axis(node, per_channel=True))
        per_channel = spec.axis is not None
        grid = weight_grid(wg, spec, pairs=PAIR_BOUNDED in plan.provenance(node.input[1]))
        q, stats = _learn(wg, grid, xf_rows, xq_rows, bias, per_channel=per_channel, iterations=iterations,
                          batch_rows=batch_rows, learning_rate=learning_rate,
                          seed=seed + index, clip=_following_clip(work, node))
        new_w = _ungrouped(node, (q * grid.scale).astype(np.float32), w.shape)
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(new_w, node.input[1]))
        fq_inits[node.input[1]].CopyFrom(numpy_helper.from_array(new_w, node.input[1]))
        overrides[node.input[1]] = TensorSpec.fixed_weight(grid.scale, axis=spec.axis)
        layers.append({"node": node.name, "rows": int(xf_rows.shape[0]), "iterations": iterations, **stats,
                       "seconds": round(time.perf_counter() - t0, 2)})
    return AdaRoundResult(model=work, weight_specs=overrides, layers=layers, skipped=skipped,
                          seconds=time.perf_counter() - start)


def _following_clip(model: onnx.ModelProto, node: onnx.NodeProto) -> tuple[float, float] | None:
    """(lo, hi) of the Relu or constant-bound Clip that alone reads ``node``'s output, else None."""
    index = GraphIndex(model.graph)
    readers = index.consumer_nodes(node.output[0])
    if len(readers) != 1 or node.output[0] in index.outputs:
        return None
    act = readers[0]
    if act.op_type == "Relu":
        return (0.0, math.inf)
    if act.op_type != "Clip":
        return None
    bounds = []
    for position, default in ((1, -math.inf), (2, math.inf)):
        name = act.input[position] if len(act.input) > position else ""
        if not name:
            bounds.append(default)
            continue
        value = numpy_helper.to_array(index.initializers[name]) if name in index.initializers else None
        if value is None or value.size != 1:
            return None  # bounds computed at run time
        bounds.append(float(value))
    return (bounds[0], bounds[1])
