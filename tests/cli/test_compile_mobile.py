"""npukit compile --target executorch-xnnpack / litert: a PyTorch model to an ExecuTorch .pte or a LiteRT .tflite
(fp32, or INT8 from npukit's plan), run on the runtime itself and checked; bad input refused in one line with
nothing written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from npukit.cli import main

pytest.importorskip("executorch", reason="the executorch extra is not installed (scripts/setup.sh installs it)")

HERE = Path(__file__).parent
SHAPE = ["--input-shape", "1,3,32,32"]
# target -> artifact suffix, the name its latency row has
TARGETS = {"executorch-xnnpack": (".pte", "ExecuTorch .pte"), "litert": (".tflite", "LiteRT .tflite")}


@pytest.fixture(params=list(TARGETS))
def target(request):
    if request.param == "litert":
        pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    return request.param


@pytest.fixture(autouse=True)
def _factory_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_fp32_artifact_matches_eager_torch(target, tmp_path):
    suffix, artifact = TARGETS[target]
    out = tmp_path / f"tiny{suffix}"
    assert main(["compile", "tinynet:tiny", "--target", target, "-o", str(out), *SHAPE]) == 0
    report = json.loads(out.with_name("tiny.report.json").read_text())
    assert report["passed"]
    assert report["results"]["fp32_error"]["max_abs_over_range"] <= 1e-4
    assert set(report["results"]["latency"]) == {artifact, "eager torch fp32", "ORT CPU fp32"}
    if target == "executorch-xnnpack":
        assert report["results"]["lowered"]["portable_ops"] == {}  # XNNPACK took every op
    else:
        assert report["results"]["lowered"]["left"] == {} and not report["results"]["lowered"]["int8_io"]


def test_int8_artifact_from_npukits_plan(target, tmp_path):
    suffix, _ = TARGETS[target]
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).normal(size=(12, 3, 32, 32)).astype(np.float32))
    out = tmp_path / f"tiny_int8{suffix}"
    assert main(["compile", "tinynet:tiny", "--target", target, "--calib", str(calib), "-o", str(out), *SHAPE]) == 0
    results = json.loads(out.with_name("tiny_int8.report.json").read_text())["results"]
    assert results["carried_plan"]["unmatched"] == [] and results["carried_plan"]["weights"] == 4
    # the plan's grids carried whole (a requantization LiteRT drops would cost 40 dB here, see test_emit_pt2e)
    assert min(o["sqnr_db"] for o in results["task_check"]["result"]["outputs"]) > 30
    if target == "executorch-xnnpack":
        assert results["lowered"]["portable_ops"] == {}
    else:  # int8 input and output tensors, quantized and dequantized for the caller by the runner
        assert results["lowered"]["int8_io"]
        assert results["lowered"]["delegated_ops"] >= 6
    assert out.stat().st_size < 20_000  # int8 weights (the fp32 file of this net is larger)


def _bad(tmp_path: Path, onnx_model: Path, target: str) -> dict[str, list[str]]:
    out = str(tmp_path / f"out{TARGETS[target][0]}")
    return {
        "onnx model": ["compile", str(onnx_model), "--target", target, "-o", out],
        "wrong suffix": ["compile", "tinynet:tiny", "--target", target, "-o", str(tmp_path / "out.onnx"), *SHAPE],
        "soc given": ["compile", "tinynet:tiny", "--target", target, "--soc", "SM8650", "-o", out, *SHAPE],
        "htp without soc": ["compile", str(onnx_model), "-o", str(tmp_path / "out.onnx")],
    }


@pytest.mark.parametrize("case", ["onnx model", "wrong suffix", "soc given", "htp without soc"])
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
    assert _files(tmp_path) == before


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
