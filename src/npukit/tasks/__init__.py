"""Tasks: how a model's outputs are decoded and compared, candidate against reference, and the pass/fail rule.

One module per task (classify, detect, segment, text_detect, text_recognize, generic), each a meter fed sample by
sample; ``choose_task`` picks one from the outputs (shapes, and the reference's values on one sample where shapes
alone are ambiguous) or takes the user's ``--task``, and always says why. Adding a task: a module with a meter
(``update(reference, candidate, labels)``, ``result() -> TaskResult``) and one entry in ``TASKS`` and in
``choose_task``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from npukit.errors import InputError
from npukit.tasks.base import (DEFAULT_MIN_METRIC, DEFAULT_MIN_SQNR_DB, OutputFidelity, QualityGate, TaskMeter,
                               TaskResult, Verdict, judge, weakness)
from npukit.tasks.classify import ClassifyMeter, is_class_scores
from npukit.tasks.detect import DetectLayout, DetectMeter, detect_layout
from npukit.tasks.generic import GenericMeter
from npukit.tasks.segment import SegmentMeter
from npukit.tasks.text_detect import TextDetectMeter
from npukit.tasks.text_recognize import TextRecognizeMeter

TASKS = ("classify", "detect", "segment", "text-detect", "text-recognize", "generic")

__all__ = ["TASKS", "DEFAULT_MIN_METRIC", "DEFAULT_MIN_SQNR_DB", "OutputFidelity", "QualityGate", "TaskChoice",
           "TaskMeter", "TaskResult", "Verdict", "choose_task", "judge", "weakness"]

Shape = Sequence[int | str | None]


@dataclasses.dataclass(frozen=True)
class TaskChoice:
    """The task, the output it decodes (index), the detection layout for detectors, and why it was chosen."""

    name: str
    output: int
    reason: str
    layout: DetectLayout | None = None
    given: bool = False  # named by the user rather than detected
    channels_last: bool = False  # segment: (N, H, W, C)
    time_major: bool = False  # text-recognize: (T, N, C), PyTorch's CTC layout

    def meter(self, output_names: Sequence[str]) -> TaskMeter:
        if self.name == "classify":
            return ClassifyMeter(output_names, self.output)
        if self.name == "detect":
            assert self.layout is not None
            return DetectMeter(output_names, self.layout)
        if self.name == "segment":
            return SegmentMeter(output_names, self.output, channels_last=self.channels_last)
        if self.name == "text-detect":
            return TextDetectMeter(output_names, self.output)
        if self.name == "text-recognize":
            return TextRecognizeMeter(output_names, self.output, time_major=self.time_major)
        return GenericMeter(output_names)

    def as_dict(self) -> dict:
        return {"task": self.name, "output": self.output, "reason": self.reason, "given": self.given,
                "layout": dataclasses.asdict(self.layout) if self.layout else None}


def _is_softmax_rows(values: np.ndarray) -> bool:
    v = np.asarray(values, np.float64)
    return v.size > 0 and v.min() >= -1e-4 and np.allclose(v.sum(axis=-1), 1.0, atol=1e-2)


def _probability_map(candidates: Sequence[int], sample: Sequence[np.ndarray] | None) -> int:
    """Of the (N, C, H, W) outputs ``candidates``, the first whose channels sum to 1 at every pixel on ``sample``
    (class probabilities), else the first."""
    if sample is not None:
        for i in candidates:
            if _is_softmax_rows(np.moveaxis(np.asarray(sample[i]), 1, -1)):
                return i
    return candidates[0]


def _plausible_yolo(layout: DetectLayout, sample: Sequence[np.ndarray] | None) -> bool:
    """A YOLO-style layout whose values look like boxes and scores: sizes >= 0, scores in [0, 1] (the reference's
    first sample; True without one)."""
    if sample is None:
        return True
    raw = np.asarray(sample[layout.boxes], np.float64)[0]
    arr = raw.T if layout.channels_first else raw
    scores = arr[:, 5:] if layout.objectness else arr[:, 4:]
    return bool(arr[:, 2:4].min() >= 0 and scores.min() >= -1e-4 and scores.max() <= 1 + 1e-4
                and not _is_softmax_rows(raw))  # (N, steps, classes) probabilities: a CTC recognizer


def _image_size(inputs: Sequence[Shape]) -> tuple[int, int] | None:
    """(H, W) of the first image-like 4-D input: NCHW, or NHWC when its last axis has 1, 3 or 4 channels."""
    image = next((list(s) for s in inputs if len(s) == 4), None)
    if image is None:
        return None
    h, w = (image[1], image[2]) if image[3] in (1, 3, 4) and image[1] not in (1, 3, 4) else (image[2], image[3])
    return (h, w) if isinstance(h, int) and isinstance(w, int) else None


def _raw_head(layout: DetectLayout, sample: Sequence[np.ndarray] | None) -> bool:
    """Whether an (N, A, 5 + C) output is YOLOX's raw head (grid offsets and log sizes, some sizes negative, or
    objectness / class logits outside [0, 1]) rather than decoded boxes and probabilities; without a sample, no."""
    if sample is None:
        return False
    raw = np.asarray(sample[layout.boxes], np.float64)[0]
    scores = raw[:, 4:]
    return bool(raw[:, 2:4].min() < 0 or scores.min() < -1e-3 or scores.max() > 1 + 1e-3)


def _detected(shapes: Sequence[Shape], inputs: Sequence[Shape],
              sample: Sequence[np.ndarray] | None) -> TaskChoice:
    size = _image_size(inputs)
    layout = detect_layout(shapes, size)
    if layout is not None and layout.kind == "yolox" and not _raw_head(layout, sample):
        layout = detect_layout(shapes, size, raw_yolox=False)  # decoded boxes and probabilities: YOLOv8-style
    if layout is not None and (layout.kind != "yolo" or _plausible_yolo(layout, sample)):
        return TaskChoice("detect", layout.boxes, f"outputs look like a detector's ({layout.kind})", layout)
    image = next((s for s in inputs if len(s) == 4), None)
    for i, shape in enumerate(shapes):
        if len(shape) == 3 and all(isinstance(d, int) for d in shape[1:]) and shape[2] >= 2 and sample is not None \
                and _is_softmax_rows(np.asarray(sample[i])):
            return _recognizer(TaskChoice("text-recognize", i, f"output {i} is (N, steps, classes) with each step "
                                                               "a probability distribution: CTC text recognition"),
                               shapes, inputs)
    maps: list[int] = []  # (N, C >= 2, H, W) outputs near the input's resolution
    for i, shape in enumerate(shapes):
        if len(shape) == 4 and all(isinstance(d, int) for d in shape[1:]) and image is not None:
            h, w = shape[2], shape[3]
            ih, iw = image[2], image[3]
            if not (isinstance(ih, int) and isinstance(iw, int)) or h < 4 or w < 4:
                continue
            if shape[1] == 1 and (h, w) == (ih, iw) and not maps:
                return TaskChoice("text-detect", i, f"output {i} is one probability map at the input's resolution "
                                                    "(a DB-style text detector; pass --task segment for a binary "
                                                    "segmenter)")
            if shape[1] >= 2 and h * 8 >= ih and w * 8 >= iw:
                maps.append(i)
    if maps:
        # several such maps (MTCNN's PNet: box offsets beside face probabilities): the one whose channels are a
        # probability distribution at each pixel is the segmentation; the others are held to the SQNR floor
        i = _probability_map(maps, sample)
        ih, iw = image[2:]  # type: ignore[index]
        why = " (its channels sum to 1)" if len(maps) > 1 and i != maps[0] else ""
        return TaskChoice("segment", i, f"output {i} is (N, {shapes[i][1]} classes, H, W), {shapes[i][2]}x"
                                        f"{shapes[i][3]} for the input's {ih}x{iw}{why}")
    for i, shape in enumerate(shapes):  # channels last: (N, H, W, C) near the input's resolution
        if len(shape) == 4 and all(isinstance(d, int) for d in shape[1:]) and size is not None \
                and 2 <= shape[3] < min(shape[1], shape[2]) and shape[1] * 8 >= size[0] and shape[2] * 8 >= size[1]:
            return TaskChoice("segment", i, f"output {i} is (N, H, W, {shape[3]} classes), channels last, near the "
                                            "input's resolution", channels_last=True)
    scores = [i for i, shape in enumerate(shapes) if is_class_scores(shape)]
    if scores:
        # several (N, C) outputs (a face net's box regression, landmarks and face probability): the one whose rows
        # are probability distributions is the classification; the others are held to the SQNR floor
        probable = [i for i in scores if sample is not None and _is_softmax_rows(
            np.asarray(sample[i]).reshape(np.shape(sample[i])[0], -1))]
        i = probable[0] if probable else scores[0]
        why = " (its rows sum to 1)" if probable and len(scores) > 1 else ""
        dims = ", ".join(str(d) for d in shapes[i][1:])  # (N, 2, 1, 1) as it is: MTCNN's PNet at its 12 px crop
        return TaskChoice("classify", i, f"output {i} is (N, {dims}) class scores{why}")
    return TaskChoice("generic", 0, "no known output layout: every output compared by SQNR and cosine")


def _recognizer(choice: TaskChoice, outputs: Sequence[Shape], inputs: Sequence[Shape]) -> TaskChoice:
    """``choice`` (text-recognize) read time-major where its output is (T, N, C), PyTorch's CTC layout: axis 1 is
    the inputs' batch and axis 0 is not (ddddocr's 32x1x8210 per line was read as 32 one-step lines: 960 "samples"
    for 30, and a model reading 13 of 30 lines differently PASSed)."""
    shape = outputs[choice.output]
    batch = next((s[0] for s in inputs if len(s) and isinstance(s[0], int)), None)
    if len(shape) == 3 and batch is not None and shape[1] == batch and shape[0] != batch:
        return dataclasses.replace(choice, time_major=True,
                                   reason=f"{choice.reason}; output {choice.output} is (steps, N, classes): time-major")
    return choice


def choose_task(output_shapes: Sequence[Shape], input_shapes: Sequence[Shape], *, task: str | None = None,
                sample: Sequence[np.ndarray] | None = None) -> TaskChoice:
    """The task for a model with these outputs: ``task`` when given (checked against the outputs), else detected
    from the output shapes and, where shapes are ambiguous, the reference's outputs on one ``sample``."""
    if task is None or task == "auto":
        return _detected(output_shapes, input_shapes, sample)
    if task not in TASKS:
        raise InputError(f"unknown task {task!r}", hint=f"use one of {', '.join(TASKS)} (or auto)")
    found = _detected(output_shapes, input_shapes, sample)
    if task == found.name:
        return dataclasses.replace(found, given=True, reason=f"given; {found.reason}")
    if task == "detect":
        layout = detect_layout(output_shapes, _image_size(input_shapes))
        if layout is None:
            raise InputError("--task detect but no output has a detector's layout ((N, 4 + C, A), (N, A, 4 + C), or "
                             "boxes (N, A, 4) with scores (N, A, C))",
                             hint="check the outputs with npukit inspect, or use --task generic")
        return TaskChoice("detect", layout.boxes, "given", layout, given=True)
    # any (N, A, B) fits CTC by shape; a detector's, its boxes found plausible on the outputs, does not
    if task == "text-recognize" and found.name == "detect" and sample is not None:
        raise InputError(f"--task text-recognize but the outputs are a detector's ({found.layout.kind}: "
                         f"{', '.join(str(list(s)) for s in output_shapes)}), not (N, steps, classes) CTC scores",
                         hint="leave --task out (the detector's metric is used), or pass --task detect")
    index = {"classify": lambda s: is_class_scores(s), "segment": lambda s: len(s) == 4,
             "text-detect": lambda s: len(s) == 4, "text-recognize": lambda s: len(s) == 3,
             "generic": lambda s: True}[task]
    fitting = [i for i, shape in enumerate(output_shapes) if index(shape)]
    if fitting:
        chosen = TaskChoice(task, _probability_map(fitting, sample) if task == "segment" else fitting[0], "given",
                            given=True)
        return _recognizer(chosen, output_shapes, input_shapes) if task == "text-recognize" else chosen
    raise InputError(f"--task {task} but no output has the shape that task decodes "
                     f"(outputs: {', '.join(str(list(s)) for s in output_shapes)})",
                     hint="check the outputs with npukit inspect, or use --task generic")
