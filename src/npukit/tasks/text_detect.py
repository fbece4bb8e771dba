"""Text detection: the probability map of a DB-style text detector ((N, 1, H, W)) decoded into text boxes the way
DBNet's post-processing finds them, and the candidate's boxes matched to the reference's.

Decoding (PaddleOCR's ``DBPostProcess`` defaults): the map binarized at ``THRESHOLD``; each 8-connected region a text
candidate, kept where its short side is at least ``MIN_SIDE`` pixels and its mean probability (the box score) at
least ``BOX_THRESHOLD``; its box grown on every side by area * ``UNCLIP_RATIO`` / perimeter (DB's unclip) and kept
where the short side is then at least ``MIN_SIDE + 2``. Boxes are axis-aligned (DB takes the region's rotated
rectangle; for matching, its bounding box). Headline: F1 of the boxes matched one to one at IoU >= ``MATCH_IOU``
(ICDAR's text-detection hmean), summed over every sample. The pixel F1 (Dice) and IoU of the binarized maps are
reported beside it: a region's edge moves by a pixel under quantization noise and the pixel figures count every such
pixel, which DB's box does not see, and miss what the box sees: a line lost or two lines merged (PP-OCRv4's detector,
INT8 for XNNPACK, 2026-12-07: on its 8 calibration inputs pixel F1 0.834, 46 of 48 boxes matched, box F1 0.958; on
7 others pixel F1 0.960, 3 of 36 weak boxes lost, box F1 0.957)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from npukit.tasks.base import OutputStats, TaskResult

THRESHOLD = 0.3  # DB's binarization threshold
BOX_THRESHOLD = 0.6  # a region's mean probability for a box (PaddleOCR's det_db_box_thresh)
UNCLIP_RATIO = 1.5  # PaddleOCR's det_db_unclip_ratio
MIN_SIDE = 3  # DB's min_size
MATCH_IOU = 0.5


def text_boxes(probability: np.ndarray) -> np.ndarray:
    """The text boxes (K, 4) as x1, y1, x2, y2 that DB's post-processing finds in one (H, W) probability map."""
    from skimage.measure import label, regionprops

    regions = regionprops(label(probability >= THRESHOLD, connectivity=2), intensity_image=probability)
    boxes = []
    for region in regions:
        y1, x1, y2, x2 = region.bbox
        height, width = y2 - y1, x2 - x1
        if min(height, width) < MIN_SIDE or float(region.intensity_mean) < BOX_THRESHOLD:
            continue
        grow = height * width * UNCLIP_RATIO / (2 * (height + width))
        if min(height, width) + 2 * grow < MIN_SIDE + 2:
            continue
        boxes.append((x1 - grow, y1 - grow, x2 + grow, y2 + grow))
    return np.asarray(boxes, dtype=np.float64).reshape(-1, 4)


def matched_boxes(reference: np.ndarray, candidate: np.ndarray) -> int:
    """How many boxes of ``reference`` and ``candidate`` pair one to one at IoU >= ``MATCH_IOU``, greedily by IoU."""
    from npukit.tasks.detect import iou_matrix

    overlap = iou_matrix(reference, candidate)
    matched = 0
    while overlap.size and overlap.max() >= MATCH_IOU:
        i, j = np.unravel_index(np.argmax(overlap), overlap.shape)
        overlap[i, :] = -1.0
        overlap[:, j] = -1.0
        matched += 1
    return matched


class TextDetectMeter:
    task = "text-detect"

    def __init__(self, output_names: Sequence[str], probability_map: int = 0) -> None:
        self.names = list(output_names)
        self.map = probability_map
        self._stats = OutputStats(self.names)
        self._tp = self._fp = self._fn = self._samples = 0
        self._ref_boxes = self._cand_boxes = self._matched = 0

    def update(self, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], labels: Any = None) -> None:
        self._stats.update(reference, candidate)
        ref_map = np.asarray(reference[self.map], dtype=np.float32)
        cand_map = np.asarray(candidate[self.map], dtype=np.float32)
        ref, cand = ref_map >= THRESHOLD, cand_map >= THRESHOLD
        self._samples += ref.shape[0]
        self._tp += int(np.sum(ref & cand))
        self._fp += int(np.sum(~ref & cand))
        self._fn += int(np.sum(ref & ~cand))
        for ref_one, cand_one in zip(ref_map.reshape(-1, *ref_map.shape[-2:]),
                                     cand_map.reshape(-1, *cand_map.shape[-2:]), strict=True):
            ref_boxes, cand_boxes = text_boxes(ref_one), text_boxes(cand_one)
            self._ref_boxes += len(ref_boxes)
            self._cand_boxes += len(cand_boxes)
            self._matched += matched_boxes(ref_boxes, cand_boxes)

    def result(self) -> TaskResult:
        pixels = self._tp + self._fn
        pixel_f1 = 2 * self._tp / (2 * self._tp + self._fp + self._fn) if pixels else None
        pixel_iou = self._tp / (self._tp + self._fp + self._fn) if pixels else None
        boxes = self._ref_boxes + self._cand_boxes
        box_f1 = 2 * self._matched / boxes if self._ref_boxes else None
        metrics = {"box_f1": box_f1, "reference_detections": self._ref_boxes, "candidate_boxes": self._cand_boxes,
                   "matched_boxes": self._matched, "pixel_f1": pixel_f1, "pixel_iou": pixel_iou,
                   "reference_text_pixels": pixels, "candidate_text_pixels": self._tp + self._fp,
                   "threshold": THRESHOLD, "box_threshold": BOX_THRESHOLD, "match_iou": MATCH_IOU}
        note = ""
        if not self._ref_boxes:
            note = (f"the reference's map reaches {THRESHOLD} nowhere on these inputs" if not pixels else
                    f"the reference's map holds no text box (a region of mean probability {BOX_THRESHOLD} or more, "
                    f"{MIN_SIDE} pixels across) on these inputs")
        return TaskResult(task=self.task, samples=self._samples, metric="box_f1", value=box_f1, metrics=metrics,
                          outputs=self._stats.result(), decoded=(self.names[self.map],), note=note)
