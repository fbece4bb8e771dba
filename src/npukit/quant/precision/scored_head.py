"""How far past the stem a model stays in float for a runtime this machine cannot time as it will run: the prefix of
each stem's chain whose quantized model scores best, among the prefixes within a share of the model's MACs.

On ONNX Runtime's CPU kernels the float head is timed here (``npukit.quant.cpu.float_head``): the stem and the
convolutions after it stay in float as far as that is not slower. For XNNPACK on a phone (ExecuTorch, LiteRT) this
machine's timing says nothing, but the reason to keep a head in float holds everywhere: the first layers of an image
model work on the largest tensors with the fewest channels, where 8-bit rounding costs the outputs most. Measured on
MobileNetV2 (npukit's XNNPACK plan, int8 activations; 208 held-out photo crops, the QDQ model on the Q/DQ graph's own
arithmetic): every conv quantized 82.2% top-1 agreement / 18.3 dB; the stem in float 88.0% / 19.0; the stem and the
next conv 85.6% / 19.8; the stem and the next two 89.4% / 20.1 (the .pte ExecuTorch ran: 85.6% / 18.2 quantized
whole, 88.0% / 20.1 with the three-conv head; agreement on those crops has a photo-level 95% interval of +-5 to +-9
points). Those three convs take 6.9% of the model's MACs.

So the cost is counted, not timed: each prefix's convs' share of the model's MACs (what the runtime's fp32 kernels
take on instead of its int8 ones), and only prefixes within ``FloatHead.share`` are candidates. Each
candidate's QDQ model (the calibrated ranges, the other float nodes as decided) is scored on the last calibration
samples (the part that method "auto" holds out; the ranges were calibrated on them too, alike for every candidate)
on the config's ``score_on`` arithmetic, and the shortest prefix within ``TIE_DB`` of the best score wins: a longer
one must pay for its MACs with accuracy. Stems are taken in graph order, each with the heads chosen before it in
float, and the share is spent across them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import onnx

from npukit.quant.cpu.float_head import stem_chain

TIE_DB = 0.1  # a longer prefix must score more than this above a shorter one to be kept
MOBILE_SHARE = 0.1  # the share of the MACs the mobile plans (compile's and optimize's) let the head take


@dataclasses.dataclass(frozen=True)
class ScoredHead:
    """``nodes``: the convs left in float (the stem first; empty where no prefix paid); ``chain``: the prefix
    candidates within the MAC share; ``scores_db``: each prefix length -> its model's output SQNR (dB);
    ``mac_share``: each prefix length -> the share of the model's MACs its convs take."""

    stem: str
    nodes: tuple[str, ...]
    chain: tuple[str, ...]
    scores_db: dict[int, float]
    mac_share: dict[int, float]

    def summary(self) -> dict:
        return {"stem": self.stem, "nodes": list(self.nodes), "chain": list(self.chain), "tie_db": TIE_DB,
                "sqnr_db": {str(k): round(v, 3) for k, v in self.scores_db.items()},
                "mac_share": {str(k): round(v, 4) for k, v in self.mac_share.items()}}


def affordable(chain: tuple[str, ...], macs: Mapping[str, int | None], total: int, budget: float) -> tuple[str, ...]:
    """The longest prefix of ``chain`` whose convs' MACs (``macs``: node -> MACs, None where unknown) stay within
    ``budget`` (a share of ``total``); it ends before a conv of unknown MACs."""
    taken, spent = (), 0
    for node in chain:
        cost = macs.get(node)
        if cost is None or total <= 0 or (spent + cost) / total > budget + 1e-12:
            break
        taken, spent = taken + (node,), spent + cost
    return taken


def pick(scores: Mapping[int, float], *, tie_db: float = TIE_DB) -> int:
    """The shortest prefix length whose score is within ``tie_db`` of the best."""
    best = max(scores.values())
    return min(k for k, v in scores.items() if v >= best - tie_db)


def choose_scored_heads(model: onnx.ModelProto, stems: list[str], *, macs: Mapping[str, int | None], total: int,
                        share: float, build: Callable[[tuple[str, ...]], onnx.ModelProto],
                        score: Callable[[dict[int, onnx.ModelProto]], Mapping[int, float]],
                        keep: frozenset[str] = frozenset()) -> list[ScoredHead]:
    """For each stem of ``model`` in turn: ``build(prefix)`` (the model quantized with the heads chosen so far and
    ``prefix`` in float) for every prefix of its chain within what is left of ``share`` of ``total`` MACs (the
    empty prefix too), ``score``d together (prefix length -> dB), and ``pick``. A chain ends before a node in
    ``keep`` (the caller's 16-bit nodes)."""
    heads: list[ScoredHead] = []
    left = share
    for stem in stems:
        chain: tuple[str, ...] = ()
        for node in stem_chain(model, stem):
            if node in keep:
                break
            chain += (node,)
        chain = affordable(chain, macs, total, left)
        if not chain:
            heads.append(ScoredHead(stem, (), (), {}, {}))
            continue
        chosen = tuple(n for h in heads for n in h.nodes)
        scores = dict(score({k: build(chosen + chain[:k]) for k in range(len(chain) + 1)}))
        k = pick(scores)
        shares = {n: sum(macs[c] or 0 for c in chain[:n]) / total for n in range(len(chain) + 1)}
        heads.append(ScoredHead(stem, chain[:k], chain, scores, shares))
        left -= shares[k]
    return heads
