"""``QuantConfig.score_on``: the arithmetic the choosing steps run candidate models on."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import npukit.quant.qdq as qdq_module
from npukit.errors import InputError
from npukit.quant import scoring
from npukit.quant.config import CalibrationSpec, QuantConfig, Recipe, Scheme
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, tiny_cnn


def test_reference_arithmetic_is_the_qdq_graph_s_own() -> None:
    """Scored on "reference", a QDQ model computes exactly what its Q/DQ nodes say: a Conv fed by dequantized
    int8 values and its output rounded to its grid, in float (checked against numpy on the same integers)."""
    model = tiny_cnn(seed=2)
    samples = make_samples(6)
    built = quantize(model, samples, config=QuantConfig(scheme=Scheme(activation_dtype="int8"),
                                                        calibration=CalibrationSpec(method="minmax"))).model
    session = scoring.session_for("reference")(built)
    # the same graph, node by node, in ONNX's own reference implementation (numpy)
    from onnx.reference import ReferenceEvaluator

    plain = onnx.ModelProto()
    plain.CopyFrom(built)  # ORT's pre-processing lists its own domains; the graph uses the default one only, and
    del plain.opset_import[:]  # ONNX's evaluator implements Q/DQ from opset 19 (the same for int8 grids)
    plain.opset_import.append(onnx.helper.make_opsetid("", 19))
    evaluator = ReferenceEvaluator(plain)
    for feeds in samples:
        got = session.run(None, feeds)[0]
        want = evaluator.run(None, feeds)[0]
        scale = float(np.abs(want).max())
        assert np.abs(got - want).max() <= 1e-4 * scale


def test_quantize_scores_its_choices_on_the_config_s_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = qdq_module.session_for

    def spy(score_on, **kwargs):
        seen.append(score_on)
        return real(score_on, **kwargs)

    monkeypatch.setattr(qdq_module, "session_for", spy)
    model, samples = tiny_cnn(seed=3), make_samples(12)
    result = quantize(model, samples, config=QuantConfig(scheme=Scheme(activation_dtype="int8"),
                                                         calibration=CalibrationSpec(method="auto"),
                                                         recipe=Recipe(score_on="reference")))
    assert seen == ["reference"]
    assert result.steps.auto["chosen"] in result.steps.auto["candidates"]


def test_an_unknown_arithmetic_is_refused() -> None:
    with pytest.raises(InputError, match="score_on"):
        QuantConfig(recipe=Recipe(score_on="xnnpack"))  # type: ignore[arg-type]
