"""npukit qat end to end on a tiny CNN: a trained artifact that passes its checks, with the PTQ model of the same bits
beside it, the export check and the training in the report; 4-bit weights stored as int4; an interrupted run
continued from its checkpoint; bad input (exit 2, nothing written)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from npukit.cli import main

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qat")
    out = folder / "tiny.onnx"
    sys.path.insert(0, str(HERE))
    try:
        assert main(["export", "tinynet:tiny", "-o", str(out), "--input-shape", "1,3,32,32"]) == 0
    finally:
        sys.path.remove(str(HERE))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 3, 32, 32)).astype(np.float32)
    np.savez(folder / "train.npz", input=x, labels=rng.integers(0, 10, 40))
    np.save(folder / "held.npy", rng.standard_normal((12, 3, 32, 32)).astype(np.float32))
    bad = x.copy()
    bad[3, 0, 0, 0] = np.nan
    np.save(folder / "nan.npy", bad)
    np.save(folder / "wrong.npy", x[:, :, :16, :16])
    np.savez(folder / "badlabels.npz", input=x, labels=np.full(40, 12))  # TinyNet has 10 classes
    return out


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _input(tiny: Path) -> str:
    return onnx.load(str(tiny)).graph.input[0].name


def test_qat_writes_a_checked_artifact_beside_the_ptq_model(tiny, tmp_path) -> None:
    out = tmp_path / "tiny.qat.onnx"
    args = ["qat", str(tiny), "-o", str(out), "--data", str(tiny.with_name("held.npy")), "--epochs", "2",
            "--runs", "3", "--method", "minmax", "--html"]
    assert main(args) == 0
    assert _files(tmp_path) == ["tiny.qat.onnx", "tiny.qat.report.html", "tiny.qat.report.json"]  # no checkpoint
    report = json.loads((tmp_path / "tiny.qat.report.json").read_text())
    assert report["passed"] and report["verdict"].startswith("PASS qat")
    results = report["results"]
    assert [e["epoch"] for e in results["training"]["history"]] == [1, 2]
    assert results["export_check"]["exact"] and results["export_check"]["layers"] >= 3
    assert set(results["comparison"]) == {"PTQ", "QAT"}
    # the same graph on other weights: the PTQ model measured as the file it would be, as the artifact is (the
    # proto in memory lacks the shape annotations onnx-ir writes: ppocr_cls's PTQ looked 14 KiB smaller)
    assert results["size"]["QAT"] == out.stat().st_size
    assert abs(results["size"]["PTQ"] - results["size"]["QAT"]) <= 16, results["size"]
    assert report["config"]["samples"]["held_out"] == 2  # the last fifth of 12 samples, never trained on
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in onnx.load(str(out)).graph.node}


def test_four_bit_weights_are_int4_and_an_interrupted_run_continues(tiny, tmp_path, monkeypatch, capsys) -> None:
    from npukit.quant.qat import train

    out = tmp_path / "new" / "w4.onnx"  # a folder the run makes: Ctrl-C took it whole, checkpoint and all
    args = ["qat", str(tiny), "-o", str(out), "--data", str(tiny.with_name("held.npy")), "--bits", "w4a8",
            "--epochs", "3", "--runs", "3", "--method", "minmax", "--lr", "1e-3", "--accept-degraded",
            "--eight-bit-share", "0.5", "--bits-schedule", "6,4"]
    real_save = train.Trainer.save

    def save_then_stop(self):
        real_save(self)
        if self.epoch == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(train.Trainer, "save", save_then_stop)
    assert main(args) == 130
    assert "run the same command again to continue" in capsys.readouterr().err
    assert _files(tmp_path / "new") == ["w4.qat.pt"]  # the last finished epoch, nothing else
    monkeypatch.setattr(train.Trainer, "save", real_save)

    def no_second_ptq(*args, **kwargs):  # the start comes from the checkpoint (a timed float head may differ)
        raise AssertionError("the PTQ start was built again")

    monkeypatch.setattr("npukit.quant.qdq.quantize", no_second_ptq)
    assert main(args) == 0
    report = json.loads((tmp_path / "new" / "w4.report.json").read_text())
    assert report["results"]["training"]["resumed_from_epoch"] == 2
    assert "resumed_start" in report["results"]
    # the opset-18 model was converted for int4 before the start was built: the resumed report says so as well
    upgrade = report["results"]["opset_upgrade"]
    assert (upgrade["from_opset"], upgrade["to_opset"], upgrade["reason"]) == (18, 21, "int4 weights")
    table = next(t for t in report["tables"] if t["title"].startswith("Opset upgrade"))
    assert table["rows"][0][:3] == [18, 21, "int4 weights"]
    assert [e["bits"] for e in report["results"]["training"]["history"]] == [6, 6, 4]  # one step an epoch
    # lowered by GPTQ before the first step and at the change (the second across the resume), and for the baseline
    assert [lowering["bits"] for lowering in report["results"]["training"]["lowered"]] == [6, 4]
    assert report["results"]["lowering"]["bits"] == 4
    model = onnx.load(str(out))
    assert any(i.data_type == onnx.TensorProto.INT4 for i in model.graph.initializer)
    plan = report["results"]["bit_plan"]  # the most sensitive weights kept 8 bits: stored as int8
    kept = [layer["tensor"].removesuffix("__float") for layer in plan["layers"] if layer["bits"] == 8]
    assert kept and 0 < plan["kept_share"] <= 0.5 and any(layer["bits"] == 4 for layer in plan["layers"])
    stored = {i.name: i.data_type for i in model.graph.initializer}
    assert all(stored[name] == onnx.TensorProto.INT8 for name in kept), kept
    assert report["results"]["export_check"]["exact"]
    assert "w4.qat.pt" not in _files(tmp_path / "new")


def test_the_default_schedule_lowers_the_weights_once_for_the_baseline_and_the_start(tiny, tmp_path,
                                                                                      monkeypatch) -> None:
    """Training starts at the final bits: the PTQ baseline's lowering (GPTQ, the longest step before training) is
    the start's, not computed a second time."""
    from npukit.quant.qat import lower

    calls = []
    real = lower.lower_weights

    def counted(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(lower, "lower_weights", counted)
    out = tmp_path / "w4.onnx"
    assert main(["qat", str(tiny), "-o", str(out), "--data", str(tiny.with_name("held.npy")), "--bits", "w4a8",
                 "--epochs", "1", "--runs", "3", "--method", "minmax", "--accept-degraded"]) == 0
    report = json.loads((tmp_path / "w4.report.json").read_text())
    assert calls == [4]
    assert [lowering["bits"] for lowering in report["results"]["training"]["lowered"]] == [4]
    assert report["results"]["lowering"] == report["results"]["training"]["lowered"][0]
    assert report["results"]["training"]["start"]["bits"] == 4


@pytest.mark.parametrize("extra, message", [
    (["--data", "{folder}/none.npy"], "none.npy"),
    (["--data", "{folder}/nan.npy"], "NaN"),
    (["--data", "{folder}/wrong.npy"], "16"),
    (["--data", "{folder}/held.npy", "--bits-schedule", "4,8"], "schedule"),
    (["--data", "{folder}/held.npy", "--epochs", "0"], "at least 1"),
    (["--data", "{folder}/held.npy", "--bits", "w4a8", "--eight-bit-share", "1.5"], "8-bit share 1.5"),
    (["--data", "{folder}/badlabels.npz", "--epochs", "1"], "label 12 is not one of the model's 10 classes"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tiny, tmp_path, capsys, extra, message) -> None:
    extra = [e.format(folder=tiny.parent) for e in extra]
    assert main(["qat", str(tiny), "-o", str(tmp_path / "out.onnx")] + extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2
    assert _files(tmp_path) == []


def test_a_quantized_model_is_refused(tiny, tmp_path, capsys) -> None:
    qdq = tmp_path / "q.onnx"
    assert main(["quantize", str(tiny), "-o", str(qdq), "--calib", str(tiny.with_name("held.npy")),
                 "--method", "minmax", "--runs", "2"]) in (0, 1)
    assert main(["qat", str(qdq), "-o", str(tmp_path / "again.onnx"), "--data",
                 str(tiny.with_name("held.npy"))]) == 2
    assert "already quantized" in capsys.readouterr().err


def test_inputs_without_a_batch_axis_are_refused_before_training() -> None:
    """Silero VAD's scalar sample rate crashed np.concatenate (internal error, exit 1); its state [2, 1, 128] is
    batched on axis 1."""
    import numpy as np

    from npukit.errors import InputError
    from npukit.verbs.qat import _require_batch_axis

    _require_batch_axis({"x": np.zeros((1, 3, 8, 8), np.float32)})
    with pytest.raises(InputError, match="'sr' is a scalar"):
        _require_batch_axis({"x": np.zeros((1, 576), np.float32), "sr": np.array(16000)})
    with pytest.raises(InputError, match=r"'state' is shaped \[2, 1, 128\] per sample"):
        _require_batch_axis({"state": np.zeros((2, 1, 128), np.float32)})


def test_a_failing_runs_hint_fits_what_happened() -> None:
    """Training that left the model worse than its PTQ start is not told to train longer, and a w8a8 run is not told
    to try 8-bit weights (a helper's 9-sample YOLOX run: map50 0.983 -> 0.349, hint 'train longer ... --bits w8a8')."""
    from types import SimpleNamespace

    from npukit.verbs.qat import _hint

    def rows(ptq: float, qat: float) -> dict:
        return {"PTQ": SimpleNamespace(value=ptq, metric="map50"), "QAT": SimpleNamespace(value=qat, metric="map50")}

    worse = _hint(rows(0.983, 0.349), SimpleNamespace(weight_bits=8))
    assert "worse than its PTQ start (map50 0.983 -> 0.349)" in worse and "train longer" not in worse
    assert "--bits w8a8" not in worse
    assert _hint(rows(0.5, 0.7), SimpleNamespace(weight_bits=4)).startswith("train longer (--epochs)")
    assert _hint(rows(0.5, 0.7), SimpleNamespace(weight_bits=4)).endswith("or 8-bit weights (--bits w8a8)")


def test_eval_data_that_is_the_training_data_is_not_called_held_out(tmp_path) -> None:
    """--eval naming the --data file: the check reads samples the model was trained on, and says so."""
    import numpy as np

    from npukit.config import PreprocessConfig
    from npukit.verbs.qat import TrainingSamples
    from tests.quant.conftest import tiny_cnn

    data = tmp_path / "d.npy"
    np.save(data, np.random.default_rng(0).standard_normal((12, 4, 8, 8)).astype(np.float32))
    proto = tiny_cnn(activation="Relu")
    samples = TrainingSamples.open(proto, data, data, None, PreprocessConfig(), None)
    assert samples.held_from.startswith("d.npy, the training data again (--eval is --data: optimistic")
    other = tmp_path / "e.npy"
    np.save(other, np.random.default_rng(1).standard_normal((4, 4, 8, 8)).astype(np.float32))
    assert TrainingSamples.open(proto, data, other, None, PreprocessConfig(), None).held_from == "held-out data e.npy"
