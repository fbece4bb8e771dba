"""The energy estimate: per-operator figures sum to the model's, integer layers cost less than float ones, fused
activations move no bytes, the memory level follows the on-chip size, and RAPL's absence is said, not hidden."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.measure.energy import (DRAM_PJ_PER_BYTE, MAC_PJ, SRAM_PJ_PER_BYTE, EnergyModel, energy_figures,
                                   estimate_energy, read_rapl)


def _conv_relu(quantized: bool = False, bias: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    nodes, inits = [], []
    x = "x"
    if quantized:
        inits += [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
                  numpy_helper.from_array(np.array(128, np.uint8), "z"),
                  numpy_helper.from_array(np.round(w / 0.02).astype(np.int8), "wq"),
                  numpy_helper.from_array(np.array(0.02, np.float32), "ws"),
                  numpy_helper.from_array(np.array(0, np.int8), "wz")]
        nodes += [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
                  helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
                  helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"])]
        if bias:  # an int32 bias on the accumulator's grid, as bias correction leaves it
            inits += [numpy_helper.from_array(np.arange(8, dtype=np.int32), "bq"),
                      numpy_helper.from_array(np.array(0.001, np.float32), "bs")]
            nodes.append(helper.make_node("DequantizeLinear", ["bq", "bs"], ["b"]))
        x = "xd"
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    nodes += [helper.make_node("Conv", [x, "w"] + (["b"] if bias else []), ["c"], name="conv", pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c"], ["r"], name="relu"),
              helper.make_node("Add", ["r", "r"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_per_operator_figures_sum_to_the_model() -> None:
    e = estimate_energy(_conv_relu())
    assert [o.name for o in e.ops] == ["conv", "relu", "add"]
    assert sum(o.total_pj for o in e.ops) == pytest.approx(e.total_pj)
    assert e.total_pj == pytest.approx(e.compute_pj + e.memory_pj)
    conv = e.ops[0]
    assert conv.macs == 8 * 3 * 9 * 16 * 16 and conv.dtype == "float32"
    assert conv.compute_pj == pytest.approx(conv.macs * MAC_PJ["float32"])
    # weights 8*3*3*3 floats, input 3*16*16 floats, output 8*16*16 floats, all on chip
    assert conv.sram_bytes == 4 * (8 * 27 + 3 * 256 + 8 * 256) and conv.dram_bytes == 0
    assert e.ops[1].sram_bytes == e.ops[1].dram_bytes == 0  # the Relu is the conv's epilogue
    assert e.ops[2].sram_bytes == 4 * 3 * 8 * 256  # two reads and a write


def test_an_int8_conv_is_priced_as_int8() -> None:
    flt, q = estimate_energy(_conv_relu()), estimate_energy(_conv_relu(quantized=True))
    conv = next(o for o in q.ops if o.name == "conv")
    assert conv.dtype == "int8" and conv.compute_pj == pytest.approx(conv.macs * MAC_PJ["int8"])
    assert conv.sram_bytes == 8 * 27 + 3 * 256 + 4 * 8 * 256  # int8 weights and input, float output
    assert q.total_pj < flt.total_pj
    assert {o.op for o in q.ops} == {"Conv", "Relu", "Add"}  # Q/DQ are plumbing, not operators
    with_bias = next(o for o in estimate_energy(_conv_relu(quantized=True, bias=True)).ops if o.name == "conv")
    assert with_bias.dtype == "int8" and with_bias.sram_bytes == conv.sram_bytes + 4 * 8  # the int32 bias read


def test_the_memory_level_follows_the_on_chip_size() -> None:
    model = _conv_relu()
    small = estimate_energy(model, energy_model=EnergyModel(on_chip_bytes=512), peak_bytes=4096)
    assert not small.weights_on_chip and not small.activations_on_chip
    conv = small.ops[0]
    assert conv.dram_bytes == 4 * (8 * 27 + 3 * 256 + 8 * 256)  # every tensor is larger than 512 B
    assert conv.memory_pj == pytest.approx(conv.dram_bytes * DRAM_PJ_PER_BYTE)
    big = estimate_energy(model)
    assert big.ops[0].memory_pj == pytest.approx(big.ops[0].sram_bytes * SRAM_PJ_PER_BYTE)


def test_energy_figures_say_why_nothing_was_measured() -> None:
    estimates, measured = energy_figures({"m": _conv_relu()}, runs=3)
    assert estimates["m"].total_pj > 0
    counter, why = read_rapl()
    if counter is None:
        assert measured["m"].uj_per_inference is None and measured["m"].note == why and why
    else:
        assert measured["m"].uj_per_inference is not None and measured["m"].runs == 3


def test_sizes_shape_inference_cannot_tell_come_from_one_run() -> None:
    static = _conv_relu()
    symbolic = onnx.ModelProto()
    symbolic.CopyFrom(static)
    dims = symbolic.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    symbolic.graph.output[0].type.tensor_type.ClearField("shape")
    blind = estimate_energy(symbolic)
    assert blind.unknown_shapes > 0 and blind.notes[0].startswith("INCOMPLETE")
    assert "--input-shape" in blind.notes[0]  # symbolic inputs: fixing them is what to do
    feeds = {"x": np.zeros((1, 3, 16, 16), np.float32)}
    seen = estimate_energy(symbolic, feeds=feeds)
    assert seen.unknown_shapes == 0 and seen.total_pj == pytest.approx(estimate_energy(static).total_pj)
    assert energy_figures({"m": symbolic}, feeds=feeds, measure=False)[0]["m"].unknown_shapes == 0


def test_a_model_for_the_htp_is_priced_with_its_activations_at_their_quantized_widths():
    """compile's QDQ model: ORT CPU would hold a float and an integer copy of its activations (a peak above the float
    model's); the HTP holds the integers only, and the note says which plan the peak is from."""
    from tests.memory.tiny import qdq_conv

    model = qdq_conv()
    estimates, _ = energy_figures({"htp": model, "cpu": model}, measure=False, views={"htp": "qnn-htp"})
    notes = {role: next(n for n in e.notes if n.startswith("activation peak")) for role, e in estimates.items()}
    assert "(memory plan, qnn-htp view)" in notes["htp"] and "(ORT CPU's allocation planner)" in notes["cpu"]
    peak = {role: int(note.split()[2]) for role, note in notes.items()}
    assert 0 < peak["htp"] < peak["cpu"], peak


def test_a_dynamically_quantized_operator_is_priced_as_integer_macs() -> None:
    """ORT's DynamicQuantizeMatMul (DynamicQuantizeLSTM likewise: ddddocr's was priced as float32, 1650 uJ of MACs)
    quantizes its float input as it runs and multiplies on the int8 weights."""
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeMatMul", ["x", "w", "s", "z"], ["y"], domain="com.microsoft", name="dq")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        [numpy_helper.from_array(np.ones((64, 32), np.int8), "w"),
         numpy_helper.from_array(np.array([0.1], np.float32), "s"),
         numpy_helper.from_array(np.array([0], np.int8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    (op,) = estimate_energy(model).ops
    assert op.dtype == "int8", op
