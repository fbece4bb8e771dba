"""What every task shares: per-output fidelity (SQNR, cosine, error against the output's range), the task result, and
the quality gate that turns a result into a verdict.

A task meter is fed one sample at a time: the reference model's outputs and the candidate's, as lists in the models'
output order (one sample: batch dimension 1 or absent). It always measures every output's SQNR and cosine; the task
decodes the outputs it understands (class scores, boxes, masks, text maps) into the task metric. The gate then
checks the task metric against its floor and every output the task does not decode against an SQNR floor, so a
model is never passed on its first output alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from npukit.measure.fidelity import sqnr_from_sums as sqnr

# Default floors (the real-models issue's targets): the task metric of the candidate against the reference as
# ground truth, and the SQNR of every output that the task metric does not cover.
DEFAULT_MIN_METRIC = 0.90
DEFAULT_MIN_SQNR_DB = 20.0
FEW_SAMPLES = 5  # a verdict on fewer samples says it is a weak check
FEW_DETECTIONS = 10  # and a detector's on fewer boxes found by the reference
GENERIC_TASK = "generic"  # no decoding: every output held to the SQNR floor, no task metric by design


@dataclasses.dataclass(frozen=True)
class OutputFidelity:
    """One output of the candidate against the reference over every sample: SQNR, cosine similarity, and the
    largest absolute error against the largest reference magnitude."""

    name: str
    shape: tuple[int, ...]
    sqnr_db: float
    cosine: float
    max_abs_error: float
    reference_max_abs: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class OutputStats:
    """Streams the per-output sums for ``OutputFidelity``."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        n = len(self.names)
        self._signal, self._noise = [0.0] * n, [0.0] * n
        self._dot, self._ref2, self._cand2 = [0.0] * n, [0.0] * n, [0.0] * n
        self._max_err, self._ref_max = [0.0] * n, [0.0] * n
        self._shapes: list[tuple[int, ...]] = [()] * n

    def update(self, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]) -> None:
        if len(reference) != len(self.names) or len(candidate) != len(self.names):
            raise ValueError(f"expected {len(self.names)} outputs, got {len(reference)} reference and "
                             f"{len(candidate)} candidate outputs")
        for i, (r, c) in enumerate(zip(reference, candidate)):
            ref = np.asarray(r, np.float64)
            cand = np.asarray(c, np.float64)
            if ref.shape != cand.shape:
                raise ValueError(f"output {self.names[i]!r}: reference shape {ref.shape} but candidate {cand.shape}")
            diff = ref - cand
            self._shapes[i] = ref.shape
            self._signal[i] += float(np.sum(ref * ref))
            self._noise[i] += float(np.sum(diff * diff))
            self._dot[i] += float(np.sum(ref * cand))
            self._ref2[i] += float(np.sum(ref * ref))
            self._cand2[i] += float(np.sum(cand * cand))
            if diff.size:
                self._max_err[i] = max(self._max_err[i], float(np.max(np.abs(diff))))
                self._ref_max[i] = max(self._ref_max[i], float(np.max(np.abs(ref))))

    def result(self) -> tuple[OutputFidelity, ...]:
        out = []
        for i, name in enumerate(self.names):
            norm = math.sqrt(self._ref2[i] * self._cand2[i])
            cosine = self._dot[i] / norm if norm > 0 else (1.0 if self._ref2[i] == self._cand2[i] else 0.0)
            out.append(OutputFidelity(name=name, shape=self._shapes[i], sqnr_db=sqnr(self._signal[i], self._noise[i]),
                                      cosine=cosine, max_abs_error=self._max_err[i],
                                      reference_max_abs=self._ref_max[i]))
        return tuple(out)


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """The candidate against the reference on ``samples`` inputs. ``metric`` names the headline figure (higher is
    better, 1.0 for identical outputs) and ``value`` is it (None when it is undefined on these inputs, e.g. a
    detector whose reference finds nothing: ``note`` says so). ``decoded`` names the outputs the metric covers;
    every output's SQNR and cosine are in ``outputs``."""

    task: str
    samples: int
    metric: str
    value: float | None
    metrics: dict[str, Any]
    outputs: tuple[OutputFidelity, ...]
    decoded: tuple[str, ...]
    note: str = ""
    checks: dict[str, float] | None = None  # metrics each held to the floor; None: the headline alone
    # undecoded outputs read only where something is detected (a detector's per-anchor landmarks), measured there:
    # the gate holds these figures, not the whole output's, to the SQNR floor
    at_detections: tuple[OutputFidelity, ...] = ()
    # the reference gave the same outputs, bit for bit, on every one of two or more samples: whatever the candidate
    # matches there, the check compared one answer (data all alike, or a model that ignores its input)
    constant_reference: bool = False

    @property
    def compared_nothing(self) -> bool:
        """Whether the task has a metric that these inputs left undefined (the reference found nothing): the task
        check then compared nothing (the generic task has no metric by design)."""
        return self.value is None and self.task != GENERIC_TASK

    def held_to_floor(self) -> list[str]:
        """The outputs the SQNR floor holds: those the task metric does not decode, and every output where the
        metric is undefined on these inputs (``judge``; the recurrent check holds the same ones)."""
        return [o.name for o in self.outputs if self.value is None or o.name not in self.decoded]

    def gated(self) -> dict[str, float]:
        """The metrics the gate holds to its floor: ``checks``, else the headline where it is defined."""
        if self.checks is not None:
            return dict(self.checks)
        return {self.metric: self.value} if self.value is not None else {}

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "samples": self.samples, "metric": self.metric, "value": self.value,
                "metrics": dict(self.metrics), "outputs": [o.as_dict() for o in self.outputs],
                "decoded": list(self.decoded), "note": self.note, "gated": self.gated(),
                "at_detections": [o.as_dict() for o in self.at_detections],
                "constant_reference": self.constant_reference}


class TaskMeter(Protocol):
    """Fed sample by sample; ``labels`` (ground truth, where the task knows how to use it) may be None."""

    def update(self, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray],
               labels: Any = None) -> None: ...

    def result(self) -> TaskResult: ...


@dataclasses.dataclass(frozen=True)
class QualityGate:
    """The floors a candidate must meet: ``min_metric`` for the task metric (None: the task's default) and
    ``min_sqnr_db`` for every output the task metric does not cover. ``accept_degraded`` passes a result below them
    (the verdict then says DEGRADED, accepted)."""

    min_metric: float | None = None
    min_sqnr_db: float = DEFAULT_MIN_SQNR_DB
    accept_degraded: bool = False

    def __post_init__(self) -> None:
        from npukit.errors import InputError

        if self.min_metric is not None and not 0.0 <= self.min_metric <= 1.0:
            raise InputError(f"the task metric floor {self.min_metric} must be in [0, 1]",
                             hint=f"e.g. --min-task-metric {DEFAULT_MIN_METRIC}")
        if not math.isfinite(self.min_sqnr_db) or self.min_sqnr_db < 0:
            raise InputError(f"the SQNR floor {self.min_sqnr_db} must be a finite number of dB, 0 or more (below 0 "
                             "the error is larger than the output itself, and nothing is held)",
                             hint=f"e.g. --min-sqnr {DEFAULT_MIN_SQNR_DB:g}")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``passed``: the artifact met every floor (or was accepted degraded); ``line``: the one-line verdict that
    starts every report; ``failures``: one entry per floor missed, worst first."""

    passed: bool
    line: str
    failures: tuple[str, ...] = ()
    degraded: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fmt(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else str(value)


def weakness(result: TaskResult, more: str = "give more data") -> str:
    """The check's warning that ``result`` rests on too little (fewer than ``FEW_SAMPLES`` samples, a detector's
    fewer than ``FEW_DETECTIONS`` reference detections, a classifier's too few confident samples), or "";
    ``judge`` puts it into the verdict's summary. ``more``: what would make it stronger (a verb whose check reads
    a fixed number of the samples given says where a larger one runs)."""
    if 0 < result.samples < FEW_SAMPLES:
        return f"only {result.samples}: a weak check, {more}"
    confident = result.metrics.get("confident_samples")
    if result.metric == "top1_agreement" and isinstance(confident, int):
        # classify's headline falls back to every sample: a flip between two near-equal classes counts (an untrained
        # network failed top-1 agreement on such ties with no word on why); with every sample confident, the
        # fallback is for their number alone (9 of 9: no tie to flip)
        if confident >= result.samples:
            return f"only {result.samples} samples: a weak check, {more}"
        return (f"the float model confident on {confident} of them: a flip between near-equal classes counts, give "
                "the inputs it is made for")
    # a raw SSD / RetinaFace head's reference detections are anchors, several per object: the objects count
    # (RetinaFace's 8 photos: 94 anchors at 0.25 for 6 faces, and the check never said it was weak)
    kind = "objects" if isinstance(result.metrics.get("reference_objects"), int) else "detections"
    found = result.metrics.get(f"reference_{kind}")
    if isinstance(found, int) and 0 < found < FEW_DETECTIONS:
        return f"{found} reference {kind}{_anchors(result, '')}: a weak check, {more}"
    # a detector's F1 at a score threshold rests on the detections at that score only (YOLOv8n on 25 images: 15
    # reference detections at 0.25, 8 at 0.5, where F1 read 0.857)
    for name in (n for n in result.gated() if n.startswith("f1_at_")):
        score = name.removeprefix("f1_at_")
        at = result.metrics.get(f"reference_{kind}_at_{score}")
        if isinstance(at, int) and at < FEW_DETECTIONS:
            return (f"{name} rests on {at} reference {kind}{_anchors(result, f'_at_{score}')} at score >= {score}: "
                    f"a weak check, {more}")
    return ""


def _anchors(result: TaskResult, at: str) -> str:
    """" (N anchors)" beside a raw head's object count (``at``: "" or "_at_0.5"), else ""."""
    anchors = result.metrics.get(f"reference_detections{at}")
    return f" ({anchors} anchors)" if "reference_objects" in result.metrics and isinstance(anchors, int) else ""


def judge(result: TaskResult, gate: QualityGate, *, what: str, default_min_metric: float = DEFAULT_MIN_METRIC,
          extra_failures: Sequence[str] = (), hint: str = "", more_data: str = "give more data") -> Verdict:
    """The verdict on ``result`` under ``gate``: the task metric against its floor, every undecoded output's SQNR
    against ``gate.min_sqnr_db``, plus ``extra_failures`` found elsewhere (e.g. no integer kernels). A failing
    verdict ends with ``hint`` (what to try); a weak check says ``more_data`` (``weakness``)."""
    floor = default_min_metric if gate.min_metric is None else gate.min_metric
    failures = list(extra_failures)
    unmeasured = result.compared_nothing
    if unmeasured:
        failures.insert(0, f"so the {result.task} check compared nothing (give data on which the float model finds "
                           "something, or --task generic to hold every output to the SQNR floor alone)")
    if result.constant_reference:
        failures.insert(0, f"the reference gave the same outputs for all {result.samples} samples (to 0.1% of "
                           "their size), so the check compared one answer (give varied inputs of the model's kind, "
                           "preprocessed as it expects; a model whose weights are random or broken may ignore its "
                           "input)")
    for name, value in sorted(result.gated().items(), key=lambda kv: kv[1]):
        if not value >= floor:
            failures.append(f"{name} {_fmt(value)} < {floor:g}")
    # outputs the task metric does not cover, and every output when the metric is undefined on these inputs
    # (an output read only at the detections is held there, while the task metric is defined)
    at = {o.name: o for o in result.at_detections} if result.value is not None else {}
    held = set(result.held_to_floor())
    undecoded = [at.get(o.name, o) for o in result.outputs if o.name in held]
    for o in sorted(undecoded, key=lambda o: o.sqnr_db if not math.isnan(o.sqnr_db) else -math.inf):
        if math.isnan(o.sqnr_db) or o.sqnr_db < gate.min_sqnr_db:
            where = " at the detections" if o.name in at else ""
            failures.append(f"output {o.name!r} SQNR{where} {_fmt(o.sqnr_db)} dB < {gate.min_sqnr_db:g} dB")
    if result.task == GENERIC_TASK:  # no task metric by design: "min_cosine undefined" read as a failure
        cosine = result.metrics.get("min_cosine")
        least = f"; min cosine {_fmt(cosine)}" if cosine is not None else ""
        headline = f"no task metric (every output held to the SQNR floor{least})"
    else:
        headline = f"{result.metric} {_fmt(result.value)}" if result.value is not None else \
            f"{result.metric} undefined ({result.note})" if result.note else f"{result.metric} undefined"
        lowest_held = min(result.gated().items(), key=lambda kv: kv[1], default=None)
        if not failures and result.value is not None and lowest_held is not None \
                and lowest_held[0] != result.metric and lowest_held[1] < result.value:
            # where the floor binds: a YOLOv8n search PASSed quoting "map50 1.000 (budget >= 0.700)" alone, its F1
            # at 0.706; a failure names the metrics below the floor already
            headline += f" (lowest held: {lowest_held[0]} {_fmt(lowest_held[1])} >= {floor:g})"
    measured = [o for o in result.outputs if not math.isnan(o.sqnr_db)]
    lowest = min(measured, key=lambda o: o.sqnr_db) if measured else None
    named = f" {lowest.name!r}" if lowest is not None and len(result.outputs) > 1 else ""
    covered = lowest is not None and result.value is not None and lowest.name in result.decoded \
        and not lowest.sqnr_db >= gate.min_sqnr_db  # below the floor, yet the task metric is what judges it
    worst = (f", worst output{named} SQNR {_fmt(lowest.sqnr_db)} dB" if lowest is not None else "") + (
        f" (under {gate.min_sqnr_db:g} dB, but judged by the task metric, which decodes it)" if covered else "")
    weak = weakness(result, more_data)
    few = f" ({weak})" if weak else ""
    summary = f"{what}: task {result.task}, {headline}{worst} on {result.samples} samples{few}"
    if not failures:
        return Verdict(True, f"PASS {summary}")
    if gate.accept_degraded:
        return Verdict(True, f"DEGRADED (accepted with --accept-degraded) {summary}: {_listed(failures)}",
                       tuple(failures), degraded=True)
    # the verb's hint is about the artifact; where the data (or the reference) is what falls short, it is no help
    hint = "" if unmeasured or result.constant_reference else hint
    return Verdict(False, f"FAIL {summary}: {_listed(failures)}" + (f"; try {hint}" if hint else ""),
                   tuple(failures), degraded=True)


def _listed(failures: Sequence[str], room: int = 160) -> str:
    """The failures for a verdict line: each that fits in ``room`` characters after the first (a detector failing
    F1 at two thresholds names both), then how many more the report lists."""
    shown = [failures[0]]
    for failure in failures[1:]:
        if len("; ".join([*shown, failure])) > room:
            break
        shown.append(failure)
    more = len(failures) - len(shown)
    return "; ".join(shown) + (f" (and {more} more in the report)" if more else "")
