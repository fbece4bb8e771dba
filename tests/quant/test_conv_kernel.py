"""Moving int8 convs from ORT's symmetric-conv kernel to its int8 GEMM: which convs can move, that the move is exact,
and quantize's use of it."""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.quant.cpu import conv_kernel
from npukit.quant.config import CpuKernels, QuantConfig
from npukit.quant.cpu.conv_kernel import _shift, candidates, choose_conv_kernels, move_to_gemm, require_exact_move
from npukit.quant.qdq import integer_kernel_report, quantize
from npukit.runtime.int8_paths import Int8Path, full_range_exact, probe_int8_paths
from tests.quant.conftest import make_samples, outputs

# The move is exact only where both of ORT's int8 conv kernels accumulate in 32 bits (VNNI, AMX, Arm): measured on
# this CPU. Where they saturate (x86 without VNNI) the tests check the refusal instead.
EXACT_HERE = full_range_exact(probe_int8_paths())
needs_exact_kernels = pytest.mark.skipif(
    not EXACT_HERE, reason="this CPU's int8 conv kernels saturate with full-range weights (no VNNI): the move is "
                           "refused here, see test_gemm_convs_is_refused_where_the_kernels_saturate")


def _projection_model(batch: int | str = 1) -> onnx.ModelProto:
    """x[batch,64,7,7] -> 1x1 (64 -> 256) -> Relu -> depthwise 3x3 (256) -> Relu -> 1x1 (256 -> 32) -> 3x3 (32 -> 16)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name) for name, shape in
             [("w1", (256, 64, 1, 1)), ("w2", (256, 1, 3, 3)), ("w3", (32, 256, 1, 1)), ("w4", (16, 32, 3, 3))]]
    inits += [numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np.float32), f"b{i}")
              for i, n in ((1, 256), (2, 256), (3, 32), (4, 16))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="expand"),
             helper.make_node("Relu", ["c1"], ["a1"], name="relu1"),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], name="dw", pads=[1] * 4, group=256),
             helper.make_node("Relu", ["c2"], ["a2"], name="relu2"),
             helper.make_node("Conv", ["a2", "w3", "b3"], ["c3"], name="project"),
             helper.make_node("Conv", ["c3", "w4", "b4"], ["y"], name="spatial", pads=[1] * 4)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16, 7, 7])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _samples(n: int = 4) -> list[dict[str, np.ndarray]]:
    return make_samples(n, shape=(1, 64, 7, 7))


@pytest.fixture(scope="module")
def built() -> onnx.ModelProto:
    return quantize(_projection_model(), _samples(), config=QuantConfig()).model


def _dequantized_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and inits.get(node.input[0]) is not None \
                and inits[node.input[0]].dtype == np.int8:
            q, s, z = (inits[t] for t in node.input[:3])
            shape = (-1,) + (1,) * (q.ndim - 1)
            found[node.input[0]] = (q.astype(np.float64) - z.reshape(shape)) * s.reshape(shape)
    return found


def test_the_shift_keeps_every_integer_in_int8() -> None:
    assert _shift(np.array([-127, 0, 127], np.int8)) == -1
    assert _shift(np.array([-128, 0, 126], np.int8)) == 1
    assert _shift(np.array([-128, 0, 127], np.int8)) is None


def test_candidates_are_the_quantized_non_depthwise_convs(built) -> None:
    names = {c.node for c in candidates(built)}
    assert names == {"expand", "project", "spatial"}  # not the depthwise one (slower on ORT's generic path)
    shapes = {c.node: c.input_shape for c in candidates(built)}
    assert shapes["project"] == (1, 7, 7, 256)  # NHWC, as ORT runs it


def test_a_weight_using_both_ends_of_int8_cannot_move(built) -> None:
    model = onnx.ModelProto()
    model.CopyFrom(built)
    target = next(c for c in candidates(model) if c.node == "project")
    for init in model.graph.initializer:
        if init.name == target.weight:
            q = numpy_helper.to_array(init).copy()
            q.flat[0], q.flat[1] = -128, 127
            init.CopyFrom(numpy_helper.from_array(q, init.name))
    assert "project" not in {c.node for c in candidates(model)}


def test_moving_to_the_gemm_changes_no_weight(built) -> None:
    moved = move_to_gemm(built, candidates(built))
    before, after = _dequantized_weights(built), _dequantized_weights(moved)
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    zero_points = {numpy_helper.to_array(i).flat[0] for i in moved.graph.initializer
                   if i.name in {c.zero_point for c in candidates(built)}}
    assert zero_points <= {-1, 1} and zero_points  # the moved convs leave ConvSym (zero points 0)
    assert candidates(moved) == []
    kernels_before, kernels_after = integer_kernel_report(built), integer_kernel_report(moved)
    assert kernels_after["integer_ops"] == kernels_before["integer_ops"]  # still QLinearConv, on the other kernel
    assert kernels_after["integer_fraction"] == 1.0


@needs_exact_kernels
def test_moving_to_the_gemm_changes_no_output_where_both_kernels_are_exact(built) -> None:
    moved = move_to_gemm(built, candidates(built))
    samples = _samples(6)
    np.testing.assert_array_equal(outputs(built, samples), outputs(moved, samples))


def _saturating() -> tuple[Int8Path, ...]:
    """The paths as measured on an AMD EPYC with AVX2 and no VNNI."""
    return (Int8Path("1x1 conv", "symmetric conv (ConvSym)", "full 8-bit", False, 22, 0.6),
            Int8Path("1x1 conv", "int8 GEMM", "full 8-bit", False, 23, 0.6),
            Int8Path("3x3 depthwise conv", "depthwise (ConvSym)", "full 8-bit", True, 0, 0.0))


def test_gemm_convs_is_refused_where_the_kernels_saturate(monkeypatch) -> None:
    with pytest.raises(InputError, match="saturate .*off by up to 23 output steps"):
        require_exact_move(_saturating())
    monkeypatch.setattr(conv_kernel, "probe_int8_paths", _saturating)
    with pytest.raises(InputError, match="gemm_convs moves"):  # before any calibration
        quantize(_projection_model(), _samples(), config=QuantConfig(cpu=CpuKernels(gemm_convs=True)))
    with pytest.raises(InputError):
        choose_conv_kernels(_projection_model(), _samples(1)[0])


def test_this_cpus_refusal_matches_its_measured_kernels() -> None:
    if EXACT_HERE:
        require_exact_move()
    else:
        with pytest.raises(InputError, match="saturate"):
            quantize(_projection_model(), _samples(), config=QuantConfig(cpu=CpuKernels(gemm_convs=True)))


@needs_exact_kernels
def test_the_choice_is_timed_and_exact(built) -> None:
    samples = _samples(3)
    choice = choose_conv_kernels(built, samples[0])
    assert set(choice.node_ratios) == {"expand", "project", "spatial"}
    assert all(r > 0 for r in choice.node_ratios.values())
    assert set(choice.moved) <= {n for n, r in choice.node_ratios.items() if r <= 0.95}
    if choice.moved:
        assert choice.model_ratio is not None and choice.model_ratio < 1.0
    np.testing.assert_array_equal(outputs(built, samples), outputs(choice.model, samples))
    summary = choice.summary()
    assert summary["moved_to_gemm"] == list(choice.moved) and summary["margin"] == 0.05


@needs_exact_kernels
def test_quantize_with_gemm_convs_reports_the_choice_and_keeps_the_outputs(built) -> None:
    samples = _samples()
    result = quantize(_projection_model(), samples, config=QuantConfig(cpu=CpuKernels(gemm_convs=True)))
    assert set(result.steps.conv_kernels["gemm_over_convsym_alone"]) == {"expand", "project", "spatial"}
    np.testing.assert_array_equal(outputs(built, samples), outputs(result.model, samples))
    assert quantize(_projection_model(), samples, config=QuantConfig()).steps.conv_kernels is None


def test_a_conv_with_16_bit_activations_is_no_candidate() -> None:
    samples = _samples()
    config = QuantConfig().with_scheme(int16_nodes=("project",))
    model = quantize(_projection_model(), samples, config=config).model
    assert "project" not in {c.node for c in candidates(model)}


def test_a_symbolic_batch_is_timed_as_one() -> None:
    model = quantize(_projection_model(batch="N"), _samples(), config=QuantConfig()).model
    shapes = {c.node: c.input_shape for c in candidates(model)}
    assert shapes.get("project") == (1, 7, 7, 256)
