"""The in-process memos (``npukit.quant.memo``): a hit gives what the cold computation gives, byte for byte; another
model (a changed weight) or other samples miss; the memos stay bounded and ORT's functions come back after an emit."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import npukit.quant.calibration.calibrate as calibrate_module
from npukit.quant import memo
from npukit.quant.calibration.calibrate import Calibration, calibrate
from npukit.quant.calibration.observers import RANGE_METHODS
from npukit.quant.config import CalibrationSpec, QuantConfig, Recipe, Scheme
from npukit.quant.emit import ort_memo
from npukit.quant.emit.ort_qdq import emit_qdq
from npukit.quant.qdq import plan_for, preprocess, quantize
from tests.quant.conftest import make_samples, tiny_cnn

AUTO = QuantConfig(calibration=CalibrationSpec(method="auto"))


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The samples the float model runs on in calibrations (``observe``'s ``each`` sees each one)."""
    runs: list[int] = []
    real = calibrate_module.observe

    def observe(*args, each=None, **kwargs):
        def seen(feeds):
            runs.append(1)
            if each is not None:
                each(feeds)

        return real(*args, each=seen, **kwargs)

    monkeypatch.setattr(calibrate_module, "observe", observe)
    return runs


def _cold(function, *args, **kwargs):
    with memo.disabled():
        return function(*args, **kwargs)


def _changed_weight(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    weight = out.graph.initializer[0]
    array = numpy_helper.to_array(weight).copy()
    array.flat[0] += 0.25
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    return out


def test_a_calibration_seen_before_is_recalled_and_equals_the_cold_one(counted: list[int]) -> None:
    model, samples = tiny_cnn(), make_samples(6)
    first = calibrate(model, samples, config=AUTO)
    assert len(counted) == 6
    again = calibrate(model, samples, config=AUTO)
    assert len(counted) == 6  # nothing ran
    cold = _cold(calibrate, model, samples, config=AUTO)
    assert again == first == cold and again.candidates["mse"] == cold.candidates["mse"]
    again.ranges.clear()  # a caller's change does not reach the memo
    assert calibrate(model, samples, config=AUTO) == cold


def test_every_method_reads_the_statistics_an_auto_calibration_gathered(counted: list[int]) -> None:
    model, samples = tiny_cnn(), make_samples(6)
    calibrate(model, samples, config=AUTO)
    for method in RANGE_METHODS:
        config = QuantConfig(calibration=CalibrationSpec(method=method))
        assert calibrate(model, samples, config=config) == _cold(calibrate, model, samples, config=config), method
    assert len(counted) == 6 + 6 * len(RANGE_METHODS)  # the cold ones only


def test_a_min_max_calibration_does_not_serve_a_histogram_one(counted: list[int]) -> None:
    model, samples = tiny_cnn(), make_samples(6)
    calibrate(model, samples, config=QuantConfig())
    mse = QuantConfig(calibration=CalibrationSpec(method="mse"))
    assert calibrate(model, samples, config=mse) == _cold(calibrate, model, samples, config=mse)
    assert len(counted) == 6 + 6 + 6  # min-max, mse (no histograms kept to start from), the cold mse
    assert calibrate(model, samples, config=QuantConfig()) == _cold(calibrate, model, samples, config=QuantConfig())


def test_other_samples_or_weights_miss(counted: list[int]) -> None:
    model, samples = tiny_cnn(), make_samples(6)
    calibrate(model, samples, config=AUTO)
    other = [dict(s) for s in samples]
    other[3] = {"x": other[3]["x"] + np.float32(0.5)}
    changed = _changed_weight(model)
    for m, s in ((model, other), (changed, samples), (model, samples[:5] + samples[:1])):
        assert calibrate(m, s, config=AUTO) == _cold(calibrate, m, s, config=AUTO)
    assert len(counted) == 6 + 3 * (6 + 6)  # each misses (a run is kept where a feed ended: no shorter prefix)


def test_a_run_kept_part_way_resumes_and_a_split_feed_recalls_both_parts(counted: list[int]) -> None:
    model, samples = tiny_cnn(), make_samples(8)
    Calibration(model, AUTO).feed(samples, stop=6)
    whole = calibrate(model, samples, config=AUTO)  # samples [0, 6) recalled, [6, 8) run
    assert len(counted) == 6 + 2 and whole == _cold(calibrate, model, samples, config=AUTO)
    told: list[int] = []
    split = Calibration(model, AUTO).feed(samples, stop=6, progress=told.append)
    assert split.result() == _cold(lambda: Calibration(model, AUTO).feed(samples, stop=6).result())
    split.feed(samples, start=6, progress=told.append)
    assert split.result() == whole and told == list(range(1, 9)) and len(counted) == 6 + 2 + 8 + 6


def test_a_one_shot_iterator_calibrates_as_before(counted: list[int]) -> None:
    model, samples = tiny_cnn(), make_samples(5)
    calibrate(model, samples, config=AUTO)
    once = calibrate(model, iter(samples), config=AUTO)  # not read ahead: it runs, and equals the cold one
    assert len(counted) == 10 and once == _cold(calibrate, model, samples, config=AUTO)


def test_a_bad_sample_is_refused_as_without_the_memo() -> None:
    model, samples = tiny_cnn(), make_samples(4)
    calibrate(model, samples, config=AUTO)
    bad = samples[:2] + [{"x": samples[2]["x"].astype(np.float64)}] + samples[3:]
    with pytest.raises(Exception) as cold:
        _cold(calibrate, model, bad, config=AUTO)
    with pytest.raises(type(cold.value)) as warm:
        calibrate(model, bad, config=AUTO)
    assert str(warm.value) == str(cold.value)
    with pytest.raises(type(cold.value), match="6 calibration samples"):
        calibrate(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="auto", samples=6)))


def test_an_emit_with_the_weights_remembered_writes_the_same_bytes() -> None:
    from onnxruntime.quantization import qdq_quantizer

    before = qdq_quantizer.compute_data_quant_params
    model, samples = preprocess(tiny_cnn()), make_samples(4)
    for per_channel in (True, False):
        config = QuantConfig(scheme=Scheme(per_channel=per_channel))
        plan = plan_for(model, config, calibrate(model, samples, config=config).ranges)
        cold = _cold(emit_qdq, model, samples[0], plan).SerializeToString()
        first = emit_qdq(model, samples[0], plan).SerializeToString()
        hits = ort_memo._GRIDS.hits
        again = emit_qdq(model, samples[0], plan).SerializeToString()
        assert first == again == cold and ort_memo._GRIDS.hits > hits and ort_memo._CALIBRATIONS.hits
    changed = _changed_weight(model)
    plan = plan_for(changed, QuantConfig(), calibrate(changed, samples, config=QuantConfig()).ranges)
    assert emit_qdq(changed, samples[0], plan).SerializeToString() == \
        _cold(emit_qdq, changed, samples[0], plan).SerializeToString() != cold
    assert qdq_quantizer.compute_data_quant_params is before  # ORT's own again


def test_a_model_pre_processed_before_comes_back_as_a_copy() -> None:
    model = tiny_cnn()
    first = preprocess(model)
    first.graph.node[0].name = "changed by the caller"
    again = preprocess(model)
    assert again.SerializeToString() == _cold(preprocess, model).SerializeToString() != first.SerializeToString()


@pytest.mark.parametrize("recipe", [Recipe(), Recipe(bias_correction=True), Recipe(cle=True, bias_correction=True)])
def test_quantize_twice_gives_the_cold_model_and_records(recipe: Recipe) -> None:
    model, samples = tiny_cnn(spread=0.5), make_samples(8)
    config = QuantConfig(calibration=CalibrationSpec(method="auto"), recipe=recipe)
    cold = _cold(quantize, model, samples, config=config)
    for _ in range(2):
        warm = quantize(model, samples, config=config)
        assert warm.model.SerializeToString() == cold.model.SerializeToString()
        assert warm.steps.as_dict() == cold.steps.as_dict() and warm.ranges == cold.ranges
    mse = config.with_calibration(method="mse")  # from the histograms "auto" gathered
    assert quantize(model, samples, config=mse).model.SerializeToString() == \
        _cold(quantize, model, samples, config=mse).model.SerializeToString()


def test_a_memo_keeps_its_bounds_and_is_off_when_disabled() -> None:
    kept = memo.memo("test", entries=3, max_bytes=100)
    for i in range(5):
        kept.put(i, str(i), 10)
    assert kept.keys() == [2, 3, 4]
    kept.get(2)
    kept.put(5, "5", 85)  # over the bytes: the least recently used go first
    assert kept.keys() == [2, 5] and kept.get(3) is None
    kept.put(6, "too large", 101)
    assert kept.get(6) is None
    with memo.disabled():
        assert kept.get(2) is None and memo.model_digest(tiny_cnn()) == ""
        kept.put(7, "7", 1)
    assert kept.get(2) == "2" and kept.get(7) is None
    memo.clear()
    assert kept.keys() == [] and list(itertools.chain(*(m.keys() for m in memo._MEMOS))) == []
