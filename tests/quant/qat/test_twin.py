"""Fake quantization is ONNX's Q/DQ arithmetic; a QDQ model's twin computes the QDQ model, and what it learns is
written back so that ONNX Runtime computes the training simulation (layer by layer within one grid step)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from npukit.quant.config import CalibrationSpec, QuantConfig, from_flat
from npukit.quant.qat.export_check import check_export
from npukit.quant.qat.fake_quant import ActivationQuant, WeightQuant, fake_quant
from npukit.quant.qat.twin import split, write_back
from npukit.quant.qdq import quantize
from npukit.runtime.ort import make_session
from tests.quant.conftest import make_samples, tiny_cnn


def _qdq_reference(x: np.ndarray, scale: float, zero: int, dtype) -> np.ndarray:
    """ONNX Runtime's QuantizeLinear -> DequantizeLinear on ``x``."""
    from onnx import TensorProto, helper, numpy_helper

    elem = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}[dtype]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
                              [numpy_helper.from_array(np.float32(scale), "s"),
                               numpy_helper.from_array(np.asarray(zero, dtype), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    del elem
    return make_session(model, optimization="disable").run(None, {"x": x})[0]


@pytest.mark.parametrize("dtype,zero", [(np.uint8, 128), (np.uint8, 3), (np.int8, 0)])
def test_fake_quant_is_onnx_quantize_dequantize_including_ties(dtype, zero):
    scale = 0.05
    info = np.iinfo(dtype)
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-10, 10, 500), (np.arange(-40, 40) + 0.5) * scale]).astype(np.float32)
    got = fake_quant(torch.from_numpy(x), torch.tensor(scale), torch.tensor(float(zero)), info.min, info.max, None)
    np.testing.assert_array_equal(got.numpy(), _qdq_reference(x, scale, zero, dtype))


def test_straight_through_gradient_passes_inside_the_grid_only():
    quant = ActivationQuant(np.float32(0.1), np.float32(0), -128, 127)
    x = torch.tensor([0.03, 1.0, -5.0, 20.0, -20.0], requires_grad=True)
    quant(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1, 1, 1, 0, 0])


def test_learned_scale_gets_a_gradient():
    quant = ActivationQuant(np.float32(0.1), np.float32(0), 0, 255, learn_scale=True)
    quant(torch.linspace(0, 30, 50)).square().sum().backward()
    assert quant.scale_.grad is not None and float(quant.scale_.grad.abs()) > 0


def _build(reduce_range: bool, **config):
    model = tiny_cnn(activation="Clip", spread=0.5)
    samples = make_samples(16)
    result = quantize(model, samples, config=from_flat(reduce_range=reduce_range, method="minmax", **config))
    return result, samples


@pytest.mark.parametrize("reduce_range", [False, True])
def test_weight_rules_reproduce_the_ptq_grids(reduce_range):
    result, _ = _build(reduce_range)
    twin = split(result.model, reduce_range=reduce_range)
    program = twin.program()
    weights = program.trained_initializers()
    rules = set()
    for node in program.nodes:
        if node.op_type == "FakeQuant" and node.attrs["kind"] == "weight":
            module = program.quant[node.attrs["key"]]
            assert isinstance(module, WeightQuant)
            rules.add((module.rule, module.levels))
            np.testing.assert_allclose(module.scale(weights[node.inputs[0]]).detach().numpy(),
                                       module.fixed_scale.numpy(), rtol=1e-6)
    assert rules == ({("absmax", 64), ("absmax", 127), ("pair", 127)} if reduce_range else {("absmax", 127)})


@pytest.mark.parametrize("reduce_range", [False, True])
def test_twin_computes_the_qdq_model(reduce_range):
    result, samples = _build(reduce_range)
    twin = split(result.model, reduce_range=reduce_range)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in twin.model.graph.node)
    check = check_export(result.model, twin.program(), samples[:8])
    assert check.layers >= 5
    assert check.exact, check


@pytest.mark.parametrize("reduce_range", [False, True])
def test_trained_weights_written_back_compute_the_simulation(reduce_range):
    """Weights moved as training moves them, then written back: ONNX Runtime's run of the exported model matches
    the simulation layer by layer, and end to end through the integer kernels where they are exact."""
    result, samples = _build(reduce_range)
    twin = split(result.model, reduce_range=reduce_range)
    program = twin.program()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in program.trained_initializers().values():
            p.add_(0.05 * torch.randn_like(p) * p.abs().mean())
    exported = write_back(result.model, twin, program)
    onnx.checker.check_model(exported)
    check = check_export(exported, program, samples[:8])
    assert check.exact, check
    if reduce_range:  # 7-bit and pair-bounded weights: ORT's int8 kernels are exact on every x86 CPU
        assert check.sqnr_db > 60, check


def test_four_bit_weights_are_stored_as_int4_and_compute_the_simulation():
    from npukit.frontend.opset import ensure_opset

    model, _ = ensure_opset(tiny_cnn(activation="Relu"), 21, reason="int4", feeds=make_samples(2))
    samples = make_samples(16)
    result = quantize(model, samples, config=QuantConfig(calibration=CalibrationSpec(method="minmax")))
    twin = split(result.model, reduce_range=False)
    program = twin.program()
    weights = program.trained_initializers()
    for node in program.nodes:
        if node.op_type == "FakeQuant" and node.attrs["kind"] == "weight":
            program.quant[node.attrs["key"]].set_bits(4, weights[node.inputs[0]])
    exported = write_back(result.model, twin, program)
    int4 = [i for i in exported.graph.initializer if i.data_type == onnx.TensorProto.INT4]
    assert len(int4) >= 8  # every weight and its zero point
    check = check_export(exported, program, samples[:8])
    assert check.exact, check
    assert len(exported.SerializeToString()) < len(result.model.SerializeToString())


def test_a_kept_float_conv_s_own_per_channel_dequantize_is_written_back():
    """A conv the plan keeps float reads its quantized input through a DequantizeLinear of its own whose scale is
    the per-tensor one repeated per channel (``quant.emit.ort_float``): writing the trained scale back into it
    crashed (PP-OCRv4's detector: cannot reshape array of size 1 into shape (32,))."""
    result, samples = _build(False, exclude=("pw",))
    per_channel = [n for n in result.model.graph.node if n.op_type == "DequantizeLinear" and n.name.startswith("pw")]
    assert per_channel, "the float conv reads its input through its own DequantizeLinear"
    twin = split(result.model, reduce_range=False)
    program = twin.program()
    exported = write_back(result.model, twin, program)
    onnx.checker.check_model(exported)
    check = check_export(exported, program, samples[:8])
    assert check.exact, check
