from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.memory.lifetimes import analyze_lifetimes
from npukit.memory.measure import measure_ort_peak


def _wide_model() -> onnx.ModelProto:
    """x[1,16,128,128] (1 MiB) -> Conv 16->32 (2 MiB) -> Relu -> Conv 32->16 (1 MiB)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 16, 1, 1)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 32, 1, 1)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 128, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.slow
def test_measured_peak_is_near_the_plan(tmp_path):
    path = tmp_path / "wide.onnx"
    onnx.save(_wide_model(), str(path))
    planned = analyze_lifetimes(_wide_model(), view="cpu").peak_bytes
    off = measure_ort_peak(path, arena=False)
    on = measure_ort_peak(path, arena=True)
    assert off.input_shape == (1, 16, 128, 128) and not off.arena and on.arena
    # The run needs the 2 MiB and the 1 MiB maps (the input is allocated before): well above 1 MiB, well below
    # everything a second session would cost.
    assert 2**20 < off.peak_bytes < 4 * planned
    assert 2**20 < on.peak_bytes < 8 * planned


def test_missing_model_is_bad_input(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        measure_ort_peak(tmp_path / "none.onnx", arena=False)
