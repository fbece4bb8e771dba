"""The 4-bit weight plan: each weight's sensitivity measured alone, the most sensitive kept at 8 bits within the
share, the twin left as it was by the measuring, and the kept weights untouched when the others are lowered."""

from __future__ import annotations

import numpy as np
import torch

from npukit.quant.config import CalibrationSpec, CpuKernels, QuantConfig
from npukit.quant.qat.bit_plan import plan_bits
from npukit.quant.qat.fake_quant import set_weight_bits
from npukit.quant.qat.program import OnnxProgram
from npukit.quant.qat.twin import split
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, tiny_cnn


def _twin():
    torch.manual_seed(0)
    result = quantize(tiny_cnn(activation="Relu", spread=0.5), make_samples(16, seed=1),
                      config=QuantConfig(calibration=CalibrationSpec(method="minmax"),
                                         cpu=CpuKernels(reduce_range=True)))
    twin = split(result.model, reduce_range=True)
    return twin.program(), OnnxProgram(result.reference)


def test_the_most_sensitive_weights_keep_eight_bits_within_the_share():
    student, teacher = _twin()
    x = np.concatenate([s["x"] for s in make_samples(8, seed=3)])
    with torch.no_grad():
        before = student({"x": torch.from_numpy(x[:1])})[0]
    everything = plan_bits(student, teacher, {"x": x}, bits=4, share=0.0)
    assert len(everything.layers) >= 2 and everything.eight_bit == frozenset() and everything.samples == 8
    assert all(layer.bits == 4 and np.isfinite(layer.sqnr_db) for layer in everything.layers)
    ranked = sorted(everything.layers, key=lambda layer: layer.sqnr_db)
    total = sum(layer.weights for layer in ranked)
    share = (ranked[0].weights + 0.5) / total  # room for the most sensitive weight alone
    plan = plan_bits(student, teacher, {"x": x}, bits=4, share=share)
    assert plan.eight_bit == {ranked[0].key} and plan.kept_share <= share
    assert [layer.sqnr_db for layer in plan.layers] == [layer.sqnr_db for layer in everything.layers]
    with torch.no_grad():  # measuring put every grid back
        torch.testing.assert_close(student({"x": torch.from_numpy(x[:1])})[0], before, rtol=0, atol=0)
    set_weight_bits(student, 4, keep=plan.eight_bit)
    assert {key: student.quant[key].qmax == 7 for key in (layer.key for layer in plan.layers)} == \
        {layer.key: layer.key != ranked[0].key for layer in plan.layers}


def test_lowering_the_weights_leaves_a_fixed_asymmetric_grid_at_eight_bits():
    """A Mul / Add constant quantized asymmetrically (a GroupNorm's affine after its InstanceNormalization, in a
    PyTorch GroupNorm model's export) has no symmetric bit width to lower: w4a8 ended in an internal error on it.
    It keeps its 8-bit grid; the conv weights go to 4 bits."""
    student, _ = _twin()
    keys = [node.attrs["key"] for node in student.nodes if node.op_type == "FakeQuant"
            and node.attrs.get("kind") == "weight"]
    fixed = student.quant[keys[0]]
    fixed.rule, fixed.qmin, fixed.qmax = "fixed", 0, 255  # as the twin makes an asymmetric uint8 weight grid
    set_weight_bits(student, 4)
    assert (fixed.rule, fixed.qmin, fixed.qmax) == ("fixed", 0, 255)
    assert all(student.quant[key].qmax == 7 for key in keys[1:])
