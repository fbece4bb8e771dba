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

The score sums every output's signal and noise, so a small output (a face detector's box offsets beside its face
probabilities) can sit below the check's SQNR floor behind a good score. With a ``Floor`` (the check's floor and a
larger share, ``FloatHead.floor_db`` / ``floor_share``), where the chosen prefix leaves an output below the floor,
the shortest longer prefix within the larger share whose every output reaches it is taken instead (none: the choice
stands, and the check says what failed). The floor is judged on every calibration sample, not only the last few the
score reads: four or eight samples put RNet's box output anywhere from 17.7 to 25.9 dB, and compile's check reads
them all (a check on other samples can still fall below it: 16 held-out crops gave 19.2 dB where the 16 calibration
crops gave 21.3). MTCNN's RNet for XNNPACK: its stem is 24% of the MACs, beyond the 10%
share; quantized whole, the box output reached 18.8 dB against the 20 dB floor (FAIL), with the stem in float 21.8 dB.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import onnx

from npukit.quant.config import QuantConfig
from npukit.quant.cpu.float_head import stem_chain

TIE_DB = 0.1  # a longer prefix must score more than this above a shorter one to be kept
MOBILE_SHARE = 0.1  # the share of the MACs the mobile plans (compile's and optimize's) let the head take
# Where that head leaves an output below the check's SQNR floor, the head may take up to FLOOR_SHARE of the MACs to
# reach it (``FloatHead.floor_db``): MTCNN's RNet, whose stem alone is 24% of its MACs, FAILed quantized whole (box
# output 18.8 dB < 20 dB) and passes with the stem in fp32. Past a third of the MACs in fp32 an INT8 artifact is
# little faster than the fp32 one; the verdict says how far the head went. The head is judged on the plan's QDQ
# arithmetic, which is not the runtime's: RNet's box output was 20.0 dB there quantized whole and 18.8 dB in the .pte
# (32 crops), so the head aims FLOOR_MARGIN_DB above the check's floor.
FLOOR_SHARE = 0.3
FLOOR_MARGIN_DB = 1.5


def held_to_floor(config: QuantConfig, floor_db: float, held: Sequence[str]) -> QuantConfig:
    """``config`` (a mobile plan, its float head chosen by accuracy) with that head holding the outputs ``held``
    (those the check holds to its SQNR floor ``floor_db``) to the floor and ``FLOOR_MARGIN_DB`` within
    ``FLOOR_SHARE`` of the MACs; none held (a classifier's one output, judged by its task metric): as it is."""
    head = config.precision.float_head
    if not held or head is None or head.by != "accuracy":
        return config
    return config.with_precision(float_head=dataclasses.replace(head, floor_db=floor_db + FLOOR_MARGIN_DB,
                                                                floor_share=max(FLOOR_SHARE, head.share),
                                                                floor_outputs=tuple(held)))


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
    worst_db: dict[int, float] = dataclasses.field(default_factory=dict)  # prefix length -> its worst output's SQNR
    stretched: bool = False  # taken past the share to reach the floor

    def summary(self) -> dict:
        return {"stem": self.stem, "nodes": list(self.nodes), "chain": list(self.chain), "tie_db": TIE_DB,
                "sqnr_db": {str(k): round(v, 3) for k, v in self.scores_db.items()},
                "mac_share": {str(k): round(v, 4) for k, v in self.mac_share.items()},
                "worst_output_db": {str(k): round(v, 3) for k, v in self.worst_db.items()},
                "stretched_to_floor": self.stretched}


@dataclasses.dataclass(frozen=True)
class Floor:
    """The SQNR every output should reach (``db``), the share of the MACs the head may take for it (``share``), and
    ``worst``: prefix length -> its model -> each model's worst output's SQNR (dB) on the scoring samples."""

    db: float
    share: float
    worst: Callable[[dict[int, onnx.ModelProto]], Mapping[int, float]]


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
                        keep: frozenset[str] = frozenset(), floor: Floor | None = None) -> list[ScoredHead]:
    """For each stem of ``model`` in turn: ``build(prefix)`` (the model quantized with the heads chosen so far and
    ``prefix`` in float) for every prefix of its chain within what is left of ``share`` of ``total`` MACs (the
    empty prefix too), ``score``d together (prefix length -> dB), and ``pick``; with a ``floor``, stretched to reach
    it (the module docstring). A chain ends before a node in ``keep`` (the caller's 16-bit nodes)."""
    heads: list[ScoredHead] = []
    spent = 0.0
    for stem in stems:
        whole: tuple[str, ...] = ()
        for node in stem_chain(model, stem):
            if node in keep:
                break
            whole += (node,)
        chain = affordable(whole, macs, total, share - spent)
        chosen = tuple(n for h in heads for n in h.nodes)
        scores = dict(score({k: build(chosen + chain[:k]) for k in range(len(chain) + 1)})) if chain else {0: 0.0}
        head = _to_floor(ScoredHead(stem, chain[:pick(scores)], chain, scores if chain else {}, {}), whole, chosen,
                         floor, macs=macs, total=total, left=(floor.share if floor else share) - spent, build=build)
        shares = {n: sum(macs[c] or 0 for c in head.chain[:n]) / total for n in range(len(head.chain) + 1)}
        head = dataclasses.replace(head, mac_share=shares if head.chain else {})
        heads.append(head)
        spent += shares[len(head.nodes)]
    return heads


def _to_floor(head: ScoredHead, whole: tuple[str, ...], chosen: tuple[str, ...], floor: Floor | None, *,
              macs: Mapping[str, int | None], total: int, left: float,
              build: Callable[[tuple[str, ...]], onnx.ModelProto]) -> ScoredHead:
    """``head`` (chosen within the share) as it is where no ``floor`` is given or its every output reaches it; else
    the shortest longer prefix of ``whole`` within ``left`` of the MACs that reaches it, if one does."""
    if floor is None:
        return head
    k = len(head.nodes)
    worst = dict(floor.worst({k: build(chosen + head.chain[:k])}))
    wide = affordable(whole, macs, total, left)
    if worst[k] >= floor.db or len(wide) <= k:
        return dataclasses.replace(head, worst_db=worst)
    worst.update(floor.worst({n: build(chosen + wide[:n]) for n in range(k + 1, len(wide) + 1)}))
    reaching = [n for n in range(k + 1, len(wide) + 1) if worst[n] >= floor.db]
    if not reaching:
        return dataclasses.replace(head, worst_db=worst)
    return dataclasses.replace(head, nodes=wide[:reaching[0]], chain=wide, worst_db=worst, stretched=True)
