from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.memory.layout import choose_planar_resizes, keep_resizes_planar, ort_predicted_peak
from npukit.memory.measure import measure_ort_peak
from npukit.runtime.ort import make_session, random_feeds, run

from .tiny import _model


def _segmentation_head() -> onnx.ModelProto:
    """x[1,16,32,32] -> Conv 16->21 (NCHWc on x86: 21 channels padded to 24) -> Relu -> Resize x8 (bilinear) ->
    y[1,21,256,256] (5.5 MB): ORT's NCHWc upsample (6.3 MB) and the plain output are live together."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((21, 16, 3, 3)).astype(np.float32) * 0.1, "w")
    scales = numpy_helper.from_array(np.array([1, 1, 8, 8], np.float32), "scales")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Resize", ["r", "", "scales"], ["y"], mode="linear",
                              coordinate_transformation_mode="half_pixel", name="up")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 21, 256, 256])], [w, scales])


def test_planar_resize_is_exact_and_named():
    model = _segmentation_head()
    planar = keep_resizes_planar(model, ["up"])
    onnx.checker.check_model(planar)
    reshape = next(n for n in planar.graph.node if n.op_type == "Reshape")
    assert reshape.name == "up_planar" and next(n for n in planar.graph.node if n.name == "up").input[0] == \
        reshape.output[0]
    session = make_session(model)
    feeds = random_feeds(session, seed=0)
    (expected,), (got,) = run(session, feeds), run(make_session(planar), feeds)
    # The same function; ORT's plain and NCHWc upsample kernels round differently in the last bits.
    assert np.max(np.abs(expected - got)) <= 1e-6 * np.max(np.abs(expected))
    with pytest.raises(InputError, match="no Resize node named 'conv'"):
        keep_resizes_planar(model, ["conv"])


def test_choose_planar_resizes_lowers_ort_predicted_peak():
    model = _segmentation_head()
    choice = choose_planar_resizes(model)
    output_bytes = 21 * 256 * 256 * 4
    if choice.predicted_peak_before <= output_bytes * 1.05:  # no NCHWc upsample on this CPU: nothing to gain
        assert choice.planar == ()
        return
    assert choice.planar == ("up",)
    assert choice.predicted_peak_after < choice.predicted_peak_before
    assert choice.predicted_peak_after <= output_bytes * 1.05
    again = ort_predicted_peak(choice.model)  # a new session: ORT may order nodes differently (see test_tiling)
    assert abs(again - choice.predicted_peak_after) <= 0.15 * choice.predicted_peak_after


@pytest.mark.slow
def test_planar_resize_cuts_the_measured_peak(tmp_path):
    model = _segmentation_head()
    choice = choose_planar_resizes(model)
    if not choice.planar:
        pytest.skip("ORT runs no NCHWc upsample on this CPU")
    before, after = tmp_path / "before.onnx", tmp_path / "after.onnx"
    onnx.save(model, str(before))
    onnx.save(choice.model, str(after))
    measured_before = measure_ort_peak(before, arena=False).peak_bytes
    measured_after = measure_ort_peak(after, arena=False).peak_bytes
    assert measured_after < 0.7 * measured_before
    assert abs(measured_after - choice.predicted_peak_after) <= 0.1 * measured_after
    assert abs(measured_before - choice.predicted_peak_before) <= 0.1 * measured_before
