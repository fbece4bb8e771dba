from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from npukit.quant.algorithms.range_search import _Scorer, activation_grids
from npukit.quant.config import CalibrationSpec, QuantConfig, RangeSearch, Recipe, Scheme
from npukit.quant.qdq import quantize
from tests.quant.test_auto import _outlier_model, _outlier_samples, _sqnr


def _grid_init(model: onnx.ModelProto, tensor: str, field: str) -> onnx.TensorProto:
    grid, = [g for g in activation_grids(model) if tensor in g.tensors]
    return next(i for i in model.graph.initializer if i.name == getattr(grid, field))


def test_search_cuts_a_tail_that_wastes_the_grid_and_the_model_is_rebuilt_on_it() -> None:
    # Exp stretches rare inputs into huge values that the Sigmoid saturates: min-max wastes e's and d's grids on them
    model = _outlier_model("exp")
    samples = _outlier_samples(16, scale=1.0, outlier=7.0)
    plain = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="minmax")))
    searched = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="minmax"),
                                                           recipe=Recipe(range_search=RangeSearch(passes=4))))
    summary = searched.steps.range_search
    assert summary["changed"]["e"]["to"][1] < plain.ranges["e"][1] / 4, summary
    assert summary["calibration_sqnr_after_db"] > summary["calibration_sqnr_before_db"] + 10.0
    # d (Conv output, Sigmoid input) loses its long positive tail but keeps its negative side
    lo, hi = summary["changed"]["d"]["to"]
    assert lo == pytest.approx(plain.ranges["d"][0], rel=0.02) and hi < plain.ranges["d"][1] / 4
    # the model is rebuilt from the searched ranges: it runs the searched grids and scores what the search did
    assert searched.ranges["e"] == pytest.approx(tuple(summary["changed"]["e"]["to"]), rel=1e-6)
    scale = float(numpy_helper.to_array(_grid_init(searched.model, "e", "scale")))
    assert scale == pytest.approx(summary["changed"]["e"]["to"][1] / 255, rel=1e-5)
    assert _sqnr(model, searched.model, samples) == pytest.approx(summary["calibration_sqnr_after_db"], abs=0.3)
    held = _outlier_samples(6, scale=1.0, outlier=7.0, seed=9)
    assert _sqnr(model, searched.model, held) > _sqnr(model, plain.model, held) + 10.0


def test_a_moved_grid_requantizes_the_biases_it_feeds() -> None:
    # e feeds a Conv whose int32 bias is quantized on e's scale x the weight's (ORT's integer kernel adds it to the
    # accumulator as is): a trial that halves e's scale must double the int32 bias so the bias stays the same
    model = _outlier_model("exp")
    samples = _outlier_samples(8, scale=1.0, outlier=7.0)
    plain = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="minmax")))
    grids = activation_grids(plain.model)
    grid, = [g for g in grids if "e" in g.tensors]
    scorer = _Scorer(model, plain.model, samples, grids, symmetric=False, threads=1)
    assert scorer.db(scorer({})) == pytest.approx(_sqnr(model, plain.model, samples), abs=1e-6)
    moved = scorer({grid.scale: (0.0, plain.ranges["e"][1] / 2)})
    inits = {i.name: numpy_helper.to_array(i) for i in scorer.model.graph.initializer}
    before = {i.name: numpy_helper.to_array(i) for i in plain.model.graph.initializer}
    (bias, bias_scale), = scorer.links[grid.scale]
    assert float(inits[grid.scale]) == pytest.approx(float(before[grid.scale]) / 2, rel=1e-5)
    assert inits[bias_scale] == pytest.approx(before[bias_scale] / 2, rel=1e-5)
    np.testing.assert_allclose(inits[bias] * inits[bias_scale], before[bias] * before[bias_scale],
                               atol=float(np.max(inits[bias_scale])))
    assert np.all(np.isfinite(moved))


def test_search_keeps_the_range_that_carries_the_output() -> None:
    # rare large values carry the output (Relu between two scalings): shrinking their grid clips them
    model = _outlier_model("relu")
    samples = _outlier_samples(16, scale=0.05, outlier=100.0)
    plain = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="minmax")))
    searched = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="minmax"),
                                                           recipe=Recipe(range_search=RangeSearch())))
    changed = searched.steps.range_search["changed"]
    assert all(c["to"][1] >= c["from"][1] for c in changed.values()), changed
    held = _outlier_samples(6, scale=0.05, outlier=100.0, seed=9)
    assert _sqnr(model, searched.model, held) >= _sqnr(model, plain.model, held) - 0.1


def test_grids_the_builder_fixes_stay_put() -> None:
    # a Softmax output is built on [0, 1] whatever range it is given: the search must not spend trials on it or
    # report it as moved
    from onnx import TensorProto, helper

    from npukit.quant.qdq import softmax_outputs
    from npukit.quant.algorithms.range_search import search_ranges

    model = _outlier_model("exp")
    samples = _outlier_samples(16, scale=1.0, outlier=7.0)
    plain = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="minmax")))
    free = search_ranges(plain.reference, plain.model, samples, ranges=plain.ranges, passes=2)
    pinned = search_ranges(plain.reference, plain.model, samples, ranges=plain.ranges, passes=2, fixed=["e"])
    assert "e" in free.ranges and "e" not in pinned.ranges and pinned.trials < free.trials
    soft = helper.make_graph([helper.make_node("Softmax", ["x"], ["p"], name="s")], "g",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                             [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 4])])
    soft_model = helper.make_model(soft)
    assert softmax_outputs(soft_model, QuantConfig()) == ["p"]
    assert softmax_outputs(soft_model, QuantConfig(scheme=Scheme(exclude=("s",)))) == []


def test_an_all_zero_activation_keeps_ort_s_empty_range_grid() -> None:
    """Relu(-|conv|) is zero on every sample: its range is [0, 0], whose grid ORT makes scale 1, zero point 0; the
    search moved it to scale 0 and divided by it (ZeroDivisionError on YOLOv8n with seeded inputs)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Abs", ["c"], ["a"], name="abs"), helper.make_node("Neg", ["a"], ["n"], name="neg"),
             helper.make_node("Relu", ["n"], ["z"], name="relu"),
             helper.make_node("Add", ["c", "z"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "zero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    samples = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)} for _ in range(8)]
    searched = quantize(model, samples, config=QuantConfig(recipe=Recipe(range_search=RangeSearch())))
    assert searched.ranges["z"] == (0.0, 0.0)
    assert float(numpy_helper.to_array(_grid_init(searched.model, "z", "scale"))) == 1.0
    assert _sqnr(model, searched.model, samples) > 30.0
