"""The third-party zoo benchmark's bookkeeping: one verb run in an empty folder, the summary's silent-failure count,
and the table it writes. (The zoo's models need scripts/setup_zoo.sh; none is needed here.)"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ._load import load_benchmark

tpz = load_benchmark("third_party_zoo")


def _tiny(path) -> None:
    w = numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="c")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_verb_runs_in_an_empty_folder_and_its_line_is_kept(tmp_path) -> None:
    model, user = tmp_path / "m.onnx", tmp_path / "user"
    user.mkdir()
    _tiny(model)
    step = tpz._run("inspect", ["inspect", str(model)], cwd=user, report=None, timeout=120)
    assert step.exit_code == 0 and step.line.startswith("INFO inspect") and step.stray_files == []
    bad = tpz._run("inspect", ["inspect", str(tmp_path / "absent.onnx")], cwd=user, report=None, timeout=120)
    assert bad.exit_code == 2 and bad.line.startswith("error:")


def _step(verb: str, code: int, task: str | None = None, value: float | None = None, line: str = "PASS") -> dict:
    return {"verb": verb, "exit_code": code, "seconds": 1.0, "line": line, "task": task, "metric": "m",
            "value": value, "worst_sqnr_db": 30.0, "stray_files": [], "skipped": ""}


def test_the_summary_counts_silent_failures_and_the_table_is_written(tmp_path) -> None:
    rows = [{"name": "det", "task": "detect", "steps": [_step("quantize", 0, "detect", 0.5),
                                                       _step("compile", 1, "detect", 0.2, "FAIL compile"),
                                                       _step("bench", 0, "detect", 0.4, "DEGRADED (accepted)")]},
            {"name": "cls", "task": "classify", "steps": [_step("quantize", 0, "classify", 0.95),
                                                         _step("compile", 2, line="error: x")]}]
    summary = tpz.summarize(rows)
    assert summary["exit_0_below_target"] == ["det quantize"]  # exit 0 below its target: the bug to hunt
    assert (summary["exit_0"], summary["exit_1"], summary["exit_2"]) == (3, 1, 1)
    assert (summary["compile_ok"], summary["compile_runs"]) == (0, 2)
    doc = {"cpu": "cpu", "date": "d", "commit": "c", "soc": "SM8650", "rows": rows, "summary": summary}
    json_path, md_path = tpz.write_results(doc, tmp_path, stem="z")
    assert json.loads(json_path.read_text())["summary"] == summary
    assert "| det | detect | quantize | 0 |" in md_path.read_text()
