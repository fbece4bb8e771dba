"""npukit compile --target executorch-xnnpack / litert / coreml: a PyTorch model to an ExecuTorch .pte, a LiteRT
.tflite or a Core ML .mlpackage (fp32, or INT8 from npukit's plan), run on the runtime itself and checked (Core ML off
macOS: read back and its grids checked, not run); bad input refused in one line with nothing written."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from npukit.cli import main
from npukit.errors import InputError

pytest.importorskip("executorch", reason="the executorch extra is not installed (scripts/setup.sh installs it)")

SHAPE = ["--input-shape", "1,3,32,32"]
# target -> artifact suffix, the name its latency row has
TARGETS = {"executorch-xnnpack": (".pte", "ExecuTorch .pte"), "litert": (".tflite", "LiteRT .tflite")}


@pytest.fixture(params=list(TARGETS))
def target(request):
    if request.param == "litert":
        pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    return request.param


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _normal(samples: int, height: int, width: int) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(samples, 3, height, width)).astype(np.float32)


def _compile_int8(tmp_path: Path, model: str, target: str, calib: np.ndarray, name: str, *args: str) -> dict:
    """``model`` compiled to INT8 for ``target`` on ``calib`` (saved as a .npy) into ``name`` + the target's suffix,
    exit 0; its report."""
    np.save(tmp_path / "calib.npy", calib)
    out = tmp_path / f"{name}{TARGETS[target][0]}"
    assert main(["compile", model, "--target", target, "--calib", str(tmp_path / "calib.npy"), "-o", str(out),
                 *args]) == 0
    return json.loads(out.with_name(out.name + ".report.json").read_text())


def test_a_torchvision_model_without_weights_is_known_untrained():
    from npukit.frontend.spec import resolve_model

    assert resolve_model("torchvision:squeezenet1_1").random_weights
    assert not resolve_model("tinynet:tiny").random_weights  # a factory's weights are its own business


def test_a_phone_artifact_does_not_replace_the_report_of_its_onnx_namesake(tmp_path):
    """export -o tiny.onnx, then compile -o tiny.pte: two reports (tiny.report.json, tiny.pte.report.json)."""
    assert main(["export", "tinynet:tiny", "-o", str(tmp_path / "tiny.onnx"), *SHAPE]) == 0
    assert main(["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "-o", str(tmp_path / "tiny.pte"),
                 *SHAPE]) == 0
    assert json.loads((tmp_path / "tiny.report.json").read_text())["command"] == "export"
    assert json.loads((tmp_path / "tiny.pte.report.json").read_text())["command"] == "compile"


def test_an_untrained_model_says_so_in_the_verdict(tmp_path, monkeypatch):
    """A check against an untrained architecture passes trivially: the verdict's first line says what it held."""
    import dataclasses

    import npukit.frontend.spec as spec

    resolve = spec.resolve_model
    monkeypatch.setattr(spec, "resolve_model", lambda *a, **k: dataclasses.replace(resolve(*a, **k),
                                                                                    random_weights=True))
    out = tmp_path / "tiny.pte"
    assert main(["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "-o", str(out), *SHAPE]) == 0
    verdict = json.loads(out.with_name(out.name + ".report.json").read_text())["verdict"]
    assert verdict.startswith("PASS") and "untrained architecture (random weights)" in verdict
    assert main(["export", "tinynet:tiny", "-o", str(tmp_path / "tiny.onnx"), *SHAPE]) == 0  # export says so too
    verdict = json.loads((tmp_path / "tiny.report.json").read_text())["verdict"]
    assert verdict.startswith("PASS") and "untrained architecture (random weights)" in verdict


def test_fp32_artifact_matches_eager_torch(target, tmp_path):
    suffix, artifact = TARGETS[target]
    out = tmp_path / f"tiny{suffix}"
    assert main(["compile", "tinynet:tiny", "--target", target, "-o", str(out), *SHAPE]) == 0
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    assert report["passed"]
    assert report["results"]["fp32_error"]["max_abs_over_range"] <= 1e-4
    # seeded random inputs: every output judged, not a task metric they cannot give (a detector's mAP: undefined)
    assert report["results"]["task_check"]["choice"]["task"] == "generic"
    assert not report["results"]["task_check"]["choice"]["given"]  # compile chose it, the report said "given"
    assert "seeded random inputs" in report["results"]["task_check"]["choice"]["reason"]
    assert "path" not in report["results"]["export"]  # the side export's scratch file, gone when compile ends
    assert "weak check" not in report["verdict"]  # fp32 compile has no flag to give it more data
    assert set(report["results"]["latency"]) == {artifact, "eager torch fp32", "ORT CPU fp32"}
    if target == "executorch-xnnpack":
        assert report["results"]["lowered"]["portable_ops"] == {}  # XNNPACK took every op
    else:
        assert report["results"]["lowered"]["left"] == {} and not report["results"]["lowered"]["int8_io"]


def test_a_converter_that_fails_on_a_valid_model_is_exit_1_not_bad_input(target, tmp_path, capsys, monkeypatch):
    """PicoDet's INT8 LiteRT conversion failed after 5.5 min on a concatenation's same-scale rule (npukit's grids),
    and an ExecuTorch lowering on an environment fault: both said "failed on this model" with exit 2, bad input.
    A library npukit drives failing on a valid model is exit 1 (ToolError), one line, nothing left."""
    if target == "litert":
        import litert_torch

        def fails(*args, **kwargs):
            raise RuntimeError("'tfl.concatenation' op quantization parameters violate the same scale constraint")

        monkeypatch.setattr(litert_torch, "convert", fails)
    else:
        import npukit.runtime.executorch as et

        def fails(exported):
            raise RuntimeError("MultiplexedPath only supports directories")

        monkeypatch.setattr(et, "_to_edge", fails)
    out = tmp_path / f"tiny{TARGETS[target][0]}"
    assert main(["compile", "tinynet:tiny", "--target", target, "-o", str(out), *SHAPE]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "failed on this model" in err and "\n" not in err
    assert _files(tmp_path) == []


@pytest.mark.parametrize("off", ["artifact", "eager torch"])
def test_an_fp32_artifact_off_eager_torch_fails_and_says_whether_onnx_runtime_is_too(off, tmp_path, monkeypatch):
    """The .pte 5% off eager torch on the seeded inputs fails, blaming the runtime; where ORT is as far off eager torch
    on them (a deep U-Net on random inputs, its float outputs decided by float32's rounding: ORT 0.97 of the range
    off eager torch on one), it fails too, but says the inputs make the model unstable and asks for --data."""
    from npukit.runtime import executorch
    from npukit.verbs import compile_mobile

    if off == "artifact":
        plain = executorch.Runner

        class Off(plain):  # type: ignore[misc, valid-type]
            def __call__(self, feeds):
                return [o * 1.05 for o in super().__call__(feeds)]
        monkeypatch.setattr(executorch, "Runner", Off)
    else:
        torch_runner = compile_mobile._torch_runner
        monkeypatch.setattr(compile_mobile, "_torch_runner",
                            lambda module: (lambda feeds: [o * 1.05 for o in torch_runner(module)(feeds)]))
    out = tmp_path / "tiny.pte"
    assert main(["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "-o", str(out), *SHAPE]) == 1
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    fp32 = report["results"]["fp32_error"]
    assert fp32["max_abs_over_range"] > 1e-2 and "differs from eager torch by" in report["verdict"]
    if off == "artifact":
        assert fp32["ort_max_abs_over_range"] <= 1e-4 and "the other mobile target" in report["verdict"]
    else:
        assert fp32["ort_max_abs_over_range"] > 1e-2 and "this check cannot judge the runtime" in report["verdict"]
        # real inputs, not INT8 (a U-Net's fp32 .tflite was sent to --calib): --data checks the fp32 artifact on them
        assert report["verdict"].endswith("try check it on real inputs with --data (the model's outputs on seeded "
                                          "random inputs are unstable: ONNX Runtime's differ as much)")


def test_an_onnx_export_that_drifts_from_torch_is_noted_not_refused(tmp_path, capsys):
    """The side export (ORT's baseline, the plan's model) drifting 1% from torch: npukit export refuses that .onnx
    (exit 1); compile builds from the torch program, checks the artifact against eager torch and says the drift;
    analyze reads the graph and says it too."""
    assert main(["export", "tinynet:drift", "-o", str(tmp_path / "drift.onnx"), *SHAPE]) == 1
    out = tmp_path / "drift.pte"
    assert main(["compile", "tinynet:drift", "--target", "executorch-xnnpack", "-o", str(out), *SHAPE]) == 0
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    assert report["passed"] and report["results"]["fp32_error"]["max_abs_over_range"] <= 1e-4
    assert "differs from eager torch by up to 0.01 of the output range" in report["verdict"]
    assert "only ORT's fp32 latency row runs it" in report["verdict"]
    assert main(["analyze", "tinynet:drift", "--target", "executorch-xnnpack", *SHAPE,
                 "--report", str(tmp_path / "analyze.json")]) == 0
    verdict = json.loads((tmp_path / "analyze.json").read_text())["verdict"]
    assert verdict.startswith("INFO analyze") and "the profiles read its graph" in verdict
    assert sorted(p.name for p in tmp_path.iterdir()) == ["analyze.json", "drift.pte", "drift.pte.report.json"]


def test_int8_artifact_from_npukits_plan(target, tmp_path):
    report = _compile_int8(tmp_path, "tinynet:tiny", target, _normal(12, 32, 32), "tiny_int8", *SHAPE)
    results = report["results"]
    assert "(checked on the calibration samples: optimistic, the grids were fitted to them" in report["verdict"]
    assert results["carried_plan"]["unmatched"] == [] and results["carried_plan"]["weights"] == 4
    # the plan's grids carried whole (a requantization LiteRT drops would cost 40 dB here, see test_emit_pt2e)
    assert min(o["sqnr_db"] for o in results["task_check"]["result"]["outputs"]) > 30
    # timed beside the fp32 artifact of the same model on the same runtime (lowered into a scratch folder: the
    # output folder holds the calibration data, the artifact and its report only)
    artifact = TARGETS[target][1]
    assert list(results["latency"]) == [artifact, f"{artifact} fp32", "eager torch fp32", "ORT CPU fp32"]
    assert "fp32_twin" not in results and "lower_fp32" in report["timings_s"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["calib.npy", f"tiny_int8{TARGETS[target][0]}",
                                                                 f"tiny_int8{TARGETS[target][0]}.report.json"])
    if target == "executorch-xnnpack":
        assert results["lowered"]["portable_ops"] == {}
    else:  # int8 input and output tensors, quantized and dequantized for the caller by the runner
        assert results["lowered"]["int8_io"]
        assert results["lowered"]["delegated_ops"] >= 6
        # its Hardswish in int8 ops XNNPACK takes (an int8 HARD_SWISH ran in LiteRT's kernel, the delegate split in 2)
        assert results["lowered"]["left"] == {} and results["lowered"]["partitions"] == 1
    assert (tmp_path / f"tiny_int8{TARGETS[target][0]}").stat().st_size < 20_000  # int8 weights (fp32's: larger)


@pytest.mark.parametrize("form", ["pt2", "torchscript"])
def test_int8_from_a_saved_program_carries_every_weight(form, target, tmp_path):
    """A torch.export .pt2 (whose module refuses .eval()) and a traced TorchScript file (which torch.export refuses:
    converted, its generic convolutions written as conv2d) compile like the factory: every weight carried; the
    calibration array in Fortran order (the runtimes take C-ordered tensors)."""
    import torch

    from tinynet import tiny

    module, example = tiny(), torch.randn(1, 3, 32, 32)
    model = tmp_path / ("tiny.pt2" if form == "pt2" else "tiny.pt")
    if form == "pt2":
        torch.export.save(torch.export.export(module, (example,)), str(model))
    else:
        torch.jit.trace(module, example).save(str(model))
    calib = tmp_path / "calib.npy"
    np.save(calib, np.asfortranarray(np.random.default_rng(0).normal(size=(12, 3, 32, 32)).astype(np.float32)))
    out = tmp_path / f"tiny_int8{TARGETS[target][0]}"
    assert main(["compile", str(model), "--target", target, "--calib", str(calib), "-o", str(out)]) == 0
    results = json.loads(out.with_name(out.name + ".report.json").read_text())["results"]
    assert results["carried_plan"]["unmatched"] == [] and results["carried_plan"]["weights"] == 4
    assert min(o["sqnr_db"] for o in results["task_check"]["result"]["outputs"]) > 30


def test_int8_segmenter_with_a_concatenated_skip(target, tmp_path):
    """A concatenation whose inputs come on different grids (a nearest upsampling of a signed conv output, a ReLU
    block that also feeds the next conv): ExecuTorch's own sharing put both on the ReLU's grid (negative values
    clipped: 1.5 dB, mIoU 0.22) and LiteRT's converter refused the requantized edge (exit 2); both now hold the task
    check near the ONNX plan's 33 dB."""
    calib = np.random.default_rng(0).uniform(size=(16, 3, 64, 64)).astype(np.float32)
    results = _compile_int8(tmp_path, "tinynet:tinyseg", target, calib, "seg", "--input-shape", "1,3,64,64",
                            "--task", "segment")["results"]
    assert results["task_check"]["result"]["metrics"]["miou"] > 0.9
    assert min(o["sqnr_db"] for o in results["task_check"]["result"]["outputs"]) > 25


def test_int8_dense_block_whose_features_feed_every_later_concatenation(target, tmp_path):
    """DenseNet's pattern (LiteRT's converter refused it: a feature widened for one concatenation was set again by
    the next): one grid per block, checked."""
    results = _compile_int8(tmp_path, "tinynet:tinydense", target, _normal(16, 32, 32), "dense", *SHAPE)["results"]
    assert min(o["sqnr_db"] for o in results["task_check"]["result"]["outputs"]) > 25


def test_int8_learnable_affine_blocks_keep_their_ops_and_grids(target, tmp_path):
    """A conv followed by a constant scale and shift (PP-LCNetV3's learnable affine block): quantize folds it into the
    conv for ORT, but the torch program keeps both ops, so the plan carried onto it is made unfolded and every
    tensor of the program finds its grid (folded, the conv's own output had none and the program was refused)."""
    results = _compile_int8(tmp_path, "tinynet:tinyaffine", target, _normal(16, 32, 32), "affine", *SHAPE)["results"]
    assert results["carried_plan"]["unmatched"] == []
    assert "folded_affines" not in results["steps"]
    assert min(o["sqnr_db"] for o in results["task_check"]["result"]["outputs"]) > 25


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS Core ML runs the package: the runner path is checked")
@pytest.mark.parametrize("int8", [False, True])
def test_coreml_package_is_read_back_and_said_not_run(int8, tmp_path, monkeypatch):
    pytest.importorskip("coremltools", reason="the coreml extra is not installed (scripts/setup.sh installs it)")
    from npukit.runtime import coreml

    args = []
    if int8:
        calib = tmp_path / "calib.npy"
        np.save(calib, np.random.default_rng(0).normal(size=(12, 3, 32, 32)).astype(np.float32))
        args = ["--calib", str(calib)]
    out = tmp_path / "tiny.mlpackage"
    assert main(["compile", "tinynet:tiny", "--target", "coreml", "-o", str(out), *args, *SHAPE]) == 0
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    assert report["verdict"].startswith("EXPORTED compile: Core ML .mlpackage") and "not run" in report["verdict"]
    check = report["results"]["package_check"]
    assert out.is_dir() and (out / "Manifest.json").is_file()
    # the model's own input and output names (the ONNX export's), not coremltools' op names
    assert check["interface"] == {"inputs": {"input": [1, 3, 32, 32]}, "outputs": {"output": [1, 10]}}
    ops = report["results"]["lowered"]["ops"]
    assert ops.get("conv") == 3 and report["results"]["lowered"]["compute_precision"] == "float32"
    if int8:  # every weight's integers and scales, and every activation grid, are the plan's
        assert "its INT8 plan checked on ORT's CPU instead" in report["verdict"]
        assert check["weights"] == 4 and check["weights_not_the_plans"] == 0
        assert check["activation_grids"] >= 5 and check["activation_grids_not_the_plans"] == 0
        assert ops["constexpr_affine_dequantize"] == 4
        # the check can fail: a package whose grids are not the plan's is refused (exit 1, the verdict says why)
        real = coreml.package_grids
        monkeypatch.setattr(coreml, "package_grids",
                            lambda lowered: ({(0.5, 3)} | real(lowered)[0], real(lowered)[1][1:]))
        assert main(["compile", "tinynet:tiny", "--target", "coreml", "-o", str(out), *args, *SHAPE]) == 1
        verdict = json.loads(out.with_name(out.name + ".report.json").read_text())["verdict"]
        assert verdict.startswith("FAIL compile: Core ML .mlpackage: it holds 3 int8 weights where 4 were carried")
        monkeypatch.setattr(coreml, "package_grids", real)
        # a plan below the floor (60 dB asked) is not exported as passing because Core ML cannot run here
        assert main(["compile", "tinynet:tiny", "--target", "coreml", "-o", str(out), *args, *SHAPE,
                     "--task", "generic", "--min-sqnr", "60"]) == 1
        verdict = json.loads(out.with_name(out.name + ".report.json").read_text())["verdict"]
        assert verdict.startswith("FAIL compile") and "the INT8 plan the Core ML .mlpackage carries, on ORT's CPU" \
            in verdict
    else:
        assert "constexpr_affine_dequantize" not in ops
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging left behind


def _two_inputs(path: Path) -> Path:
    """An ONNX model with two inputs (a torch program is built from a one-input ONNX model)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _integer(path: Path) -> Path:
    """An ONNX model quantized with ORT's integer ops (ddddocr's OCR model's form: ConvInteger, MatMulInteger)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.int8), "w")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("ConvInteger", ["xq", "w", "xz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _bad(tmp_path: Path, onnx_model: Path, target: str) -> dict[str, list[str]]:
    out = str(tmp_path / f"out{TARGETS[target][0]}")
    return {
        "integer-quantized onnx model": ["compile", str(_integer(onnx_model.with_name("int.onnx"))), "--target",
                                         target, "-o", out],
        "onnx model with two inputs": ["compile", str(_two_inputs(onnx_model.with_name("two.onnx"))), "--target",
                                       target, "-o", out],
        "both shapes of a two-input onnx model": ["compile", str(_two_inputs(onnx_model.with_name("two.onnx"))),
                                                  "--target", target, "-o", out, "--input-shape", "a=1,4",
                                                  "--input-shape", "b=1,4"],
        "wrong suffix": ["compile", "tinynet:tiny", "--target", target, "-o", str(tmp_path / "out.onnx"), *SHAPE],
        "soc given": ["compile", "tinynet:tiny", "--target", target, "--soc", "SM8650", "-o", out, *SHAPE],
        "htp without soc": ["compile", str(onnx_model), "-o", str(tmp_path / "out.onnx")],
    }


@pytest.mark.parametrize("case", ["onnx model with two inputs", "both shapes of a two-input onnx model",
                                  "wrong suffix", "soc given", "htp without soc", "integer-quantized onnx model"])
def test_bad_input_one_line_exit_2_no_file(case, target, tmp_path_factory, tmp_path, capsys):
    models = tmp_path_factory.mktemp("models")
    onnx_model = models / "tiny.onnx"
    if not onnx_model.exists():
        assert main(["export", "tinynet:tiny", "-o", str(onnx_model), *SHAPE]) == 0
        capsys.readouterr()
    before = _files(tmp_path)
    assert main(_bad(tmp_path, onnx_model, target)[case]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    if "two-input" in case or "two inputs" in case:
        assert "two.onnx has 2 inputs (a, b)" in err, err
    if case == "integer-quantized onnx model":  # it sent ddddocr's OCR model to the HTP, which refuses it too
        assert "it is quantized already (ConvInteger, DynamicQuantizeLinear)" in err and "qnn-htp" not in err, err
    assert _files(tmp_path) == before


def test_an_onnx_model_compiles_as_a_torch_program_checked_against_onnx_runtime(target, tmp_path):
    """An ONNX model (one input) runs as a torch program built from its graph, checked against ORT first; the
    artifact is checked against that program as against eager torch, and the report says how the model was loaded.
    INT8: npukit's plan carried onto the program as onto any torch module."""
    model = tmp_path / "tiny.onnx"
    assert main(["export", "tinynet:tiny", "-o", str(model), *SHAPE]) == 0
    out = tmp_path / f"tiny{TARGETS[target][0]}"
    assert main(["compile", str(model), "--target", target, "-o", str(out)]) == 0
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    assert report["verdict"].startswith("PASS compile")
    (note,) = report["results"]["model_source"]["notes"]
    assert "tiny.onnx runs as a torch program" in note and "against ONNX Runtime" in note
    int8 = _compile_int8(tmp_path, str(model), target, _normal(16, 32, 32), "tiny_int8")
    assert int8["verdict"].startswith("PASS compile") and int8["config"]["precision"] == "int8"
    assert int8["results"]["carried_plan"]


@pytest.mark.parametrize("target, missing, extra", [("executorch-xnnpack", "executorch", "npukit[executorch]"),
                                                    ("litert", "litert_torch", "npukit[litert]"),
                                                    ("litert", "ai_edge_litert", "npukit[litert]")])
def test_missing_extra_says_how_to_install(target, missing, extra, tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a))
    assert main(["compile", "tinynet:tiny", "--target", target, "-o", str(tmp_path / f"m{TARGETS[target][0]}"),
                 *SHAPE]) == 2
    err = capsys.readouterr().err
    assert extra in err and _files(tmp_path) == []


def test_coreml_bad_output_and_missing_extra_one_line_exit_2(tmp_path, capsys, monkeypatch):
    occupied = tmp_path / "taken.mlpackage"
    occupied.write_bytes(b"a file, not a package")
    for out in (occupied, tmp_path / "m.pte"):
        assert main(["compile", "tinynet:tiny", "--target", "coreml", "-o", str(out), *SHAPE]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and ".mlpackage" in err, err
    assert occupied.read_bytes() == b"a file, not a package" and _files(tmp_path) == [occupied]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "coremltools" else real(name, *a))
    assert main(["compile", "tinynet:tiny", "--target", "coreml", "-o", str(tmp_path / "m.mlpackage"), *SHAPE]) == 2
    assert "npukit[coreml]" in capsys.readouterr().err and _files(tmp_path) == [occupied]


def test_a_module_without_a_known_shape_takes_its_data_s_shape(tmp_path, capsys):
    """MTCNN's ONet (module:factory, 48x48 crops) was told to pass --input-shape 1,3,224,224; then told to pass the
    shape of one sample of its .npy, which it now takes by itself (the report says so). Channels-last images are
    still refused: they need a transpose, not their shape."""
    calib = tmp_path / "crops.npy"
    np.save(calib, np.random.default_rng(0).normal(size=(8, 3, 48, 48)).astype(np.float32))
    out = tmp_path / "tiny.pte"
    assert main(["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "--calib", str(calib), "-o",
                 str(out)]) in (0, 1)
    config = json.loads(Path(f"{out}.report.json").read_text())["config"]
    assert config["input_shape"] == [1, 3, 48, 48] and config["input_shape_from"] == "one sample of crops.npy"
    assert "one sample of crops.npy" in capsys.readouterr().out
    out.unlink()
    np.save(calib, np.zeros((4, 48, 48, 3), np.float32))  # channels last: transposed, not passed as 1,48,48,3
    assert main(["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "--calib", str(calib), "-o",
                 str(out)]) == 2
    err = capsys.readouterr().err
    assert "transpose the data to (N, C, H, W)" in err and "--input-shape 1,3,48,48" in err and not out.exists()


def test_a_module_object_compiles_as_a_spec_does(tmp_path, capsys):
    """npukit.export takes a torch.nn.Module; compile crashed on one (``Path(module)``: a file name too long), and a
    factory spec longer than a file name could be was an internal error."""
    import tinynet

    from npukit.api import compile as compile_model

    out = tmp_path / "tiny.pte"
    result = compile_model(tinynet.tiny(), out, target="executorch-xnnpack", input_shape="1,3,32,32")
    assert result.report.passed and out.is_file() and result.report.config["model"] == "TinyNet"
    assert len(result.result.buffer) == out.stat().st_size  # the typed result: the lowered program (it was None)
    with pytest.raises(InputError, match="the HTP compiles an ONNX model, not a TinyNet"):
        compile_model(tinynet.tiny(), tmp_path / "t.onnx", target="qnn-htp", soc="SM8650")
    long_spec = "tinynet:tiny(" + " " * 300 + ")"
    assert main(["compile", long_spec, "--target", "executorch-xnnpack", "-o", str(tmp_path / "long.pte"),
                 *SHAPE]) == 0


def test_int8_linear_over_a_sequence_carries_its_weights(target, tmp_path):
    """A Linear over a (B, T, C) tensor (CRNN heads): ORT fuses it into Reshape -> Gemm -> Reshape, and the plan was
    refused as not carried (exit 2) for every mobile target; now the Gemm's grid is found through the views."""
    results = _compile_int8(tmp_path, "tinynet:tinyseq", target, _normal(12, 16, 32), "seq",
                            "--input-shape", "1,3,16,32", "--task", "generic")["results"]
    assert results["carried_plan"]["unmatched"] == [] and results["carried_plan"]["weights"] == 3


@pytest.mark.parametrize("int8", [False, True])
def test_prelu_after_a_linear_layer_is_lowered_whole(int8, target, tmp_path):
    """A PReLU on a 2-D tensor (MTCNN's RNet and ONet): ExecuTorch's XNNPACK lowering refused it (exit 2); it is now
    computed on a 4-D view, every op delegated, fp32 within the tolerance and INT8 on the plan's grids."""
    if int8:
        results = _compile_int8(tmp_path, "tinynet:tinyprelu", target, _normal(16, 32, 32), "prelu",
                                *SHAPE)["results"]
        assert results["carried_plan"]["unmatched"] == []
        assert min(o["sqnr_db"] for o in results["task_check"]["result"]["outputs"]) > 20
    else:
        out = tmp_path / f"prelu{TARGETS[target][0]}"
        assert main(["compile", "tinynet:tinyprelu", "--target", target, "-o", str(out), *SHAPE]) == 0
        results = json.loads(out.with_name(out.name + ".report.json").read_text())["results"]
        assert results["fp32_error"]["max_abs_over_range"] <= 1e-4
    if target == "executorch-xnnpack":
        assert results["lowered"]["portable_ops"] == {} and results["lowered"]["delegate_calls"] == 1
        # the model's ops, counted inside the delegate, its grids' quantize and dequantize ops left out
        assert 7 <= results["lowered"]["delegated_ops"] <= 12, results["lowered"]
    else:
        assert results["lowered"]["int8_io"] == int8  # quantized inputs and outputs only where the model is INT8
        # one FULLY_CONNECTED per Linear: the converter stored the dense layer twice (relu(y) - a * relu(-y), the
        # negation folded into a second copy of its weights: MTCNN ONet's fp32 .tflite 1.75x its size)
        assert results["lowered"]["ops"]["FULLY_CONNECTED"] == 2, results["lowered"]["ops"]


def test_a_model_with_more_than_ten_outputs_is_compared_output_for_output(target, tmp_path):
    """LiteRT lists a signature's outputs with their names sorted as text (output_0, output_1, output_10, ...): a
    model with twelve outputs was compared with the wrong outputs of eager torch (an internal error, exit 1)."""
    out = tmp_path / f"heads{TARGETS[target][0]}"
    assert main(["compile", "tinynet:tinyheads", "--target", target, "-o", str(out), *SHAPE, "--task", "generic"]) == 0
    results = json.loads(out.with_name(out.name + ".report.json").read_text())["results"]
    assert results["fp32_error"]["max_abs_over_range"] <= 1e-4


def test_an_int8_concatenation_as_the_output_is_built_on_one_grid(target, tmp_path):
    """A concatenation the plan leaves float (the model's output) over heads of different ranges: LiteRT's converter
    refused it ('tfl.concatenation' op quantization parameters violate the same scale constraint, exit 2). Its inputs
    and output now share the grid covering the heads' (derived, said in the carried plan), on both runtimes."""
    report = _compile_int8(tmp_path, "tinynet:tinycatout", target, _normal(16, 32, 32), "catout", *SHAPE,
                           "--task", "generic")
    assert report["passed"] and report["results"]["carried_plan"]["unmatched"] == []
    assert report["results"]["carried_plan"]["derived_from_range"] == ["cat"]
    assert min(o["sqnr_db"] for o in report["results"]["task_check"]["result"]["outputs"]) > 25


def test_an_integer_output_is_read_as_it_is(target, tmp_path):
    """An argmax's indices: LiteRT's runner read every integer output as an int8 model's quantized one, on a grid
    of scale 0, so the indices all became 0 and the fp32 .tflite FAILed against eager torch (4.0 of the range)."""
    out = tmp_path / f"argmax{TARGETS[target][0]}"
    assert main(["compile", "tinynet:tinyargmax", "--target", target, "-o", str(out), *SHAPE, "--task",
                 "generic"]) == 0
    results = json.loads(out.with_name(out.name + ".report.json").read_text())["results"]
    assert results["fp32_error"]["max_abs_over_range"] <= 1e-4
    if target == "litert":  # each input and output as the interpreter has it, not one flag for all
        dtypes = results["lowered"]["io_dtypes"]
        assert "float32" in dtypes.values() and {"int32", "int64"} & set(dtypes.values()), dtypes


def test_the_litert_table_names_each_tensor_where_input_and_outputs_differ() -> None:
    """MTCNN's RNet as INT8 .tflite: int8 input and box offsets, its softmax probabilities float32; the report said
    'int8 (quantized for the caller)' for all, and a caller following it would dequantize float probabilities."""
    from npukit.runtime.litert import Delegation, Lowered

    lowered = Lowered(buffer=b"x", ops={}, delegation=Delegation(0, 0, {}), int8_io=True,
                      io_dtypes=(("input", "int8"), ("output_0", "int8"), ("output_1", "float32")))
    cell = lowered.table()[2][0][-1]
    assert cell == ("input int8, output_0 int8, output_1 float32 (quantize int8 inputs, dequantize int8 outputs by "
                    "their tensors' scales; npukit's checks do)")
    assert lowered.summary()["io_dtypes"] == {"input": "int8", "output_0": "int8", "output_1": "float32"}


def test_a_model_that_ignores_its_input_fails_its_check(tmp_path):
    """Its outputs the same for every input, the check compares one answer: FAIL (it PASSed at 'SQNR inf'), with a
    hint for an fp32 artifact that does not ask for fp32."""
    out = tmp_path / "dead.pte"
    assert main(["compile", "tinynet:tinydead", "--target", "executorch-xnnpack", "-o", str(out), *SHAPE]) == 1
    verdict = json.loads(out.with_name(out.name + ".report.json").read_text())["verdict"]
    assert "same outputs for all 8 samples" in verdict and "without --calib" not in verdict


def test_the_float_head_is_held_to_the_floor_only_for_outputs_the_check_holds_there() -> None:
    """MTCNN's RNet FAILed for XNNPACK (its box output 18.8 dB < 20 dB; the stem that would fix it is 24% of the MACs,
    past the 10% share): the plan's head now reaches the floor for the outputs the task metric does not cover. A
    classifier's one output, judged by top-1 agreement, gets no floor (its head stays as planned)."""
    from onnx import TensorProto, helper, numpy_helper

    from npukit.tasks import QualityGate
    from npukit.quant.precision.scored_head import FLOOR_MARGIN_DB, FLOOR_SHARE, held_to_floor
    from npukit.verbs.common import held_outputs
    from npukit.verbs.compile_mobile import XNNPACK_INT8

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name) for name, shape in
             (("w", (4, 3, 3, 3)), ("wp", (4, 2)), ("wb", (4, 4)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]), helper.make_node("MatMul", ["f", "wp"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["prob"], axis=1),
             helper.make_node("MatMul", ["f", "wb"], ["box"])]
    out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, k]) for n, k in (("box", 4), ("prob", 2))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])], out,
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    samples = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    assert held_outputs(model, samples, None) == ("box",)  # prob is the classification's
    assert held_outputs(model, samples, "generic") == ("box", "prob")
    head = held_to_floor(XNNPACK_INT8, QualityGate(min_sqnr_db=25.0).min_sqnr_db, ("box",)).precision.float_head
    assert (head.floor_db, head.floor_share, head.floor_outputs) == (25.0 + FLOOR_MARGIN_DB, FLOOR_SHARE, ("box",))
    assert held_to_floor(XNNPACK_INT8, QualityGate().min_sqnr_db, ()) is XNNPACK_INT8


def test_an_artifact_its_runtime_cannot_load_fails_the_compile(tmp_path, monkeypatch, capsys):
    """ExecuTorch refused a U-Net's .pte at load ('Failed to load method forward'; XNNPACK: a max pool whose grids
    differ) and compile ended in an internal error: it fails (exit 1) saying the runtime does not load what npukit
    built, with the runtime's reason, and leaves no artifact."""
    from npukit.runtime import executorch as et

    def refuse(*args, **kwargs):
        raise RuntimeError("Failed to load method forward, error: 0x:1")

    monkeypatch.setattr(et, "Runner", refuse)
    out = tmp_path / "tiny.pte"
    assert main(["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "-o", str(out), *SHAPE]) == 1
    err = capsys.readouterr().err
    assert "the ExecuTorch .pte npukit built does not load in its runtime (Failed to load method forward" in err
    assert "internal error" not in err and "try the other mobile target, or npukit export for ORT" in err
    assert _files(tmp_path) == []


def test_held_out_data_is_what_an_int8_artifact_is_judged_on(tmp_path):
    """compile had no --data: an INT8 artifact passed on the samples its grids were fitted to (MTCNN ONet .pte:
    21.8 dB there, 13.6 dB on 60 held-out crops, under the 20 dB floor). With --data the check reads those."""
    np.save(tmp_path / "held.npy", _normal(20, 32, 32) * 3.0)  # other inputs than the calibration samples'
    report = _compile_int8(tmp_path, "tinynet:tiny", "executorch-xnnpack", _normal(12, 32, 32), "tiny", *SHAPE,
                           "--data", str(tmp_path / "held.npy"))
    assert report["config"]["data"].endswith("held.npy") and "optimistic" not in report["verdict"]
    assert report["results"]["task_check"]["where"] == "20 held-out samples of held.npy"
    # the same file as --calib: said to be optimistic, as without --data
    again = _compile_int8(tmp_path, "tinynet:tiny", "executorch-xnnpack", _normal(12, 32, 32), "again", *SHAPE,
                          "--data", str(tmp_path / "calib.npy"))
    assert "(--data is --calib)" in again["results"]["task_check"]["where"] and "optimistic" in again["verdict"]
