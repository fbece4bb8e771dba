"""npukit optimize --target executorch-xnnpack / litert: each trial's plan carried onto the torch program, lowered
by the runtime and measured on it against the runtime's own fp32 artifact; the chosen .pte / .tflite written, loaded
and run again; an ONNX model refused in one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npukit.cli import main

pytest.importorskip("executorch", reason="the executorch extra is not installed (scripts/setup.sh installs it)")

SHAPE = ["--input-shape", "1,3,32,32"]
SUFFIX = {"executorch-xnnpack": ".pte", "litert": ".tflite"}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("optimize-mobile") / "data.npy"
    np.save(path, np.random.default_rng(3).standard_normal((16, 3, 32, 32)).astype(np.float32))
    return path


@pytest.mark.parametrize("target, trials", [("executorch-xnnpack", 2), ("litert", 1)])
def test_the_search_measures_on_the_runtime_and_writes_its_artifact(target, trials, data, tmp_path,
                                                                   monkeypatch) -> None:
    if target == "litert":
        pytest.importorskip("litert_torch", reason="the litert extra is not installed (scripts/setup.sh installs it)")
    import dataclasses

    import npukit.frontend.spec as spec
    from npukit.search.mobile import runtime_module

    resolve = spec.resolve_model  # as an untrained torchvision architecture: the verdict must say so
    monkeypatch.setattr(spec, "resolve_model", lambda *a, **k: dataclasses.replace(resolve(*a, **k),
                                                                                    random_weights=True))

    out = tmp_path / f"best{SUFFIX[target]}"
    assert main(["optimize", "tinynet:tiny", "--target", target, "-o", str(out), "--data", str(data), *SHAPE,
                 "--budget", "5%", "--trials", str(trials), "--runs", "3"]) == 0
    report_name = f"{out.name}.report.json"  # a phone artifact's report and study keep its suffix
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, f"{out.name}.optimize.db", report_name])
    report = json.loads((tmp_path / report_name).read_text())
    assert report["passed"] and report["verdict"].startswith("PASS optimize: trial")
    assert f"the fp32 {target} artifact's" in report["verdict"]
    assert "untrained architecture (random weights)" in report["verdict"]
    search = report["results"]["search"]
    assert len(search["trials"]) == trials and search["trials"][0]["label"] == "pc auto"
    assert report["results"]["baseline_calibration"]["method"] == "auto"  # calibrated as its label says
    fp32_bytes = report["results"]["fp32_artifact"]["bytes"]
    for trial in search["trials"]:
        assert trial["feasible"] and trial["metric"] >= 0.95 and trial["integer_fraction"] == 1.0
        assert trial["latency_ms"] > 0 and trial["float_latency_ms"] > 0  # timed on the runtime, both
        assert trial["size"] == pytest.approx(trial["size_bytes"] / fp32_bytes)
    lifts = search["space"]["knobs"]["lift"]
    assert not any("int16" in v for v in lifts)  # XNNPACK takes no 16-bit activations
    # LiteRT's converter would quantize the float layers itself: no float lifts there
    assert any("float" in v for v in lifts) == (target == "executorch-xnnpack")
    chosen = next(t for t in search["trials"] if t["number"] == search["chosen"])
    assert out.stat().st_size == chosen["size_bytes"]
    # the artifact written is the chosen trial's: it runs on its runtime and agrees with the float model as checked
    runner = runtime_module({"executorch-xnnpack": "executorch", "litert": "litert"}[target]).Runner(out)
    feeds = {"input": np.load(data)[:1]}
    assert runner(feeds)[0].shape == (1, 10)
    assert report["results"]["task_check"]["result"]["samples"] == 8


def test_a_failing_search_of_an_untrained_architecture_says_so(data, tmp_path, monkeypatch) -> None:
    """The untrained-weights note was added to a PASS only: a FAIL on random weights (which say nothing of the
    trained model's behaviour) gave no hint that --weights was missing."""
    import dataclasses

    import npukit.frontend.spec as spec

    resolve = spec.resolve_model
    monkeypatch.setattr(spec, "resolve_model", lambda *a, **k: dataclasses.replace(resolve(*a, **k),
                                                                                    random_weights=True))
    out = tmp_path / "best.pte"
    assert main(["optimize", "tinynet:tiny", "--target", "executorch-xnnpack", "-o", str(out), "--data", str(data),
                 *SHAPE, "--trials", "1", "--runs", "3", "--min-sqnr", "200", "--task", "generic"]) == 1
    report = json.loads((tmp_path / "best.pte.report.json").read_text())
    assert report["verdict"].startswith("FAIL optimize") and "untrained architecture (random weights)" in \
        report["verdict"]
    assert not out.exists()


def test_an_onnx_model_with_two_inputs_is_refused_for_a_mobile_runtime(tmp_path, capsys) -> None:
    """An ONNX model runs as a torch program built from its graph (one input); two inputs: refused, nothing
    written."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    np.save(tmp_path / "d.npy", np.zeros((8, 1, 4), np.float32))
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["optimize", str(model), "--target", "executorch-xnnpack", "-o", str(tmp_path / "b.pte"), "--data",
                 str(tmp_path / "d.npy"), "--input-shape", "1,4"]) == 2
    err = capsys.readouterr().err
    assert "has 2 inputs (a, b)" in err and "\n" not in err.strip()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_onnx_model_is_searched_as_a_torch_program_under_its_own_names(data, tmp_path) -> None:
    """An ONNX model with one input: its graph becomes the torch program each trial carries a plan onto (checked
    against ORT first, said in the report's model source); the report names its input and output as the model does
    (PP-OCR's angle classifier, ONNX -> .tflite, measured: PASS, top-1 1.000 on 45 held-out lines, 0.94x fp32)."""
    import onnx

    model = tmp_path / "models" / "tiny.onnx"
    model.parent.mkdir()
    assert main(["export", "tinynet:tiny", "-o", str(model), "--input-shape", "image=1,3,32,32"]) == 0
    named = onnx.load(model)
    old = named.graph.output[0].name
    for node in named.graph.node:  # the output renamed as a third-party file might name it
        node.output[:] = ["scores/softmax.0" if name == old else name for name in node.output]
    named.graph.output[0].name = "scores/softmax.0"
    onnx.save(named, model)
    out = tmp_path / "best.pte"
    assert main(["optimize", str(model), "--target", "executorch-xnnpack", "-o", str(out), "--data", str(data),
                 "--input-shape", "1,3,32,32", "--budget", "5%", "--trials", "1", "--runs", "3"]) == 0
    report = json.loads((tmp_path / "best.pte.report.json").read_text())
    assert report["passed"] and report["verdict"].startswith("PASS optimize: trial")
    (note,) = report["results"]["model_source"]["notes"]
    assert "tiny.onnx runs as a torch program" in note
    assert [o["name"] for o in report["results"]["task_check"]["result"]["outputs"]] == ["scores/softmax.0"]
