"""How far past the stem a model stays in float on this CPU: the longest prefix of the stem's chain of convolutions
that ONNX Runtime runs fastest, timed here.

The float head timed here (``FloatHead()``, ``--float-stem``) leaves the stem (a Conv with a short reduction over the
float input, ``schemes.stem_convs``) in float because ORT's int8 kernel is slower there. The convolutions right after
it are often no better: they run at the network's largest spatial size with few channels, where MLAS's NHWC int8
kernels gain least, and the place the model crosses from float to int8 pays a layout change and a QuantizeLinear over
the whole tensor it crosses at.
Measured on MobileNetV2 (ORT profile, 1 thread, Intel Xeon with AVX-512 VNNI): the first depthwise conv (32
channels, 112 x 112) takes 226 us as QLinearConv against 142 us in float; the crossing after the stem (NCHWc ->
NCHW reorder, QuantizeLinear, NCHW -> NHWC transpose of a 32 x 112 x 112 tensor) 200 us; the pointwise conv after
the depthwise one, 32 -> 16 channels, is faster in int8 (58 against 94 us) but moving the crossing past it halves
the tensor crossed. The 16 -> 96 expansion after that is 2.2x faster in int8. Which prefix wins depends on the CPU
and the shapes, so it is timed rather than modelled: each candidate prefix is built with quick ranges (min-max on
one sample; latency does not depend on the ranges) and all are timed interleaved (1 thread, ratios to the stem-only
model paired round by round, ``latency.paired_ratio``). The longest prefix not clearly slower than the fastest wins:
every convolution left in float also drops its own rounding and that of the tensor it writes, so a tie goes to
accuracy. "Clearly slower": more than ``NOISE`` slower than the fastest prefix (the one of lowest median ratio) in
at least ``SLOWER_ROUNDS`` of the 20 rounds, a one-sided sign test at p = 0.021. Before (2026-12-04) the longest
prefix whose median ratio lay within ``NOISE`` of the fastest won, and a prefix whose true cost sat near that bound
won in one run and lost in the next: MobileNetV2's third conv measured 1.4% and 2.1% slower than the second in two
runs on an AMD EPYC, so its default INT8 model kept two or three convs in float (81.7% or 85.1% top-1 agreement on
208 crops, 17.0 or 18.6 dB); timed four times on a loaded host, the median rule picked 2, 2, 3, 3 and the sign test
3, 3, 3, 3 (the fourth conv, 6-14% slower, clearly slower in 17-18 of 20 rounds every time).

The chain: from the stem's output, a tensor with exactly one consumer (and not a graph output), through unary
activations (which ORT fuses into a float Conv), to the next Conv with a constant weight, whose output must feed
something other than the graph's outputs (the model's tail stays quantized); at most ``MAX_CONVS`` convolutions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from npukit.measure.latency import paired_ratio, round_ratios, time_sessions_interleaved
from npukit.passes._rewrite import producer_of, sole_consumer
from npukit.runtime.ort import make_session

MAX_CONVS = 4  # the stem and at most three convolutions after it
ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh"})
TIMING = {"threads": 1, "warmup": 5, "runs": 200, "rounds": 20}  # interleaved; ratios paired by round
# How much slower than the fastest prefix a round must show a prefix to count against it, and in how many of the 20
# rounds (P(at least 15 of 20 fair coin flips) = 0.021).
NOISE = 0.02
SLOWER_ROUNDS = 15


def stem_chain(model: onnx.ModelProto, stem: str, *, max_convs: int = MAX_CONVS) -> list[str]:
    """The Convs of ``stem``'s chain (the module docstring), ``stem`` first; ``[stem]`` where nothing follows it."""
    graph = ir.serde.deserialize_model(model).graph
    node = next(n for n in graph if n.name == stem)
    chain = [stem]
    while len(chain) < max_convs:
        nxt = sole_consumer(node.outputs[0])
        while nxt is not None and nxt.op_type in ACTIVATIONS:
            nxt = sole_consumer(nxt.outputs[0])
        if nxt is None or nxt.op_type != "Conv" or not _constant(nxt.inputs[1] if len(nxt.inputs) > 1 else None):
            break
        if nxt.outputs[0].is_graph_output() or not nxt.outputs[0].uses():
            break
        chain.append(nxt.name)
        node = nxt
    return chain


def _constant(value: ir.Value | None) -> bool:
    return value is not None and (value.is_initializer() or producer_of(value, "Constant") is not None)


@dataclasses.dataclass(frozen=True)
class HeadChoice:
    """``nodes``: the Convs left in float (the stem first); ``ratios``: each timed prefix length -> its latency over
    the stem-only model's (empty when the chain is the stem alone: nothing to time)."""

    nodes: tuple[str, ...]
    chain: tuple[str, ...]
    ratios: dict[int, float]
    slower_rounds: dict[int, int] = dataclasses.field(default_factory=dict)  # rounds clearly slower than the fastest

    def summary(self) -> dict:
        return {"nodes": list(self.nodes), "chain": list(self.chain), "noise": NOISE,
                "latency_ratio_to_stem_only": {str(k): round(v, 4) for k, v in self.ratios.items()},
                "rounds_over_noise_of_fastest": {str(k): v for k, v in self.slower_rounds.items()},
                "slower_rounds_needed": SLOWER_ROUNDS}


def slower_rounds(per_round: Mapping[int, Sequence[float]], *, noise: float = NOISE) -> dict[int, int]:
    """Per prefix length, the rounds in which its ratio (to the stem alone, ``per_round``) was more than ``noise``
    above that of the fastest prefix (the lowest median ratio) in the same round."""
    medians = {k: float(np.median(v)) for k, v in per_round.items()}
    best = np.asarray(per_round[min(medians, key=lambda k: (medians[k], k))], np.float64)
    return {k: int(np.sum(np.asarray(v, np.float64) > best * (1.0 + noise))) for k, v in per_round.items()}


def pick_prefix(per_round: Mapping[int, Sequence[float]], *, noise: float = NOISE,
                needed: int = SLOWER_ROUNDS) -> int:
    """The longest prefix length not clearly slower than the fastest: more than ``noise`` slower in fewer than
    ``needed`` rounds (``slower_rounds``)."""
    counts = slower_rounds(per_round, noise=noise)
    return max(k for k, n in counts.items() if n < needed)


def choose_float_head(model: onnx.ModelProto, stem: str, feeds: dict[str, np.ndarray],
                      build: Callable[[tuple[str, ...]], onnx.ModelProto], *,
                      keep: frozenset[str] = frozenset()) -> HeadChoice:
    """Time ``build(prefix)`` (the model quantized with ``prefix`` left in float) for every prefix of ``stem``'s
    chain on ``feeds`` and pick one (``pick_prefix``). The chain ends before the first node in ``keep`` (ones the
    caller wants quantized, e.g. its 16-bit nodes)."""
    chain: tuple[str, ...] = ()
    for node in stem_chain(model, stem):
        if node in keep:
            break
        chain += (node,)
    if len(chain) == 1:
        return HeadChoice(nodes=chain, chain=chain, ratios={})
    sessions = {k: make_session(build(chain[:k])) for k in range(1, len(chain) + 1)}
    times = time_sessions_interleaved(sessions, feeds=feeds, **TIMING)
    ratios = {k: paired_ratio(times[1], times[k], rounds=TIMING["rounds"]) for k in sessions}
    per_round = {k: round_ratios(times[1], times[k], rounds=TIMING["rounds"]) for k in sessions}
    return HeadChoice(nodes=chain[:pick_prefix(per_round)], chain=chain, ratios=ratios,
                      slower_rounds=slower_rounds(per_round))
