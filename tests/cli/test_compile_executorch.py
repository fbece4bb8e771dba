"""npukit compile --target executorch-xnnpack: a PyTorch model to an ExecuTorch .pte (fp32, or INT8 from npukit's
plan), run on ExecuTorch's runtime and checked; bad input refused in one line with nothing written."""

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


@pytest.fixture(autouse=True)
def _factory_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_fp32_pte_matches_eager_torch(tmp_path):
    out = tmp_path / "tiny.pte"
    assert main(["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "-o", str(out), *SHAPE]) == 0
    report = json.loads(out.with_name("tiny.report.json").read_text())
    assert report["passed"]
    assert report["results"]["fp32_error"]["max_abs_over_range"] <= 1e-4
    assert report["results"]["lowered"]["portable_ops"] == {}  # XNNPACK took every op
    assert set(report["results"]["latency"]) == {"ExecuTorch .pte", "eager torch fp32", "ORT CPU fp32"}


def test_int8_pte_from_npukits_plan(tmp_path):
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).normal(size=(12, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "tiny_int8.pte"
    assert main(["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "--calib", str(calib), "-o", str(out),
                 *SHAPE]) == 0
    results = json.loads(out.with_name("tiny_int8.report.json").read_text())["results"]
    assert results["carried_plan"]["unmatched"] == [] and results["carried_plan"]["weights"] == 4
    assert results["lowered"]["portable_ops"] == {}
    assert out.stat().st_size < 20_000  # int8 weights (the fp32 file of this net is larger)


def _bad(tmp_path: Path, onnx_model: Path) -> dict[str, list[str]]:
    out = str(tmp_path / "out.pte")
    return {
        "onnx model": ["compile", str(onnx_model), "--target", "executorch-xnnpack", "-o", out],
        "wrong suffix": ["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "-o",
                         str(tmp_path / "out.onnx"), *SHAPE],
        "soc given": ["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "--soc", "SM8650", "-o", out,
                      *SHAPE],
        "htp without soc": ["compile", str(onnx_model), "-o", str(tmp_path / "out.onnx")],
    }


@pytest.mark.parametrize("case", ["onnx model", "wrong suffix", "soc given", "htp without soc"])
def test_bad_input_one_line_exit_2_no_file(case, tmp_path_factory, tmp_path, capsys):
    models = tmp_path_factory.mktemp("models")
    onnx_model = models / "tiny.onnx"
    if not onnx_model.exists():
        assert main(["export", "tinynet:tiny", "-o", str(onnx_model), *SHAPE]) == 0
        capsys.readouterr()
    before = _files(tmp_path)
    assert main(_bad(tmp_path, onnx_model)[case]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert _files(tmp_path) == before


def test_missing_extra_says_how_to_install(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "executorch" else real(name, *a))
    assert main(["compile", "tinynet:tiny", "--target", "executorch-xnnpack", "-o", str(tmp_path / "m.pte"),
                 *SHAPE]) == 2
    err = capsys.readouterr().err
    assert "npukit[executorch]" in err and _files(tmp_path) == []
