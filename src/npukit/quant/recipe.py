"""Recipe "auto": the recovery recipe that quantizes this model best, chosen on held-out calibration samples within a
time budget.

No recipe wins on every model (benchmarks/results/default_recipe.md, AMD EPYC, evaluation inputs disjoint from the
calibration ones): cross-layer equalization, activation equalization and bias correction together raise MobileNetV2's
output SQNR from 27.1 to 29.9 dB and the PP-OCR angle classifier's from 25.3 to 34.6 dB, and lower YOLOv8n's (29.1 ->
27.4 dB), a YOLOX text detector's (12.9 -> 11.1 dB, its F1 under the floor) and PicoDet's mAP@0.5 (0.989 -> 0.945).
So ``quantize`` (with ``Recipe.choose``) runs each candidate of ``CANDIDATES`` up to the method choice of
``calibration.auto`` (equalization, ranges from the first three quarters of the calibration samples in spread order,
each method's model scored on the last quarter: its outputs' SQNR against the float model's) and keeps the first
candidate (the plain recipe: fewer transforms, less time) unless another is clearly better there: a higher score
over all held-out samples and better on so many of them that a one-sided sign test gives p <= ``ALPHA`` (0.05; at
least 5 of 5, 9 of 10). With few held-out samples the score alone misleads: on the YOLOX text detector of ddddocr
(9 calibration images, 2 held out) the equalized recipe scored 22.9 against 21.6 dB, better on one sample and worse
on the other, and on the evaluation images it is the worse one (F1 under the floor); on MobileNetV2 (10 held out) it
was better on all 10 (+0.9 to +2.3 dB) and on the 208 evaluation crops too (30.3 against 27.1 dB); these figures
were measured with the last quarter in file order. Only the recipe kept is calibrated on every sample,
bias-corrected and emitted.

What is shared: the steps before the recipe's own (the float head timed on this CPU, float joins and squares); what
each candidate costs (MobileNetV2, 2 cores, AMD EPYC): the plain recipe's steps and held-out scoring 16 s, the
equalized one's 26 s (CLE and activation equalization, its calibration, one bias-correction pass shared by the
methods). Measured on 7 real models (benchmarks/results/default_recipe_1204.md) it kept the plain recipe on every one,
which the evaluation inputs bore out, at 5-27 s more than the plain recipe alone: so it is not the default.
A candidate after the first runs only while the time spent so far plus the last candidate's time stays within
``RecipeChoice.budget_s`` (60 s by default): a model too large for that gets the first candidate, and the record
says what was skipped and why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from npukit.quant.config import ActivationEqualization, Recipe

# The candidates in the order they run and break ties (each scored on the arithmetic the config asks for).
CANDIDATES: dict[str, Recipe] = {
    "plain": Recipe(),
    "equalized": Recipe(cle=True, activation_equalization=ActivationEqualization(), bias_correction=True),
}
RECIPES = (*CANDIDATES, "auto")  # what quantize's --recipe takes: one candidate, or the choice among them
ALPHA = 0.05  # a later candidate replaces the first only when the sign test over the held-out samples says so
FLAGS = {"cle": "--cle", "activation_equalization": "--equalize-activations", "bias_correction": "--bias-correction"}


def flags(name: str) -> str:
    """The quantize flags that give candidate ``name`` ("" for the plain recipe)."""
    return " ".join(FLAGS[f] for f in CANDIDATES[name].steps())


def within_budget(elapsed_s: float, last_s: float, budget_s: float) -> bool:
    """Whether another candidate fits: ``elapsed_s`` spent since quantization began, the last candidate took
    ``last_s``."""
    return elapsed_s + last_s <= budget_s


@dataclasses.dataclass(frozen=True)
class Scored:
    """One candidate recipe as measured: its best method's held-out output SQNR over all held-out samples and sample
    by sample (dB), the method, and the seconds its steps took."""

    total_db: float
    per_sample_db: tuple[float, ...]
    method: str
    seconds: float


def sign_test(wins: int, n: int) -> float:
    """P(at least ``wins`` of ``n`` fair coin flips come up heads): the one-sided sign test's p-value."""
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n if n else 1.0


def clearly_better(candidate: Scored, incumbent: Scored, *, alpha: float = ALPHA) -> tuple[bool, str]:
    """Whether ``candidate`` beats ``incumbent`` on the held-out samples beyond their noise: a higher score over all
    of them and better on so many samples that the one-sided sign test gives p <= ``alpha``; and why (a line)."""
    pairs = list(zip(candidate.per_sample_db, incumbent.per_sample_db))
    wins, ties = sum(c > i for c, i in pairs), sum(c == i for c, i in pairs)
    n = len(pairs) - ties
    p = sign_test(wins, n)
    line = f"better on {wins} of {n} held-out samples (sign test p = {p:.3g})"
    return candidate.total_db > incumbent.total_db and p <= alpha, line


def choose(scored: Mapping[str, Scored], *, skipped: Mapping[str, str], budget_s: float,
           note: str = "") -> tuple[str, dict[str, Any]]:
    """The recipe to keep: the first candidate of ``CANDIDATES`` measured (the incumbent) unless another is clearly
    better (``clearly_better``), then the best scoring of those that are; and the record for ``QuantSteps.recipe``:
    each candidate's score, method, seconds and comparison, the ones skipped and why."""
    order = [n for n in CANDIDATES if n in scored]
    incumbent = order[0]
    verdicts = {n: clearly_better(scored[n], scored[incumbent]) for n in order[1:]}
    better = [n for n in order[1:] if verdicts[n][0]]
    chosen = max(better, key=lambda n: (scored[n].total_db, -order.index(n))) if better else incumbent
    record: dict[str, Any] = {
        "chosen": chosen,
        "flags": flags(chosen),
        "candidates": {n: {"held_out_sqnr_db": scored[n].total_db, "method": scored[n].method,
                           "seconds": round(scored[n].seconds, 2), "flags": flags(n),
                           "against_first": verdicts[n][1] if n in verdicts else "the first candidate"}
                       for n in order},
        "skipped": dict(skipped),
        "budget_s": budget_s,
        "alpha": ALPHA,
        "held_out_samples": len(scored[incumbent].per_sample_db),
    }
    if note:
        record["note"] = note
    return chosen, record
