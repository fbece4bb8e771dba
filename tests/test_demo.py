"""The README's main job, end to end: MobileNetV2 with its official weights on real photos, offline."""

from __future__ import annotations

import json

import onnx
import pytest

from npukit.cli import main


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path), "--runs", "3"]) == 0
    report = json.loads((tmp_path / "demo.report.json").read_text())
    models = report["results"]["models"]
    assert set(models) == {"fp32", "optimized", "int8"}
    eager = report["results"]["eager_torch"]  # the PyTorch model in eager mode, timed in the same rounds
    assert eager["latency"]["runs"] == 3 and set(eager["speedup"]) == set(models)
    assert report["results"]["export"]["passed"] and report["results"]["export"]["max_rel_error"] <= 1e-4
    assert models["optimized"]["agreement_with_fp32"]["top1_agreement"] == 1.0
    int8 = models["int8"]
    # Sanity, not the quantization issue's targets (benchmarks/quant_vs_anchors.py measures those):
    # a working INT8 model agrees with the float one on most real-photo crops and is about 4x smaller.
    assert int8["agreement_with_fp32"]["top1_agreement"] > 0.6
    assert int8["file_bytes"] < models["fp32"]["file_bytes"] / 3
    # every Conv/Gemm on integer kernels, except the 3x3 RGB stem where this CPU runs it faster in float and the
    # convs chained after it as far as that is timed fastest (at most three)
    stems = report["results"]["quantize.steps"].get("float_stem", {}).get("nodes", [])
    assert len(stems) <= 4
    assert sum(report["results"]["quantize.integer_kernels"]["float_compute"].values()) == len(stems)
    # MobileNetV2's 34 pointwise and 17 depthwise convs, each one node of ORT's profile in both models
    kinds = report["results"]["quantize.kernel_profile"]["int8"]["by_kind"]
    assert (kinds["pointwise conv"]["nodes"], kinds["depthwise conv"]["nodes"]) == (34, 17)
    ops = report["results"]["quantize.kernel_profile"]["int8"]["ops"]
    float_pointwise = [op for op in ops if op["kind"] == "pointwise conv" and not op["integer"]]
    assert len(float_pointwise) <= max(0, len(stems) - 1) and kinds["pointwise conv"]["integer_ms"] > 0
    assert (tmp_path / "demo.report.html").read_text().count("<svg") >= 1
    from tests.report.browser import chromium, inspect_report, layout_problems

    if chromium() is not None:  # the demo's report in a real browser too (tests/report/test_html_in_browser.py)
        from tests.report.test_html_in_browser import SHOTS

        shown = inspect_report(tmp_path / "demo.report.html", screenshot=SHOTS / "demo.png")
        assert layout_problems(shown) == [] and shown["figures"]
    predictions = {p["photo"]: p["top1"] for p in report["results"]["predictions"]}
    assert predictions["coffee"] == "espresso"
    for name in ("mobilenet_v2.onnx", "mobilenet_v2.opt.onnx", "mobilenet_v2.int8.onnx"):
        onnx.checker.check_model(onnx.load(str(tmp_path / name)))
    assert "What the INT8 model sees" in capsys.readouterr().out


def test_demo_into_a_file_or_an_unwritable_place_is_refused(tmp_path, capsys):
    # was "internal error: FileExistsError", exit 1
    afile = tmp_path / "afile"
    afile.write_text("hi")
    assert main(["demo", "-o", str(afile), "--runs", "2", "--no-html"]) == 2
    err = capsys.readouterr().err.strip()
    assert "afile is a file: the demo writes its models and report into a folder" in err and "\n" not in err
    assert main(["demo", "-o", str(afile / "sub"), "--runs", "2", "--no-html"]) == 2
    assert "afile is a file, not a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"] and afile.read_text() == "hi"


def test_an_interrupted_demo_takes_its_new_folder_whole(tmp_path, capsys, monkeypatch):
    """Ctrl-C at 70 s left npukit_out/ with the fp32, optimized and INT8 models but no demo report, under
    "nothing was left half-written". A new folder goes whole; a folder that was there stays."""
    import npukit.demo_pipeline as pipeline

    def interrupted(output_dir, **kwargs):
        folder = tmp_path / "out"
        folder.mkdir(exist_ok=True)
        (folder / "mobilenet_v2.onnx").write_bytes(b"written before the interrupt")
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "demo", interrupted)
    assert main(["demo", "-o", str(tmp_path / "out"), "--runs", "2"]) == 130
    assert "interrupted; nothing was left half-written" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("kept")
    assert main(["demo", "-o", str(tmp_path / "out"), "--runs", "2"]) == 130
    assert (tmp_path / "out" / "mine.txt").read_text() == "kept"
