"""End to end through the ``npukit`` command: every verb on a tiny real model, and every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from npukit.cli import build_parser, main
from npukit.errors import InputError


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_export_writes_verified_model_and_reports(exported):
    report = json.loads(exported.with_name("tiny.report.json").read_text())
    assert report["command"] == "export"
    assert report["results"]["export"]["passed"] is True
    assert report["results"]["export"]["max_rel_error"] <= 1e-4
    assert report["config"]["export"]["input_shape"] == [1, 3, 32, 32]
    assert report["environment"]["packages"]["torch"]
    html = exported.with_name("tiny.report.html").read_text()
    assert "<svg" in html or "<table" in html
    onnx.checker.check_model(onnx.load(str(exported)))
    assert not [p for p in exported.parent.iterdir() if p.name.endswith(".tmp")]


def test_an_onnx_file_passed_through_says_what_was_checked(exported, tmp_path, capsys):
    """An .onnx file has no torch model: the verdict said its outputs were checked "against torch's" (n/a); --opset
    was ignored (the file kept its own) and --exporter too."""
    out = tmp_path / "copy.onnx"
    assert main(["export", str(exported), "-o", str(out)]) == 0
    verdict = json.loads(out.with_name("copy.report.json").read_text())["verdict"]
    assert "outputs not compared (the file as given, the ONNX checker passed)" in verdict and "torch" not in verdict
    assert main(["export", str(exported), "-o", str(out), "--input-shape", "1,3,32,32", "--opset", "21"]) == 0
    verdict = json.loads(out.with_name("copy.report.json").read_text())["verdict"]
    assert "converted to opset 21 (verified), outputs against the file as given on seeded inputs" in verdict
    assert onnx.load(str(out)).opset_import[0].version == 21
    upgrade = json.loads(out.with_name("copy.report.json").read_text())["results"]["opset_upgrade"]
    assert (upgrade["from_opset"], upgrade["to_opset"]) == (18, 21) and upgrade["max_abs_error"] is not None
    capsys.readouterr()
    assert main(["export", str(exported), "-o", str(tmp_path / "t.onnx"), "--exporter", "torchscript"]) == 2
    assert "--exporter torchscript chooses how a PyTorch model is exported" in capsys.readouterr().err
    assert not (tmp_path / "t.onnx").exists()


def test_optimize_graph_removes_bn_dropout_and_verifies(exported, tmp_path, capsys):
    out = tmp_path / "tiny.opt.onnx"
    assert main(["optimize-graph", str(exported), "-o", str(out)]) == 0
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert not ops & {"BatchNormalization", "Dropout", "Identity"}
    report = json.loads(out.with_name("tiny.opt.report.json").read_text())
    assert report["results"]["verification"]["max_rel"] <= 1e-4
    printed = capsys.readouterr().out
    assert "Ops by type" in printed and "Passes" in printed


def test_inspect_prints_macs(exported, capsys, tmp_path):
    assert main(["inspect", str(exported), "--json", str(tmp_path / "s.json")]) == 0
    printed = capsys.readouterr().out
    assert "Layers by MACs" in printed and "Conv" in printed
    summary = json.loads((tmp_path / "s.json").read_text())["results"]["summary"]
    # conv1 3->8 3x3 s2 on 32x32 -> 16x16: 16*16*8*27 MACs; depthwise 16*16*8*9; pointwise 16*16*16*8; fc 16*10
    assert summary["macs"] == 16 * 16 * 8 * 27 + 16 * 16 * 8 * 9 + 16 * 16 * 16 * 8 + 16 * 10


def test_bench_with_data_and_reference(exported, tmp_path, capsys):
    rng = np.random.default_rng(0)
    data = tmp_path / "x.npz"
    np.savez(data, input=rng.standard_normal((6, 3, 32, 32)).astype(np.float32),
             labels=np.arange(6) % 10)
    report_path = tmp_path / "bench.json"
    assert main(["bench", str(exported), "--data", str(data), "--reference", str(exported), "--runs", "5",
                 "--warmup", "1", "--report", str(report_path), "--html"]) == 0
    report = json.loads(report_path.read_text())
    assert report["results"]["agreement"]["samples"] == 6
    assert report["results"]["agreement"]["top1_agreement"] == 1.0
    assert report["results"]["latency"]["model"]["median_ms"] > 0
    assert report_path.with_suffix(".html").is_file()


def test_bench_refuses_a_reference_that_takes_other_inputs(exported, tmp_path, capsys, monkeypatch):
    """A reference with another input name or size: exit 2 in one line naming both, nothing written."""
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    renamed, resized = onnx.load(str(exported)), onnx.load(str(exported))
    old = renamed.graph.input[0].name
    renamed.graph.input[0].name = "pixels"
    for node in renamed.graph.node:
        node.input[:] = ["pixels" if i == old else i for i in node.input]
    resized.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 10  # a placeholder batch fixed in the file
    before = _files(tmp_path)
    for model, says in ((renamed, "takes inputs ['pixels']"), (resized, "[10, 3, 32, 32] in the reference")):
        path = tmp_path / "ref.onnx"
        onnx.save(model, str(path))
        assert main(["bench", str(exported), "--data", str(data), "--reference", str(path), "--runs", "2",
                     "--report", str(tmp_path / "b.json")]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) <= 2
        path.unlink()
    # with --input-shape the shape was fixed into the reference first: an unrelated detector, which fails at the
    # classifier's shape, read as a wrong --input-shape ("does not fit the model: node '/model.11/Concat' ...")
    import npukit.frontend.shapes as shapes

    real = shapes.load_with_inputs

    def fails_on_the_reference(path, spec, **kwargs):
        if Path(str(path)).name == "ref.onnx":
            raise InputError("input shape (1, 3, 32, 32) does not fit the model: node '/model.11/Concat'")
        return real(path, spec, **kwargs)

    monkeypatch.setattr(shapes, "load_with_inputs", fails_on_the_reference)
    onnx.save(renamed, str(tmp_path / "ref.onnx"))
    assert main(["bench", str(exported), "--data", str(data), "--reference", str(tmp_path / "ref.onnx"), "--runs",
                 "2", "--input-shape", "1,3,32,32", "--report", str(tmp_path / "b.json")]) == 2
    assert f"takes inputs ['pixels'], the model ['{old}']" in capsys.readouterr().err
    (tmp_path / "ref.onnx").unlink()
    assert _files(tmp_path) == before


def test_console_script_runs():
    exe = Path(sys.executable).with_name("npukit")
    done = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("npukit ")


def test_a_reader_that_leaves_early_does_not_change_the_exit_code(exported):
    """`npukit inspect m.onnx | head -1` where the reader has gone before the report is printed: exit 0 as without
    the pipe (rich's own handler exits with 1, which reads as a failed check)."""
    exe = Path(sys.executable).with_name("npukit")
    proc = subprocess.Popen([str(exe), "inspect", str(exported)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves before the first line: every write of the report meets a closed pipe
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()


def _bad_inputs(tmp: Path) -> dict[str, list[str]]:
    (tmp / "notonnx.onnx").write_text("this is text, not a model\n")
    (tmp / "empty").mkdir()
    (tmp / "badimg").mkdir()
    (tmp / "badimg" / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    nan = np.full((2, 3, 32, 32), np.nan, dtype=np.float32)
    np.save(tmp / "nan.npy", nan)
    return {
        "missing path": ["inspect", str(tmp / "nope.onnx")],
        "not onnx": ["inspect", str(tmp / "notonnx.onnx")],
        "truncated onnx": ["optimize-graph", "{truncated}", "-o", str(tmp / "out.onnx")],
        "unknown torchvision name": ["export", "torchvision:mobilenetv2", "-o", str(tmp / "out.onnx")],
        "factory raises": ["export", "tinynet:broken", "-o", str(tmp / "out.onnx")],
        "shape does not fit": ["export", "tinynet:tiny", "-o", str(tmp / "out.onnx"), "--input-shape", "1,5,32,32"],
        "empty data folder": ["bench", "{model}", "--data", str(tmp / "empty"), "--runs", "1"],
        "unreadable image": ["bench", "{model}", "--data", str(tmp / "badimg"), "--runs", "1"],
        "NaN data": ["bench", "{model}", "--data", str(tmp / "nan.npy"), "--runs", "1"],
        "wrong output suffix": ["export", "tinynet:tiny", "-o", str(tmp / "out.txt")],
        "serve a truncated model": ["serve-bench", "{truncated}"],
        "shape beyond memory": ["export", "tinynet:tiny", "-o", str(tmp / "new" / "out.onnx"),
                                "--input-shape", "1,3,100000,100000"],
        "output under a file": ["optimize-graph", "{model}", "-o", str(tmp / "nan.npy" / "out.onnx")],
        "report under a file": ["inspect", "{model}", "--json", str(tmp / "nan.npy" / "s.json")],
        "pytorch model to an onnx verb": ["bench", "tinynet:tiny", "--runs", "1"],
    }


@pytest.mark.parametrize("case", [
    "missing path", "not onnx", "truncated onnx", "unknown torchvision name", "factory raises", "shape does not fit",
    "empty data folder", "unreadable image", "NaN data", "wrong output suffix", "serve a truncated model",
    "shape beyond memory", "output under a file", "report under a file", "pytorch model to an onnx verb"])
def test_bad_input_one_line_exit_2_no_file(case, exported, tmp_path, capsys):
    args = _bad_inputs(tmp_path)[case]
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(exported.read_bytes()[: exported.stat().st_size // 3])
    args = [a.replace("{truncated}", str(truncated)).replace("{model}", str(exported)) for a in args]
    before = set(_files(tmp_path))
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert set(_files(tmp_path)) == before, "a bad input must not leave files behind"
    if case == "unknown torchvision name":
        assert "mobilenet_v2" in err
    if case == "pytorch model to an onnx verb":
        assert "npukit export tinynet:tiny -o model.onnx" in err


@pytest.mark.parametrize("argument", [["inspect", "m.onnx", "--top", "-3"], ["quantize", "m.onnx", "--calib", "c",
                                                                              "-o", "q.onnx", "--resize", "0"]])
def test_a_count_below_one_is_refused_by_the_parser(argument, capsys):
    assert main(argument) == 2
    err = capsys.readouterr().err
    assert "must be at least 1" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [
    ["bench", "{model}", "--runs", "1", "--report", "{model}"],
    ["bench", "{model}", "--runs", "1", "--report", "./{name}"],
    ["bench", "{other}", "--reference", "{model}", "--runs", "1", "--report", "{model}"],
    ["bench", "{other}", "--runs", "1", "--report", "{stem}.report.json", "--html"],  # the HTML lands on the input
    ["analyze", "{model}", "--target", "cpu", "--report", "{model}"],
    ["plan-memory", "{model}", "--report", "{link}"],
    ["serve-bench", "{model}", "--report", "{model}"],
    ["inspect", "{model}", "--json", "{model}"],
], ids=["bench", "bench-relative", "bench-reference", "bench-html", "analyze", "plan-memory-symlink", "serve-bench",
        "inspect"])
def test_a_report_named_like_an_input_is_refused_and_the_input_kept(command, exported, tmp_path, capsys,
                                                                    monkeypatch):
    model = tmp_path / "m.onnx"
    model.write_bytes(exported.read_bytes())
    other = tmp_path / "other.onnx"
    other.write_bytes(exported.read_bytes())
    (tmp_path / "m.report.html").write_bytes(exported.read_bytes())  # an input named like bench-html's page
    (tmp_path / "link.onnx").symlink_to(model)
    monkeypatch.chdir(tmp_path)
    fill = {"{model}": str(model), "{name}": model.name, "{other}": str(other), "{link}": str(tmp_path / "link.onnx"),
            "{stem}": str(tmp_path / "m")}
    args = []
    for arg in command:
        for key, value in fill.items():
            arg = arg.replace(key, value)
        args.append(arg)
    if "--html" in args:  # the page beside m.report.json is m.report.html: make that the input
        args[1] = str(tmp_path / "m.report.html")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "would overwrite it" in err and "\n" not in err, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_report_not_named_json_is_refused(exported, tmp_path, capsys):
    assert main(["plan-memory", str(exported), "--report", str(tmp_path / "pm" / "x.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--report" in err and "must end in .json" in err and "x.json" in err and "\n" not in err, err
    assert list(tmp_path.iterdir()) == []
    import npukit  # from Python too: npukit.inspect(..., report_path="x.txt") wrote x.txt, plan_memory JSON as .html
    from npukit.errors import InputError

    for verb, name in ((npukit.inspect, "x.txt"), (npukit.plan_memory, "pm.html"), (npukit.bench, "b.onnx"),
                       (npukit.serve_bench, "s.txt")):
        with pytest.raises(InputError, match=r"report_path .* must end in \.json"):
            verb(str(exported), report_path=str(tmp_path / name))
    with pytest.raises(InputError, match=r"report_path .* must end in \.json"):
        npukit.analyze(str(exported), targets="cpu", report_path=str(tmp_path / "a.txt"))
    with pytest.raises(InputError, match=r"report_path .* must end in \.json"):
        npukit.devices(report_path=str(tmp_path / "d.txt"))
    assert list(tmp_path.iterdir()) == []


def test_analyze_across_targets(exported, tmp_path, capsys):
    report_path = tmp_path / "analyze.json"
    assert main(["analyze", str(exported), "--target", "qnn-htp", "--target", "litert", "--report",
                 str(report_path)]) == 0
    printed = capsys.readouterr().out
    assert "Operator support by target" in printed and "qnn-htp" in printed and "litert" in printed
    assert json.loads(report_path.read_text())["command"] == "analyze"


def test_analyze_unknown_target_lists_valid_ones(exported, capsys):
    assert main(["analyze", str(exported), "--target", "hexagon9000"]) == 2
    err = capsys.readouterr().err
    assert "qnn-htp" in err and "\n" not in err.strip()


def test_analyze_output_without_fix_is_refused(exported, tmp_path, capsys):
    """-o names the model --fix writes: without --fix analyze wrote the report there and no model, exit 0."""
    assert main(["analyze", str(exported), "--target", "cpu", "-o", str(tmp_path / "fixed.onnx")]) == 2
    err = capsys.readouterr().err
    assert "without --fix" in err and "\n" not in err.strip()
    assert list(tmp_path.iterdir()) == []


def test_plan_memory_reports_plans_and_timeline(exported, tmp_path, capsys):
    report_path = tmp_path / "mem.json"
    assert main(["plan-memory", str(exported), "--target", "cpu", "--report", str(report_path), "--html"]) == 0
    report = json.loads(report_path.read_text())
    assert any(f["kind"] == "timeline" for f in report["figures"])
    assert "greedy_by_size" in capsys.readouterr().out
    assert "<svg" in report_path.with_suffix(".html").read_text()
    assert report["results"]["device_peak_bytes"] > 0  # ORT's own allocation, replayed on the graph ORT runs
    assert main(["plan-memory", str(exported), "--rules-view", "--report", str(report_path)]) == 0
    assert "device_peak_bytes" not in json.loads(report_path.read_text())["results"]


@pytest.mark.slow
def test_bench_memory_predicts_and_measures(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)  # maps of 1-2 MiB, well above the allocator's noise
    weights = [numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "w1"),
               numpy_helper.from_array(rng.standard_normal((16, 32, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 128, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 128, 128])],
                              initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "wide.onnx"
    onnx.save(model, str(path))
    report_path = tmp_path / "bench.json"
    assert main(["bench", str(path), "--memory", "--runs", "3", "--warmup", "1",
                 "--report", str(report_path)]) == 0
    memory = json.loads(report_path.read_text())["results"]["memory"]
    measured = memory["measured_arena_off"]["peak_bytes"]
    assert abs(memory["predicted_bytes"] - measured) <= 0.15 * measured, memory


def test_devices_probe(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "CPUExecutionProvider" in out and "Plan" in out
    assert "int8 conv paths" in out and "depthwise" in out


def test_devices_html_beside_its_report(tmp_path, capsys):
    report = tmp_path / "machine.json"
    assert main(["devices", "--report", str(report), "--html"]) == 0
    assert report.is_file() and report.with_suffix(".html").read_text().lstrip().lower().startswith("<!doctype")
    assert main(["devices", "--html"]) == 2  # nothing to write it beside: one line, what to add
    err = capsys.readouterr().err
    assert "give --report PATH.json" in err and len(err.strip().splitlines()) == 1


def test_quantize_writes_integer_model_and_report(exported, tmp_path):
    rng = np.random.default_rng(1)
    calib = tmp_path / "calib.npy"
    np.save(calib, rng.standard_normal((8, 3, 32, 32)).astype(np.float32))
    held = tmp_path / "held.npy"
    np.save(held, rng.standard_normal((6, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "tiny.int8.onnx"
    assert main(["quantize", str(exported), "--calib", str(calib), "--data", str(held), "-o", str(out),
                 "--cle", "--bias-correction", "--range-search", "--runs", "3"]) == 0
    report = json.loads(out.with_name("tiny.int8.report.json").read_text())
    search = report["results"]["steps"]["range_search"]
    assert report["config"]["preprocess"] == "none: the data are arrays, fed as given"  # not ImageNet's mean/std
    assert search["calibration_sqnr_after_db"] >= search["calibration_sqnr_before_db"] and search["samples"] == 8
    # every Conv on integer kernels but a stem this CPU runs faster in float (--float-stem auto)
    stems = report["results"]["steps"].get("float_stem", {}).get("nodes", [])
    head = report["config"]["quant"]["precision"]["float_head"]
    assert (head == {"by": "latency", "share": 0.0, "floor_db": None, "floor_share": 0.0, "floor_outputs": []}
            if report["config"]["cpu_scheme"]["float_stem"] else head is None)
    assert sum(report["results"]["integer_kernels"]["float_compute"].values()) == len(stems)
    assert report["results"]["agreement"]["samples"] == 6
    assert report["results"]["size"]["int8"] < report["results"]["size"]["float"]
    profile = report["results"]["kernel_profile"]
    assert profile["float"]["kernel_ms"] > 0 and profile["int8"]["kernel_ms"] > 0
    assert profile["int8"]["by_kind"]["pointwise conv"]["integer_ms"] > 0  # TinyNet's 1x1 convs on int8 kernels
    assert not any(op["integer"] for op in profile["float"]["ops"])
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops


def _assert_says_when_int8_is_not_faster(report: dict) -> None:
    """A passing or failing verdict says when the INT8 model is not faster than the float one, with the ratio the
    report measured."""
    speed = next(t for t in report["tables"] if t["title"].startswith("Size and latency"))
    ratio = next(r for r in speed["rows"] if r[0] == "int8")[3]
    assert ("the float model may serve better here" in report["verdict"]) == (ratio >= 1.0)
    assert ratio < 1.0 or f"{ratio:.2f}x the float model's time" in report["verdict"]


def test_quantize_checks_the_task_and_exits_1_below_the_floors(exported, tmp_path, capsys):
    rng = np.random.default_rng(1)
    calib = tmp_path / "calib.npy"
    np.save(calib, rng.standard_normal((8, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "q.onnx"
    args = ["quantize", str(exported), "--calib", str(calib), "-o", str(out), "--method", "minmax", "--runs", "2"]
    assert main(args) == 0
    report = json.loads(out.with_name("q.report.json").read_text())
    assert report["verdict"].startswith("PASS quantize: task classify") and report["passed"]
    _assert_says_when_int8_is_not_faster(report)
    check = report["results"]["task_check"]
    assert check["choice"]["task"] == "classify" and "calibration samples" in check["where"]
    # the verdict says it too (a table row alone did): compile's verdict already did
    assert "(checked on the calibration samples: optimistic, the model was fitted to them; pass held-out --data)" \
        in report["verdict"]
    assert [o["name"] for o in check["result"]["outputs"]] == [o.name for o in onnx.load(str(exported)).graph.output]
    capsys.readouterr()
    assert main(args + ["--min-sqnr", "500", "--task", "generic"]) == 1  # no int8 model is that close
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("FAIL quantize: task generic") and "< 500 dB" in printed
    verdict = json.loads(out.with_name("q.report.json").read_text())["verdict"]
    assert "; try --cle --equalize-activations --bias-correction, --int16-budget 0.1" in verdict  # what it did not use
    failed = json.loads(out.with_name("q.report.json").read_text())
    assert failed["passed"] is False
    _assert_says_when_int8_is_not_faster(failed)
    assert failed["degraded"] is False
    assert main(args + ["--min-sqnr", "500", "--task", "generic", "--accept-degraded"]) == 0
    accepted = json.loads(out.with_name("q.report.json").read_text())
    assert accepted["verdict"].startswith("DEGRADED") and accepted["passed"] is True and accepted["degraded"] is True


def test_a_task_the_outputs_cannot_carry_is_refused_before_any_work(exported, tmp_path, capsys, monkeypatch):
    """--task detect on a classifier: exit 2 with one line, before quantizing, nothing written."""
    import npukit.quant.qdq

    def never(*args, **kwargs):
        raise AssertionError("quantized although the task was refused")

    monkeypatch.setattr(npukit.quant.qdq, "quantize", never)
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32))
    before = _files(tmp_path)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(out), "--task", "detect"]) == 2
    assert "--task detect but no output has a detector's layout" in capsys.readouterr().err
    assert _files(tmp_path) == before


def test_inspect_from_python_writes_its_json_where_asked(exported, tmp_path):
    from npukit.api import inspect

    out = inspect(str(exported), report_path=tmp_path / "s.json")
    assert out.report_path == tmp_path / "s.json"
    assert json.loads((tmp_path / "s.json").read_text())["results"]["summary"]["nodes"] == out.result.nodes


def test_an_array_given_in_python_calibrates_as_its_npy_file_does(exported, tmp_path):
    """npukit.quantize(calib=array) iterated the array as samples without their batch axis ([3, 32, 32] for an
    input of [1, 3, 32, 32]) while the same array saved as .npy worked."""
    from npukit.api import quantize

    calib = np.random.default_rng(1).standard_normal((8, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "calib.npy", calib)
    common = dict(method="minmax", runs=2, max_samples=4)
    in_memory = quantize(str(exported), tmp_path / "a.onnx", calib=calib, data=calib, **common)
    from_file = quantize(str(exported), tmp_path / "f.onnx", calib=tmp_path / "calib.npy", **common)
    assert in_memory.report.passed and from_file.report.passed
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "f.onnx").read_bytes()
    with pytest.raises(InputError, match="does not fit input"):
        quantize(str(exported), tmp_path / "b.onnx", calib=calib[:, :1], **common)


def test_feed_dicts_and_dicts_of_arrays_calibrate_as_the_array_does(exported, tmp_path):
    """A list of feed dicts with --data crashed after all the work (same_data made a path of the list: OSError); a
    wrong key, a torch tensor, a bare array in the list or a mixed shape reached ORT or numpy as raw errors."""
    import logging

    import onnx
    import torch

    from npukit.api import bench, quantize

    name = onnx.load(str(exported)).graph.input[0].name
    calib = np.random.default_rng(1).standard_normal((8, 3, 32, 32)).astype(np.float32)
    common = dict(method="minmax", runs=2, max_samples=4)
    handlers = list(logging.getLogger().handlers)
    assert quantize(str(exported), tmp_path / "a.onnx", calib=calib, **common).report.passed
    assert logging.getLogger().handlers == handlers  # ORT's quantizer left no handler on the root logger
    for form, given in {"batch1": [{name: calib[i:i + 1]} for i in range(8)], "sample": [{name: calib[i]}
                                                                                         for i in range(8)],
                        "dict": {name: calib}}.items():
        result = quantize(str(exported), tmp_path / f"{form}.onnx", calib=given, data=given, **common)
        assert result.report.passed, form
        assert (tmp_path / f"{form}.onnx").read_bytes() == (tmp_path / "a.onnx").read_bytes(), form
        assert "given in memory" in result.report.config["calib"]
    assert bench(str(tmp_path / "a.onnx"), reference=str(exported), data=calib, runs=2).report.passed
    before = _files(tmp_path)
    for given, says in [([{"x": calib[i:i + 1]} for i in range(2)], "has no array for input"),
                        ([{name: torch.from_numpy(calib[:1])}], "torch.Tensor"),
                        ([calib[:1], calib[1:2]], "not a feed dict"),
                        ([{name: calib[:1]}, {name: calib[:2]}], "several shapes"),
                        ([], "is empty. give at least one sample")]:  # the hint in str(), as on the CLI
        with pytest.raises(InputError, match=says):
            quantize(str(exported), tmp_path / "bad.onnx", calib=given, **common)
    with pytest.raises(InputError, match="not a ModelProto given in Python"):
        quantize(onnx.load(str(exported)), tmp_path / "bad.onnx", calib=calib, **common)
    with pytest.raises(InputError, match="threads must be at least 1"):
        quantize(str(exported), tmp_path / "bad.onnx", calib=calib, threads=0, **common)
    assert _files(tmp_path) == before  # refused before anything was written


def test_a_reference_with_other_outputs_and_one_target_named_alone(exported, tmp_path):
    """bench against a reference giving another number of outputs raised a bare ValueError from the task check;
    analyze(targets="qnn-htp") read the string's letters as targets ("unknown target 'q'")."""
    import onnx

    from npukit.api import analyze, bench

    two = onnx.load(str(exported))
    two.graph.node.append(onnx.helper.make_node("Identity", [two.graph.output[0].name], ["again"]))
    two.graph.output.append(onnx.helper.make_tensor_value_info("again", onnx.TensorProto.FLOAT, [1, 10]))
    onnx.save(two, str(tmp_path / "two.onnx"))
    calib = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with pytest.raises(InputError, match="gives 2 output"):
        bench(str(exported), reference=str(tmp_path / "two.onnx"), data=calib, runs=2)
    result = analyze(str(exported), targets="qnn-htp")
    assert list(result.report.config["targets"]) == ["qnn-htp"]


def test_a_module_given_in_python_keeps_its_training_modes(tmp_path):
    """export(module) left the caller's module, and every submodule, in eval mode: exporting in the middle of training
    turned dropout and BatchNorm's statistics off for the rest of it."""
    import torch

    from npukit.api import analyze, export

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Dropout(0.5),
                              torch.nn.Conv2d(4, 2, 1)).train()
    net[3].eval()  # a submodule the caller froze stays frozen
    modes = [m.training for m in net.modules()]
    assert export(net, tmp_path / "net.onnx", input_shape=(1, 3, 16, 16)).report.passed
    assert [m.training for m in net.modules()] == modes
    analyze(net, targets=["cpu"], input_shape=(1, 3, 16, 16))
    assert [m.training for m in net.modules()] == modes


def test_excluding_every_compute_node_is_refused_before_any_work(exported, tmp_path, capsys, monkeypatch):
    """--exclude of every conv/matmul wrote the float model as the "INT8" one, checked against itself: PASS, exit 0."""
    import onnx

    import npukit.quant.qdq

    def never(*args, **kwargs):
        raise AssertionError("quantized although nothing was left to quantize")

    compute = [n.name for n in onnx.load(str(exported)).graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(1).standard_normal((8, 3, 32, 32)).astype(np.float32))
    monkeypatch.setattr(npukit.quant.qdq, "quantize", never)
    before = _files(tmp_path)
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(tmp_path / "q.onnx"),
                 "--exclude", *compute]) == 2
    assert f"--exclude names every conv/matmul node of the model ({len(compute)})" in capsys.readouterr().err
    assert _files(tmp_path) == before
    # qat trained such a model, wrote it and failed it with 'SQNR inf dB': refused before any work too
    assert main(["qat", str(exported), "--data", str(calib), "-o", str(tmp_path / "t.onnx"), "--exclude",
                 *compute]) == 2
    assert "--exclude names every conv/matmul node" in capsys.readouterr().err and _files(tmp_path) == before
    # a model whose nodes have no names (CenterFace): excluded by the names quantize and inspect give them
    from npukit.frontend.onnx_io import named_nodes

    unnamed = onnx.load(str(exported))
    for node in unnamed.graph.node:
        node.name = ""
    onnx.save(unnamed, tmp_path / "unnamed.onnx")
    given = [n.name for n in named_nodes(unnamed).graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    before = _files(tmp_path)
    assert main(["quantize", str(tmp_path / "unnamed.onnx"), "--calib", str(calib), "-o", str(tmp_path / "u.onnx"),
                 "--exclude", *given]) == 2
    assert "--exclude names every conv/matmul node" in capsys.readouterr().err
    assert _files(tmp_path) == before


def test_a_verb_that_fails_after_writing_its_artifact_leaves_nothing_new(exported, tmp_path, capsys, monkeypatch):
    """An artifact written before a later step refused (exit 2) or broke (exit 1) is removed with its report; a
    file that was there before the run is left alone."""
    from npukit import api
    from npukit.errors import InputError

    def writes_then_refuses(*args, **kwargs):
        out = Path(kwargs.get("output") or args[1])
        out.write_bytes(b"half")
        out.with_name(out.stem + ".report.json").write_text("{}")
        raise InputError("refused late", hint="nothing to do")

    monkeypatch.setattr(api, "optimize_graph", writes_then_refuses)
    before = _files(tmp_path)
    assert main(["optimize-graph", str(exported), "-o", str(tmp_path / "o.onnx")]) == 2
    assert _files(tmp_path) == before
    kept = tmp_path / "kept.onnx"
    kept.write_bytes(b"the user's")
    assert main(["optimize-graph", str(exported), "-o", str(kept)]) == 2
    assert kept.exists() and not (tmp_path / "kept.report.json").exists()
    capsys.readouterr()


def test_integer_pixels_for_a_float_model_are_named_in_the_report_and_on_the_terminal(exported, tmp_path, capsys):
    """uint8 0..255 arrays for a float input are read unscaled (some models take 0..255): the report and the terminal
    say so, so a user whose model expects 0..1 sees why its calibration and checks read the wrong range."""
    data = tmp_path / "pixels.npy"
    np.save(data, np.random.default_rng(0).integers(0, 256, (3, 3, 32, 32), dtype=np.uint8))
    report = tmp_path / "b.json"
    assert main(["bench", str(exported), "--data", str(data), "--runs", "1", "--report", str(report)]) == 0
    note = json.loads(report.read_text())["results"]["data_cast"]
    assert note.startswith("pixels.npy: array 'input' is uint8 (values 0..255)") and "not scaled" in note
    assert "integer arrays fed to float inputs" in capsys.readouterr().out


def test_quantize_says_how_images_were_read_and_takes_the_normalization(exported, tmp_path):
    """An image folder is resized, cropped and normalized (ImageNet's by default): the report says how, and
    --mean / --std change it (a model not trained on ImageNet's statistics)."""
    from PIL import Image

    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(exported), "--calib", str(folder), "-o", str(out), "--runs", "2",
                 "--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5"]) == 0
    note = json.loads(out.with_name("q.report.json").read_text())["results"]["image_preprocessing"]
    assert "imgs: 8 image(s)" in note and "center crop 32x32" in note and "mean [0.5, 0.5, 0.5]" in note
    # the crop is most of the image, as 224 of 256 is for ImageNet models, not a 32-pixel patch of a 256-pixel image
    assert "short side resized to 37," in note


def test_a_recipe_auto_that_ran_out_of_time_says_what_it_did_not_try(exported, tmp_path):
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(1).standard_normal((8, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(out), "--runs", "2", "--recipe", "auto",
                 "--recipe-budget", "0.000001"]) == 0
    verdict = json.loads(out.with_name("q.report.json").read_text())["verdict"]
    assert verdict.startswith("PASS") and "--recipe auto did not try equalized (" in verdict
    assert "--recipe-budget gives it more time" in verdict


def test_html_without_report_path_lands_beside_the_input(exported, tmp_path):
    import shutil

    model = tmp_path / "m.onnx"
    shutil.copyfile(exported, model)
    assert main(["plan-memory", str(model), "--html"]) == 0
    assert main(["analyze", str(model), "--target", "qnn-htp", "--html"]) == 0
    names = _files(tmp_path)
    assert {"m.plan-memory.report.json", "m.plan-memory.report.html", "m.analyze.report.json",
            "m.analyze.report.html"} <= set(names), names
    report = json.loads((tmp_path / "m.analyze.report.json").read_text())
    assert report["verdict"].startswith("INFO analyze")


def test_html_without_report_path_for_a_model_inside_a_package_lands_in_the_current_folder(exported, tmp_path,
                                                                                             monkeypatch):
    """A model shipped in a package (site-packages/nudenet/320n.onnx): its reports are not written into the
    Python installation but into the current folder."""
    import shutil

    package = tmp_path / "lib" / "site-packages" / "vendor"
    package.mkdir(parents=True)
    shutil.copyfile(exported, package / "m.onnx")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["plan-memory", str(package / "m.onnx"), "--html"]) == 0
    assert _files(package) == ["m.onnx"]
    assert {"m.plan-memory.report.json", "m.plan-memory.report.html"} <= set(_files(work))


def test_bench_fails_a_broken_model_against_its_reference(exported, tmp_path, capsys):
    broken = onnx.load(str(exported))
    logits = broken.graph.output[0].name
    for node in broken.graph.node:  # the logits negated: the argmax becomes the argmin
        node.output[:] = [o if o != logits else "pre_logits" for o in node.output]
    broken.graph.node.append(onnx.helper.make_node("Neg", ["pre_logits"], [logits], name="broken"))
    path = tmp_path / "broken.onnx"
    onnx.save(broken, str(path))
    data = tmp_path / "data.npy"
    np.save(data, np.random.default_rng(2).standard_normal((6, 3, 32, 32)).astype(np.float32))
    report_path = tmp_path / "b.json"
    code = main(["bench", str(path), "--reference", str(exported), "--data", str(data), "--runs", "2",
                 "--report", str(report_path)])
    assert code == 1
    report = json.loads(report_path.read_text())
    assert report["verdict"].startswith("FAIL bench") and not report["passed"]
    assert "; try quantizing again with a recovery recipe" in report["verdict"]
    assert main(["bench", str(exported), "--reference", str(exported), "--data", str(data), "--runs", "2"]) == 0


@pytest.mark.parametrize("pair", [True, False])
def test_quantize_pairs_channels_unless_told_not_to(pair, exported, tmp_path):
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(3).standard_normal((8, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "tiny.int8.onnx"
    flags = [] if pair else ["--no-pair-channels"]
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(out), "--method", "minmax",
                 "--reduce-range", "on", "--runs", "2", *flags]) == 0
    report = json.loads(out.with_name("tiny.int8.report.json").read_text())
    assert report["config"]["quant"]["cpu"]["pair_channels"] is pair
    assert ("pair_channels" in report["results"]["steps"]) is pair


@pytest.mark.parametrize("stem", ["on", "off"])
def test_quantize_float_stem_flag(stem, exported, tmp_path):
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(4).standard_normal((8, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "tiny.int8.onnx"
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(out), "--method", "minmax",
                 "--float-stem", stem, "--runs", "2"]) == 0
    report = json.loads(out.with_name("tiny.int8.report.json").read_text())
    kernels = report["results"]["integer_kernels"]
    if stem == "on":  # TinyNet's first Conv (3 input channels, 3x3) and the prefix of its chain timed fastest
        step = report["results"]["steps"]["float_stem"]
        (head,) = step["heads"]
        assert step["nodes"] == head["nodes"] and 1 <= len(step["nodes"]) <= len(head["chain"])
        assert head["chain"][:len(step["nodes"])] == step["nodes"]
        assert sum(kernels["float_compute"].values()) == len(step["nodes"])
    else:
        assert "float_stem" not in report["results"]["steps"] and kernels["integer_fraction"] == 1.0


def test_quantize_int16_budget_lifts_tensors_within_it(exported, tmp_path):
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(5).standard_normal((8, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "tiny.int8.onnx"
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(out), "--method", "minmax",
                 "--int16-budget", "0.5", "--runs", "2"]) == 0
    report = json.loads(out.with_name("tiny.int8.report.json").read_text())
    plan = report["results"]["steps"]["int16_plan"]
    assert report["config"]["quant"]["precision"]["int16_budget"] == 0.5
    assert plan["plan_ms"] <= 1.5 * plan["base_ms"] and set(plan["tensors"]) <= {c["tensor"] for c in
                                                                                 plan["candidates"]}
    assert any(t["title"].startswith("16-bit activations chosen") for t in report["tables"])
    wide = {i.name for i in onnx.load(str(out)).graph.initializer if i.data_type == onnx.TensorProto.UINT16}
    assert len(wide) >= len(plan["tensors"])  # a 16-bit zero point for each lifted tensor


def test_quantize_mixed_precision_lifts_layers_until_the_floor_is_met(exported, tmp_path, capsys):
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(5).standard_normal((12, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "tiny.mp.onnx"
    args = ["quantize", str(exported), "--calib", str(calib), "-o", str(out), "--method", "minmax", "--runs", "2",
            "--task", "generic", "--per-tensor", "--float-stem", "off"]
    assert main(args) == 0
    base = json.loads(out.with_name("tiny.mp.report.json").read_text())["results"]["task_check"]["result"]
    floor = min(o["sqnr_db"] for o in base["outputs"]) + 3.0
    code = main(args + ["--mixed-precision", "--min-sqnr", f"{floor:.2f}", "--calib-samples", "8"])
    report = json.loads(out.with_name("tiny.mp.report.json").read_text())
    plan = report["results"]["mixed_precision"]
    assert plan["met"] and plan["assignment"] and plan["tried"][0]["lifted"] == 0 and not plan["tried"][0]["passed"]
    # the search reads the 8 samples --calib-samples gives the model written (it read all 12), and says that the
    # model written is calibrated on the held-back ones too
    assert plan["checked_on"].startswith("2 calibration samples held back from the 6")
    assert any("the model written is then calibrated on them all" in t["title"] for t in report["tables"])
    # the plan passed on the held-back samples; the verdict is on all of them, and the exit code says which
    assert code == (0 if report["passed"] else 1) and report["passed"] == report["results"]["task_check"][
        "verdict"]["passed"]
    floats = report["results"]["steps"]["plan"]["float_nodes"]
    assert {n for n, p in plan["assignment"].items() if p == "float32"} <= set(floats)
    assert all(why[-1].startswith("mixed_precision") for n, why in floats.items() if n in plan["assignment"])
    assert any(t["title"].startswith("Mixed precision per layer") for t in report["tables"])
    # a floor no plan reaches: exit 2, one line, nothing written
    out.unlink()
    out.with_name("tiny.mp.report.json").unlink()
    capsys.readouterr()
    assert main(args + ["--mixed-precision", "--min-sqnr", "300", "--mixed-precision-layers", "2"]) == 2
    err = capsys.readouterr().err
    assert "no per-layer precision plan meets the floors" in err and "every activation at 16 bits" in err
    assert not out.exists() and not out.with_name("tiny.mp.report.json").exists()
    assert main(args + ["--mixed-precision", "--int16-budget", "0.1"]) == 2
    assert "--int16-budget" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["nan", "empty", "wrong shape", "too few"])
def test_quantize_bad_calibration_data(case, exported, tmp_path, capsys):
    calib = tmp_path / "calib.npy"
    shapes = {"nan": (4, 3, 32, 32), "empty": (0, 3, 32, 32), "wrong shape": (4, 3, 16, 16), "too few": (2, 3, 32, 32)}
    data = np.ones(shapes[case], dtype=np.float32)
    if case == "nan":
        data[1, 0, 0, 0] = np.nan
    np.save(calib, data)
    out = tmp_path / "q.onnx"
    extra = ["--calib-samples", "5"] if case == "too few" else []
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def test_gemm_convs_on_where_the_kernels_saturate_is_exit_2_and_writes_nothing(exported, tmp_path, capsys,
                                                                              monkeypatch):
    from npukit.quant.cpu import conv_kernel
    from npukit.runtime.int8_paths import Int8Path

    saturating = (Int8Path("1x1 conv", "symmetric conv (ConvSym)", "full 8-bit", False, 22, 0.6),
                  Int8Path("1x1 conv", "int8 GEMM", "full 8-bit", False, 23, 0.6))
    monkeypatch.setattr(conv_kernel, "probe_int8_paths", lambda: saturating)  # an AVX2 CPU without VNNI, anywhere
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "q.onnx"
    args = ["quantize", str(exported), "--calib", str(calib), "-o", str(out), "--method", "minmax"]
    assert main(args + ["--gemm-convs", "on", "--reduce-range", "off"]) == 2
    err = capsys.readouterr().err.strip()
    assert "saturate" in err and "--gemm-convs" in err and "\n" not in err, err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["calib.npy"]


def test_compile_float_model_for_two_socs_and_bench_on_htp(exported, tmp_path):
    pytest.importorskip("onnxruntime_qnn")
    rng = np.random.default_rng(2)
    calib = tmp_path / "calib.npy"
    np.save(calib, rng.standard_normal((8, 3, 32, 32)).astype(np.float32))
    for soc, form in (("SM8350", ["--soc", "SM8350"]), ("SM8650", ["--target", "qnn-htp@SM8650"])):
        out = tmp_path / f"tiny_{soc}.onnx"
        assert main(["compile", str(exported), *form, "--calib", str(calib), "-o", str(out)]) == 0
        report = json.loads(out.with_name(f"tiny_{soc}.report.json").read_text())["results"]["compile"]
        assert report["soc"] == soc and report["context_nodes"] >= 1 and report["identical"]
        assert {n.op_type for n in onnx.load(str(out)).graph.node} >= {"EPContext"}
    int8 = tmp_path / "tiny.int8.onnx"
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(int8), "--runs", "2"]) == 0
    bench_report = tmp_path / "htp.json"
    assert main(["bench", str(int8), "--target", "qnn-htp", "--reference", str(exported), "--data", str(calib),
                 "--runs", "2", "--warmup", "1", "--report", str(bench_report)]) == 0
    results = json.loads(bench_report.read_text())["results"]
    assert results["qnn_assignment"]["qnn_nodes"] > 0
    assert results["npu_agreement"]["HTP vs CPU run of the same model"]["samples"] == 8
    assert results["htp_soc"]["soc"] == "SM8650" and results["htp_soc"]["htp_arch"] == 75
    assert main(["bench", str(int8), "--target", "qnn-htp", "--soc", "SM0000", "--runs", "2"]) == 2


def test_bench_runs_an_epcontext_model_on_the_htp_as_its_soc(exported, tmp_path, capsys):
    pytest.importorskip("onnxruntime_qnn")
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(3).standard_normal((8, 3, 32, 32)).astype(np.float32))
    held = tmp_path / "held.npy"
    np.save(held, np.random.default_rng(4).standard_normal((10, 3, 32, 32)).astype(np.float32))
    ctx = tmp_path / "tiny_ctx.onnx"
    assert main(["compile", str(exported), "--soc", "SM8350", "--calib", str(calib), "--data", str(held), "-o",
                 str(ctx)]) == 0
    checked = json.loads(ctx.with_name("tiny_ctx.report.json").read_text())["results"]["task_check"]
    assert checked["where"] == "8 samples (spread over its 10) held out in held.npy"  # not the calibration samples
    report = tmp_path / "ctx_bench.json"
    # --soc SM8650 for a binary compiled for SM8350: it ran as SM8350 and only a note said so; now refused
    capsys.readouterr()
    assert main(["bench", str(ctx), "--target", "qnn-htp", "--soc", "SM8650", "--runs", "2"]) == 2
    assert "was compiled for SM8350" in capsys.readouterr().err
    assert main(["bench", str(ctx), "--target", "qnn-htp", "--reference", str(exported),
                 "--data", str(calib), "--runs", "2", "--warmup", "1", "--report", str(report)]) == 0
    results = json.loads(report.read_text())["results"]
    assert results["htp_soc"] == {"soc": "SM8350", "name": "Snapdragon 888", "htp_arch": 68, "soc_model": 30,
                                  "epcontext": True}
    # compile writes whether the model had 16-bit activations; v68 computes them at reduced precision, which the
    # bench of the QDQ model said (in the JSON alone) and the bench of its EPContext model did not
    a16 = {p.key: p.value for p in onnx.load(str(ctx)).metadata_props}["npukit.qnn.activations16"]
    assert a16 == "1" and "reduced precision" in results["htp_note"]
    assert "What to expect of the HTP (SM8350, HTP v68)" in capsys.readouterr().out
    assert results["latency"]["model"]["runs"] == 2
    assert results["task_check"]["verdict"]["passed"] and "on the HTP as SM8350" in results["task_check"]["where"]
    capsys.readouterr()
    assert main(["bench", str(ctx), "--runs", "2"]) == 2  # the CPU cannot run a context binary
    assert "--target qnn-htp" in capsys.readouterr().err


def test_compile_mixed_precision_starts_from_int8_and_refuses_what_it_cannot_plan(exported, tmp_path, capsys):
    pytest.importorskip("onnxruntime_qnn")
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(4).standard_normal((8, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "tiny_mixed.onnx"
    args = ["compile", str(exported), "--soc", "SM8650", "--calib", str(calib), "-o", str(out), "--task", "generic"]
    assert main(args + ["--mixed-precision", "--min-sqnr", "0"]) == 0
    report = json.loads(out.with_name("tiny_mixed.report.json").read_text())
    plan = report["results"]["mixed_precision"]
    assert plan["met"] and plan["assignment"] == {} and plan["tried"][0]["passed"]  # all-int8 already passes
    assert any(t["title"].startswith("Mixed precision per layer on the HTP") for t in report["tables"])
    capsys.readouterr()
    assert main(args + ["--mixed-precision", "--min-sqnr", "300", "-o", str(tmp_path / "never.onnx")]) == 2
    assert "no per-layer precision plan meets the floors on the HTP" in capsys.readouterr().err
    assert not (tmp_path / "never.onnx").exists() and not (tmp_path / "never.report.json").exists()
    assert main(["compile", str(exported), "--soc", "SM8650", "--mixed-precision", "-o", str(tmp_path / "x.onnx")]) == 2
    assert "needs a float model and --calib" in capsys.readouterr().err
    assert main(["compile", str(exported), "--target", "litert", "--mixed-precision", "-o", str(tmp_path / "x.tflite")
                 ]) == 2
    assert "--mixed-precision is for --target qnn-htp" in capsys.readouterr().err


def test_compile_unknown_soc_lists_valid(exported, tmp_path, capsys):
    pytest.importorskip("onnxruntime_qnn")
    assert main(["compile", str(exported), "--soc", "SM0000", "-o", str(tmp_path / "x.onnx")]) == 2
    err = capsys.readouterr().err
    assert "SM8650" in err and not (tmp_path / "x.onnx").exists()
    assert main(["bench", str(exported), "--soc", "SM8550", "--runs", "2"]) == 2  # the CPU alone: --soc was ignored
    assert "add --target qnn-htp" in capsys.readouterr().err
    assert main(["compile", str(exported), "--target", "qnn-htp@SM8650", "--soc", "SM8350", "-o",
                 str(tmp_path / "x.onnx")]) == 2
    assert "name two SoCs" in capsys.readouterr().err and not (tmp_path / "x.onnx").exists()


def test_memory_budget_too_low_says_smallest_reachable_and_writes_nothing(exported, tmp_path, capsys):
    out = tmp_path / "tiled.onnx"
    assert main(["optimize-graph", str(exported), "-o", str(out), "--memory-budget", "64"]) == 2
    err = capsys.readouterr().err
    assert "smallest" in err and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_memory_budget_into_a_new_folder_reports_the_model_written(tmp_path, capsys):
    from npukit.memory.layout import ort_predicted_peak
    from tests.memory.test_tiling import _stem_model

    source = tmp_path / "stem.onnx"
    onnx.save(_stem_model(), source)
    budget = ort_predicted_peak(source) * 2 // 3
    out = tmp_path / "new" / "tiled.onnx"
    assert main(["optimize-graph", str(source), "-o", str(out), "--memory-budget", str(budget)]) == 0
    written = onnx.load(out)
    report = json.loads(out.with_name("tiled.report.json").read_text())
    assert f"-> {len(written.graph.node)} nodes" in report["verdict"]  # the tiled file, not the untiled model
    assert f"within the budget of {budget:,}" in report["verdict"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiled.onnx", "tiled.report.json"]


def test_debug_is_taken_before_or_after_the_verb() -> None:
    parser = build_parser()
    assert parser.parse_args(["inspect", "m.onnx"]).debug is False
    assert parser.parse_args(["--debug", "inspect", "m.onnx"]).debug is True
    assert parser.parse_args(["inspect", "m.onnx", "--debug"]).debug is True


def test_compile_w4a16_writes_int4_weights_for_the_htp_and_refuses_what_it_cannot(exported, tmp_path, capsys):
    pytest.importorskip("onnxruntime_qnn")
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(6).standard_normal((8, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "tiny_w4.onnx"
    args = ["compile", str(exported), "--soc", "SM8650", "--calib", str(calib), "-o", str(out), "--task", "generic",
            "--min-sqnr", "5"]
    assert main(args + ["--weight-bits", "4"]) == 0
    report = json.loads(out.with_name("tiny_w4.report.json").read_text())
    assert report["config"]["weight_bits"] == 4 and report["results"]["compile"]["identical"]
    titles = [t["title"] for t in report["tables"]]
    assert any(t.startswith("Quantized for the HTP (int4 weights, uint16 activations") for t in titles)
    assert report["results"]["htp_quantization"]["gptq_nodes"] >= 1
    capsys.readouterr()
    assert main(args + ["--weight-bits", "4", "--mixed-precision", "-o", str(tmp_path / "x.onnx")]) == 2
    assert "does not take --weight-bits 4" in capsys.readouterr().err
    assert main(["compile", str(exported), "--soc", "SM8650", "--weight-bits", "4", "-o", str(tmp_path / "x.onnx")
                 ]) == 2
    assert "needs a float model and --calib" in capsys.readouterr().err
    assert main(["compile", str(exported), "--target", "litert", "--weight-bits", "4", "-o", str(tmp_path / "x.tflite")
                 ]) == 2
    assert "--weight-bits is for --target qnn-htp" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "x.tflite").exists()


def test_quantize_recipe_auto_reports_its_choice_and_refuses_recipe_flags(exported, tmp_path, capsys):
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(5).standard_normal((12, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "tiny.int8.onnx"
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(out), "--recipe", "auto",
                 "--float-stem", "off", "--runs", "2"]) == 0
    report = json.loads(out.with_name("tiny.int8.report.json").read_text())
    choice = report["results"]["steps"]["recipe"]
    assert set(choice["candidates"]) == {"plain", "equalized"} and choice["chosen"] in choice["candidates"]
    assert any(t["title"].startswith("Recipe chosen on 3 held-out") for t in report["tables"])
    capsys.readouterr()
    refused = tmp_path / "refused.onnx"
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(refused), "--recipe", "auto",
                 "--cle"]) == 2
    err = capsys.readouterr().err
    assert "--recipe auto chooses the recovery steps itself; --cle cannot be given with it" in err
    assert not refused.exists() and not refused.with_name("refused.report.json").exists()


def test_analyze_takes_a_pytorch_model_through_its_export(tmp_path, monkeypatch, capsys):
    """A PyTorch model is analyzed as its ONNX export (the same graph `npukit export` writes at that shape), the
    export recorded, and nothing left in the working directory."""
    monkeypatch.chdir(tmp_path)
    report_path = tmp_path / "r.json"
    assert main(["analyze", "tinynet:tiny", "--input-shape", "1,3,32,32", "--target", "executorch-xnnpack",
                 "--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    export = report["results"]["export"]
    assert export["from"] == "tinynet:tiny" and export["input_shape"] == [1, 3, 32, 32] and export["passed"]
    assert _files(tmp_path) == ["r.json"]
    assert main(["export", "tinynet:tiny", "--input-shape", "1,3,32,32", "-o", str(tmp_path / "t.onnx")]) == 0
    exported = onnx.load(str(tmp_path / "t.onnx"))
    analysis = report["results"]["analyses"][0]
    assert analysis["nodes_total"] == len(exported.graph.node)
    assert sorted(v["op_type"] for v in analysis["nodes"]) == sorted(n.op_type for n in exported.graph.node)


def test_analyze_refuses_weights_for_an_onnx_model(exported, tmp_path, capsys):
    assert main(["analyze", str(exported), "--target", "cpu", "--weights", str(tmp_path / "w.pt")]) == 2
    assert "--weights" in capsys.readouterr().err


@pytest.mark.parametrize("verb", [["devices", "--report"], ["inspect", "{model}", "--json"]])
def test_a_report_path_that_is_a_folder_is_refused_in_one_line(exported, tmp_path, capsys, verb):
    args = [a.replace("{model}", str(exported)) for a in verb] + [str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "is a folder" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_optimize_graph_s_graph_table_gives_the_files_sizes(exported, tmp_path):
    """The demo's table said +4.7 KiB (the in-memory model's serialized size, inferred shapes counted) for a file
    that shrank."""
    out = tmp_path / "opt.onnx"
    assert main(["optimize-graph", str(exported), "-o", str(out)]) == 0
    report = json.loads(out.with_name("opt.report.json").read_text())
    assert report["results"]["file_bytes"] == {"before": exported.stat().st_size, "after": out.stat().st_size}
    graph = next(t for t in report["tables"] if t["title"] == "Graph")
    assert any(row[0] == "file bytes" for row in graph["rows"])


def test_an_interrupted_run_keeps_what_it_resumes_from_and_no_empty_new_folder(tmp_path):
    from npukit.cli import _remove_new

    new, empty = tmp_path / "a" / "b", tmp_path / "c"
    new.mkdir(parents=True)
    empty.mkdir()
    (new / "m.onnx").write_text("artifact")
    (new / "m.qat.pt").write_text("checkpoint")
    before = {tmp_path / "a": False, new: False, new / "m.onnx": False, empty: False, tmp_path: True}
    _remove_new(before, keep_resume=True)
    assert sorted(p.name for p in new.iterdir()) == ["m.qat.pt"] and not empty.exists()
    _remove_new(before)  # a failed run takes every new folder whole
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    package = tmp_path / "m.mlpackage"  # a Core ML package is a folder, and an artifact: it goes whole
    (package / "Data").mkdir(parents=True)
    (package / "Manifest.json").write_text("{}")
    _remove_new({package: False}, keep_resume=True)
    assert not package.exists()


def test_a_ctrl_c_a_finalizer_swallowed_still_ends_the_run_as_interrupted(exported, tmp_path, monkeypatch, capsys):
    """Python ignores a KeyboardInterrupt raised inside a __del__ ("Exception ignored in ..."): the run went on and
    exited 0. The interrupt is recorded where it arrives, and the run ends as interrupted: exit 130, its new
    artifact and report removed."""
    import os
    import signal

    from npukit import cli

    real = cli.run

    def swallowed(args):
        code = real(args)
        try:
            os.kill(os.getpid(), signal.SIGINT)  # arrives, and a finalizer would swallow the KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        return code

    monkeypatch.setattr(cli, "run", swallowed)
    out = tmp_path / "o.onnx"
    assert main(["optimize-graph", str(exported), "-o", str(out)]) == 130
    assert "interrupted" in capsys.readouterr().err and not out.exists()
    assert not out.with_name("o.report.json").exists()


def test_sigterm_ends_the_run_as_interrupted_with_nothing_half_written(exported, tmp_path, monkeypatch, capsys):
    """SIGTERM (kill, timeout, a CI cancel) ended the process where it was: compile --soc left its EPContext model
    written and not yet checked at the output, or its temporary folder. It ends the run as Ctrl-C does: exit 143,
    the new artifact and report removed, the handler put back."""
    import os
    import signal

    from npukit import cli

    real = cli.run

    def terminated(args):
        real(args)  # the artifact written, then the signal (as while it is being checked)
        os.kill(os.getpid(), signal.SIGTERM)
        return 0

    monkeypatch.setattr(cli, "run", terminated)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "o.onnx"
    assert main(["optimize-graph", str(exported), "-o", str(out)]) == 143
    assert "terminated (SIGTERM); nothing was left half-written" in capsys.readouterr().err
    assert not out.exists() and not out.with_name("o.report.json").exists()
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_unknown_flag_points_at_the_verb_s_help(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "m.onnx"), "--bogus", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "npukit inspect: unrecognized arguments: --bogus 1. See `npukit inspect -h`" in err and "\n" not in err
    assert main(["--bogus"]) == 2  # no verb yet: the top-level usage
    assert "See `npukit -h`" in capsys.readouterr().err


def test_an_output_ending_in_a_slash_is_refused(exported, tmp_path, capsys):
    assert main(["optimize-graph", str(exported), "-o", str(tmp_path / "out" / "m.onnx") + "/"]) == 2
    err = capsys.readouterr().err.strip()
    assert "ends in a slash" in err and "\n" not in err, err
    assert list(tmp_path.iterdir()) == []


def _tiny_detector(path: Path) -> Path:
    """x[1, 3, 8, 8] -> YOLOv8's (1, 4 + 2, 64): fixed boxes on the 8x8 grid, class scores Sigmoid(4 * sum of the
    pixels' channels - 10): a black image scores 0.00005 everywhere (nothing detected), a white one 0.88."""
    from onnx import TensorProto, helper, numpy_helper

    grid = np.stack(np.meshgrid(np.arange(8) + 0.5, np.arange(8) + 0.5), 0).reshape(2, 64)
    boxes = np.concatenate([grid, np.full((2, 64), 2.0)], 0)[None].astype(np.float32)
    inits = [numpy_helper.from_array(np.full((2, 3, 1, 1), 4.0, np.float32), "w"),
             numpy_helper.from_array(np.full(2, -10.0, np.float32), "b"),
             numpy_helper.from_array(np.array([1, 2, 64], np.int64), "shape"),
             numpy_helper.from_array(boxes, "boxes")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Reshape", ["s", "shape"], ["scores"]),
             helper.make_node("Concat", ["boxes", "scores"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_data_on_which_the_float_detector_finds_nothing_is_refused_before_any_work(tmp_path, capsys):
    """A detector's check on images where the float model detects nothing would compare nothing (it passed on the
    SQNR floor): quantize and optimize refuse such data in one line, exit 2, nothing written; --task generic takes
    it (SQNR alone), and data with something to find passes the pre-check."""
    from npukit.verbs.common import check_task_measurable

    model = _tiny_detector(tmp_path / "det.onnx")
    black, white = tmp_path / "black.npy", tmp_path / "white.npy"
    np.save(black, np.zeros((8, 3, 8, 8), np.float32))
    np.save(white, np.ones((8, 3, 8, 8), np.float32))
    before = _files(tmp_path)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(model), "--calib", str(white), "--data", str(black), "--task", "detect",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the detect check would compare nothing on held-out data black.npy: the reference detected nothing" in err
    assert "--task generic" in err and _files(tmp_path) == before
    assert main(["optimize", str(model), "--data", str(black), "--trials", "1", "-o", str(tmp_path / "o.onnx")]) == 2
    assert "the detect check would compare nothing on the held-out samples (every 2nd sample of black.npy)" in \
        capsys.readouterr().err and _files(tmp_path) == before
    check_task_measurable(onnx.load(model), [{"x": np.ones((1, 3, 8, 8), np.float32)}], "detect", where="white")
    check_task_measurable(onnx.load(model), [{"x": np.zeros((1, 3, 8, 8), np.float32)}], "generic", where="black")


@pytest.mark.parametrize("verb", ["analyze", "inspect", "optimize-graph", "quantize", "plan-memory", "export",
                                  "compile"])
def test_a_compiled_context_model_is_refused_by_the_verbs_that_read_graphs(verb, tmp_path, capsys):
    """compile's EPContext output (one node holding the HTP's binary, its context bytes not text) given to a verb that
    reads the graph: analyze crashed on the bytes (internal error, exit 1), inspect said "1 nodes, 0 MACs", export
    copied it as a PASS; now one line, exit 2, nothing written."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft", source="QNNExecutionProvider",
                            ep_cache_context=b"\xb8\x00binary", embed_mode=1)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, 8, 8]) for n in ("x", "y")]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(helper.make_graph([node], "ctx", io[:1], io[1:]), opset_imports=opsets),
              str(tmp_path / "m.ctx.onnx"))
    np.save(tmp_path / "calib.npy", np.zeros((2, 3, 8, 8), np.float32))
    model, out = str(tmp_path / "m.ctx.onnx"), str(tmp_path / "out.onnx")
    args = {"analyze": ["--target", "qnn-htp", "-o", out, "--fix"], "inspect": [], "optimize-graph": ["-o", out],
            "quantize": ["-o", out, "--calib", str(tmp_path / "calib.npy")], "plan-memory": [],
            "export": ["-o", out], "compile": ["--soc", "SM8650", "-o", out, "--calib", str(tmp_path / "calib.npy")]}
    assert main([verb, model, *args[verb]]) == 2
    err = capsys.readouterr().err
    assert "compiled HTP context model" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.npy", "m.ctx.onnx"]


def _box_and_prob(box_scale: float) -> onnx.ModelProto:
    """x[1, 3, 8, 8] -> GAP features -> (box offsets [1, 4] scaled by ``box_scale``, face probabilities [1, 2])."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * scale, name)
             for name, shape, scale in (("w", (4, 3, 3, 3), 1.0), ("wp", (4, 2), 1.0), ("wb", (4, 4), box_scale))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]), helper.make_node("MatMul", ["f", "wb"], ["box"]),
             helper.make_node("MatMul", ["f", "wp"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["prob"], axis=1)]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, k]) for n, k in (("box", 4), ("prob", 2))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_bench_agreement_reads_the_class_scores_not_the_first_output(tmp_path) -> None:
    """MTCNN ONet's bench: the task check read the face probabilities (output 2; 36.0 dB, top-1 1.0), the Agreement
    table the box offsets (output 0; 13.4 dB, top-1 0.9), both called class figures."""
    reference, candidate = tmp_path / "ref.onnx", tmp_path / "cand.onnx"
    onnx.save(_box_and_prob(1.0), str(reference))
    onnx.save(_box_and_prob(1.5), str(candidate))  # other box offsets, the same probabilities
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(1).standard_normal((8, 3, 8, 8)).astype(np.float32))
    report = tmp_path / "b.json"
    main(["bench", str(candidate), "--reference", str(reference), "--data", str(data), "--runs", "3", "--report",
          str(report)])
    results = json.loads(report.read_text())["results"]
    assert results["agreement"]["top1_agreement"] == 1.0
    assert float(results["agreement"]["sqnr_db"]) == float("inf")  # the probabilities, identical (the boxes differ)


def _log_of_mean() -> onnx.ModelProto:
    """x[1, 3, 8, 8] -> Conv (3 -> 4) -> GlobalAveragePool -> Flatten -> Log -> y[1, 4]: NaN where a channel's mean
    is negative."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]), helper.make_node("Log", ["f"], ["y"])]
    graph = helper.make_graph(nodes, "log", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_float_model_giving_nan_is_refused_in_one_line(tmp_path, capsys) -> None:
    """quantize crashed in ORT's calibrator ('internal error: AssertionError: scale issue'); bench compared such a
    model with itself and advised a recovery recipe."""
    model = tmp_path / "log.onnx"
    onnx.save(_log_of_mean(), str(model))
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(1).standard_normal((8, 3, 8, 8)).astype(np.float32))
    assert main(["quantize", str(model), "--calib", str(data), "-o", str(tmp_path / "q.onnx"), "--runs", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "gives NaN" in err or "computes NaN" in err
    assert len(err.splitlines()) == 1
    assert main(["bench", str(model), "--reference", str(model), "--data", str(data), "--runs", "2"]) == 2
    assert "the float (reference) model gives NaN in output 'y'" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.onnx", "x.npy"]
    from npukit.quant.config import QuantConfig
    from npukit.quant.qdq import quantize as quantize_model  # calibration itself, where no check ran first

    with pytest.raises(InputError, match="computes NaN in tensor"):
        quantize_model(_log_of_mean(), [{"x": x[None]} for x in np.load(data)], config=QuantConfig())


def test_too_few_calibration_samples_to_check_on_are_refused_unless_held_out_data_is_given(exported, tmp_path,
                                                                                          capsys) -> None:
    """MTCNN ONet fitted to 4 crops PASSed on them at 30 dB (exit 0) and gave 11.7 dB on 30 held-out crops; fitted to
    1, 29.5 and 5.9 dB; compile for the HTP likewise."""
    calib, held = tmp_path / "four.npy", tmp_path / "held.npy"
    rng = np.random.default_rng(7)
    np.save(calib, rng.standard_normal((4, 3, 32, 32)).astype(np.float32))
    np.save(held, rng.standard_normal((6, 3, 32, 32)).astype(np.float32))
    assert main(["quantize", str(exported), "--calib", str(calib), "-o", str(tmp_path / "q.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert "4 calibration sample(s): too few" in err and "--data with held-out samples" in err
    assert main(["compile", str(exported), "--soc", "SM8650", "--calib", str(calib), "-o",
                 str(tmp_path / "c.onnx")]) == 2
    assert "give at least 8 calibration samples, or --data with held-out" in capsys.readouterr().err  # compile too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["four.npy", "held.npy"]
    # held-out data checks what the grids do on other inputs: calibrating on few is the user's call, and checked
    assert main(["quantize", str(exported), "--calib", str(calib), "--data", str(held), "-o",
                 str(tmp_path / "q.onnx"), "--runs", "2"]) in (0, 1)


def test_bench_says_what_is_missing_for_a_check(exported, tmp_path) -> None:
    """bench --reference without --data said "no data and reference given" though a reference was."""
    report = tmp_path / "b.json"
    for extra, said in ((["--reference", str(exported)], "no --data given to check it against the reference on"),
                        ([], "no data and reference given")):
        assert main(["bench", str(exported), "--runs", "2", "--report", str(report), *extra]) == 0
        verdict = json.loads(report.read_text())["verdict"]
        assert verdict.startswith("MEASURED bench: ") and said in verdict


def test_an_internal_error_leaves_nothing_half_written_with_debug_too(tmp_path, monkeypatch):
    """An npukit bug after the artifact was written: the new file is removed, with --debug as without (a .pte that
    failed to load was left beside no report under --debug)."""
    import npukit.verbs.export as export_verb

    def broken(report, output, **kwargs):
        raise RuntimeError("a bug after writing")

    monkeypatch.setattr(export_verb, "finish", broken)
    out = tmp_path / "m.onnx"
    for debug in ([], ["--debug"]):
        try:
            code = main([*debug, "export", "tinynet:tiny", "-o", str(out), "--input-shape", "1,3,32,32"])
        except RuntimeError:
            code = "raised"
        assert code == ("raised" if debug else 1)
        assert list(tmp_path.iterdir()) == []


def test_debug_prints_the_traceback_and_keeps_the_exit_code(tmp_path, capsys):
    text = tmp_path / "m.txt"
    text.write_text("not a model")
    assert main(["inspect", str(text)]) == 2
    plain = capsys.readouterr().err
    assert main(["--debug", "inspect", str(text)]) == 2  # not 1, as an uncaught exception would give
    err = capsys.readouterr().err
    assert "Traceback" in err and plain.strip().splitlines()[-1] in err


def test_analyze_predicts_the_mobile_targets_on_the_graph_compile_runs(tmp_path):
    """An ONNX model's shape arithmetic (Shape, Gather, Range... on a symbolic input) folds away at the fixed input
    shape in the torch program compile builds; analyze counted it as LiteRT / ExecuTorch fallbacks (YOLOv8n)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "two"], ["nc"]),
             helper.make_node("Concat", ["nc", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["r", "target"], ["flat"]),
             helper.make_node("ReduceMean", ["flat", "last"], ["m"], keepdims=0),
             helper.make_node("ConstantOfShape", ["shape2"], ["ones"],  # the program computes it outside tracing
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
             helper.make_node("Add", ["m", "ones"], ["y"])]
    ints = [helper.make_tensor(n, TensorProto.INT64, [len(v)], v)
            for n, v in (("zero", [0]), ("two", [2]), ("minus1", [-1]), ("last", [2]), ("shape2", [1, 3]))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], ints)
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), model)
    report = tmp_path / "a.json"
    assert main(["analyze", str(model), "--input-shape", "1,3,8,8", "--target", "litert", "--target", "cpu",
                 "--report", str(report)]) == 0
    analyses = {a["target"]: a for a in json.loads(report.read_text())["results"]["analyses"]}
    litert = analyses["litert"]
    ops = {n["op_type"] for n in litert["nodes"]}
    assert ops == {"Relu", "Reshape", "ReduceMean", "Add"}, ops
    assert any("graph compile runs as a torch program" in n for n in litert["notes"])
    assert not any("torch program" in n for n in analyses["cpu"]["notes"])  # ORT's own targets read the graph as is


def test_analyze_says_what_compile_builds_for_the_mobile_targets(exported, tmp_path):
    report = tmp_path / "a.json"
    assert main(["analyze", str(exported), "--target", "coreml", "--target", "cpu", "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    notes = data["results"]["compile_notes"]
    assert set(notes) == {"coreml"} and "as a torch program" in notes["coreml"] and "coremltools" in notes["coreml"]
    # a float model on the HTP: analyze counts its fp16 path, compile quantizes (and refuses without --calib)
    assert main(["analyze", str(exported), "--target", "qnn-htp@SM8650", "--report", str(report)]) == 0
    notes = json.loads(report.read_text())["results"]["compile_notes"]
    assert "fp16 path" in notes["qnn-htp@SM8650"] and "--calib" in notes["qnn-htp@SM8650"]
    assert data["verdict"].startswith("INFO analyze") and "coreml" in data["verdict"]


def test_calibration_samples_all_one_input_are_refused_before_any_work(exported, tmp_path, capsys):
    """An array of zeros as --calib with varied --data: every grid fitted to zeros, and the held-out check FAILed with
    the recovery recipe as its hint (PP-OCR cls: 0.786 agreement, 3.4 dB). Now one line, exit 2, nothing written."""
    zeros, varied = tmp_path / "zeros.npy", tmp_path / "varied.npy"
    np.save(zeros, np.zeros((8, 3, 32, 32), np.float32))
    np.save(varied, np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32))
    before = _files(tmp_path)
    assert main(["quantize", str(exported), "--calib", str(zeros), "--data", str(varied), "-o",
                 str(tmp_path / "q.onnx")]) == 2
    err = capsys.readouterr().err
    assert "are all one input (input all 0)" in err and len(err.strip().splitlines()) == 1, err
    assert _files(tmp_path) == before
    assert main(["optimize", str(exported), "--calib", str(zeros), "--data", str(varied), "--trials", "1", "-o",
                 str(tmp_path / "o.onnx")]) == 2
    assert "are all one input" in capsys.readouterr().err and _files(tmp_path) == before
    # qat trained on them (exit 0: its held-out fifth, zeros too, passed), or calibrated on them
    for args, said in ((["qat", "--data", str(zeros)], "the training samples of zeros.npy"),
                       (["qat", "--data", str(varied), "--calib", str(zeros)], "calibration samples of zeros.npy"),
                       (["qat", "--data", str(varied), "--eval", str(zeros)], "the check samples of zeros.npy")):
        assert main([args[0], str(exported)] + args[1:] + ["-o", str(tmp_path / "o.onnx")]) == 2, args
        err = capsys.readouterr().err
        assert said in err and "are all one input" in err and len(err.strip().splitlines()) == 1, err
        assert _files(tmp_path) == before


def test_every_verb_that_reads_images_takes_the_image_flags(exported, tmp_path, monkeypatch):
    """qat, prune, substitute, optimize and serve-bench read image folders but had no --size / --mean / --std (their
    reports said those flags change the preprocessing): MTCNN ONet, which takes [-1, 1], was trained and checked on
    ImageNet's normalization. Each verb now passes them on as quantize, bench and compile do."""
    from npukit import api
    from npukit.errors import InputError

    seen = {}

    def records(verb):
        def call(*args, **kwargs):
            seen[verb] = kwargs.get("preprocess")
            raise InputError("stop here", hint="a test")
        return call

    flags = ["--size", "48", "--resize", "48", "--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5"]
    out = ["-o", str(tmp_path / "o.onnx")]
    for verb, args in (("qat", ["--data", "d"] + out), ("prune", ["--data", "d", "--sparsity", "0.5"] + out),
                       ("substitute", ["--data", "d", "--rule", "hardswish_to_relu6"] + out),
                       ("optimize", ["--data", "d"] + out), ("serve-bench", [])):
        monkeypatch.setattr(api, verb.replace("-", "_"), records(verb))
        assert main([verb, str(exported)] + args + flags) == 2, verb
        config = seen[verb]
        assert (config.size, config.resize, config.mean, config.std) == (48, 48, (0.5,) * 3, (0.5,) * 3), verb
