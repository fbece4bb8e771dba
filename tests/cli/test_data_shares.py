"""A share of the data a verb reads (``--calib-samples``, ``--max-samples``, held-out parts) is spread over it: data
sorted by class would otherwise calibrate or check on its first classes only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from npukit.cli import main


def _sorted_by_class(path: Path, classes: int = 4, per_class: int = 8) -> np.ndarray:
    """Samples sorted by class, class k at (k + 1)^2 times the scale of class 0."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal((per_class, 3, 32, 32)).astype(np.float32) * (k + 1) ** 2
                        for k in range(classes)])
    np.savez(path, input=x, labels=np.repeat(np.arange(classes), per_class))
    return x


def _input_scale(model: Path) -> float:
    proto = onnx.load(str(model))
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    source = proto.graph.input[0].name
    q = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == source)
    return float(inits[q.input[1]])


def test_calib_samples_of_data_sorted_by_class_are_spread_over_every_class(exported, tmp_path):
    x = _sorted_by_class(tmp_path / "sorted.npz")
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(exported), "--calib", str(tmp_path / "sorted.npz"), "--calib-samples", "8",
                 "--data", str(tmp_path / "sorted.npz"), "--method", "minmax", "--task", "generic", "--runs", "2",
                 "--float-stem", "off",
                 "-o", str(out)]) in (0, 1)
    report = json.loads(out.with_name("q.report.json").read_text())
    assert report["config"]["calib"].endswith("sorted.npz (8 of its 32 samples, spread evenly)")
    assert report["results"]["steps"]["calibration"]["samples"] == 8
    # the input's grid covers the last class (16x the first's scale), not the first 8 samples (the first class)
    first_class = float(np.abs(x[:8]).max())
    assert _input_scale(out) * 255 > 8 * first_class


def test_bench_max_samples_reads_them_spread_and_says_so(exported, tmp_path):
    _sorted_by_class(tmp_path / "sorted.npz")
    report_path = tmp_path / "bench.json"
    assert main(["bench", str(exported), "--reference", str(exported), "--data", str(tmp_path / "sorted.npz"),
                 "--max-samples", "4", "--task", "generic", "--runs", "2", "--report", str(report_path)]) == 0
    check = json.loads(report_path.read_text())["results"]["task_check"]
    assert check["where"] == "4 samples (spread over its 32) of sorted.npz"
