"""The verdict's note on an INT8 mobile artifact most of whose layers the plan keeps float."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from npukit.search.mobile import float_share_note, quantized_compute


def _two_convs(quantized: int) -> object:
    """x -> Conv -> Conv -> y, the first ``quantized`` of them reading dequantized input and weight."""
    nodes, inits, feed = [], [], "x"
    for i in range(2):
        w = numpy_helper.from_array(np.ones((3, 3, 1, 1), np.float32), f"w{i}")
        inits.append(w)
        inputs = [feed, f"w{i}"]
        if i < quantized:
            for name in (feed, f"w{i}"):
                nodes.append(helper.make_node("QuantizeLinear", [name, "s", "z"], [f"{name}_q{i}"]))
                nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q{i}", "s", "z"], [f"{name}_dq{i}"]))
            inputs = [f"{feed}_dq{i}", f"w{i}_dq{i}"]
        nodes.append(helper.make_node("Conv", inputs, [f"c{i}"]))
        feed = f"c{i}"
    inits += [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8),
                                                                                               "z")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info(feed, TensorProto.FLOAT, [1, 3, 4, 4])], inits)
    return helper.make_model(graph)


def test_a_mostly_float_int8_artifact_is_said_to_be_so() -> None:
    assert quantized_compute(_two_convs(2)) == 1.0 and float_share_note(1.0) == ""
    assert quantized_compute(_two_convs(1)) == 0.5 and float_share_note(0.5) == ""  # a float head or tail: usual
    assert quantized_compute(_two_convs(0)) == 0.0
    note = float_share_note(0.21)
    assert "only 21% of its convolutions and matrix products run in int8" in note
