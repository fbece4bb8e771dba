"""A depthwise conv whose input channels span very different ranges (one 8-bit grid leaves the narrow ones a level or
two) stays in float with the conv that writes that input; one on an even input stays int8."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.measure.fidelity import sqnr_db
from npukit.quant.config import CalibrationSpec, Precision, QuantConfig
from npukit.quant.precision.fragile import FRAGILE_DB, fragile_convs, input_grid_sqnr
from npukit.quant.qdq import quantize
from tests.quant.conftest import outputs


def _net(spread: float) -> onnx.ModelProto:
    """x[1,8,16,16] -> 1x1 conv (8 -> 16; output channel c scaled by spread ** (c / 15)) -> HardSwish -> 3x3
    depthwise conv -> 1x1 conv (16 -> 4) -> y. ``spread`` 1: every channel of the depthwise input on one scale."""
    rng = np.random.default_rng(0)
    gains = spread ** (np.arange(16) / 15.0)
    pw = (rng.standard_normal((16, 8, 1, 1)) * 0.3 * gains[:, None, None, None] / gains.max() * 10).astype(np.float32)
    dw = (rng.standard_normal((16, 1, 3, 3)) * 0.4).astype(np.float32)
    dw /= np.abs(dw).sum(axis=(1, 2, 3), keepdims=True) / gains.max()  # the output would equalize (as a folded BN)
    dw *= (1.0 / gains)[:, None, None, None]
    out = (rng.standard_normal((4, 16, 1, 1)) * 0.3).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((pw, "w_pw"), (dw, "w_dw"), (out, "w_out"))]
    nodes = [helper.make_node("Conv", ["x", "w_pw"], ["a"], name="expand"),
             helper.make_node("HardSwish", ["a"], ["b"], name="act"),
             helper.make_node("Conv", ["b", "w_dw"], ["c"], name="depthwise", group=16, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w_out"], ["y"], name="project")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _samples(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)} for _ in range(n)]


def _minmax(model: onnx.ModelProto, samples, tensor: str) -> dict[str, tuple[float, float]]:
    from npukit.runtime.ort import make_session

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_empty_tensor_value_info(tensor))
    session = make_session(probe, optimization="disable")
    values = [session.run([tensor], s)[0] for s in samples]
    return {tensor: (min(float(v.min()) for v in values), max(float(v.max()) for v in values))}


def test_the_measure_is_the_output_sqnr_of_the_conv_with_its_input_rounded() -> None:
    model, samples = _net(300.0), _samples(2, 0)
    ranges = _minmax(model, samples, "b")
    got = input_grid_sqnr(model, samples, ranges)
    # the same figure by hand: the input rounded on its asymmetric uint8 grid, the depthwise conv in torch
    import torch

    lo, hi = ranges["b"]
    scale = (hi - lo) / 255.0
    zero = np.clip(np.round(-lo / scale), 0, 255)
    weight = torch.from_numpy(numpy_helper.to_array(model.graph.initializer[1]).copy())
    from npukit.runtime.ort import make_session

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_empty_tensor_value_info("b"))
    session = make_session(probe, optimization="disable")
    signal = noise = 0.0
    for s in samples:
        b = session.run(["b"], s)[0]
        q = (np.clip(np.round(b / scale) + zero, 0, 255) - zero) * scale
        y = torch.nn.functional.conv2d(torch.from_numpy(b), weight, padding=1, groups=16).numpy().astype(np.float64)
        yq = torch.nn.functional.conv2d(torch.from_numpy(q.astype(np.float32)), weight, padding=1,
                                        groups=16).numpy()
        signal += float((y * y).sum())
        noise += float(((y - yq) ** 2).sum())
    assert got["depthwise"] == pytest.approx(10 * np.log10(signal / noise), abs=0.05)


def test_a_spread_input_is_fragile_with_its_writer_and_an_even_one_is_not() -> None:
    samples = _samples(2, 0)
    spread, even = _net(300.0), _net(1.0)
    found = fragile_convs(spread, samples, _minmax(spread, samples, "b"))
    assert [(f.node, f.input, f.producer) for f in found] == [("depthwise", "b", "expand")]  # through HardSwish
    assert found[0].sqnr_db < FRAGILE_DB
    assert input_grid_sqnr(even, samples, _minmax(even, samples, "b"))["depthwise"] > 35.0
    assert fragile_convs(even, samples, _minmax(even, samples, "b")) == []
    assert fragile_convs(spread, samples, _minmax(spread, samples, "b"), skip=["depthwise"]) == []


def test_quantize_keeps_the_fragile_pair_in_float_and_gains_on_held_out_samples() -> None:
    model, calib, held_out = _net(300.0), _samples(8, 1), _samples(4, 2)
    on = quantize(model, calib, config=QuantConfig(calibration=CalibrationSpec(method="minmax")))
    off = quantize(model, calib, config=QuantConfig(calibration=CalibrationSpec(method="minmax"),
                                                    precision=Precision(float_fragile=False)))
    record = on.steps.float_fragile
    assert record is not None and record["nodes"] == ["depthwise", "expand"] and record["samples"] == 4
    assert off.steps.float_fragile is None
    assert [d.step for d in on.plan.float_nodes["depthwise"]] == ["float_fragile"]
    assert [d.step for d in on.plan.float_nodes["expand"]] == ["float_fragile"]
    dequantized = {o for n in on.model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    weights = {n.name: n.input[1] for n in on.model.graph.node if n.op_type == "Conv"}
    assert weights["depthwise"] not in dequantized and weights["expand"] not in dequantized  # float weights
    assert weights["project"] in dequantized  # the projection stays int8
    reference = outputs(model, held_out)
    assert sqnr_db(reference, outputs(on.model, held_out)) > sqnr_db(reference, outputs(off.model, held_out)) + 6.0
    # fewer calibration samples than the measure takes: it runs on those there are
    few = quantize(model, calib[:3], config=QuantConfig(calibration=CalibrationSpec(method="minmax")))
    assert few.steps.float_fragile["samples"] == 3 and few.steps.float_fragile["nodes"] == ["depthwise", "expand"]
    # the even model keeps every conv int8
    even = quantize(_net(1.0), calib, config=QuantConfig(calibration=CalibrationSpec(method="minmax")))
    assert even.steps.float_fragile is not None and even.steps.float_fragile["nodes"] == []
