"""Run a candidate model beside its reference on the same inputs and measure them with the model's task
(``npukit.tasks``): every output, decoded where the task knows how."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from npukit.data.subsets import spread
from npukit.errors import InputError
from npukit.tasks import TaskChoice, TaskResult, choose_task

Feeds = Mapping[str, np.ndarray]
# the reference varies between samples where an output moves by more than this share of its largest magnitude:
# below it, the movement is under an 8-bit grid's step on that range, so a check compares one answer (an untrained
# ShuffleNetV2's logits moved by 2.6e-5 of their size over 8 random images, trained or untrained torchvision
# classifiers by 5e-2 or more)
CONSTANT_SHARE = 1e-3
Runner = Callable[[Feeds], Sequence[np.ndarray]]


def session_runner(session: Any) -> Runner:
    """An ORT InferenceSession as a function of one feed dict (all outputs, in order)."""
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: session.run(names, dict(feeds))


def feeds_and_labels(samples: Iterable[Any]) -> Iterable[tuple[Feeds, Any]]:
    """(feeds, labels) from feed dicts, (feeds, labels) pairs, or a dataset's batches (``.feeds``, ``.labels``)."""
    for item in samples:
        if isinstance(item, Mapping):
            yield item, None
        elif hasattr(item, "feeds"):
            yield item.feeds, getattr(item, "labels", None)
        else:
            feeds, labels = item
            yield feeds, labels


def compare_task(reference: Runner, candidate: Runner, samples: Iterable[Any], *, output_names: Sequence[str],
                 task: str | None = None, limit: int | None = None) -> tuple[TaskChoice, TaskResult]:
    """The candidate against the reference on ``samples`` (at most ``limit``), with ``task`` (None or "auto":
    chosen from the reference's outputs on the first sample)."""
    meter = None
    choice = None
    first: list[np.ndarray] = []
    varies = False  # whether the reference's outputs differ between samples
    compared = 0  # calls, not result.samples: a classifier's counts rows, a batch of several in one call
    for count, (feeds, labels) in enumerate(feeds_and_labels(samples)):
        if limit is not None and count >= limit:
            break
        ref = [np.asarray(o) for o in reference(feeds)]
        _finite_reference(ref, output_names, count)
        cand = [np.asarray(o) for o in candidate(feeds)]
        if meter is None:
            choice = choose_task([o.shape for o in ref], [np.shape(v) for v in feeds.values()], task=task,
                                 sample=ref)
            meter = choice.meter(output_names)
            first = [o.copy() for o in ref]
        elif not varies:
            varies = any(_differs(a, b) for a, b in zip(first, ref))
        meter.update(ref, cand, labels)
        compared += 1
    if meter is None or choice is None:
        raise ValueError("no samples to compare on")
    result = meter.result()
    return choice, dataclasses.replace(result, constant_reference=True) if compared > 1 and not varies else result


def _differs(first: np.ndarray, other: np.ndarray) -> bool:
    """Whether an output of the reference on one sample differs from its value on the first beyond
    ``CONSTANT_SHARE`` of their largest magnitude (another shape differs)."""
    if first.shape != other.shape:
        return True
    if not first.size:
        return False
    a, b = first.astype(np.float64), other.astype(np.float64)
    scale = max(float(np.abs(a).max()), float(np.abs(b).max()))
    return scale > 0 and float(np.abs(a - b).max()) > CONSTANT_SHARE * scale


def _finite_reference(outputs: Sequence[np.ndarray], names: Sequence[str], index: int) -> None:
    """The reference's (the float model's) outputs on sample ``index`` hold no NaN or inf: a check against them
    measures nothing (a model computing log of a mean gave NaN on a quarter of its samples; quantize crashed in
    ORT's calibrator and bench compared the model with itself and advised a recovery recipe)."""
    for name, out in zip(names, outputs):
        if np.issubdtype(out.dtype, np.floating) and not np.all(np.isfinite(out)):
            what = "NaN" if np.isnan(out).any() else "inf"
            raise InputError(f"the float (reference) model gives {what} in output {name!r} on sample {index}: a "
                             "check against it compares nothing there",
                             hint="give inputs the model is made for (its preprocessing, its value range), or fix "
                                  "the model where it divides, takes a log or a square root")


def check_samples(data: Any, limit: int) -> list[Any]:
    """At most ``limit`` samples of ``data`` (a dataset with ``batches``, or a sequence of feed dicts), one per
    item, as ``compare_task`` takes them; fewer than all are spread over the data (``npukit.data.subsets``), not its
    first: a folder sorted by class would give the first classes only."""
    if hasattr(data, "batches"):
        return list(spread(data, limit).batches(1))
    return spread(data, limit)
