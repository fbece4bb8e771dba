"""quantize folds the constant scale and shift after a conv (PP-LCNetV3's learnable affine block) into it before
calibrating: one output grid per conv, recorded in the steps; an affine node the user excludes stays."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from npukit.measure.fidelity import sqnr_db
from npukit.quant.config import from_flat
from npukit.quant.qdq import fold_conv_affines, quantize
from tests.passes.tiny import const, info, make_model
from tests.quant.conftest import make_samples, outputs


def _affine_net() -> onnx.ModelProto:
    """x[1,4,8,8] -> Conv 3x3 (8) -> Mul(scale, .) -> Add(., shift) -> Relu -> Conv 1x1 (4) -> Mul -> Add: written
    with the constant first, as paddle2onnx writes PP-LCNetV3's blocks."""
    rng = np.random.default_rng(3)
    inits = [const("w1", rng.standard_normal((8, 4, 3, 3)) * 0.3), const("b1", rng.standard_normal(8) * 0.1),
             const("k1", [2.1]), const("d1", [1.05]),
             const("w2", rng.standard_normal((4, 8, 1, 1)) * 0.3), const("k2", 0.7), const("d2", -0.2)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["k1", "c1"], ["m1"], name="scale1"),
             helper.make_node("Add", ["m1", "d1"], ["a1"], name="shift1"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
             helper.make_node("Mul", ["k2", "c2"], ["m2"], name="scale2"),
             helper.make_node("Add", ["m2", "d2"], ["y"], name="shift2")]
    return make_model(nodes, [info("x", [1, 4, 8, 8])], [info("y", [1, 4, 8, 8])], inits)


def test_the_affines_fold_exactly_and_are_recorded() -> None:
    model = _affine_net()
    folded, record = fold_conv_affines(model)
    assert record == {"into": {"scale1": "conv1", "shift1": "conv1", "scale2": "conv2", "shift2": "conv2"}}
    assert [n.op_type for n in folded.graph.node] == ["Conv", "Relu", "Conv"]
    samples = make_samples(4)
    np.testing.assert_allclose(outputs(folded, samples), outputs(model, samples), rtol=1e-5, atol=1e-5)
    assert fold_conv_affines(folded) == (folded, None)  # nothing left: the model itself


def test_quantize_folds_first_and_keeps_an_excluded_affine() -> None:
    model = _affine_net()
    samples = make_samples(16)
    reference = outputs(model, samples)
    result = quantize(model, samples, config=from_flat(method="minmax"))
    assert result.steps.folded_affines == {"into": {"scale1": "conv1", "shift1": "conv1", "scale2": "conv2",
                                                    "shift2": "conv2"}}
    assert not any(n.op_type in ("Mul", "Add") for n in result.model.graph.node)
    assert sqnr_db(reference, outputs(result.model, samples)) > 25
    kept = quantize(model, samples, config=from_flat(method="minmax", exclude=("scale2",)))
    assert kept.steps.folded_affines == {"into": {"scale1": "conv1", "shift1": "conv1"}}
    assert "scale2" in {n.name for n in kept.model.graph.node}


def test_an_affine_on_a_tensor_named_16_bit_stays() -> None:
    """A 16-bit tensor the user names (the conv output, read by the scale) keeps the nodes that read or write it."""
    folded, record = fold_conv_affines(_affine_net(), keep_tensors=("c2",))
    assert record == {"into": {"scale1": "conv1", "shift1": "conv1"}}
    assert "c2" in {o for n in folded.graph.node for o in n.output}
