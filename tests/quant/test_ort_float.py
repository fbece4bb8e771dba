"""Float convs stay float on ONNX Runtime: its weight quantizer does not take them (quant.emit.ort_float)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from npukit.quant.calibration.calibrate import calibrate
from npukit.quant.config import CpuKernels, QuantConfig, Scheme
from npukit.quant.emit import ort_qdq
from npukit.quant.emit.ort_float import keep_float_convs, taken_by_ort
from npukit.quant.qdq import plan_for, preprocess, quantize
from tests.quant.conftest import make_samples, tiny_cnn

FLOAT = ("dw", "fc")  # read quantized inputs: a1 (conv1's Relu output) and the flattened pooled features


def _outputs(model, samples, level) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, s)[0] for s in samples])


def _planned_and_run(model, samples) -> tuple[np.ndarray, np.ndarray]:
    """The QDQ model's outputs as written (no graph optimizations: each Q/DQ and float node as it stands) and as
    ONNX Runtime runs it by default."""
    return (_outputs(model, samples, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
            _outputs(model, samples, ort.GraphOptimizationLevel.ORT_ENABLE_ALL))


def test_ort_quantizes_float_convs_that_read_a_quantized_input_unless_they_read_it_on_their_own(monkeypatch) -> None:
    model = preprocess(tiny_cnn(spread=1.0))
    samples = make_samples(6)
    # exact integer kernels on every CPU
    config = QuantConfig(scheme=Scheme(exclude=FLOAT), cpu=CpuKernels(reduce_range=True))
    plan = plan_for(model, config, calibrate(model, samples, config=config).ranges)
    monkeypatch.setattr(ort_qdq, "keep_float_convs", lambda m, nodes: type("R", (), {"model": m})())
    raw = ort_qdq.emit_qdq(model, samples[0], plan)  # ORT's quantizer's output as it is
    assert taken_by_ort(raw, FLOAT) == list(FLOAT)
    planned, run = _planned_and_run(raw, samples)
    assert np.abs(planned - run).max() > 1e-3  # ORT ran the "float" convs on per-tensor int8 weights of its own

    kept = keep_float_convs(raw, FLOAT)
    assert kept.kept == FLOAT and kept.not_kept == {} and taken_by_ort(kept.model, FLOAT) == []
    fixed_planned, fixed_run = _planned_and_run(kept.model, samples)
    np.testing.assert_array_equal(fixed_planned, planned)  # the same function as written
    np.testing.assert_allclose(fixed_run, fixed_planned, rtol=1e-5, atol=1e-5)  # and ORT runs it as written


def test_the_pipeline_records_the_float_convs_it_kept() -> None:
    model = tiny_cnn(spread=1.0)
    samples = make_samples(6)
    result = quantize(model, samples, config=QuantConfig(scheme=Scheme(exclude=FLOAT),
                                                         cpu=CpuKernels(reduce_range=True)))
    record = result.steps.float_convs
    assert record == {"float_convs": list(FLOAT), "quantized_input_kept_float": list(FLOAT), "int8_by_ort": []}
    planned, run = _planned_and_run(result.model, samples)
    np.testing.assert_allclose(run, planned, rtol=1e-5, atol=1e-5)


def test_below_opset_13_a_float_conv_is_listed_as_not_kept() -> None:
    model = preprocess(tiny_cnn(opset=12))
    samples = make_samples(4)
    config = QuantConfig(scheme=Scheme(per_channel=False, exclude=("dw",)))
    plan = plan_for(model, config, calibrate(model, samples, config=config).ranges)
    qdq = ort_qdq.emit_qdq(model, samples[0], plan)
    opset = next(o.version for o in qdq.opset_import if o.domain in ("", "ai.onnx"))
    if opset >= 13:
        pytest.skip(f"ORT's quantizer wrote opset {opset}: every float conv can be kept")
    assert taken_by_ort(qdq, ("dw",)) == ["dw"]
    assert "opset" in keep_float_convs(qdq, ("dw",)).not_kept["dw"]
