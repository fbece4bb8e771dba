"""Task metrics on small synthetic cases whose answer is known, task detection from outputs, and the gate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from npukit.errors import InputError
from npukit.tasks import QualityGate, choose_task, judge
from npukit.tasks.base import FEW_SAMPLES
from npukit.tasks.detect import DetectLayout, DetectMeter, average_precision, iou_matrix, nms
from npukit.tasks.generic import GenericMeter
from npukit.tasks.segment import SegmentMeter
from npukit.tasks.text_detect import TextDetectMeter, text_boxes
from npukit.tasks.text_recognize import TextRecognizeMeter, ctc_greedy, edit_distance

rng = np.random.default_rng(0)


def _yolo(boxes: list[tuple[float, float, float, float]], classes: list[int], scores: list[float],
          n_classes: int = 3, anchors: int = 100) -> np.ndarray:
    """(1, 4 + C, A): the given cx, cy, w, h boxes first, the rest background-only anchors with tiny scores."""
    out = np.zeros((1, 4 + n_classes, anchors), np.float32)
    out[0, :4, :] = rng.uniform(10, 50, (4, anchors))
    out[0, 4:, :] = rng.uniform(0, 0.0005, (n_classes, anchors))
    for a, (box, c, s) in enumerate(zip(boxes, classes, scores)):
        out[0, :4, a] = box
        out[0, 4 + c, a] = s
    return out


def _detect(reference: list[np.ndarray], candidate: list[np.ndarray], layout: DetectLayout):
    meter = DetectMeter([f"out{i}" for i in range(len(reference))], layout)
    meter.update(reference, candidate)
    return meter.result()


YOLO = DetectLayout("yolo", 0, 0, channels_first=True)


def test_identical_detections_score_one_and_a_shifted_box_its_iou() -> None:
    ref = _yolo([(50, 50, 20, 20), (150, 80, 40, 30)], [0, 2], [0.9, 0.8])
    same = _detect([ref], [ref.copy()], YOLO)
    assert same.value == 1.0 and same.metrics["recall"] == 1.0 and same.metrics["mean_iou_of_matches"] == 1.0
    assert "recall: reference detections" in same.metrics["scoring"] and "0.05" in same.metrics["scoring"]
    shifted = ref.copy()
    shifted[0, 0, 0] += 4  # 20 x 20 box moved 4 px: IoU 16 * 20 / (2 * 400 - 320) = 2/3
    result = _detect([ref], [shifted], YOLO)
    assert result.value == 1.0
    assert result.metrics["mean_iou_of_matches"] == pytest.approx((2 / 3 + 1) / 2, abs=1e-6)
    far = ref.copy()
    far[0, 0, 0] += 10  # IoU 10 * 20 / (800 - 200) = 1/3 < 0.5: the box is missed, class 0's AP is 0
    assert _detect([ref], [far], YOLO).value == pytest.approx(0.5)


def test_zeroed_class_scores_fail_the_gate_where_sqnr_alone_looked_healthy() -> None:
    ref = _yolo([(50, 50, 20, 20), (150, 80, 40, 30)], [0, 2], [0.9, 0.8])
    broken = ref.copy()
    broken[0, 4:, :] = 0.0  # the INT8 failure of issue 21: one uint8 grid for coordinates and scores
    result = _detect([ref], [broken], YOLO)
    assert result.value == 0.0 and result.metrics["candidate_detections"] == 0
    assert result.outputs[0].sqnr_db > 25  # the whole output's SQNR hides it: box coordinates dominate
    verdict = judge(result, QualityGate(), what="quantize")
    assert not verdict.passed and verdict.line.startswith("FAIL") and "map50 0.000 < 0.9" in verdict.line
    accepted = judge(result, QualityGate(accept_degraded=True), what="quantize")
    assert accepted.passed and accepted.degraded and accepted.line.startswith("DEGRADED")


def test_a_wrong_class_is_no_match_and_a_missed_detection_lowers_recall() -> None:
    ref = _yolo([(50, 50, 20, 20), (150, 80, 40, 30)], [0, 2], [0.9, 0.8])
    cand = _yolo([(50, 50, 20, 20), (150, 80, 40, 30)], [1, 2], [0.9, 0.1])
    result = _detect([ref], [cand], YOLO)
    assert result.metrics["recall"] == 0.0  # class 0 called class 1; class 2 found below the operating threshold
    assert result.value == pytest.approx(0.5)  # class 0's AP 0, class 2's 1 (AP ranks every score)


def test_boxes_scores_layout_with_softmax_background_and_corners() -> None:
    anchors = 50
    boxes = np.tile(np.array([0, 0, 1, 1], np.float32), (1, anchors, 1)) * rng.uniform(0.5, 1, (1, anchors, 1))
    logits = np.zeros((1, anchors, 2), np.float32)
    logits[..., 0] = 5.0  # background everywhere ...
    logits[0, 3] = [0.0, 6.0]  # ... but one face
    boxes[0, 3] = [0.2, 0.2, 0.4, 0.5]
    layout = choose_task([(1, anchors, 4), (1, anchors, 2)], [(1, 3, 64, 64)]).layout
    assert layout == DetectLayout("boxes-scores", 0, 1, image=(64, 64))
    result = _detect([boxes, logits], [boxes.copy(), logits.copy()], layout)
    assert result.metrics["reference_detections"] == 1 and result.value == 1.0


def test_nms_iou_and_average_precision() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30]], np.float64)
    assert iou_matrix(boxes[:1], boxes[1:2])[0, 0] == pytest.approx(90 / 110)
    keep = nms(boxes, np.array([0.9, 0.8, 0.7]), np.array([0, 0, 0]))
    assert keep.tolist() == [0, 2]
    assert nms(boxes, np.array([0.9, 0.8, 0.7]), np.array([0, 1, 0])).tolist() == [0, 1, 2]  # class-wise
    assert average_precision([(0.9, True), (0.8, False), (0.7, True)], 2) == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert average_precision([], 3) == 0.0


def test_segmentation_miou_and_pixel_agreement() -> None:
    ref = np.zeros((1, 2, 4, 4), np.float32)
    ref[0, 1, :, :2] = 1.0  # class 1 on the left half
    same = SegmentMeter(["masks"])
    same.update([ref], [ref.copy()])
    assert same.result().value == 1.0
    cand = np.zeros_like(ref)
    cand[0, 1, :, :1] = 1.0  # class 1 on the left quarter: IoU(1) = 4/8, IoU(0) = 8/12
    meter = SegmentMeter(["masks"])
    meter.update([ref], [cand])
    result = meter.result()
    assert result.value == pytest.approx((0.5 + 8 / 12) / 2) and result.metrics["pixel_agreement"] == 0.75


def test_a_one_channel_mask_is_a_binary_segmentation() -> None:
    """--task segment on a (N, 1, H, W) mask took the argmax over one channel: class 0 everywhere, mIoU 1.0 for an
    artifact at -9.4 dB (exit 0). One channel is foreground where a logit map exceeds 0 (a probability map reaches
    0.5): a mask that moved fails, one that kept its pixels passes."""
    logits = np.full((1, 1, 4, 4), -3.0, np.float32)
    logits[0, 0, :, :2] = 2.0  # foreground on the left half
    moved = -logits  # foreground on the right half
    meter = SegmentMeter(["mask"])
    meter.update([logits], [moved])
    result = meter.result()
    assert result.value == 0.0 and result.metrics["binary_threshold"] == 0.0
    assert not judge(result, QualityGate(), what="compile").passed
    meter = SegmentMeter(["mask"])
    meter.update([logits], [logits + 0.5])  # off by 0.5 everywhere, the same pixels on either side of 0
    assert meter.result().value == 1.0
    probabilities = 1 / (1 + np.exp(-logits))
    meter = SegmentMeter(["mask"])
    meter.update([probabilities], [probabilities * 0.9])  # 0.88 -> 0.79 stays foreground, 0.047 background
    assert meter.result().value == 1.0 and meter.result().metrics["binary_threshold"] == 0.5


def test_masks_of_one_class_everywhere_compare_nothing() -> None:
    """An untrained LR-ASPP gave class 0 at every pixel: mIoU 1.000 passed, having compared nothing."""
    ref = np.zeros((1, 3, 4, 4), np.float32)
    ref[0, 0] = 1.0
    meter = SegmentMeter(["masks"])
    meter.update([ref], [ref.copy()])
    result = meter.result()
    assert result.value is None and result.compared_nothing
    assert result.note == "the reference's masks are class 0 at every pixel of these inputs"
    verdict = judge(result, QualityGate(), what="compile")
    assert not verdict.passed and "so the segment check compared nothing" in verdict.line


def _text_map(*lines: tuple[int, int, int, int], value: float = 0.9) -> np.ndarray:
    """A (1, 1, 64, 64) probability map with each line (y1, y2, x1, x2) at ``value``."""
    probability = np.zeros((1, 1, 64, 64), np.float32)
    for y1, y2, x1, x2 in lines:
        probability[0, 0, y1:y2, x1:x2] = value
    return probability


def test_text_detection_matches_db_boxes_not_pixels() -> None:
    """Edges a pixel off keep every box (the pixel F1 counts them); a lost line, two lines merged into one region, a
    region too faint for DB's box score and a new line each cost a box."""
    ref = _text_map((4, 12, 4, 60), (20, 28, 4, 60), (36, 44, 4, 40))
    meter = TextDetectMeter(["maps"])
    meter.update([ref], [_text_map((5, 12, 4, 61), (20, 29, 3, 60), (36, 44, 5, 40))])
    result = meter.result()
    assert result.metric == "box_f1" and result.value == 1.0 and result.metrics["pixel_f1"] < 0.95
    assert result.metrics["reference_detections"] == 3 and text_boxes(ref[0, 0]).shape == (3, 4)
    lost = TextDetectMeter(["maps"])
    lost.update([ref], [_text_map((4, 12, 4, 60), (20, 28, 4, 60))])  # 2 of 3 found: 2 * 2 / (3 + 2)
    assert lost.result().value == pytest.approx(0.8)
    merged = TextDetectMeter(["maps"])
    merged.update([ref], [_text_map((4, 28, 4, 60), (36, 44, 4, 40))])  # the first two lines one region
    assert merged.result().value == pytest.approx(2 * 1 / 5)
    faint = TextDetectMeter(["maps"])
    faint.update([ref], [np.maximum(_text_map((4, 12, 4, 60), (20, 28, 4, 60)), _text_map((36, 44, 4, 40), value=0.5))])
    assert faint.result().value == pytest.approx(0.8)  # mapped above 0.3, under DB's box score of 0.6
    extra = TextDetectMeter(["maps"])
    extra.update([ref], [np.maximum(ref, _text_map((52, 60, 4, 60)))])
    assert extra.result().value == pytest.approx(2 * 3 / 7)


def test_text_detection_with_no_reference_box_compared_nothing() -> None:
    meter = TextDetectMeter(["maps"])
    meter.update([_text_map((4, 12, 4, 60), value=0.4)], [_text_map((4, 12, 4, 60))])
    result = meter.result()
    assert result.value is None and result.compared_nothing and "holds no text box" in result.note
    blank = TextDetectMeter(["maps"])
    blank.update([_text_map()], [_text_map()])
    assert "reaches 0.3 nowhere" in blank.result().note


def test_ctc_decoding_and_character_agreement() -> None:
    steps = np.eye(4)[[1, 1, 0, 1, 2, 2, 0, 0, 3]]  # a a _ a b b _ _ c -> a a b c
    assert ctc_greedy(steps) == [1, 1, 2, 3]
    assert edit_distance([1, 2, 3], [1, 3]) == 1 and edit_distance([], [1]) == 1
    other = steps.copy()
    other[4:6] = np.eye(4)[[3, 3]]  # b -> c
    meter = TextRecognizeMeter(["probs"])
    meter.update([steps[None]], [other[None]])
    result = meter.result()
    assert result.value == pytest.approx(0.75) and result.metrics["sequence_agreement"] == 0.0


def test_a_task_metric_the_data_leaves_undefined_fails_the_check_and_says_what_data_to_give() -> None:
    """A detector on images where the float model finds nothing (and the quantized one too), a recognizer reading no
    character: the task check compared nothing, so no PASS, whatever the SQNR (the helper's zoo run: nudenet on
    black images passed at 23.6 dB); --accept-degraded accepts it as DEGRADED; the generic task never has a metric."""
    empty = _yolo([], [], [])
    meter = DetectMeter(["out0"], YOLO)
    for _ in range(8):
        meter.update([empty], [empty.copy()])
    verdict = judge(meter.result(), QualityGate(), what="quantize", hint="--recipe auto")
    assert not verdict.passed and verdict.line.startswith("FAIL quantize: task detect, map50 undefined (the "
                                                          "reference detected nothing")
    assert "so the detect check compared nothing (give data on which the float model finds something, or " \
           "--task generic" in verdict.line and "--recipe auto" not in verdict.line
    accepted = judge(meter.result(), QualityGate(accept_degraded=True), what="quantize")
    assert accepted.passed and accepted.line.startswith("DEGRADED")
    blank = np.zeros((1, 6, 4), np.float32)
    blank[..., 0] = 1.0  # every step the CTC blank: no character read
    reader = TextRecognizeMeter(["probs"])
    reader.update([blank], [blank.copy()])
    assert judge(reader.result(), QualityGate(), what="compile").line.startswith("FAIL compile: task text-recognize")
    generic = GenericMeter(["y"])
    same = np.ones((1, 4), np.float32)
    for _ in range(FEW_SAMPLES):
        generic.update([same], [same])
    assert judge(generic.result(), QualityGate(), what="quantize").passed


def test_a_verdict_on_few_samples_says_it_is_weak() -> None:
    from npukit.tasks import QualityGate, judge

    def verdict(n: int) -> str:
        meter = GenericMeter(["y"])
        for _ in range(n):
            a = rng.standard_normal((1, 10)).astype(np.float32)
            meter.update([a], [a])
        return judge(meter.result(), QualityGate(), what="quantize").line

    assert verdict(1).startswith("PASS") and "on 1 samples (only 1: a weak check, give more data)" in verdict(1)
    assert "weak" not in verdict(5)
    boxes = _yolo([(50, 50, 20, 20), (150, 80, 40, 30)], [0, 2], [0.9, 0.8])
    meter = DetectMeter(["out0"], YOLO)
    for _ in range(FEW_SAMPLES):  # enough samples, two boxes in each: 10 detections are enough
        meter.update([boxes], [boxes.copy()])
    assert "weak" not in judge(meter.result(), QualityGate(), what="quantize").line
    meter = DetectMeter(["out0"], YOLO)
    for image in (boxes, _yolo([], [], []), _yolo([], [], []), _yolo([], [], []), _yolo([], [], [])):
        meter.update([image], [image.copy()])  # one image with faces, four without
    detected = judge(meter.result(), QualityGate(), what="quantize").line
    assert detected.startswith("PASS") and "(2 reference detections: a weak check, give more data)" in detected
    # enough detections in all, but those above 0.5, which F1 at 0.5 is counted on, are few
    sure, faint = _yolo([(50, 50, 20, 20)], [0], [0.9]), _yolo([(150, 80, 40, 30), (60, 150, 30, 30)], [2, 1],
                                                               [0.3, 0.35])
    meter = DetectMeter(["out0"], YOLO)
    for image in (sure, faint, faint, faint, faint, faint):
        meter.update([image], [image.copy()])
    result = meter.result()
    assert result.metrics["reference_detections"] == 11 and result.metrics["reference_detections_at_0.5"] == 1
    assert "(f1_at_0.5 rests on 1 reference detections at score >= 0.5: a weak check, give more data)" in \
        judge(result, QualityGate(), what="quantize").line


def test_text_recognition_holds_whole_lines_to_the_floor_too() -> None:
    """One character in each of three lines of ten flips: 0.94 of the characters agree,
    0.7 of the lines; the gate names the lines."""
    from npukit.tasks import QualityGate, judge

    line = np.eye(5)[[1, 0, 2, 0, 3, 0, 4, 0, 1, 0]]  # a b c d a
    meter = TextRecognizeMeter(["probs"])
    for i in range(10):
        other = line.copy()
        if i < 3:
            other[2] = np.eye(5)[4]  # c -> d in three lines
        meter.update([line[None]], [other[None]])
    result = meter.result()
    assert result.gated() == {"char_agreement": pytest.approx(0.94), "sequence_agreement": pytest.approx(0.7)}
    verdict = judge(result, QualityGate(), what="quantize")
    assert not verdict.passed and "sequence_agreement 0.700 < 0.9" in verdict.line
    assert judge(result, QualityGate(min_metric=0.6), what="quantize").passed


def test_every_output_is_checked_and_the_worst_named() -> None:
    a = rng.standard_normal((1, 10)).astype(np.float32)
    b = rng.standard_normal((1, 5)).astype(np.float32)
    meter = GenericMeter(["good", "bad"])
    meter.update([a, b], [a + 1e-4, b * 0.5])  # "bad" at 6 dB
    result = meter.result()
    verdict = judge(result, QualityGate(), what="bench")
    assert not verdict.passed and "output 'bad' SQNR 6.021 dB < 20 dB" in verdict.line
    assert "worst output 'bad' SQNR 6.021 dB" in verdict.line  # the summary names it too
    hinted = judge(result, QualityGate(), what="bench", hint="--int16-budget 0.1")
    assert hinted.line.endswith("; try --int16-budget 0.1")
    assert "try" not in judge(result, QualityGate(min_sqnr_db=5.0), what="bench", hint="x").line  # said on failure only
    assert judge(result, QualityGate(min_sqnr_db=5.0), what="bench").passed
    same = GenericMeter(["x"])
    same.update([a], [a])
    assert math.isinf(same.result().outputs[0].sqnr_db) and judge(same.result(), QualityGate(), what="x").passed


def test_task_detection_from_outputs() -> None:
    image = [(1, 3, 320, 320)]
    assert choose_task([(1, 84, 2100)], image).name == "detect"
    assert choose_task([(1, 2100, 84)], image).layout == DetectLayout("yolo", 0, 0, channels_first=False)
    assert choose_task([(1, 1000)], [(1, 3, 224, 224)]).name == "classify"
    assert choose_task([(1, 21, 80, 80)], image).name == "segment"
    assert choose_task([(1, 1, 320, 320)], image).name == "text-detect"
    ctc = np.full((1, 40, 97), 1 / 97, np.float32)
    assert choose_task([(1, 40, 97)], [(1, 3, 48, 320)], sample=[ctc]).name == "text-recognize"
    assert choose_task([(1, 128)], [(1, 80, 100)]).name == "classify"
    assert choose_task([(1, 7)], [(1, 7)]).reason
    assert choose_task([(3,)], [(3,)]).name == "generic"
    assert choose_task([(1, 1, 320, 320)], image, task="segment").given
    with pytest.raises(InputError, match="unknown task"):
        choose_task([(1, 10)], image, task="pose")
    with pytest.raises(InputError, match="detector's layout"):
        choose_task([(1, 10)], image, task="detect")
    # any 3-D output fits CTC by shape: a YOLO head read as text steps gave a meaningless metric
    with pytest.raises(InputError, match="--task text-recognize but the outputs are a detector's \\(yolo"):
        choose_task([(1, 7, 100)], image, task="text-recognize", sample=[_yolo([(50, 50, 20, 20)], [0], [0.9])])
    assert choose_task([(1, 40, 97)], [(1, 3, 48, 320)], task="text-recognize").given  # raw CTC logits


def test_a_time_major_ctc_output_is_read_per_line():
    """ddddocr's recognizer gives (T, N, C) = 32x1x8210, PyTorch's CTC layout: --task text-recognize read it as 32
    one-step lines per image (960 "samples" for 30) and PASSed a model that read 13 of the 30 lines differently."""
    choice = choose_task([(32, 1, 50)], [(1, 1, 64, 256)], task="text-recognize")
    assert choice.time_major and "time-major" in choice.reason
    assert not choose_task([(1, 40, 97)], [(1, 3, 48, 320)], task="text-recognize").time_major
    steps = np.full((32, 1, 50), -5.0, np.float32)
    steps[:, 0, 0] = 5.0  # blank everywhere ...
    steps[3:5, 0, 7], steps[10, 0, 9] = 9.0, 9.0  # ... but "7" (two steps) then "9"
    other = steps.copy()
    other[10, 0, 9] = -9.0  # the candidate misses the "9"
    meter = choice.meter(["probs"])
    meter.update([steps], [other])
    result = meter.result()
    assert result.samples == 1 and result.metrics["reference_characters"] == 2
    assert result.value == 0.5 and result.metrics["sequence_agreement"] == 0.0


def test_the_gate_validates_its_floors() -> None:
    with pytest.raises(InputError):
        QualityGate(min_metric=1.5)
    with pytest.raises(InputError):
        QualityGate(min_sqnr_db=float("nan"))
    with pytest.raises(InputError, match="0 or more"):  # a negative floor was taken, and held nothing
        QualityGate(min_sqnr_db=-5.0)
    assert QualityGate(min_sqnr_db=0.0).min_sqnr_db == 0.0


def test_scores_squeezed_below_a_callers_threshold_fail_though_ap_ranks_them_alike() -> None:
    ref = _yolo([(50, 50, 20, 20), (150, 80, 40, 30), (250, 200, 30, 30)], [0, 0, 1], [0.83, 0.81, 0.69])
    squeezed = ref.copy()
    squeezed[0, 4:, :3] = np.minimum(squeezed[0, 4:, :3], 0.499)  # an int8 grid that stops at 0.5
    result = _detect([ref], [squeezed], YOLO)
    assert result.value == 1.0  # every box found and ranked the same: AP cannot see it
    assert result.metrics["f1_at_0.25"] == 1.0 and result.metrics["f1_at_0.5"] == 0.0
    verdict = judge(result, QualityGate(), what="quantize")
    assert not verdict.passed and "f1_at_0.5 0.000 < 0.9" in verdict.line


def test_the_probability_output_is_the_classification_among_several() -> None:
    box, landmarks, prob = np.zeros((1, 4)), np.zeros((1, 10)), np.array([[0.2, 0.8]])
    choice = choose_task([(1, 4), (1, 10), (1, 2)], [(1, 3, 48, 48)], sample=[box, landmarks, prob])
    assert choice.name == "classify" and choice.output == 2 and "sum to 1" in choice.reason


def test_channels_last_segmentation() -> None:
    choice = choose_task([(1, 64, 64, 2)], [(1, 64, 64, 1)])
    assert choice.name == "segment" and choice.channels_last
    ref = np.zeros((1, 4, 4, 2), np.float32)
    ref[0, :2, :, 1] = 1.0  # class 1 on the top half
    meter = choice.meter(["masks"])
    meter.update([ref], [ref.copy()])
    assert meter.result().value == 1.0


def _gfl_outputs(image=(64, 64), classes: int = 3, bins: int = 8) -> tuple[list[np.ndarray], list[tuple]]:
    outputs, shapes = [], []
    for stride in (8, 16):
        anchors = (image[0] // stride) * (image[1] // stride)
        scores = rng.uniform(0, 0.01, (1, anchors, classes)).astype(np.float32)
        scores[0, 5, 1] = 0.9
        dist = rng.standard_normal((1, anchors, 4 * bins)).astype(np.float32)
        outputs += [scores, dist]
        shapes += [scores.shape, dist.shape]
    return outputs, shapes


def test_per_level_gfl_heads_are_decoded() -> None:
    outputs, shapes = _gfl_outputs()
    choice = choose_task(shapes, [(1, 3, 64, 64)], sample=outputs)
    assert choice.name == "detect" and choice.layout.kind == "gfl-levels"
    assert [level[2] for level in choice.layout.levels] == [8, 16]
    meter = choice.meter([f"o{i}" for i in range(4)])
    meter.update(outputs, [o.copy() for o in outputs])
    result = meter.result()
    assert result.value == 1.0 and result.metrics["reference_detections"] == 2 and result.decoded == ("o0", "o1",
                                                                                                       "o2", "o3")


def test_a_raw_yolox_head_is_told_from_decoded_yolo_by_its_values() -> None:
    anchors = sum((64 // s) ** 2 for s in (8, 16, 32))  # 84
    raw = rng.standard_normal((1, anchors, 6)).astype(np.float32) * 2  # offsets, log sizes, logits
    raw[0, 7, 4:] = 6.0  # one confident object
    choice = choose_task([raw.shape], [(1, 3, 64, 64)], sample=[raw])
    assert choice.name == "detect" and choice.layout.kind == "yolox"
    meter = choice.meter(["out"])
    meter.update([raw], [raw.copy()])
    assert meter.result().value == 1.0


def test_a_score_sitting_on_a_threshold_may_fall_either_way() -> None:
    ref = _yolo([(50, 50, 20, 20), (150, 80, 40, 30)], [0, 1], [0.52, 0.9])
    cand = _yolo([(50, 50, 20, 20), (150, 80, 40, 30)], [0, 1], [0.48, 0.9])  # 0.52 -> 0.48 across 0.5
    assert _detect([ref], [cand], YOLO).metrics["f1_at_0.5"] == 1.0
    dropped = _yolo([(50, 50, 20, 20), (150, 80, 40, 30)], [0, 1], [0.48, 0.62])  # 0.9 -> 0.62: still kept
    assert _detect([ref], [dropped], YOLO).metrics["f1_at_0.5"] == 1.0
    lost = _yolo([(50, 50, 20, 20), (150, 80, 40, 30)], [0, 1], [0.52, 0.45])  # 0.9 -> 0.45: lost at 0.5
    # the sure detection missed, the one at 0.52 kept where it stays: one of two found
    assert _detect([ref], [lost], YOLO).metrics["f1_at_0.5"] == pytest.approx(2 / 3)


def test_a_yolox_head_with_sigmoids_applied_is_still_raw_by_its_negative_log_sizes() -> None:
    anchors = sum((64 // s) ** 2 for s in (8, 16, 32))
    raw = rng.standard_normal((1, anchors, 6)).astype(np.float32)  # offsets and log sizes, some negative
    raw[0, :, 4:] = rng.uniform(0, 0.01, (anchors, 2))  # objectness and class already probabilities
    raw[0, 7, 4:] = 0.95
    choice = choose_task([raw.shape], [(1, 3, 64, 64)], sample=[raw])
    assert choice.layout.kind == "yolox"
    meter = choice.meter(["out"])
    meter.update([raw], [raw.copy()])
    result = meter.result()
    assert result.metrics["reference_detections"] == 1 and result.value == 1.0  # 0.95 x 0.95, not sigmoid(0.95)


def _centerface(offset_x: float = 0.0) -> list[np.ndarray]:
    """A CenterFace-style head at stride 4 over a 160x160 input: heatmap (1, 1, 40, 40) with one face at cell
    (10, 10), log sizes log(4) (a 16x16 box), offsets (y, x), and 10 landmark channels."""
    heat = np.full((1, 1, 40, 40), 0.01, np.float32)
    heat[0, 0, 10, 10] = 0.9
    heat[0, 0, 10, 11] = 0.5  # a neighbour of the peak: not a detection of its own
    size = np.full((1, 2, 40, 40), np.log(4.0), np.float32)
    offset = np.zeros((1, 2, 40, 40), np.float32)
    offset[0, 1] = offset_x
    landmarks = np.linspace(0, 1, 10 * 40 * 40, dtype=np.float32).reshape(1, 10, 40, 40)
    return [heat, size, offset, landmarks]


def test_a_centernet_heatmap_head_is_found_and_decoded_at_its_peaks() -> None:
    shapes = [o.shape for o in _centerface()]
    choice = choose_task(shapes, [(1, 3, 160, 160)])
    assert choice.name == "detect" and choice.layout.kind == "heatmap"
    assert (choice.layout.scores, choice.layout.boxes, choice.layout.offsets, choice.layout.stride) == (0, 1, 2, 4)
    assert choose_task([(1, 21, 40, 40)], [(1, 3, 160, 160)]).name == "segment"  # a segmenter is not a heatmap
    same = _detect(_centerface(), _centerface(), choice.layout)
    assert same.value == 1.0 and same.metrics["reference_detections"] == 1  # the neighbour is no peak
    assert "out3" not in same.decoded  # landmarks: held to the SQNR floor
    # one cell (4 px) to the right: two 16x16 boxes overlap 12x16, IoU 192 / 320 = 0.6, still a match
    near = _detect(_centerface(), _centerface(offset_x=1.0), choice.layout)
    assert near.value == 1.0 and near.metrics["mean_iou_of_matches"] == pytest.approx(0.6, abs=1e-6)
    # three cells: IoU 64 / 448, a miss
    assert _detect(_centerface(), _centerface(offset_x=3.0), choice.layout).value == 0.0


def _retinaface(dx: float = 0.0, landmark_noise: float = 0.0, background_noise: float = 0.0) -> list[np.ndarray]:
    """A RetinaFace-style raw head over 200 anchors: box offsets (some below -0.5: not coordinates), softmax scores
    with a background class (faces at anchors 5 and 40) and 10 landmark offsets per anchor. ``dx`` shifts the faces'
    box centres, ``landmark_noise`` their landmarks, ``background_noise`` every other anchor's landmarks."""
    gen = np.random.default_rng(7)
    loc = gen.uniform(-2, 2, (1, 200, 4)).astype(np.float32)
    conf = np.tile(np.array([0.99, 0.01], np.float32), (1, 200, 1))
    landmarks = gen.uniform(-3, 3, (1, 200, 10)).astype(np.float32)
    faces = [5, 40]
    conf[0, faces] = [0.05, 0.95]
    loc[0, faces, 0] += dx
    background = np.setdiff1d(np.arange(200), faces)
    landmarks[0, faces] += landmark_noise
    landmarks[0, background] += background_noise * gen.standard_normal((len(background), 10)).astype(np.float32)
    return [loc, conf, landmarks]


def test_a_raw_heads_landmarks_are_held_at_the_detections_and_its_boxes_decoded_on_their_prior() -> None:
    layout = choose_task([o.shape for o in _retinaface()], [(1, 3, 64, 64)]).layout
    assert layout == DetectLayout("boxes-scores", 0, 1, image=(64, 64))
    # noise on landmarks nobody decodes: the whole output falls under the floor, the detections' rows are exact
    quiet = _detect(_retinaface(), _retinaface(background_noise=3.0), layout)
    whole = {o.name: o.sqnr_db for o in quiet.outputs}["out2"]
    assert whole < 5.0 and quiet.value == 1.0
    (at,) = quiet.at_detections
    assert at.name == "out2" and at.shape == (2, 10) and at.sqnr_db == math.inf
    assert judge(quiet, QualityGate(), what="quantize").passed
    # the same noise on the two faces' landmarks fails, and the verdict says where it was measured
    noisy = _detect(_retinaface(), _retinaface(landmark_noise=3.0), layout)
    verdict = judge(noisy, QualityGate(), what="quantize")
    assert not verdict.passed and "'out2' SQNR at the detections" in verdict.line
    # boxes decoded on the anchor's prior (unit size): widths w = exp(0.2 dw) between 0.67 and 1.49; a centre
    # offset of 1 moves a box by 0.1 (IoU (w - 0.1) / (w + 0.1): a match), one of 5 by 0.5 (IoU under 1/2: none)
    sizes = np.exp(0.2 * _retinaface()[0][0, [5, 40], 2])
    near = _detect(_retinaface(), _retinaface(dx=1.0), layout)
    expected = np.mean([(w - 0.1) / (w + 0.1) for w in sizes])  # same height; widths overlap w - 0.1 of w + 0.1
    assert near.value == 1.0 and near.metrics["mean_iou_of_matches"] == pytest.approx(expected, rel=1e-5)
    assert _detect(_retinaface(), _retinaface(dx=5.0), layout).value == 0.0


def test_a_heatmap_heads_landmarks_are_held_at_its_peaks() -> None:
    layout = choose_task([o.shape for o in _centerface()], [(1, 3, 160, 160)]).layout
    cand = _centerface()
    cand[3] = cand[3] + rng.standard_normal(cand[3].shape).astype(np.float32)  # every cell's landmarks noisy ...
    cand[3][0, :, 10, 10] = _centerface()[3][0, :, 10, 10]  # ... but the face's
    result = _detect(_centerface(), cand, layout)
    assert {o.name: o.sqnr_db for o in result.outputs}["out3"] < 10.0
    assert [(o.name, o.shape, o.sqnr_db) for o in result.at_detections] == [("out3", (1, 10), math.inf)]
    assert judge(result, QualityGate(), what="quantize").passed


def test_a_decoded_output_under_the_sqnr_floor_is_said_to_be_judged_by_the_task_metric() -> None:
    """The demo's PASS showed 'worst output SQNR 19.952 dB' beside a 20 dB floor with no word why it passed."""
    from npukit.tasks import QualityGate, judge
    from npukit.tasks.classify import ClassifyMeter

    logits = np.zeros((16, 10), np.float32)
    logits[np.arange(16), np.arange(16) % 10] = 8.0
    noisy = logits + np.random.default_rng(0).normal(0, 0.6, logits.shape).astype(np.float32)
    meter = ClassifyMeter(["y"])
    meter.update([logits], [noisy])
    line = judge(meter.result(), QualityGate(), what="quantize").line
    assert line.startswith("PASS") and "judged by the task metric" in line
    quiet = ClassifyMeter(["y"])
    quiet.update([logits], [logits + 1e-4])
    assert "judged by" not in judge(quiet.result(), QualityGate(), what="quantize").line


def test_top1_agreement_over_unconfident_samples_says_so() -> None:
    """An untrained classifier is never confident: its headline is top-1 agreement over every sample, where a flip
    between two near-equal classes counts, and its FAIL said nothing of that. The verdict says on how many samples
    the float model was confident; a classifier confident on enough samples says nothing."""
    from npukit.tasks.classify import MIN_CONFIDENT, ClassifyMeter

    rng = np.random.default_rng(0)
    flat = rng.normal(0, 0.01, (40, 10)).astype(np.float32)
    meter = ClassifyMeter(["y"])
    meter.update([flat], [flat + rng.normal(0, 0.01, flat.shape).astype(np.float32)])
    line = judge(meter.result(), QualityGate(), what="quantize").line
    assert line.startswith("FAIL") and "top1_agreement " in line
    assert "(the float model confident on 0 of them: a flip between near-equal classes counts" in line
    sure = np.zeros((MIN_CONFIDENT, 10), np.float32)
    sure[:, 3] = 8.0
    meter = ClassifyMeter(["y"])
    meter.update([sure], [sure])
    assert "confident on" not in judge(meter.result(), QualityGate(), what="quantize").line
    few = ClassifyMeter(["y"])  # every one of fewer than MIN_CONFIDENT samples confident: too few, not ties
    few.update([sure[:MIN_CONFIDENT - 1]], [sure[:MIN_CONFIDENT - 1]])
    line = judge(few.result(), QualityGate(), what="quantize").line
    assert "confident on" not in line and f"only {MIN_CONFIDENT - 1} samples: a weak check" in line


def test_a_detection_just_above_a_threshold_that_falls_well_below_it_is_missed() -> None:
    """CenterFace's one face in a helper's held-out images: 0.298 in float, 0.196 in INT8 at threshold 0.25. Within
    the band above the threshold, it was not counted at all: F1 undefined, dropped from the checks, and mAP (which
    ignores thresholds) passed the model at 1.0. A score within the band may move within the band below."""
    ref = _yolo([(50, 50, 20, 20)], [0], [0.298])
    cand = _yolo([(50, 50, 20, 20)], [0], [0.196])
    result = _detect([ref], [cand], YOLO)
    assert result.metrics["f1_at_0.25"] == 0.0 and result.value == 1.0
    assert not judge(result, QualityGate(), what="bench").passed
    kept = _yolo([(50, 50, 20, 20)], [0], [0.21])  # 0.298 -> 0.21: within the band below
    assert _detect([ref], [kept], YOLO).metrics["f1_at_0.25"] == 1.0
    new = _detect([_yolo([], [], [])], [ref], YOLO)  # a candidate's 0.298 where the reference has nothing
    assert new.metrics["f1_at_0.25"] == 0.0


def test_a_reference_that_never_changes_compares_one_answer() -> None:
    """An untrained googlenet gives its last layer's bias for every input: a candidate matching it passed the check
    at 47.8 dB, having been compared on one answer. The reference's outputs the same bit for bit on every sample
    FAIL the check, saying why; one sample, or outputs that differ at all, are judged as before."""
    from npukit.measure.task_fidelity import compare_task

    constant = lambda feeds: [np.array([[0.1, 2.0, -1.0]], np.float32)]  # noqa: E731
    echo = lambda feeds: [feeds["x"][:, :3].copy()]  # noqa: E731
    samples = [{"x": np.full((1, 4), float(i), np.float32)} for i in range(6)]
    _, result = compare_task(constant, constant, samples, output_names=["logits"])
    assert result.constant_reference and result.as_dict()["constant_reference"]
    verdict = judge(result, QualityGate(), what="quantize", hint="--cle")
    assert not verdict.passed and "same outputs for all 6 samples" in verdict.line
    assert "try --cle" not in verdict.line  # the data (or the model's weights) fall short, not the artifact
    assert not compare_task(constant, constant, samples[:1], output_names=["logits"])[1].constant_reference
    assert not compare_task(echo, echo, samples, output_names=["logits"])[1].constant_reference


def test_a_reference_that_barely_changes_compares_one_answer() -> None:
    """An untrained ShuffleNetV2's logits moved by 2.6e-5 of their size between random images, not bit for bit the
    same: the check passed, having compared one answer. Movement under 0.1% of an output's largest magnitude
    (below one step of an 8-bit grid on it) is no variation; 1% is."""
    from npukit.measure.task_fidelity import compare_task

    base = np.array([[0.1, 2.0, -1.0]], np.float32)
    samples = [{"x": np.full((1, 3), float(i), np.float32)} for i in range(6)]
    barely = lambda feeds: [base + 2e-5 * feeds["x"]]  # noqa: E731
    moving = lambda feeds: [base + 4e-3 * feeds["x"]]  # noqa: E731  (up to 1% of 2.0)
    _, result = compare_task(barely, barely, samples, output_names=["logits"])
    assert result.constant_reference
    assert "same outputs for all 6 samples (to 0.1% of their size)" in judge(result, QualityGate(), what="q").line
    assert not compare_task(moving, moving, samples, output_names=["logits"])[1].constant_reference
    grows = lambda feeds: [np.zeros((1, int(feeds["x"][0, 0]) + 1), np.float32)]  # noqa: E731  (another shape)
    assert not compare_task(grows, grows, samples, output_names=["logits"])[1].constant_reference


def test_the_probability_map_among_several_maps_is_the_segmentation() -> None:
    """MTCNN's PNet: box offsets (N, 4, H, W) before face probabilities (N, 2, H, W). The offsets were taken for a
    4-class segmentation (miou 0.855, FAIL) and --task segment could not pick the other; the map whose channels
    sum to 1 is the one decoded, found or given, the offsets held to the SQNR floor."""
    rng = np.random.default_rng(0)
    offsets = rng.normal(size=(1, 4, 27, 27)).astype(np.float32)
    logits = rng.normal(size=(1, 2, 27, 27))
    probabilities = (np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)).astype(np.float32)
    shapes, image = [(1, 4, 27, 27), (1, 2, 27, 27)], [(1, 3, 64, 64)]
    found = choose_task(shapes, image, sample=[offsets, probabilities])
    assert (found.name, found.output) == ("segment", 1) and "channels sum to 1" in found.reason
    assert choose_task(shapes, image, task="segment", sample=[offsets, probabilities]).output == 1
    assert choose_task(shapes, image).output == 0  # without a sample: the first, as before


def test_class_scores_are_described_with_the_shape_they_have() -> None:
    """MTCNN's PNet at its 12 px crop gives (1, 2, 1, 1) face probabilities; the report called them (N, 2)."""
    choice = choose_task([(1, 4, 1, 1), (1, 2, 1, 1)], [(1, 3, 12, 12)],
                         sample=[np.zeros((1, 4, 1, 1)), np.array([0.3, 0.7]).reshape(1, 2, 1, 1)])
    assert choice.name == "classify" and choice.reason == "output 1 is (N, 2, 1, 1) class scores (its rows sum to 1)"
    assert choose_task([(1, 1000)], [(1, 3, 224, 224)]).reason == "output 0 is (N, 1000) class scores"


def test_a_raw_heads_anchors_are_counted_as_the_objects_they_point_at():
    """RetinaFace's 8 photos: 94 anchors at score 0.25 were "94 reference detections" for 6 faces, and the check
    never said it was weak; the weakness rule counts objects (anchors within OBJECT_REACH strides of one another)."""
    from npukit.tasks.base import TaskResult, weakness
    from npukit.tasks.detect import Detections, anchor_centres, objects_among

    centres = anchor_centres(12600, (480, 640))  # RetinaFace at 480x640: strides 8, 16, 32, two anchors per cell
    assert centres is not None and len(centres) == 12600 and sorted(set(centres[:, 2].tolist())) == [8, 16, 32]
    assert centres[0].tolist() == [4.0, 4.0, 8.0] and centres[1].tolist() == [4.0, 4.0, 8.0]  # k anchors per cell
    assert anchor_centres(12601, (480, 640)) is None and anchor_centres(12600, None) is None

    def at(*points):  # anchors of stride 16 at these cell centres
        rows = [int(np.nonzero((centres[:, 0] == x) & (centres[:, 1] == y) & (centres[:, 2] == 16))[0][0])
                for x, y in points]
        n = len(rows)
        return Detections(np.zeros((n, 4)), np.linspace(0.9, 0.3, n), np.zeros(n, np.int64), np.array(rows))

    one_face = at((200, 88), (216, 88), (232, 104), (184, 136), (216, 136))  # spread over about 50 px
    assert objects_among(one_face, centres) == 1
    assert objects_among(at((200, 88), (216, 104), (456, 360)), centres) == 2  # a second face far away
    result = TaskResult(task="detect", samples=8, metric="map50", value=1.0,
                        metrics={"reference_detections": 94, "reference_objects": 6}, outputs=(), decoded=())
    assert weakness(result) == "6 reference objects (94 anchors): a weak check, give more data"
