"""Forms real third-party models take, end to end through the CLI on tiny stand-ins (the zoo itself,
benchmarks/zoo_models.py, is not installed in CI): a recurrent model whose inputs are not batch-first (Silero VAD),
and models that are quantized already (ddddocr's ConvInteger OCR, QDQ files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.cli import main


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def _vad_like() -> onnx.ModelProto:
    """Silero VAD's interface: input [batch, 8], state [2, batch, 4] (batch on axis 1), sr an int64 scalar [];
    outputs output [batch, 4] and stateN, which goes through an If whose branches have different ranks."""
    rng = np.random.default_rng(0)
    axis1 = numpy_helper.from_array(np.array([1], np.int64))
    then_g = helper.make_graph([helper.make_node("Constant", [], ["ax"], value=axis1),
                                helper.make_node("Squeeze", ["st", "ax"], ["sq"])], "then", [],
                               [helper.make_tensor_value_info("sq", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["st"], ["id"])], "else", [],
                               [helper.make_tensor_value_info("id", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["input", "w"], ["m"]),
             helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Add", ["state", "r"], ["st"]),
             helper.make_node("Shape", ["st"], ["shp"]),
             helper.make_node("Gather", ["shp", "one"], ["d1"], axis=0),
             helper.make_node("Equal", ["d1", "one"], ["cond"]),
             helper.make_node("If", ["cond"], ["branch"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Reshape", ["branch", "shape3"], ["stateN"]),
             helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["srf", "ref_sr"], ["k"]),
             helper.make_node("Mul", ["r", "k"], ["output"])]
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([2, 1, 4], np.int64), "shape3"),
             numpy_helper.from_array(np.array(16000, np.float32), "ref_sr")]
    graph = helper.make_graph(
        nodes, "vad", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 8]),
                       helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 4]),
                       helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, ["S0", "batch", "S2"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture
def vad(tmp_path) -> tuple[Path, Path]:
    path = tmp_path / "models" / "vad.onnx"
    path.parent.mkdir()
    onnx.save(_vad_like(), path)
    rng = np.random.default_rng(1)
    data = tmp_path / "vad.npz"  # as benchmarks/zoo_models.py saves Silero's feeds: state and sr stacked
    np.savez(data, input=rng.standard_normal((12, 8)).astype(np.float32),
             state=rng.standard_normal((12, 2, 1, 4)).astype(np.float32), sr=np.full(12, 16000, np.int64))
    return path, data


def test_a_model_whose_inputs_are_not_batch_first_takes_stacked_samples(vad, tmp_path, capsys):
    model, data = vad
    shapes = ["--input-shape", "input=1,8", "--input-shape", "state=2,1,4"]
    assert main(["bench", str(model), "--data", str(data), "--runs", "2", "--warmup", "1"]) == 0
    out = tmp_path / "models" / "vad.int8.onnx"
    code = main(["quantize", str(model), *shapes, "--calib", str(data), "--data", str(data), "-o", str(out),
                 "--runs", "2"])
    assert code in (0, 1) and out.exists()  # written and checked; the verdict decides between 0 and 1
    capsys.readouterr()
    assert main(["bench", str(out), "--reference", str(model), *shapes, "--data", str(data), "--runs", "2",
                 "--warmup", "1"]) in (0, 1)
    printed = capsys.readouterr().out
    assert "bench: task" in printed and "12 samples" in printed


def test_data_that_fits_no_rule_says_which_and_how(vad, tmp_path, capsys):
    model, _ = vad
    bad = tmp_path / "bad.npz"
    np.savez(bad, input=np.zeros((3, 8), np.float32), state=np.zeros((3, 2, 4), np.float32),
             sr=np.full(3, 16000, np.int64))
    assert main(["bench", str(model), "--input-shape", "input=1,8", "--input-shape", "state=2,1,4",
                 "--data", str(bad)]) == 2
    err = _one_line_error(capsys)
    assert "does not fit input 'state', which takes (2, 1, 4): its samples are (2, 4) each" in err
    assert "batch axis 0 each sample would be (1, 2, 4)" in err and "not the input's whole shape (2, 1, 4)" in err


def _conv_integer() -> onnx.ModelProto:
    """x -> DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul(scales): ORT's dynamic-quantization operator form."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-20, 20, (4, 3, 3, 3)).astype(np.uint8), "wq"),
             numpy_helper.from_array(np.array(0, np.uint8), "wzp"),
             numpy_helper.from_array(np.array(0.01, np.float32), "ws")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
             helper.make_node("ConvInteger", ["xq", "wq", "xzp", "wzp"], ["acc"], pads=[1, 1, 1, 1]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    graph = helper.make_graph(nodes, "convint", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _qdq() -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.uint8), "z"),
             numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("Conv", ["xd", "w"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("build", "ops", "way"), [
    (_conv_integer, "ConvInteger x1, DynamicQuantizeLinear x1", "ORT CPU runs these ops"),
    (_qdq, "DequantizeLinear x1, QuantizeLinear x1", "compile it as it is"),
])
def test_an_already_quantized_model_is_refused_up_front(build, ops, way, tmp_path, capsys):
    """ddddocr's OCR model (ConvInteger + DynamicQuantizeLinear) used to die in ORT's quantizer with
    "internal error: KeyError: '140_scale'" (exit 1)."""
    model = tmp_path / "m.onnx"
    onnx.save(build(), model)
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(model), "--calib", str(calib), "-o", str(out)]) == 2
    err = _one_line_error(capsys)
    assert f"m.onnx is already quantized ({ops}); quantize takes a float model" in err and way in err
    assert not out.exists()
    assert main(["bench", str(model), "--data", str(calib), "--runs", "2", "--warmup", "1"]) == 0
    if build is _conv_integer:  # the HTP takes float (quantized for it) or QDQ models, not the operator form
        assert main(["compile", str(model), "--soc", "SM8650", "--calib", str(calib), "-o", str(out)]) == 2
        assert "compile takes a float model (quantized here for the HTP) or a QDQ model" in _one_line_error(capsys)
        assert not out.exists()


def _placeholder_net() -> onnx.ModelProto:
    """Conv -> Relu -> Conv on a placeholder static input [10, 3, 8, 8], as CenterFace declares [10, 3, 32, 32] and
    its users overwrite."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "placeholder",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_a_placeholder_static_shape_is_overridden_by_a_full_input_shape(tmp_path, capsys):
    model = tmp_path / "face.onnx"
    onnx.save(_placeholder_net(), model)
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).uniform(0, 1, (8, 3, 24, 32)).astype(np.float32))
    out = tmp_path / "face.int8.onnx"
    assert main(["quantize", str(model), "--input-shape", "1,3,24,32", "--calib", str(calib), "-o", str(out),
                 "--runs", "2"]) in (0, 1)  # the float model is timed as fixed, not as the file declares it
    report = json.loads(out.with_name("face.int8.report.json").read_text())
    assert "x axis 0: 10 -> 1; x axis 2: 8 -> 24; x axis 3: 8 -> 32" in report["results"]["input_shape_override"]
    assert "Input shape: the model's static sizes overridden by --input-shape" in capsys.readouterr().out
    assert main(["bench", str(out), "--reference", str(model), "--input-shape", "1,3,24,32", "--data", str(calib),
                 "--runs", "2", "--warmup", "1"]) in (0, 1)
    assert main(["quantize", str(model), "--input-shape", "1,5,24,32", "--calib", str(calib), "-o",
                 str(tmp_path / "bad.onnx")]) == 2
    err = _one_line_error(capsys)
    assert "changes static input size(s) of the model (x axis 0: 10 -> 1; x axis 1: 3 -> 5" in err
    assert "and the model does not run at it: an unnamed Conv node fails: Input channels C is not equal" in err
