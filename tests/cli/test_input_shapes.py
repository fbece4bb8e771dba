"""--input-shape on every verb, on an opset-12 model whose input is [N, 3, H, W] (as Paddle's OCR detector exports):
symbolic dimensions fixed first, the opset raised (verified) where Q/DQ needs it, --skip-pass names, and no file
written outside the outputs' folder."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from npukit.cli import main
from npukit.runtime.ort import make_session

HERE = Path(__file__).parent
TINY_MACS = 16 * 16 * 8 * 27 + 16 * 16 * 8 * 9 + 16 * 16 * 16 * 8 + 16 * 10  # TinyNet at 32x32 (test_cli)


@pytest.fixture(scope="module")
def symbolic(tmp_path_factory) -> Path:
    """TinyNet exported by the TorchScript exporter at opset 12 with input 'x' of shape [N, 3, H, W]."""
    import torch

    sys.path.insert(0, str(HERE))
    try:
        from tinynet import tiny
    finally:
        sys.path.remove(str(HERE))
    path = tmp_path_factory.mktemp("symbolic") / "sym.onnx"
    torch.onnx.export(tiny(), (torch.randn(1, 3, 32, 32),), str(path), dynamo=False, opset_version=12,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "N", 2: "H", 3: "W"}})
    return path


@pytest.fixture(scope="module")
def calib(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("calib") / "calib.npy"
    np.save(path, np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32))
    return path


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_inspect_says_macs_are_unknown_until_the_shape_is_given(symbolic, tmp_path, capsys):
    assert main(["inspect", str(symbolic), "--json", str(tmp_path / "a.json")]) == 0
    assert "unknown (" in capsys.readouterr().out
    assert json.loads((tmp_path / "a.json").read_text())["results"]["summary"]["unknown_mac_layers"] > 0
    assert main(["inspect", str(symbolic), "--input-shape", "x=1,3,32,32", "--json", str(tmp_path / "b.json")]) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["results"]["summary"]["macs"] == TINY_MACS
    assert report["results"]["summary"]["unknown_mac_layers"] == 0
    assert report["config"]["input_shape"] == {"x": [1, 3, 32, 32]}


def test_optimize_graph_uses_the_shape_given_for_its_check(symbolic, tmp_path, capsys):
    out = tmp_path / "opt.onnx"
    assert main(["optimize-graph", str(symbolic), "-o", str(out)]) == 2
    err = _one_line_error(capsys)
    assert "input 'x' is Nx3xHxW" in err and "--input-shape x=1,3,H,W" in err and not out.exists()
    assert main(["optimize-graph", str(symbolic), "-o", str(out), "--input-shape", "1,3,32,32",
                 "--skip-pass", "FoldBatchNormPass"]) == 0
    model = onnx.load(str(out))
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 32, 32]
    report = json.loads(out.with_name("opt.report.json").read_text())
    assert "FoldBatchNormPass" not in [r["name"] for r in report["results"]["passes"]]
    assert report["config"]["optimize"]["skip_passes"] == ["fold_batch_norm"]
    assert report["results"]["after"]["macs"] == TINY_MACS
    assert main(["optimize-graph", str(symbolic), "-o", str(out), "--input-shape", "1,3,32,32",
                 "--skip-pass", "fold_bn"]) == 2
    assert "FoldBatchNormPass" in _one_line_error(capsys)


def test_quantize_needs_the_shape_then_raises_the_opset_verified(symbolic, calib, tmp_path, capsys):
    out = tmp_path / "q.onnx"
    flat = tmp_path / "flat.npy"  # no sample layout of x [N, 3, H, W] fits (N, 3, 32): no shape to take from it
    np.save(flat, np.zeros((4, 3, 32), np.float32))
    args = ["quantize", str(symbolic), "--calib", str(flat), "-o", str(out), "--method", "minmax", "--runs", "2"]
    assert main(args) == 2  # the data's own misfit is said (it read "pass --input-shape", which then refused it)
    assert "flat.npy does not fit input 'x'" in _one_line_error(capsys) and not out.exists()
    args[3] = str(calib)
    assert main(args + ["--input-shape", "x=1,3,32,32"]) == 0
    report = json.loads(out.with_name("q.report.json").read_text())
    upgrade = report["results"]["opset_upgrade"]
    assert (upgrade["from_opset"], upgrade["to_opset"]) == (12, 13) and upgrade["inputs"] == "calibration samples"
    assert upgrade["max_rel_error"] <= 1e-5
    quantized = onnx.load(str(out))
    assert next(o.version for o in quantized.opset_import if o.domain in ("", "ai.onnx")) >= 13
    assert any(a.name == "axis" for n in quantized.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute)
    make_session(quantized)  # ORT loads the per-channel Q/DQ model
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((4, 3, 16, 16), np.float32))
    assert main(["quantize", str(symbolic), "--calib", str(wrong), "-o", str(tmp_path / "w.onnx"),
                 "--input-shape", "1,3,32,32"]) == 2
    assert "(1, 3, 32, 32)" in _one_line_error(capsys)  # the calibration data is checked against the fixed shape


def test_a_failed_opset_conversion_is_exit_2_and_names_the_way_out(symbolic, calib, tmp_path, capsys, monkeypatch):
    def fail(model, version):
        raise RuntimeError("No Adapter For Resize")

    monkeypatch.setattr(onnx.version_converter, "convert_version", fail)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(symbolic), "--calib", str(calib), "-o", str(out), "--input-shape", "1,3,32,32"]) == 2
    err = _one_line_error(capsys)
    assert "onnx.version_converter" in err and "--per-tensor" in err and "No Adapter For Resize" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_bench_and_plan_memory_take_the_shape(symbolic, tmp_path, capsys):
    assert main(["bench", str(symbolic), "--runs", "2", "--warmup", "1"]) == 2
    assert "--input-shape x=1,3,H,W" in _one_line_error(capsys)
    report = tmp_path / "bench.json"
    assert main(["bench", str(symbolic), "--runs", "2", "--warmup", "1", "--input-shape", "x=1,3,48,32",
                 "--report", str(report)]) == 0
    assert json.loads(report.read_text())["config"]["input_shape"] == {"x": [1, 3, 48, 32]}
    assert main(["plan-memory", str(symbolic), "--report", str(report)]) == 2
    assert "plan-memory needs static input shapes" in _one_line_error(capsys)
    assert main(["plan-memory", str(symbolic), "--input-shape", "x=1,3,32,32", "--report", str(report)]) == 0
    small = json.loads(report.read_text())["results"]["memory"]["lower_bound_bytes"]
    assert main(["plan-memory", str(symbolic), "--input-shape", "x=1,3,64,64", "--report", str(report)]) == 0
    assert json.loads(report.read_text())["results"]["memory"]["lower_bound_bytes"] > 3 * small


def test_verbs_write_nothing_outside_the_output_folder(symbolic, calib, tmp_path, monkeypatch):
    """Every verb run with an empty working directory and an empty temporary directory: both are empty afterwards
    (ORT's symbolic shape inference, external data, ORT's optimized-model and profile files, QNN's context files
    all go into temporary directories that are removed)."""
    work, scratch, out = tmp_path / "cwd", tmp_path / "tmp", tmp_path / "out"
    for folder in (work, scratch, out):
        folder.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    shape = ["--input-shape", "x=1,3,32,32"]
    runs = [
        ["export", str(symbolic), "-o", str(out / "exported.onnx"), *shape],
        ["inspect", str(symbolic), *shape],
        ["optimize-graph", str(symbolic), "-o", str(out / "opt.onnx"), *shape],
        ["quantize", str(symbolic), "--calib", str(calib), "-o", str(out / "q.onnx"), "--method", "minmax",
         "--runs", "2", *shape],
        ["analyze", str(symbolic), "--target", "qnn-htp", "--fix", "-o", str(out / "fixed.onnx"), *shape],
        ["analyze", str(symbolic), "--target", "qnn-htp", "--target", "cpu", "--report", str(out / "a.json"),
         *shape],
        ["plan-memory", str(symbolic), "--report", str(out / "plan.json"), *shape],
        ["bench", str(symbolic), "--runs", "2", "--warmup", "1", "--memory", "--report", str(out / "b.json"),
         *shape],
    ]
    try:
        import onnxruntime_qnn  # noqa: F401
    except ImportError:
        pass
    else:
        runs.append(["compile", str(symbolic), "--soc", "SM8650", "--calib", str(calib), "-o",
                     str(out / "ctx.onnx"), *shape])
    for argv in runs:
        assert main(argv) == 0, argv
        assert sorted(p.name for p in work.iterdir()) == [], argv[0]
        assert sorted(p.name for p in scratch.iterdir()) == [], argv[0]
    assert (out / "q.onnx").is_file() and not [p for p in out.iterdir() if p.suffix == ".tmp"]


def test_export_takes_the_named_form(symbolic, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    out = tmp_path / "e.onnx"
    assert main(["export", str(symbolic), "-o", str(out), "--input-shape", "x=1,3,40,32"]) == 0
    assert [d.dim_value for d in onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim] == [1, 3, 40, 32]
    assert main(["export", str(symbolic), "-o", str(tmp_path / "f.onnx"), "--input-shape", "y=1,3,32,32"]) == 2
    assert "no input named 'y'" in _one_line_error(capsys)
    # a torch model's one input takes the name given; two inputs are refused
    assert main(["export", "tinynet:tiny", "-o", str(tmp_path / "g.onnx"), "--input-shape", "foo=1,3,32,32"]) == 0
    assert [i.name for i in onnx.load(str(tmp_path / "g.onnx")).graph.input] == ["foo"]
    assert main(["export", "tinynet:tiny", "-o", str(tmp_path / "h.onnx"), "--input-shape", "a=1,3,32,32",
                 "--input-shape", "b=1,3,32,32"]) == 2
    assert "one tensor input" in _one_line_error(capsys)
    assert not (tmp_path / "f.onnx").exists() and not (tmp_path / "h.onnx").exists()


def test_without_input_shape_the_sizes_come_from_one_sample_of_the_data(symbolic, calib, tmp_path, capsys):
    """PP-OCRv4's detector ([N, 3, H, W]) quantized with calib.npy (8, 3, 640, 640) stopped: "pass --input-shape
    x=1,3,D2,D3". The data's sample is the shape: taken, said in the report, and the artifact fixed at it."""
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(symbolic), "--calib", str(calib), "-o", str(out), "--method", "minmax",
                 "--runs", "2"]) == 0
    report = json.loads(out.with_name("q.report.json").read_text())
    assert report["config"]["input_shape"] == {"x": [1, 3, 32, 32]}
    assert report["results"]["input_shape_from_data"].startswith(
        "no --input-shape given: input shape x=1,3,32,32 taken from one sample of calib.npy")
    assert [d.dim_value for d in onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim] == [1, 3, 32, 32]
    capsys.readouterr()


def test_shapes_from_data_reads_each_layout_and_leaves_what_does_not_fit():
    from npukit.verbs.common import shapes_from_data

    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["a", "s"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, ["N", 4, "T"]),
         onnx.helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [1, 4, "T"])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "d.npz"
        np.savez(npz, a=np.zeros((5, 4, 7), np.float32), s=np.zeros((5, 1, 4, 7), np.float32),
                 labels=np.zeros(5, np.int64))
        for data in (str(npz), {"a": np.zeros((5, 4, 7)), "s": np.zeros((5, 1, 4, 7))},
                     [{"a": np.zeros((1, 4, 7)), "s": np.zeros((1, 4, 7))}] * 3):
            with pytest.warns(UserWarning, match="a=1,4,7 s=1,4,7"):
                fixed, spec = shapes_from_data(model, data)
            assert spec.as_dict() == {"a": [1, 4, 7], "s": [1, 4, 7]}
            assert [d.dim_value for d in fixed.graph.input[1].type.tensor_type.shape.dim] == [1, 4, 7]
    for data in (None, np.zeros((5, 4)), {"a": np.zeros((5, 3, 7))}, "images/"):  # nothing fits: left as it is
        assert shapes_from_data(model, data) == (model, None)
