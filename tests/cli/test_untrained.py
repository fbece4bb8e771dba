"""An export of an untrained architecture (torchvision:NAME without --weights) carries a mark in its metadata, and
every verb that reads that ONNX model, or a model made from it, says so in its verdict: a check that passes there says
nothing of the trained model."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx

from npukit.cli import main
from npukit.frontend.onnx_io import UNTRAINED_KEY, untrained_note

SHAPE = ["--input-shape", "1,3,32,32"]


def test_verbs_on_an_untrained_export_say_so(tmp_path, monkeypatch):
    import npukit.frontend.spec as spec

    resolve = spec.resolve_model
    monkeypatch.setattr(spec, "resolve_model", lambda *a, **k: dataclasses.replace(resolve(*a, **k),
                                                                                    random_weights=True))
    exported, optimized, quantized = (tmp_path / n for n in ("tiny.onnx", "tiny.opt.onnx", "tiny.int8.onnx"))
    assert main(["export", "tinynet:tiny", "-o", str(exported), *SHAPE]) == 0
    assert untrained_note(onnx.load(str(exported))) == "tinynet:tiny without --weights (random weights)"
    monkeypatch.setattr(spec, "resolve_model", resolve)
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32))
    assert main(["optimize-graph", str(exported), "-o", str(optimized)]) == 0
    assert main(["quantize", str(optimized), "--calib", str(calib), "-o", str(quantized)]) in (0, 1)
    for path in (optimized, quantized):
        assert untrained_note(onnx.load(str(path))) is not None  # the mark travels with the model
        report = json.loads(path.with_name(path.name.replace(".onnx", ".report.json")).read_text())
        assert "tinynet:tiny without --weights (random weights)" in report["verdict"]
        assert report["verdict"].count("random weights") == 1


def test_a_trained_export_carries_no_mark(tmp_path):
    out = tmp_path / "tiny.onnx"
    assert main(["export", "tinynet:tiny", "-o", str(out), *SHAPE]) == 0
    model = onnx.load(str(out))
    assert untrained_note(model) is None and all(p.key != UNTRAINED_KEY for p in model.metadata_props)
    assert "random weights" not in json.loads((tmp_path / "tiny.report.json").read_text())["verdict"]
