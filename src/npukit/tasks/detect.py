"""Detection: decode both models' outputs into boxes, run NMS, and score the candidate's detections against the
reference's as ground truth: mAP@0.5 (the headline), recall at the operating threshold, and the IoU of matched boxes.

Layouts understood (``detect_layout`` finds them from the output shapes):
- ``yolo``: one output (N, 4 + C, A) or (N, A, 4 + C): box centre x, y, width, height, then C class scores
  (YOLOv8 style; ``objectness=True`` reads (N, A, 5 + C) as YOLOv5 does: score = objectness x class score).
- ``boxes-scores``: a boxes output (N, A, 4) and a scores output (N, A, C) (SSD, RetinaFace, decoded detectors).
  Boxes are corners (x1, y1, x2, y2) when the reference's confident boxes all have x2 >= x1 and y2 >= y1, centre
  and size otherwise. Scores outside [0, 1] are logits (softmax over C > 1, sigmoid for one class); scores whose
  rows sum to 1 over C >= 2 classes have a background class first, which is dropped. A raw head whose "boxes" are
  anchor offsets (some values below -0.5: not coordinates) is matched anchor by anchor, with no NMS (the anchors
  are the same in both models), and a match needs IoU >= 0.5 of the two boxes decoded on that anchor's prior: with
  the SSD variances (0.1 for the centre, 0.2 for the log size) the prior's position and size do not change the IoU,
  so a unit prior stands in for the one the model was trained with.
- ``yolox`` (a raw YOLOX head) and ``gfl-levels`` (PicoDet / GFL: per-level scores and box distributions).
- ``heatmap`` (CenterNet / CenterFace): a class heatmap (N, C, h, w) at a stride of the input, then a size output
  and an offset output (N, 2, h, w) at the same resolution, in that order. Detections are the heatmap's 3x3 local
  maxima (sigmoid first where the values are logits); a box is centred on its cell plus the offset, sized by the
  size output, read as log sizes in strides (CenterFace: exp(s) x stride) where every value at the peaks is under
  8 in magnitude, as sizes in output cells (CenterNet) otherwise. Outputs after these (CenterFace's landmarks) are
  held to the SQNR floor.

Outputs beside the decoded ones that hold one value per anchor (RetinaFace's landmarks: (N, A, 10) beside its boxes
and scores) or per heatmap cell (CenterFace's landmarks: (N, 10, h, w)) are read only where something is detected:
their fidelity is also measured at the anchors or cells either model detects at ``GT_SCORE`` or more (after NMS),
and that figure is the one held to the SQNR floor (``TaskResult.at_detections``). Measured over every anchor,
RetinaFace-MobileNet0.25's INT8 landmarks read 14.6 dB while the 192 rows at its detections read 25.2 dB: the
difference is noise on background anchors nobody decodes.

The reference's detections at ``GT_SCORE`` or more after NMS are the ground truth; the candidate's at
``PRED_SCORE`` or more are ranked by score (the way COCO and VOC evaluate), matched greedily to an unmatched ground
truth box of the same class at IoU >= 0.5, and AP is the area under the interpolated precision-recall curve, averaged
over the classes present in the ground truth.

AP ranks scores and so cannot see scores squeezed below a caller's threshold (all ranked the same way, all found):
the detections a user actually gets are checked too, as F1 at each operating threshold in ``OPERATING`` (the
reference's detections at or above it against the candidate's at or above it; a score less than ``BAND`` above the
threshold may fall either way). Each of mAP@0.5 and those F1 scores is held to
the floor.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from npukit.tasks.base import OutputStats, TaskResult

GT_SCORE = 0.25  # the reference's operating threshold: its detections at or above it are the ground truth
PRED_SCORE = 0.001  # the candidate's detections ranked for AP (COCO's evaluation threshold)
NMS_IOU = 0.5
MATCH_IOU = 0.5
MAX_DETECTIONS = 300
OPERATING = (0.25, 0.5)  # score thresholds callers commonly use; F1 of the detections kept at each
BAND = 0.05  # a detection within this of a threshold may fall on either side of it without counting as an error


SSD_VARIANCES = (0.1, 0.2)  # centre and log-size scales of SSD-style box offsets (SSD, RetinaFace, TF OD API 10/5)
STRIDES = (8, 16, 32, 64, 128)  # feature-map strides of anchor-free heads (YOLOX, PicoDet/GFL)
OBJECT_REACH = 4.0  # a raw head's anchors within this many strides of an object's first one count as that object


@dataclasses.dataclass(frozen=True)
class DetectLayout:
    kind: str  # "yolo" | "boxes-scores" | "gfl-levels" | "yolox" | "heatmap"
    boxes: int  # output index of the boxes (of everything, for yolo and yolox)
    scores: int  # output index of the scores
    channels_first: bool = False  # yolo (N, 4 + C, A)
    objectness: bool = False  # yolo (N, A, 5 + C)
    levels: tuple[tuple[int, int, int], ...] = ()  # gfl-levels: (scores output, distribution output, stride)
    image: tuple[int, int] | None = None  # the input's (H, W), for the grids of yolox and gfl-levels
    offsets: int = -1  # heatmap: the offset output (``boxes`` is the size output, ``scores`` the heatmap)
    stride: int = 0  # heatmap: input pixels per heatmap cell

    def decoded(self) -> tuple[int, ...]:
        if self.kind == "gfl-levels":
            return tuple(i for level in self.levels for i in level[:2])
        if self.kind == "heatmap":
            return (self.scores, self.boxes, self.offsets)
        return tuple(dict.fromkeys((self.boxes, self.scores)))

    def describe(self, names: Sequence[str]) -> str:
        if self.kind == "yolo":
            return (f"YOLO-style {names[self.boxes]!r} ({'4 + C, anchors' if self.channels_first else 'anchors, 4 + C'}"
                    f"{', objectness' if self.objectness else ''})")
        if self.kind == "yolox":
            return f"YOLOX-style raw head {names[self.boxes]!r} (grid offsets, log sizes, objectness, classes)"
        if self.kind == "heatmap":
            return (f"CenterNet-style heatmap {names[self.scores]!r} + size {names[self.boxes]!r} + offset "
                    f"{names[self.offsets]!r} at stride {self.stride}")
        if self.kind == "gfl-levels":
            return ("per-level scores + box distributions (GFL / PicoDet): "
                    + ", ".join(f"stride {st}: {names[a]!r} + {names[b]!r}" for a, b, st in self.levels))
        return f"boxes {names[self.boxes]!r} + scores {names[self.scores]!r}"


def _grid(side: int, stride: int) -> int:
    return -(-side // stride)


def _stride_for(anchors: int, image: tuple[int, int]) -> int | None:
    for stride in STRIDES:
        if _grid(image[0], stride) * _grid(image[1], stride) == anchors:
            return stride
    return None


def detect_layout(shapes: Sequence[Sequence[int | str | None]],
                  image: tuple[int, int] | None = None, *, raw_yolox: bool = True) -> DetectLayout | None:
    """The layout of a detector's outputs from their shapes (and the input's (H, W) for anchor-free heads), or None
    when they do not look like one. ``raw_yolox=False`` reads an (N, A, 5 + C) output as decoded boxes and scores
    even where A is YOLOX's anchor count (YOLOv8 at the same size has as many)."""
    dims = [list(s) for s in shapes]

    def static(d: list) -> bool:
        return all(isinstance(v, int) for v in d[1:])

    if image is not None:  # CenterNet / CenterFace: heatmap, then size and offset maps at its resolution
        maps = [i for i, d in enumerate(dims) if len(d) == 4 and static(d) and d[2] >= 2 and d[3] >= 2
                and image[0] % d[2] == 0 and image[1] % d[3] == 0 and image[0] // d[2] == image[1] // d[3] >= 2]
        for h in maps:
            if dims[h][1] == 2:
                continue
            pairs = [i for i in maps if i > h and dims[i][1] == 2 and dims[i][2:] == dims[h][2:]]
            if len(pairs) >= 2:
                return DetectLayout("heatmap", pairs[0], h, image=image, offsets=pairs[1],
                                    stride=image[0] // dims[h][2])

    for i, d in enumerate(dims):  # (N, A, 4) boxes with an (N, A, C) scores output of the same A
        if len(d) == 3 and d[-1] == 4 and static(d):
            for j, e in enumerate(dims):
                if j != i and len(e) == 3 and static(e) and e[1] == d[1] and e[2] >= 1 and e[2] != 4:
                    return DetectLayout("boxes-scores", i, j, image=image)
                if j != i and len(e) == 2 and static(e) and e[1] == d[1]:  # (N, A) single-class scores
                    return DetectLayout("boxes-scores", i, j, image=image)
    if image is not None:  # per level: (N, A, C) scores and (N, A, 4 x bins) distributions, A = the level's grid
        by_anchors: dict[int, list[int]] = {}
        for i, d in enumerate(dims):
            if len(d) == 3 and static(d):
                by_anchors.setdefault(d[1], []).append(i)
        levels = []
        for anchors, members in by_anchors.items():
            stride = _stride_for(anchors, image)
            dist = [i for i in members if dims[i][2] % 4 == 0 and dims[i][2] >= 8]
            score = [i for i in members if i not in dist]
            if stride is not None and len(dist) == 1 and len(score) == 1:
                levels.append((score[0], dist[0], stride))
        if len(levels) >= 2:
            levels.sort(key=lambda level: level[2])
            return DetectLayout("gfl-levels", levels[0][1], levels[0][0], levels=tuple(levels), image=image)
        for i, d in enumerate(dims):  # YOLOX: (N, A, 5 + C), A the anchors of strides 8, 16 and 32 together
            if raw_yolox and len(d) == 3 and static(d) and d[2] >= 6 and \
                    d[1] == sum(_grid(image[0], st) * _grid(image[1], st) for st in (8, 16, 32)):
                return DetectLayout("yolox", i, i, objectness=True, image=image)
    for i, d in enumerate(dims):  # one (N, 4 + C, A) or (N, A, 4 + C) output, A the larger
        if len(d) == 3 and static(d) and min(d[1], d[2]) >= 5:
            if d[2] > d[1] and d[2] >= 64:
                return DetectLayout("yolo", i, i, channels_first=True)
            if d[1] > d[2] and d[1] >= 64:
                return DetectLayout("yolo", i, i, channels_first=False)
    return None


@dataclasses.dataclass(frozen=True)
class Detections:
    boxes: np.ndarray  # (M, 4) corners; anchor offsets for a raw head
    scores: np.ndarray  # (M,)
    classes: np.ndarray  # (M,) int
    anchors: np.ndarray  # (M,) the anchor each came from (a heatmap's: its cell, y * w + x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _corners(cxcywh: np.ndarray) -> np.ndarray:
    cx, cy, w, h = cxcywh.T
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every corner box of ``a`` (M, 4) with every one of ``b`` (K, 4)."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float = NMS_IOU,
        limit: int = MAX_DETECTIONS) -> np.ndarray:
    """Indices kept by class-wise greedy non-maximum suppression, highest score first."""
    keep: list[int] = []
    order = np.argsort(-scores, kind="stable")
    suppressed = np.zeros(len(scores), bool)
    for pos, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(int(i))
        if len(keep) >= limit:
            break
        rest = order[pos + 1:]
        rest = rest[(classes[rest] == classes[i]) & ~suppressed[rest]]
        if len(rest):
            overlaps = iou_matrix(boxes[i:i + 1], boxes[rest])[0]
            suppressed[rest[overlaps > iou]] = True
    return np.array(keep, np.int64)


class _Decoder:
    """Turns one sample's outputs into detections. Box format, score form and background class are read from the
    reference's first sample and then fixed, so both models are decoded the same way."""

    def __init__(self, layout: DetectLayout) -> None:
        self.layout = layout
        self.corners: bool | None = None
        self.log_sizes = False  # heatmap: sizes are log sizes in strides (CenterFace), not sizes in cells
        self.score_form: str | None = None  # "prob" | "softmax" | "sigmoid"
        self.background = False
        self.raw = False

    def _split(self, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        boxes, scores, _ = self._split_at(outputs)
        return boxes, scores

    def _split_at(self, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Boxes, scores, and where each row comes from: its anchor (the row of the outputs' anchor axis), or for a
        heatmap its cell (y * w + x)."""
        lay = self.layout
        if lay.kind == "heatmap":  # scores come back as probabilities
            heat, size, offset = (np.asarray(outputs[i], np.float64)[0] for i in (lay.scores, lay.boxes, lay.offsets))
            return _heatmap_peaks(heat, size, offset, lay.stride, logits=self.score_form == "sigmoid",
                                  log_sizes=self.log_sizes)
        boxes, scores = self._rows(outputs)
        return boxes, scores, np.arange(len(boxes))

    def _rows(self, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        lay = self.layout
        if lay.kind == "yolox":
            return _yolox(np.asarray(outputs[lay.boxes], np.float64)[0], lay.image, logits=self.score_form != "prob")
        if lay.kind == "gfl-levels":
            parts = [_gfl_level(np.asarray(outputs[a], np.float64)[0], np.asarray(outputs[b], np.float64)[0], st,
                                lay.image) for a, b, st in lay.levels]
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        if lay.kind == "yolo":
            arr = np.asarray(outputs[lay.boxes], np.float64)[0]
            if lay.channels_first:
                arr = arr.T
            boxes = _corners(arr[:, :4])
            scores = arr[:, 5:] * arr[:, 4:5] if lay.objectness else arr[:, 4:]
            return boxes, scores
        boxes = np.asarray(outputs[lay.boxes], np.float64)[0]
        scores = np.asarray(outputs[lay.scores], np.float64)[0]
        if scores.ndim == 1:
            scores = scores[:, None]
        return boxes, scores

    def fix_format(self, outputs: Sequence[np.ndarray]) -> None:
        if self.score_form is not None:
            return
        if self.layout.kind == "yolox":  # objectness and classes: logits, or already probabilities
            raw = np.asarray(outputs[self.layout.boxes], np.float64)[0][:, 4:]
            self.score_form = "sigmoid" if raw.min() < -1e-3 or raw.max() > 1 + 1e-3 else "prob"
            self.corners = True
            return
        boxes, scores = self._split(outputs)
        if self.layout.kind == "yolo":
            self.score_form, self.corners = "prob", True
            return
        if self.layout.kind == "gfl-levels":
            self.corners = True
            self.score_form = "sigmoid" if scores.min() < -1e-3 or scores.max() > 1 + 1e-3 else "prob"
            return
        if self.layout.kind == "heatmap":  # read before the split: the peaks depend on both choices
            heat = np.asarray(outputs[self.layout.scores], np.float64)[0]
            self.score_form = "sigmoid" if heat.min() < -1e-3 or heat.max() > 1 + 1e-3 else "prob"
            probs = _sigmoid(heat) if self.score_form == "sigmoid" else heat
            peaks = _local_maxima(probs) & (probs >= GT_SCORE)
            sizes = np.asarray(outputs[self.layout.boxes], np.float64)[0][:, peaks.any(axis=0)]
            self.log_sizes = bool(sizes.size == 0 or np.abs(sizes).max() < 8.0)
            self.corners = True
            return
        if scores.min() < -1e-3 or scores.max() > 1 + 1e-3:
            self.score_form = "softmax" if scores.shape[1] > 1 else "sigmoid"
        else:
            self.score_form = "prob"
        probs = self._probs(scores)
        if probs.shape[1] >= 2 and np.allclose(probs.sum(axis=1), 1.0, atol=1e-2):
            self.background = True
        self.raw = bool(boxes.size and boxes.min() < -0.5)
        if not self.raw:
            top = self._class_scores(probs).max(axis=1) >= GT_SCORE
            sample = boxes[top] if top.any() else boxes
            self.corners = bool(np.all(sample[:, 2] >= sample[:, 0]) and np.all(sample[:, 3] >= sample[:, 1]))

    def _probs(self, scores: np.ndarray) -> np.ndarray:
        if self.score_form == "softmax":
            return _softmax(scores)
        if self.score_form == "sigmoid":
            return _sigmoid(scores)
        return scores

    def _class_scores(self, probs: np.ndarray) -> np.ndarray:
        return probs[:, 1:] if self.background else probs

    def decode(self, outputs: Sequence[np.ndarray], threshold: float) -> Detections:
        boxes, scores, where = self._split_at(outputs)
        probs = scores if self.layout.kind == "heatmap" else self._class_scores(self._probs(scores))
        if self.layout.kind == "boxes-scores" and not self.raw and not self.corners:
            boxes = _corners(boxes)
        classes = probs.argmax(axis=1)
        best = probs[np.arange(len(probs)), classes]
        chosen = np.nonzero(best >= threshold)[0]
        boxes, best, classes = boxes[chosen], best[chosen], classes[chosen]
        if self.raw:  # anchor offsets: no NMS, matched anchor by anchor
            order = np.argsort(-best, kind="stable")[:MAX_DETECTIONS]
        else:
            order = nms(boxes, best, classes)
        return Detections(boxes[order], best[order], classes[order], where[chosen[order]])


ANCHOR_STRIDES = ((8, 16, 32), (8, 16, 32, 64), (8, 16, 32, 64, 128), (16, 32, 64), (16, 32, 64, 128))


def anchor_centres(anchors: int, image: tuple[int, int] | None) -> np.ndarray | None:
    """(A, 3) centre x, centre y and stride of each anchor of a raw SSD / RetinaFace head with ``anchors`` rows on
    an ``image`` (H, W), where they fit a feature pyramid of ``ANCHOR_STRIDES`` with k anchors per cell, laid out
    level by level, cell by cell (row-major), then the k of a cell, as RetinaFace's prior box generator does; None
    where no such pyramid gives ``anchors``."""
    if image is None:
        return None
    for strides in ANCHOR_STRIDES:
        cells = [_grid(image[0], s) * _grid(image[1], s) for s in strides]
        if anchors % sum(cells):
            continue
        per_cell = anchors // sum(cells)
        if not 1 <= per_cell <= 9:
            continue
        levels = []
        for stride in strides:
            col, row = _centers(image, stride)
            centre = np.stack([(col + 0.5) * stride, (row + 0.5) * stride, np.full(col.shape, stride)], axis=1)
            levels.append(np.repeat(centre, per_cell, axis=0))
        return np.concatenate(levels)
    return None


def objects_among(found: Detections, centres: np.ndarray, *, reach: float = OBJECT_REACH) -> int:
    """How many objects a raw head's detections (anchors) point at, about: anchors taken by score, each starting
    an object unless its cell centre lies within ``reach`` strides (the larger of the two anchors') of an object's
    first anchor. Several anchors of neighbouring cells and levels fire on one face; the weakness of a check is in
    the objects, not in them (RetinaFace's 8 photos: 94 anchors at score 0.25 for 6 faces)."""
    kept: list[np.ndarray] = []
    for anchor in found.anchors[np.argsort(-found.scores, kind="stable")]:
        here = centres[int(anchor)]
        if not any(np.hypot(*(here[:2] - k[:2])) <= reach * max(here[2], k[2]) for k in kept):
            kept.append(here)
    return len(kept)


def _centers(image: tuple[int, int], stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-major cell indices (column, row) of a stride's grid over the image."""
    rows, cols = _grid(image[0], stride), _grid(image[1], stride)
    col, row = np.meshgrid(np.arange(cols, dtype=np.float64), np.arange(rows, dtype=np.float64))
    return col.reshape(-1), row.reshape(-1)


def _on_unit_prior(offsets: np.ndarray) -> np.ndarray:
    """An SSD / RetinaFace head's box offsets (dx, dy, dw, dh) -> corner boxes on a unit prior centred at 0, with
    the variances every such head is trained with (``SSD_VARIANCES``). Two boxes decoded on the same prior have the
    IoU they would have on the real one: IoU does not change when both are shifted or scaled along either axis."""
    centre = offsets[:, :2] * SSD_VARIANCES[0]
    size = np.exp(np.clip(offsets[:, 2:4] * SSD_VARIANCES[1], -20, 20))
    return np.concatenate([centre - size / 2, centre + size / 2], axis=1)


def _yolox(raw: np.ndarray, image: tuple[int, int], *, logits: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """YOLOX's raw head (A, 5 + C) -> corner boxes in input pixels and objectness x class probabilities
    (``logits=False``: the export applied the sigmoids already)."""
    grids = [(*_centers(image, st), st) for st in (8, 16, 32)]
    col = np.concatenate([g[0] for g in grids])
    row = np.concatenate([g[1] for g in grids])
    stride = np.concatenate([np.full(len(g[0]), g[2], np.float64) for g in grids])
    cx, cy = (raw[:, 0] + col) * stride, (raw[:, 1] + row) * stride
    w, h = np.exp(np.clip(raw[:, 2], -20, 20)) * stride, np.exp(np.clip(raw[:, 3], -20, 20)) * stride
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    squash = _sigmoid if logits else (lambda v: v)
    return boxes, squash(raw[:, 4:5]) * squash(raw[:, 5:])


def _local_maxima(probs: np.ndarray) -> np.ndarray:
    """(C, h, w) -> where each value is the largest of its 3x3 neighbourhood in its channel (CenterNet's NMS)."""
    padded = np.pad(probs, ((0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    h, w = probs.shape[1:]
    pooled = np.max([padded[:, dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)], axis=0)
    return probs >= pooled


def _heatmap_peaks(heat: np.ndarray, size: np.ndarray, offset: np.ndarray, stride: int, *, logits: bool,
                   log_sizes: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A CenterNet head's (C, h, w) heatmap with (2, h, w) sizes (height, width) and offsets (y, x) -> corner boxes
    in input pixels at the heatmap's local maxima (at most ``MAX_DETECTIONS``, the strongest), their class
    scores (the peak's class has the peak's value, the others 0) and their cells (y * w + x)."""
    probs = _sigmoid(heat) if logits else heat
    c, y, x = np.nonzero(_local_maxima(probs) & (probs >= PRED_SCORE))
    keep = np.argsort(-probs[c, y, x], kind="stable")[:MAX_DETECTIONS]
    c, y, x = c[keep], y[keep], x[keep]
    sh, sw = size[0, y, x], size[1, y, x]
    if log_sizes:
        sh, sw = np.exp(np.clip(sh, -20, 20)) * stride, np.exp(np.clip(sw, -20, 20)) * stride
    else:
        sh, sw = sh * stride, sw * stride
    cy, cx = (y + offset[0, y, x] + 0.5) * stride, (x + offset[1, y, x] + 0.5) * stride
    boxes = np.stack([cx - sw / 2, cy - sh / 2, cx + sw / 2, cy + sh / 2], axis=1)
    scores = np.zeros((len(c), heat.shape[0]))
    scores[np.arange(len(c)), c] = probs[c, y, x]
    return boxes, scores, y * heat.shape[2] + x


def _gfl_level(scores: np.ndarray, dist: np.ndarray, stride: int,
               image: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """One level of a GFL head: (A, 4 x bins) distances as distributions (softmax, expectation in bins of the
    stride) around each cell's centre -> corner boxes; scores as given."""
    bins = dist.shape[1] // 4
    probs = _softmax(dist.reshape(-1, 4, bins))
    distance = (probs * np.arange(bins)).sum(axis=-1) * stride  # left, top, right, bottom
    col, row = _centers(image, stride)
    cx, cy = (col + 0.5) * stride, (row + 0.5) * stride
    boxes = np.stack([cx - distance[:, 0], cy - distance[:, 1], cx + distance[:, 2], cy + distance[:, 3]], axis=1)
    return boxes, scores


class DetectMeter:
    task = "detect"

    def __init__(self, output_names: Sequence[str], layout: DetectLayout) -> None:
        self.names = list(output_names)
        self.layout = layout
        self._stats = OutputStats(self.names)
        self._decoder = _Decoder(layout)
        self._gt_per_class: dict[int, int] = defaultdict(int)
        self._preds: dict[int, list[tuple[float, bool]]] = defaultdict(list)
        self._samples = 0
        self._gt = 0
        self._recalled = 0
        self._ious: list[float] = []
        self._cand_at_threshold = 0
        self._operating = {t: [0, 0, 0] for t in OPERATING}  # threshold -> [true pos, false pos, false neg]
        self._aligned: list[int] | None = None  # undecoded outputs with a value per anchor / heatmap cell
        self._at: OutputStats | None = None
        self._at_rows = 0
        self._centres: np.ndarray | None = None  # a raw head's anchor centres, where its pyramid is known
        self._objects = {t: 0 for t in (GT_SCORE, *OPERATING)}  # a raw head's objects (about) at each score

    def update(self, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], labels: Any = None) -> None:
        self._stats.update(reference, candidate)
        batch = np.asarray(reference[self.layout.decoded()[0]]).shape[0]
        for b in range(batch):
            ref = [np.asarray(o)[b:b + 1] for o in reference]
            cand = [np.asarray(o)[b:b + 1] for o in candidate]
            self._decoder.fix_format(ref)
            gt, pred = self._decoder.decode(ref, GT_SCORE), self._decoder.decode(cand, PRED_SCORE)
            self._one(gt, pred)
            self._count_objects(ref, gt)
            self._at_detections(ref, cand, gt, pred)

    def _count_objects(self, ref: Sequence[np.ndarray], gt: Detections) -> None:
        """A raw head's reference detections are anchors: count the objects behind them (``objects_among``) at each
        score, where the anchors fit a known pyramid."""
        if not self._decoder.raw:
            return
        if self._centres is None:
            self._centres = anchor_centres(np.shape(ref[self.layout.boxes])[1], self.layout.image)
        if self._centres is None:
            return
        for score in self._objects:
            at = gt.scores >= score
            self._objects[score] += objects_among(
                Detections(gt.boxes[at], gt.scores[at], gt.classes[at], gt.anchors[at]), self._centres)

    def _aligned_outputs(self, reference: Sequence[np.ndarray]) -> list[int]:
        """Undecoded outputs with one row per anchor of a boxes-scores head, or one map per cell of a heatmap."""
        lay, decoded = self.layout, set(self.layout.decoded())
        shapes = [np.shape(o) for o in reference]
        if lay.kind == "boxes-scores":
            anchors = shapes[lay.boxes][1]
            return [i for i, s in enumerate(shapes) if i not in decoded and len(s) >= 2 and s[1] == anchors]
        if lay.kind == "heatmap":
            cells = shapes[lay.scores][2:]
            return [i for i, s in enumerate(shapes) if i not in decoded and len(s) == 4 and s[2:] == cells]
        return []

    def _at_detections(self, ref: Sequence[np.ndarray], cand: Sequence[np.ndarray], gt: Detections,
                       pred: Detections) -> None:
        """Feed the aligned outputs' rows at the anchors (cells) either model detects to their own statistics. The
        candidate's detections at ``GT_SCORE`` are ``pred``'s at that score or more: NMS is greedy by score, so
        what it keeps above a threshold does not depend on the boxes below it."""
        if self._aligned is None:
            self._aligned = self._aligned_outputs(ref)
            self._at = OutputStats([self.names[i] for i in self._aligned])
        if not self._aligned:
            return
        where = np.union1d(gt.anchors, pred.anchors[pred.scores >= GT_SCORE]).astype(np.int64)
        if not len(where):
            return

        def rows(o: np.ndarray) -> np.ndarray:
            o = np.asarray(o)[0]
            return o.reshape(o.shape[0], -1)[:, where].T if self.layout.kind == "heatmap" else o[where]

        assert self._at is not None
        self._at.update([rows(ref[i]) for i in self._aligned], [rows(cand[i]) for i in self._aligned])
        self._at_rows += len(where)

    def _matches(self, gt: Detections, pred: Detections) -> np.ndarray:
        """(len(gt), len(pred)) match strengths: IoU of same-class boxes, or 1 for the same anchor and class."""
        if self._decoder.raw:  # the same anchor and class, as close as the boxes decoded on that anchor's prior
            same = (gt.anchors[:, None] == pred.anchors[None, :]) & (gt.classes[:, None] == pred.classes[None, :])
            return np.where(same, iou_matrix(_on_unit_prior(gt.boxes), _on_unit_prior(pred.boxes)), 0.0)
        overlap = iou_matrix(gt.boxes, pred.boxes)
        overlap[gt.classes[:, None] != pred.classes[None, :]] = 0.0
        return overlap

    def _unmatched(self, wanted: np.ndarray, offered: np.ndarray, overlap: np.ndarray) -> int:
        """How many of the ``wanted`` rows of ``overlap`` find no ``offered`` column at MATCH_IOU (one each)."""
        sub = overlap[wanted][:, offered]
        taken = np.zeros(sub.shape[1], bool)
        missed = 0
        for row in sub:
            column = np.where(taken, -1.0, row)
            j = int(np.argmax(column)) if len(column) else -1
            if j >= 0 and column[j] >= MATCH_IOU:
                taken[j] = True
            else:
                missed += 1
        return missed

    def _operating_point(self, gt: Detections, pred: Detections, threshold: float) -> None:
        """F1 counts at ``threshold`` with a tolerance ``BAND`` for a score that moves a little across it: a
        reference detection at or above the threshold is missed where the candidate does not keep it at the
        threshold (if the reference's score is BAND or more above it) or within BAND below it (if the reference's
        score lies within BAND above it); a candidate detection likewise is false against the reference. So 0.52 ->
        0.48 across 0.5 counts as kept, 0.9 -> 0.45 and 0.30 -> 0.19 across 0.25 as missed."""
        overlap = self._matches(gt, pred)
        sure_gt, near_gt = gt.scores >= threshold + BAND, (gt.scores >= threshold) & (gt.scores < threshold + BAND)
        sure_pred = pred.scores >= threshold + BAND
        near_pred = (pred.scores >= threshold) & (pred.scores < threshold + BAND)
        missed = self._unmatched(sure_gt, pred.scores >= threshold, overlap) + self._unmatched(
            near_gt, pred.scores >= threshold - BAND, overlap)
        false = self._unmatched(sure_pred, gt.scores >= threshold, overlap.T) + self._unmatched(
            near_pred, gt.scores >= threshold - BAND, overlap.T)
        counts = self._operating[threshold]
        counts[0] += int(sure_gt.sum() + near_gt.sum()) - missed
        counts[1] += false
        counts[2] += missed

    def _one(self, gt: Detections, pred: Detections) -> None:
        for threshold in OPERATING:
            self._operating_point(gt, pred, threshold)
        self._samples += 1
        self._gt += len(gt.scores)
        for c in gt.classes.tolist():
            self._gt_per_class[c] += 1
        overlap = self._matches(gt, pred)
        taken = np.zeros(len(gt.scores), bool)
        for j in np.argsort(-pred.scores, kind="stable"):
            hit = False
            if len(gt.scores):
                candidates = np.where(taken, -1.0, overlap[:, j])
                i = int(np.argmax(candidates))
                if candidates[i] >= MATCH_IOU:
                    taken[i] = hit = True
                    if pred.scores[j] >= GT_SCORE:
                        self._recalled += 1
                        self._ious.append(float(overlap[i, j]))
            self._preds[int(pred.classes[j])].append((float(pred.scores[j]), hit))
        self._cand_at_threshold += int(np.sum(pred.scores >= GT_SCORE))

    def result(self) -> TaskResult:
        aps = {c: average_precision(self._preds.get(c, []), n) for c, n in self._gt_per_class.items() if n}
        value = float(np.mean(list(aps.values()))) if aps else None
        metrics = {"map50": value, "classes_with_reference_detections": len(aps), "reference_detections": self._gt,
                   "candidate_detections": self._cand_at_threshold,
                   "recall": self._recalled / self._gt if self._gt else None,
                   "mean_iou_of_matches": float(np.mean(self._ious)) if self._ious else None,
                   "layout": self.layout.describe(self.names),
                   "matching": (f"the same anchor, IoU >= {MATCH_IOU} decoded on it (SSD variances "
                                f"{SSD_VARIANCES[0]:g}, {SSD_VARIANCES[1]:g})") if self._decoder.raw
                   else f"IoU >= {MATCH_IOU}",
                   "reference_threshold": GT_SCORE,
                   "scoring": (f"recall: reference detections the candidate finds at score >= {GT_SCORE:g} exactly; "
                               f"F1 at {', '.join(f'{t:g}' for t in OPERATING)}: a detection whose score moves less "
                               f"than {BAND:g} across the threshold counts as kept (so F1 can read 1.0 beside a "
                               "recall below it)")}
        checks = {"map50": value} if value is not None else {}
        for threshold, (tp, fp, fn) in self._operating.items():
            if tp + fp + fn:  # undefined where neither model detects anything at this threshold
                f1 = 2 * tp / (2 * tp + fp + fn)
                metrics[f"f1_at_{threshold:g}"] = f1
                checks[f"f1_at_{threshold:g}"] = f1
            metrics[f"reference_detections_at_{threshold:g}"] = tp + fn  # what F1 at this threshold rests on
        if self._decoder.raw and self._centres is not None:  # what a raw head's anchors point at, for weakness
            metrics["reference_objects"] = self._objects[GT_SCORE]
            for threshold in OPERATING:
                metrics[f"reference_objects_at_{threshold:g}"] = self._objects[threshold]
            metrics["objects"] = (f"reference detections are anchors (a raw head is matched anchor by anchor); the "
                                  f"objects behind them are counted as anchors within {OBJECT_REACH:g} strides of "
                                  "one another's cell centres, about")
        note = "" if value is not None else f"the reference detected nothing at score >= {GT_SCORE} on these inputs"
        decoded = tuple(dict.fromkeys(self.names[i] for i in self.layout.decoded()))
        at = tuple(dataclasses.replace(o, shape=(self._at_rows, *o.shape[1:]))  # every row fed, not the last batch's
                   for o in (self._at.result() if self._at is not None and self._at_rows else ()))
        if at:
            metrics["aligned_outputs_at_detections"] = (
                f"{', '.join(repr(o.name) for o in at)}: held to the SQNR floor on the {self._at_rows} "
                f"{'cells' if self.layout.kind == 'heatmap' else 'anchors'} either model detects at score >= "
                f"{GT_SCORE} ({', '.join(f'{o.sqnr_db:.1f} dB' for o in at)}), not on every one")
        return TaskResult(task=self.task, samples=self._samples, metric="map50", value=value, metrics=metrics,
                          outputs=self._stats.result(), decoded=decoded, note=note, checks=checks,
                          at_detections=at)


def average_precision(preds: list[tuple[float, bool]], positives: int) -> float:
    """Area under the interpolated precision-recall curve of ``preds`` (score, true positive) over ``positives``
    ground-truth boxes (all-point interpolation, as VOC 2010+ and COCO compute it)."""
    if positives == 0:
        return float("nan")
    if not preds:
        return 0.0
    ranked = sorted(preds, key=lambda p: -p[0])
    hits = np.array([h for _, h in ranked], np.float64)
    tp = np.cumsum(hits)
    precision = tp / np.arange(1, len(hits) + 1)
    recall = tp / positives
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    previous = np.concatenate([[0.0], recall[:-1]])
    return float(np.sum((recall - previous) * precision))
