"""Calibration method "auto": keep the method whose QDQ model's outputs are closest to the float model's.

Inside ``quantize`` the order is: pre-process -> CLE -> calibrate once with histograms (``MultiObserver``) on the
first samples -> one QDQ candidate per method of ``RANGE_METHODS`` (the same ORT step as the final model; when the
final model gets bias correction or AdaRound, the candidate gets bias correction, measured on the calibration part
only, in one pass for all candidates) -> SQNR of all graph outputs against the float model on the held-out samples
-> the histograms go on over the held-out quarter, and the chosen method's ranges are read from them: the ranges of
calibrating on every sample (the held-out quarter may show what the rest never does: a detector's only confident
scores were there once), without observing the first three quarters again -> its ranges feed AdaRound and bias
correction, which run once -> the final QDQ model.

Why bias correction in the candidates: the methods differ in how much mean shift their clipping and rounding cause,
and bias correction (or AdaRound) removes most of it, so the ranking without it is not the ranking with it. Measured
on MobileNetV2 (per-channel, CLE + activation equalization + bias correction, 42 calibration crops, 208 evaluation
crops): scored bias-corrected, the held-out ranking is mse 19.9 dB, minmax 19.0, percentile 17.4, entropy 14.5, and
the final model reaches 18.8 dB on the evaluation crops, against 17.5 dB when the candidates were scored without it.

Held-out split: with ``n >= MIN_SPLIT`` samples the last quarter (at least one) is held out and the candidates' ranges
come from the others (the final ranges from all); with fewer, the ranges come from all samples and the last quarter
is also the evaluation set (noted). ``quantize`` reads a data set or a list in ``npukit.data.subsets.spread_order``,
so its last quarter is every 4th sample given, not the last classes of a folder sorted by class or the last photos
of crops grouped by photo.
CLE, AdaRound and bias correction use all samples, as without "auto".
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import onnx

from npukit.data.subsets import HELD_OUT_EVERY
from npukit.quant.calibration.calibrate import iter_samples
from npukit.quant.layer_sqnr import sqnr_db
from npukit.runtime.ort import make_session

MIN_SPLIT = 8
Ranges = dict[str, tuple[float, float]]


@dataclasses.dataclass(frozen=True)
class Split:
    """Samples [0, calibration) give the ranges; samples [held_out_start, total) score the candidates."""

    total: int
    calibration: int
    held_out_start: int
    note: str

    @property
    def held_out(self) -> int:
        return self.total - self.held_out_start


def split_samples(total: int) -> Split:
    """The calibration / held-out split for ``total`` samples (see the module docstring)."""
    held = max(1, total // HELD_OUT_EVERY)  # quantize reads every 4th sample last (``data.subsets.spread_order``)
    if total >= MIN_SPLIT:
        return Split(total=total, calibration=total - held, held_out_start=total - held, note="")
    return Split(total=total, calibration=total, held_out_start=total - held,
                 note=f"only {total} samples (< {MIN_SPLIT}): ranges from all of them, the held-out "
                      f"{held} also calibrated; give more samples for an unbiased choice")


def output_sqnrs(reference: onnx.ModelProto, candidates: dict[str, onnx.ModelProto], samples: Iterable[object], *,
                 start: int, stop: int, session: Callable[[onnx.ModelProto], Any] = make_session) -> dict[str, float]:
    """SQNR (dB) of every graph output of each candidate against ``reference``, summed over all outputs, on samples
    [start, stop) in one pass; each candidate run by ``session(model)`` (ORT CPU with its optimizations by
    default)."""
    return scored_outputs(reference, candidates, samples, start=start, stop=stop, session=session)[0]


def _paired_runs(reference: onnx.ModelProto, candidates: dict[Any, onnx.ModelProto], samples: Iterable[object], *,
                 start: int, stop: int, names: list[str], session: Callable[[onnx.ModelProto], Any]
                 ) -> Iterator[tuple[list[np.ndarray], dict[Any, list[Any]]]]:
    """Per sample of [start, stop): the reference's outputs ``names`` (float64, on ORT CPU) and each candidate's,
    each run by ``session(model)``."""
    ref = make_session(reference)
    sessions = {m: session(model) for m, model in candidates.items()}
    for feeds in itertools.islice(iter_samples(reference, samples, limit=stop), start, None):
        want = [np.asarray(v, np.float64) for v in ref.run(names, feeds)]
        yield want, {m: run.run(names, feeds) for m, run in sessions.items()}


def scored_outputs(reference: onnx.ModelProto, candidates: dict[str, onnx.ModelProto], samples: Iterable[object], *,
                   start: int, stop: int, session: Callable[[onnx.ModelProto], Any] = make_session
                   ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """``output_sqnrs``, and each candidate's SQNR sample by sample (signal and noise summed over the outputs of
    that sample alone)."""
    names = [o.name for o in reference.graph.output]
    signal = 0.0
    noise = dict.fromkeys(candidates, 0.0)
    per_sample: dict[str, list[float]] = {m: [] for m in candidates}
    for want, runs in _paired_runs(reference, candidates, samples, start=start, stop=stop, names=names,
                                   session=session):
        here = sum(float(np.sum(w * w)) for w in want)
        signal += here
        for method, got in runs.items():
            err = sum(float(np.sum((w - np.asarray(g, np.float64)) ** 2)) for w, g in zip(want, got))
            noise[method] += err
            per_sample[method].append(sqnr_db(here, err))
    return {m: sqnr_db(signal, n) for m, n in noise.items()}, per_sample


def worst_output_sqnrs(reference: onnx.ModelProto, candidates: dict[Any, onnx.ModelProto], samples: Iterable[object],
                       *, start: int, stop: int, outputs: Iterable[str] | None = None,
                       session: Callable[[onnx.ModelProto], Any] = make_session) -> dict[Any, float]:
    """Each candidate's lowest SQNR (dB) over ``outputs`` (default: every graph output; each output's signal and
    noise summed over samples [start, stop)), as a check holds outputs to a floor: ``output_sqnrs`` sums the
    outputs, where a small one (box offsets beside probabilities) hides behind a large one."""
    names = list(outputs) if outputs is not None else [o.name for o in reference.graph.output]
    signal = np.zeros(len(names))
    noise = {m: np.zeros(len(names)) for m in candidates}
    for want, runs in _paired_runs(reference, candidates, samples, start=start, stop=stop, names=names,
                                   session=session):
        signal += [float(np.sum(w * w)) for w in want]
        for m, got in runs.items():
            noise[m] += [float(np.sum((w - np.asarray(g, np.float64)) ** 2)) for w, g in zip(want, got)]
    return {m: min(sqnr_db(s, e) for s, e in zip(signal, n)) for m, n in noise.items()}


def choose_method(reference: onnx.ModelProto, candidates: dict[str, Ranges], samples: Iterable[object], *,
                  split: Split, build: Callable[[dict[str, Ranges]], dict[str, onnx.ModelProto]],
                  session: Callable[[onnx.ModelProto], Any] = make_session) -> tuple[str, dict]:
    """The method (of ``candidates``: method -> its ranges, in the order ties break: the earlier wins) whose model
    scores the highest output SQNR on the held-out samples, and the summary for ``QuantResult.steps.auto``.
    ``build`` makes the models of the distinct range sets at once (method -> model); methods whose ranges equal an
    earlier method's share its model and score. ``session`` runs each model (``npukit.quant.scoring.session_for``:
    ORT's integer kernels by default)."""
    distinct: dict[str, Ranges] = {}
    same_as: dict[str, str] = {}
    for method, ranges in candidates.items():
        twin = next((m for m in distinct if distinct[m] == ranges), None)
        if twin is None:
            distinct[method] = ranges
        else:
            same_as[method] = twin
    scores, per_sample = scored_outputs(reference, build(distinct), samples, start=split.held_out_start,
                                        stop=split.total, session=session)
    scores |= {m: scores[t] for m, t in same_as.items()}
    per_sample |= {m: per_sample[t] for m, t in same_as.items()}
    order = list(candidates)
    chosen = max(order, key=lambda m: (scores[m], -order.index(m)))
    summary = {
        "candidates": {m: scores[m] for m in order},
        "chosen": chosen,
        "identical_ranges": same_as,
        "calibration_samples": split.calibration,
        "held_out_samples": split.held_out,
        "chosen_per_sample_db": per_sample[chosen],
    }
    if split.note:
        summary["note"] = split.note
    return chosen, summary
