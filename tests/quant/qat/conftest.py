"""A quantized classifier ending in a Softmax, and its training twin."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.quant.conftest import make_samples, tiny_cnn


@pytest.fixture(scope="module")
def softmax_twin():
    """(the QuantResult, the twin) of the tiny CNN ending in a Softmax over its 5 classes, made confident (its last
    layer's weights x4): its 8-bit probabilities are 0 or 1, as a confident detector's (MTCNN ONet) mostly are."""
    from npukit.quant.config import CalibrationSpec, QuantConfig
    from npukit.quant.qat.twin import split
    from npukit.quant.qdq import quantize

    model = tiny_cnn()
    w4 = next(i for i in model.graph.initializer if i.name == "w4")
    w4.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w4) * np.float32(4), "w4"))
    model.graph.output[0].name = "p"
    model.graph.node.append(helper.make_node("Softmax", ["y"], ["p"], name="softmax", axis=-1))
    result = quantize(model, make_samples(16), config=QuantConfig(calibration=CalibrationSpec(method="minmax")))
    return result, split(result.model, reduce_range=False)
