"""npukit substitute end to end on a small CNN with a HardSwish: HardSwish -> ReLU6 changes what the model
computes, distillation fine-tuning from the original wins back part of it (measured before and after on held-out
samples), an exact substitution is checked without fine-tuning, a degraded result exits 1, bad input exits 2 and
writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from npukit.cli import main
from tests.pruning.test_channels import PruneNet


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("substitute_cli")
    torch.manual_seed(0)
    path = folder / "net.onnx"
    torch.onnx.export(PruneNet().eval(), torch.zeros(1, 3, 32, 32), str(path), input_names=["x"], dynamo=False,
                      opset_version=17)
    rng = np.random.default_rng(5)
    np.save(folder / "data.npy", (3 * rng.standard_normal((60, 3, 32, 32))).astype(np.float32))
    return path


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_hardswish_to_relu6_is_measured_and_recovered_by_fine_tuning(net, tmp_path) -> None:
    out = tmp_path / "relu6.onnx"
    args = ["substitute", str(net), "-o", str(out), "--data", str(net.with_name("data.npy")), "--rule",
            "hardswish_to_relu6", "--epochs", "4", "--runs", "3", "--min-sqnr", "0",
            "--min-task-metric", "0"]
    assert main(args) == 0
    assert _files(tmp_path) == ["relu6.onnx", "relu6.report.json"]  # no checkpoint left
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "HardSwish" not in ops and "HardSigmoid" not in ops and "Clip" in ops
    report = json.loads((tmp_path / "relu6.report.json").read_text())
    assert report["passed"] and report["verdict"].startswith("PASS substitute")
    results = report["results"]
    assert [(a["fix"], a["exact"], a["rewrites"]) for a in results["substitutions"]] == [
        ("hardswish_to_relu6", False, 1)]
    worst = {k: min(o["sqnr_db"] for o in v["outputs"]) for k, v in results["comparison"].items()}
    assert set(worst) == {"substituted", "fine-tuned"}
    assert worst["fine-tuned"] > worst["substituted"] + 2.0, worst  # recovered: +4.6 to +4.7 dB over 3 data seeds
    assert any(t["title"].startswith("Substitutions applied") for t in report["tables"])
    # blended in over the first half of the steps (--ramp 0.5, the default): the start is judged whole, then the
    # share rises; only epochs with the substitute whole are kept
    training = results["training"]
    assert "skipped" not in training and "train" in report["timings_s"]  # inexact: fine-tuned
    assert report["config"]["ramp"] == 0.5 and training["start"]["share"] == 1.0
    assert [e["share"] for e in training["history"]] == [0.5, 1.0, 1.0, 1.0]
    assert training["kept_epoch"] in (0, 2, 3, 4)
    table = next(t for t in report["tables"] if t["title"].startswith("Training"))
    assert "substitute's share" in table["columns"]


def _no_training(monkeypatch) -> None:
    from npukit.quant.qat.train import Trainer

    def refuse(*args, **kwargs):
        raise AssertionError("an exact substitution was fine-tuned")

    monkeypatch.setattr(Trainer, "__init__", refuse)


def test_an_exact_substitution_is_checked_without_fine_tuning(net, tmp_path, monkeypatch) -> None:
    """HardSwish -> x * Clip(x + 3, 0, 6) / 6 computes the same function: nothing to recover, so no training (it
    cost about 26 s and claimed a recovery); the substituted model is written and the verdict is its own task check
    on the held-out samples, measured as the fine-tuned model's is."""
    _no_training(monkeypatch)
    out = tmp_path / "clip.onnx"
    assert main(["substitute", str(net), "-o", str(out), "--data", str(net.with_name("data.npy")), "--rule",
                 "hardswish_to_clip", "--runs", "3", "--html"]) == 0
    assert _files(tmp_path) == ["clip.onnx", "clip.report.html", "clip.report.json"]  # no checkpoint
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "HardSwish" not in ops and "Clip" in ops
    report = json.loads((tmp_path / "clip.report.json").read_text())
    assert report["passed"]
    assert report["verdict"].startswith("PASS substitute without fine-tuning (every substitution is exact): task ")
    results = report["results"]
    assert [(a["fix"], a["exact"]) for a in results["substitutions"]] == [("hardswish_to_clip", True)]
    assert results["training"]["skipped"] == "every substitution is exact" and results["training"]["history"] == []
    assert "train" not in report["timings_s"] and "check_substituted" in report["timings_s"]
    assert set(results["comparison"]) == {"substituted"}
    worst = min(o["sqnr_db"] for o in results["comparison"]["substituted"]["outputs"])
    assert worst > 80, worst  # float rounding alone: 132.9 dB
    assert results["task_check"]["result"] == results["comparison"]["substituted"]
    titles = [t["title"] for t in report["tables"]]
    assert "Training: none (every substitution is exact)" in titles
    table = next(t for t in report["tables"] if t["title"].startswith("Float and substituted on the held-out"))
    assert "not fine-tuned: every substitution is exact" in table["title"]
    assert [row[0] for row in table["rows"]] == ["float", "substituted"]
    assert table["rows"][1][table["columns"].index("median ms")] is not None  # the substituted model timed


def test_an_exact_substitution_below_the_floor_exits_1(net, tmp_path, monkeypatch) -> None:
    _no_training(monkeypatch)
    out = tmp_path / "clip.onnx"
    assert main(["substitute", str(net), "-o", str(out), "--data", str(net.with_name("data.npy")), "--rule",
                 "hardswish_to_clip", "--runs", "3", "--task", "generic", "--min-sqnr", "300"]) == 1
    report = json.loads((tmp_path / "clip.report.json").read_text())
    assert not report["passed"] and report["verdict"].startswith("FAIL substitute without fine-tuning")
    assert "only float rounding separates the models" in report["verdict"]


def test_an_exact_substitution_under_torchrun_is_written_by_process_0_only(net, tmp_path, monkeypatch) -> None:
    _no_training(monkeypatch)
    monkeypatch.setenv("RANK", "1")
    assert main(["substitute", str(net), "-o", str(tmp_path / "clip.onnx"), "--data",
                 str(net.with_name("data.npy")), "--rule", "hardswish_to_clip", "--runs", "3"]) == 0
    assert _files(tmp_path) == []


def test_ramp_0_fine_tunes_the_substituted_model_from_the_first_step(net, tmp_path) -> None:
    out = tmp_path / "relu6.onnx"
    assert main(["substitute", str(net), "-o", str(out), "--data", str(net.with_name("data.npy")), "--rule",
                 "hardswish_to_relu6", "--epochs", "1", "--max-steps", "2", "--runs", "3", "--ramp", "0",
                 "--accept-degraded"]) == 0
    training = json.loads((tmp_path / "relu6.report.json").read_text())["results"]["training"]
    assert [e["share"] for e in training["history"]] == [None]
    assert main(["substitute", str(net), "-o", str(tmp_path / "x.onnx"), "--data", str(net.with_name("data.npy")),
                 "--rule", "hardswish_to_relu6", "--ramp", "1.5"]) == 2
    assert not (tmp_path / "x.onnx").exists()


def test_a_result_below_the_floor_exits_1(net, tmp_path) -> None:
    out = tmp_path / "relu6.onnx"
    assert main(["substitute", str(net), "-o", str(out), "--data", str(net.with_name("data.npy")), "--rule",
                 "hardswish_to_relu6", "--epochs", "1", "--max-steps", "1", "--runs", "3", "--task", "generic",
                 "--min-sqnr", "80"]) == 1
    report = json.loads((tmp_path / "relu6.report.json").read_text())
    assert not report["passed"] and report["verdict"].startswith("FAIL substitute")


@pytest.mark.parametrize("rule, message", [
    ("relu_to_anything", "unknown substitution relu_to_anything"),
    ("groupnorm_to_instancenorm", "nothing to substitute for groupnorm_to_instancenorm: the model has no node "
                                  "GroupNormalization"),
])
def test_bad_input_exits_2_and_writes_nothing(net, tmp_path, capsys, rule, message) -> None:
    out = tmp_path / "out.onnx"
    assert main(["substitute", str(net), "-o", str(out), "--data", str(net.with_name("data.npy")), "--rule",
                 rule]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
    assert _files(tmp_path) == []


def test_notes_of_nodes_kept_for_one_reason_are_said_once() -> None:
    """PP-OCRv4's recognizer: ten ReduceMeans kept for one reason were ten copies of one sentence in the table."""
    from npukit.report.prune import grouped_notes

    notes = [f"ReduceMean 'p2o.ReduceMean.{i}' is kept: input rank unknown" for i in range(10)]
    assert grouped_notes(notes + ["HardSwish written out made one node"]) == [
        "ReduceMean x10 ('p2o.ReduceMean.0', 'p2o.ReduceMean.1', ...) kept: input rank unknown",
        "HardSwish written out made one node"]
    assert grouped_notes(notes[:1]) == notes[:1]


def test_timing_whose_side_by_side_runs_disagree_is_said_to_be_noisy() -> None:
    """A helper's prune with --runs 3 on a busy machine: float [21.9, 39.4, 43.3] ms against pruned [19.9, 19.9,
    45.3]: a 0.51x median ratio that a quiet 15-round timing put at 0.94x. The table says the ratio is noise."""
    from types import SimpleNamespace

    from npukit.report.qat import noisy_timing

    note = noisy_timing(SimpleNamespace(times_ms=(21.9, 39.4, 43.3)), SimpleNamespace(times_ms=(19.9, 19.9, 45.3)))
    assert "ratios 0.51-1.05 over 3 runs" in note
    assert noisy_timing(SimpleNamespace(times_ms=(10.0, 10.5, 9.8)), SimpleNamespace(times_ms=(9.0, 9.4, 9.1))) == ""
