from __future__ import annotations

import pytest

from npukit.quant.config import CalibrationSpec, CpuKernels, FloatHead, Precision, QuantConfig, Recipe, Scheme
from npukit.quant.cpu.schemes import config_for_cpu, cpu_int8_scheme
from npukit.runtime.devices import X86_INT8_FLAGS, read_cpu_info


def _cpu(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: test cpu\nflags\t\t: {flags}\ncore id\t\t: 0\n\n")
    return read_cpu_info(path)


@pytest.mark.parametrize("flags, activation, reduce_range, float_stem", [
    ("sse4_2 avx avx2 fma", "uint8", True, True),  # AVX2 without VNNI: saturating 16-bit pair sums, slow int8 stem
    ("avx2 avx512f avx512bw avx512_vnni", "uint8", False, True),  # 32-bit sums; the int8 stem is still slower
    ("avx2 avx_vnni", "uint8", False, True),
    ("avx2 avx512_vnni amx_tile amx_int8", "uint8", False, True),
    ("sse2", "uint8", True, False),
])
def test_x86_scheme_follows_the_dot_product_instructions(tmp_path, monkeypatch, flags, activation, reduce_range,
                                                         float_stem):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    cpu = _cpu(tmp_path, flags)
    assert set(cpu.int8_features) >= set(X86_INT8_FLAGS)
    scheme = cpu_int8_scheme(cpu)
    assert (scheme["activation_dtype"], scheme["reduce_range"], scheme["float_stem"]) == (activation, reduce_range,
                                                                                          float_stem)
    assert scheme["reason"]
    config = config_for_cpu(QuantConfig(calibration=CalibrationSpec(method="entropy"), recipe=Recipe(cle=True)), cpu)
    assert config.cpu.reduce_range == reduce_range and config.calibration.method == "entropy" and config.recipe.cle
    assert config.precision.timed_head == float_stem
    assert config.cpu.gemm_convs == scheme["gemm_convs"] == (not reduce_range)  # both conv kernels exact: time them


def test_arm_scheme_uses_full_range_and_signed_activations_with_i8mm(tmp_path, monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    plain = cpu_int8_scheme(_cpu(tmp_path, "fp asimd asimddp"))
    assert plain["activation_dtype"] == "uint8" and not plain["reduce_range"]
    assert cpu_int8_scheme(_cpu(tmp_path, "fp asimd asimddp i8mm"))["activation_dtype"] == "int8"


def test_reduce_range_caps_only_the_weights_whose_kernel_saturates() -> None:
    from onnx import helper

    from npukit.quant.cpu.schemes import is_depthwise, pair_bounded, reduced_weight_range

    dw = helper.make_node("Conv", ["x", "w"], ["y"], group=8)
    grouped = helper.make_node("Conv", ["x", "w"], ["y"], group=2)  # 4 input channels per group: the GEMM path
    plain = helper.make_node("Conv", ["x", "w"], ["y"])
    gemm = helper.make_node("Gemm", ["x", "w"], ["y"])
    assert is_depthwise(dw, (8, 1, 3, 3))
    assert not is_depthwise(dw, (16, 1, 3, 3))  # channel multiplier 2: not MLAS's depthwise kernel
    assert not is_depthwise(grouped, (8, 4, 3, 3)) and not is_depthwise(plain, (8, 8, 1, 1))
    assert not is_depthwise(gemm, (8, 1))
    on, off = QuantConfig(cpu=CpuKernels(reduce_range=True)), QuantConfig()
    assert not reduced_weight_range(dw, (8, 1, 3, 3), on) and not pair_bounded(dw, (8, 1, 3, 3), on)
    assert pair_bounded(plain, (8, 8, 1, 1), on) and pair_bounded(gemm, (5, 6), on)
    assert not reduced_weight_range(plain, (8, 8, 1, 1), on) and not reduced_weight_range(gemm, (5, 6), on)
    assert reduced_weight_range(plain, (8, 8, 3, 3), on) and reduced_weight_range(grouped, (8, 4, 1, 1), on)
    assert not pair_bounded(plain, (8, 8, 1, 1), off) and not reduced_weight_range(plain, (8, 8, 3, 3), off)
    asymmetric = QuantConfig(scheme=Scheme(symmetric_weights=False), cpu=CpuKernels(reduce_range=True))
    assert not pair_bounded(plain, (8, 8, 1, 1), asymmetric) and reduced_weight_range(plain, (8, 8, 1, 1), asymmetric)


def test_pair_bounded_scale_keeps_every_rounded_pair_within_the_int16_lane() -> None:
    import numpy as np

    from npukit.quant.cpu.schemes import PAIR_LIMIT, pair_bounded_scale

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((16, 37)) * rng.uniform(0.1, 3, (16, 1))  # odd K: the last weight pairs with a zero
    for per_channel in (True, False):
        scale = pair_bounded_scale(rows, per_channel=per_channel)
        q = np.abs(np.rint(rows / scale[:, None]))
        q = np.concatenate([q, np.zeros((16, 1))], axis=1)
        pairs = q[:, 0::2] + q[:, 1::2]
        assert pairs.max() <= PAIR_LIMIT and q.max() <= 127
        if per_channel:
            assert pairs.max(axis=1).min() >= PAIR_LIMIT - 2  # no channel gives levels away
        up = np.abs(np.floor(rows / (s := pair_bounded_scale(rows, per_channel=per_channel, headroom=2))[:, None]) + 1)
        assert (np.concatenate([up, np.zeros((16, 1))], 1)[:, 0::2]
                + np.concatenate([up, np.zeros((16, 1))], 1)[:, 1::2]).max() <= PAIR_LIMIT
        assert s.shape == ((16,) if per_channel else (1,))  # one scale per row, or one


def _stem_model(in_channels: int, kernel: int):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(size=(8, in_channels, kernel, kernel)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(4, 8, 3, 3)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="stem", pads=[kernel // 2] * 4),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Conv", ["b", "w2"], ["y"], name="body", pads=[1] * 4)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, in_channels, 8, 8])
    graph = helper.make_graph(nodes, "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_stem_convs_are_the_short_reductions_over_the_float_input() -> None:
    from npukit.quant.cpu.schemes import STEM_MAX_K, stem_convs

    assert stem_convs(_stem_model(3, 3)) == ["stem"]  # K = 27: a 3x3 RGB stem
    assert stem_convs(_stem_model(1, 5)) == ["stem"]  # K = 25
    assert stem_convs(_stem_model(3, 7)) == []  # K = 147: faster in int8 (ResNet's stem)
    assert 27 <= STEM_MAX_K < 147


def test_float_stem_leaves_the_stem_and_the_input_unquantized() -> None:
    import numpy as np

    from npukit.quant.qdq import quantize
    from npukit.runtime.ort import make_session

    model = _stem_model(3, 3)
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    plain = quantize(model, samples, config=QuantConfig())
    stem = quantize(model, samples, config=QuantConfig(precision=Precision(float_head=FloatHead())))
    assert stem.steps.float_stem["nodes"] == ["stem"] and plain.steps.float_stem is None
    quantized_inputs = {n.input[0] for n in stem.model.graph.node if n.op_type == "QuantizeLinear"}
    assert "x" not in quantized_inputs and "x" in {n.input[0] for n in plain.model.graph.node
                                                   if n.op_type == "QuantizeLinear"}
    rows = {r["node"]: r for r in stem.per_layer}
    assert rows["stem"]["excluded"] and not rows["stem"]["quantized"] and rows["body"]["quantized"]
    # the stem's float weights: its output is exact up to the body's own rounding, so closer to float than plain
    ref = make_session(model).run(None, samples[0])[0]
    err = [np.abs(make_session(r.model).run(None, samples[0])[0] - ref).mean() for r in (plain, stem)]
    assert err[1] < err[0]
