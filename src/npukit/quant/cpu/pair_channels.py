"""Channel pairing: reorder channels so that the weight pairs ONNX Runtime's AVX2 kernels add together are unequal.

Without VNNI, MLAS's u8 x s8 kernels add the products of input channels 2j and 2j + 1 in a saturating 16-bit lane,
so a 1x1 Conv's or a Gemm's weights take the pair-bounded grid (``npukit.quant.cpu.schemes``): each output channel's
scale is set by its largest pair sum |w_2j| + |w_2j+1|, not by its largest weight. Which channels share a pair is
only the order of the channels in the activation, and that order is free: reordering the output channels of the
layers that write an activation (and of the depthwise Convs, Clips, Relus and residual Adds it passes through) and
the input channels of the layers that read it leaves the float model's function unchanged. A good order pairs each
large weight with a small one, so the pair sums, and with them the scales, shrink towards the largest single
weight: the full 8-bit grid on the same fast kernels.

The order is chosen per group of channel-linked activations (``find_stream_groups(permutation=True)``) from the
pair-bounded layers that read the group. With a_rc = |w_rc| / max_c |w_rc| for each output channel r of each such
layer (per tensor: divided by the tensor's largest weight) and M_r that row's largest pair sum so far (starting
at 1, its largest weight), the channels are taken in decreasing order of their largest a_rc, each paired with the
free channel d that least raises sum_r log max(M_r, a_rc + a_rd), the sum of the rows' log scales, which is what
the rows' weight quantization noise follows. A group keeps the new order only where that sum falls; it is reported
per group, with the median ratio of the new scales to the old.

Measured on MobileNetV2 (official weights, 42 calibration and 208 evaluation photo crops, reduce_range):

- weights quantized (nearest rounding, after CLE and activation equalization), activations in float: logits SQNR
  15.0 dB in the original channel order, 17.1 dB after pairing, 18.0 dB with every weight on its full 8-bit grid
  (which these kernels cannot run exactly). The projection Convs (expanded channels, through the depthwise Conv)
  get scales 0.74-0.85x the old (median), the expansion Convs (residual streams, few channels) 0.95-0.98x.
- whole int8 model, per channel: auto calibration 13.9 -> 15.5 dB, minmax 10.3 -> 11.1 dB, CLE + activation
  equalization 13.7 -> 15.6 dB; top-1 agreement within a point either way. With bias correction, nothing: 18.8 ->
  18.5 dB (and 19.6 -> 19.1 dB with the range search after it), inside the spread that changes of no consequence
  cause on these crops. With the activations' rounding taken out of those models (weights and clipping only)
  it is 23.6 vs 23.5 dB, so after bias correction the weights' remaining error does not shrink with finer scales:
  likely because the correction removes each channel's mean output error, and a rounding error on inputs that are
  all positive (ReLU6) acts largely as such a mean. So ``quantize`` pairs only per-channel weights without bias
  correction (``pairing_pays``).
- per tensor: no gain (auto 8.4 -> 8.2 dB, minmax 6.9 -> 6.5 dB): the one tensor scale follows the single largest
  pair of the whole weight, and the error is the small channels' few levels, which pairing does not change.

Where rows x free channels exceed ``EXACT_LIMIT``, each step computes the exact cost only for a shortlist of
``SHORTLIST`` partners, those overlapping least with c on the rows where c is large: 99% of the exact matching's
drop in the log-scale sum on MobileNetV2. Pairing takes 4 s there (25 groups) and 6 s on ResNet50 (21 groups, up to
2048 channels read by 2000 rows), the float outputs within 8e-7 relative of the original's on both and on ResNet18,
RegNetY-400MF and EfficientNet-B0.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import numpy_helper

from npukit.frontend.graph_index import GraphIndex
from npukit.quant.algorithms.stream_equalize import StreamGroup, channel_axis, find_stream_groups
from npukit.quant.config import QuantConfig
from npukit.quant.cpu.schemes import is_depthwise, largest_pair_sums, pair_bounded, weight_rows
from npukit.quant.nodes import node_attr


@dataclasses.dataclass(frozen=True)
class PairChannelsResult:
    """``model``: a copy with the channels reordered; ``groups``: per reordered group its producers, consumers,
    channels, log-scale sum before and after and median new/old scale ratio; ``skipped``: {"seed", "reason"}."""

    model: onnx.ModelProto
    groups: list[dict]
    skipped: list[dict]

    def summary(self) -> dict:
        ratios = [g["median_scale_ratio"] for g in self.groups]
        return {"groups": len(self.groups), "skipped": len(self.skipped),
                "median_scale_ratio": float(np.median(ratios)) if ratios else 1.0}


EXACT_LIMIT = 300_000  # rows x free channels up to which every partner's exact cost is computed at each step
SHORTLIST = 64  # above it, only the partners with the least overlap sum_r a_rc a_rd / level_r^2 (over the rows
#                where a_rc > level_r / 2) get it


def pairing_pays(config: QuantConfig) -> bool:
    """Whether ``quantize`` pairs channels under ``config``: asked for (the default), on the pair-bounded grid
    (``reduce_range``, symmetric weights), per channel, and without bias correction (see the module docstring)."""
    return (config.cpu.pair_channels and config.cpu.reduce_range and config.scheme.symmetric_weights
            and config.scheme.per_channel and not config.recipe.bias_correction)


def greedy_pairing(a: np.ndarray) -> np.ndarray:
    """A channel order for the (rows, K) normalized magnitudes ``a``: channels at positions 2j and 2j + 1 form a
    pair (module docstring). An odd K leaves the last channel alone, as the kernels pair it with nothing."""
    rows, k = a.shape
    padded = np.asarray(a, np.float32)  # float32 halves the time of the cost evaluations
    if k % 2:
        padded = np.concatenate([padded, np.zeros((rows, 1), np.float32)], axis=1)
    columns = np.ascontiguousarray(padded.T)  # channel-major: one channel's magnitudes are contiguous
    level = np.maximum(padded.max(axis=1), np.float32(1e-12))
    free = np.ones(padded.shape[1], dtype=bool)
    pairs: list[tuple[int, int]] = []
    for c in np.argsort(-padded.max(axis=0), kind="stable"):
        if not free[c]:
            continue
        free[c] = False
        candidates = np.flatnonzero(free)
        if candidates.size > SHORTLIST and candidates.size * rows > EXACT_LIMIT:
            hot = np.flatnonzero(columns[c] > 0.5 * level)  # the rows where c can raise the level
            overlap = (columns[c, hot] / level[hot] ** 2) @ padded[hot]
            candidates = candidates[np.argpartition(overlap[candidates], SHORTLIST)[:SHORTLIST]]
        sums = columns[c] + columns[candidates]
        cost = np.log(np.maximum(sums / level, np.float32(1.0))).sum(axis=1)
        d = int(candidates[np.argmin(cost)])
        free[d] = False
        level = np.maximum(level, columns[c] + columns[d])
        pairs.append((int(c), d))
    order: list[int] = []
    alone: list[int] = []  # the channel paired with the padding (index k) goes last
    for c, d in pairs:
        if k in (c, d):
            alone.append(d if c == k else c)
        else:
            order += [c, d]
    return np.array(order + alone, dtype=np.int64)


def pair_scales(rows: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Each row's largest pair sum when the K columns of ``rows`` are read in ``order`` (None: as they are)."""
    return largest_pair_sums(rows if order is None else np.asarray(rows)[:, order])


def _scales(rows: np.ndarray, order: np.ndarray | None, per_channel: bool) -> np.ndarray:
    """The pair-bounded scales (up to the constant 1 / 127) of one layer: per row, or its one tensor scale."""
    s = np.maximum(pair_scales(rows, order), 1e-30)
    return s if per_channel else s.max(keepdims=True)


def _log_scales(rows: list[np.ndarray], order: np.ndarray | None, per_channel: bool) -> float:
    """Sum of log scales over every output channel of every layer (per tensor: the tensor scale, once per row)."""
    return float(sum(np.log(_scales(r, order, per_channel)).sum() * (1 if per_channel else r.shape[0])
                     for r in rows))


def pair_channels(model: onnx.ModelProto, config: QuantConfig) -> PairChannelsResult:
    """Reorder the channels of every group that pair-bounded layers read (a copy; see the module docstring)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    groups, skipped = find_stream_groups(out, permutation=True)
    index = GraphIndex(out.graph)  # inits and uses are kept in step by hand as parameters are copied below
    nodes = {n.name: n for n in index.nodes}
    inits = index.initializers
    uses = {name: len(slots) for name, slots in index.consumers.items()}  # input slots reading each tensor
    rows_out: list[dict] = []
    for g in groups:
        readers = [nodes[c] for c in g.consumers
                   if pair_bounded(nodes[c], tuple(inits[nodes[c].input[1]].dims), config)]
        if not readers:
            continue
        reason = _unsupported(g, nodes, inits)
        if reason:
            skipped.append({"seed": g.producers[0] if g.producers else g.consumers[0], "reason": reason})
            continue
        rows = [weight_rows(n, numpy_helper.to_array(inits[n.input[1]]).astype(np.float64)) for n in readers]
        per_channel = config.scheme.per_channel
        norm = [np.abs(r) / np.maximum(np.abs(r).max(axis=1 if per_channel else None, keepdims=True), 1e-30)
                for r in rows]
        order = greedy_pairing(np.concatenate(norm, axis=0))
        before = _log_scales(rows, None, per_channel)
        after = _log_scales(rows, order, per_channel)
        if after >= before:
            continue
        ratio = np.concatenate([_scales(r, order, per_channel) / _scales(r, None, per_channel) for r in rows])
        _own_parameters(out, g, nodes, inits, uses)
        _reorder(g, order, nodes, inits)
        rows_out.append({"producers": list(g.producers), "consumers": list(g.consumers),
                         "channelwise": list(g.channelwise), "channels": int(order.size),
                         "log_scale_before": before, "log_scale_after": after,
                         "median_scale_ratio": float(np.median(ratio))})
    return PairChannelsResult(model=out, groups=rows_out, skipped=skipped)


def _unsupported(g: StreamGroup, nodes: dict, inits: dict) -> str:
    """Why ``g`` cannot be reordered in place ("" when it can)."""
    for name in (*g.producers, *g.channelwise, *g.consumers):
        node = nodes[name]
        params = [t for t in node.input[1:3] if t]
        if any(t not in inits for t in params):
            return f"{node.op_type} {name} has a computed weight or bias"
    for name in g.producers:
        node = nodes[name]
        if node.op_type == "Conv" and node_attr(node, "group", 1) != 1 \
                and not is_depthwise(node, inits[node.input[1]].dims):
            return f"grouped Conv {name} writes the group: its output channels cannot move between groups"
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] \
                and len(inits[node.input[2]].dims) == 2 and inits[node.input[2]].dims[0] != 1:
            return f"Gemm {name} has a per-row bias"
    return ""


def _own_parameters(model: onnx.ModelProto, g: StreamGroup, nodes: dict, inits: dict, uses: dict[str, int]) -> None:
    """Give each node of ``g`` its own copy of a weight or bias it shares with another node (exporters merge equal
    constants), so reordering it changes nothing else."""
    for name in (*g.producers, *g.channelwise, *g.consumers):
        node = nodes[name]
        for i in (1, 2):
            t = node.input[i] if len(node.input) > i else ""
            if not t or uses.get(t, 0) <= 1:
                continue
            copy = f"{t}__{name}"
            model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(inits[t]), copy))
            inits[copy] = model.graph.initializer[-1]
            uses[t] -= 1
            uses[copy] = 1
            node.input[i] = copy


def _reorder(g: StreamGroup, order: np.ndarray, nodes: dict, inits: dict) -> None:
    def take(name: str, axis: int) -> None:
        value = numpy_helper.to_array(inits[name])
        if value.ndim == 0 or value.shape[axis] == 1:
            return  # a broadcast bias is the same for every channel
        inits[name].CopyFrom(numpy_helper.from_array(np.take(value, order, axis=axis), name))

    for name in (*g.producers, *g.channelwise):
        node = nodes[name]
        take(node.input[1], channel_axis(node, output=True))
        if len(node.input) > 2 and node.input[2]:
            take(node.input[2], -1)
    for name in g.consumers:
        node = nodes[name]
        take(node.input[1], channel_axis(node, output=False))
