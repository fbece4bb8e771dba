"""A square that a root, logarithm or division reads back (a spectrogram's magnitude, a LayerNorm's variance) stays in
float with the nodes between; the convs around it stay int8."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npukit.measure.fidelity import sqnr_db
from npukit.quant.config import Precision, QuantConfig
from npukit.quant.precision.squares import square_chains
from npukit.quant.qdq import integer_kernel_report, quantize
from tests.quant.conftest import outputs


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _magnitude_net() -> onnx.ModelProto:
    """x[1,1,512] -> Conv1d with a windowed DFT basis (16 bins, real and imaginary) -> Slice re, im -> Pow 2 each ->
    Add -> Sqrt -> Conv1d (16 -> 8) -> Relu: a spectrogram front end as Silero VAD has it."""
    rng = np.random.default_rng(0)
    frames, bins = 64, 16
    phase = 2 * np.pi * np.outer(np.arange(bins), np.arange(frames)) / frames
    basis = np.concatenate([np.cos(phase), -np.sin(phase)]) * np.hanning(frames)
    inits = [_const("basis", basis[:, None, :].astype(np.float32)),
             _const("w", (rng.standard_normal((8, bins, 3)) * 0.3).astype(np.float32)),
             _const("zero", np.array([0], np.int64)), _const("half", np.array([bins], np.int64)),
             _const("end", np.array([2 * bins], np.int64)), _const("axis", np.array([1], np.int64)),
             _const("two", np.array(2.0, np.float32))]
    nodes = [helper.make_node("Conv", ["x", "basis"], ["spec"], name="stft", strides=[16]),
             helper.make_node("Slice", ["spec", "zero", "half", "axis"], ["re"], name="real"),
             helper.make_node("Slice", ["spec", "half", "end", "axis"], ["im"], name="imag"),
             helper.make_node("Pow", ["re", "two"], ["re2"], name="re_squared"),
             helper.make_node("Pow", ["im", "two"], ["im2"], name="im_squared"),
             helper.make_node("Add", ["re2", "im2"], ["power"], name="power"),
             helper.make_node("Sqrt", ["power"], ["mag"], name="magnitude"),
             helper.make_node("Conv", ["mag", "w"], ["h"], name="encoder", pads=[1, 1]),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    return _model(nodes, inits, [1, 1, 512])


def _clips(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Noise clips, each at one loudness between -40 dB and 0 dB."""
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((1, 1, 512)) * 10.0 ** rng.uniform(-2, 0)).astype(np.float32)}
            for _ in range(n)]


def test_a_magnitude_and_a_layernorm_are_found_and_nothing_else() -> None:
    chains = square_chains(_magnitude_net())
    assert [(c.square, c.reader, c.nodes) for c in chains] == [
        ("re_squared", "magnitude", ("re_squared", "power", "magnitude")),
        ("im_squared", "magnitude", ("im_squared", "power", "magnitude"))]
    layernorm = [helper.make_node("ReduceMean", ["x"], ["mean"], name="mean", axes=[-1]),
                 helper.make_node("Sub", ["x", "mean"], ["centred"], name="centre"),
                 helper.make_node("Pow", ["centred", "two"], ["sq"], name="square"),
                 helper.make_node("ReduceMean", ["sq"], ["var"], name="variance", axes=[-1]),
                 helper.make_node("Add", ["var", "eps"], ["var_eps"], name="plus_eps"),
                 helper.make_node("Sqrt", ["var_eps"], ["std"], name="std"),
                 helper.make_node("Div", ["centred", "std"], ["y"], name="normalize")]
    ln = _model(layernorm, [_const("two", np.float32(2.0)), _const("eps", np.float32(1e-5))], [1, 4, 8])
    assert [c.nodes for c in square_chains(ln)] == [("square", "variance", "plus_eps", "std")]
    # the variance as optimize-graph writes a mean over the last axes: GlobalAveragePool
    layernorm[3] = helper.make_node("GlobalAveragePool", ["sq"], ["var"], name="variance")
    ln = _model(layernorm, [_const("two", np.float32(2.0)), _const("eps", np.float32(1e-5))], [1, 4, 8])
    assert [c.nodes for c in square_chains(ln)] == [("square", "variance", "plus_eps", "std")]
    # a square nothing reads back (squared then fed to a conv), and a product of two tensors: left alone
    plain = [helper.make_node("Pow", ["x", "two"], ["sq"], name="square"),
             helper.make_node("Mul", ["sq", "x"], ["cube"], name="times_x"),
             helper.make_node("Relu", ["cube"], ["r"], name="relu"),
             helper.make_node("Sqrt", ["r"], ["y"], name="root")]
    assert square_chains(_model(plain, [_const("two", np.float32(2.0))], [1, 4, 8])) == []


def test_quiet_clips_survive_only_with_the_squares_in_float() -> None:
    model, held = _magnitude_net(), _clips(8, seed=7)
    reference = outputs(model, held)

    def worst_clip(config: QuantConfig) -> tuple[float, dict]:
        result = quantize(model, _clips(16, seed=1), config=config)
        got = outputs(result.model, held)
        assert integer_kernel_report(result.model)["integer_fraction"] == 1.0  # both convs stay int8
        return min(sqnr_db(reference[i:i + 1], got[i:i + 1]) for i in range(len(held))), result.steps.float_squares

    squared_in_int8, none = worst_clip(QuantConfig(precision=Precision(float_squares=False)))
    in_float, record = worst_clip(QuantConfig())
    assert none is None and squared_in_int8 < 5  # the quietest clip's magnitudes rounded to zero
    assert record["nodes"] == ["re_squared", "power", "magnitude", "im_squared"]
    assert in_float > 10 and in_float > squared_in_int8 + 8
