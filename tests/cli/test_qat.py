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
    assert report["config"]["samples"]["held_out"] == 2  # every 5th of 12 samples, never trained on
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
    (["--data", "{folder}/held.npy", "--bits", "w8a8", "--eight-bit-share", "0.2"], "has every weight at 8 bits"),
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


def test_a_classifier_ending_in_softmax_is_trained_on_its_logits(tmp_path) -> None:
    """The student's 8-bit probabilities are exactly 0 below half a step, where no loss on them has a gradient
    (MTCNN ONet: a validation loss of 7.011 that no epoch moved): qat distils on the logits the Softmax reads, in the
    twin (its quantized logits) and in the float model, as prune and substitute do."""
    from onnx import helper

    from tests.quant.conftest import tiny_cnn

    model = tiny_cnn()
    model.graph.output[0].name = "p"
    model.graph.node.append(helper.make_node("Softmax", ["y"], ["p"], name="softmax", axis=-1))
    onnx.save(model, tmp_path / "soft.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((30, 4, 8, 8)).astype(np.float32))
    out = tmp_path / "soft.qat.onnx"
    assert main(["qat", str(tmp_path / "soft.onnx"), "-o", str(out), "--data", str(tmp_path / "x.npy"), "--epochs",
                 "1", "--runs", "2", "--method", "minmax", "--accept-degraded"]) == 0
    results = json.loads((tmp_path / "soft.qat.report.json").read_text())["results"]
    distilled = results["distilled_on"]
    assert distilled["output"] == 0 and distilled["teacher"] == "y" and distilled["student"] not in ("p", "y")


@pytest.mark.parametrize("flipped", ["held-out", "validation"])
def test_the_model_written_is_chosen_on_the_validation_samples_not_the_check_data(tiny, tmp_path, monkeypatch,
                                                                                  flipped) -> None:
    """The PTQ model and the trained one are measured on the validation samples (every tenth training sample) and
    the better is written; the held-out check samples, whose figures the report gives, never choose (selection on
    the test set). Training is spoilt after its last epoch, so the PTQ model is truly the better; the task check's
    figures are then turned upside down on one of the two sample sets (``flipped``): on the held-out ones the PTQ
    model must still be written, on the validation ones the trained model must be."""
    import dataclasses

    import torch

    from npukit.measure import task_fidelity
    from npukit.quant.qat import train
    from npukit.runtime.ort import make_session

    real_train, real_compare = train.Trainer.train, task_fidelity.compare_task
    held_x = np.load(tiny.with_name("held.npy"))

    def spoilt(self, **kwargs):  # training that ends far from the float model, an epoch kept
        result = real_train(self, **kwargs)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for weight in self.student.trained_initializers().values():
                weight.add_(torch.randn(weight.shape, generator=generator) * weight.std())
        return dataclasses.replace(result, kept=result.kept or 1)

    def upside_down(reference, candidate, samples, **kwargs):
        choice, result = real_compare(reference, candidate, samples, **kwargs)
        feeds = next(iter(task_fidelity.feeds_and_labels(samples)))[0]
        on_held = np.array_equal(next(iter(feeds.values())), held_x[:1])
        if on_held != (flipped == "held-out"):
            return choice, result
        outputs = tuple(dataclasses.replace(o, sqnr_db=100 - o.sqnr_db) for o in result.outputs)
        return choice, dataclasses.replace(result, value=None if result.value is None else 1 - result.value,
                                           outputs=outputs)

    monkeypatch.setattr(train.Trainer, "train", spoilt)
    monkeypatch.setattr(task_fidelity, "compare_task", upside_down)
    out = tmp_path / "t.qat.onnx"
    main(["qat", str(tiny), "-o", str(out), "--data", str(tiny.with_name("train.npz")), "--eval",
          str(tiny.with_name("held.npy")), "--epochs", "1", "--runs", "2", "--method", "minmax"])
    report = json.loads((tmp_path / "t.qat.report.json").read_text())
    results = report["results"]
    kept = results["kept"]
    expected = "PTQ" if flipped == "held-out" else "QAT"
    assert kept["model"] == expected, kept
    assert kept["chosen_on"].startswith("the 4 validation samples"), kept  # 40 training samples, every tenth
    assert set(kept["figures"]) == {"PTQ", "QAT"} and kept["figures"]["PTQ"]["samples"] == 4
    figures = {label: kept["figures"][label]["worst_sqnr_db"] for label in ("PTQ", "QAT")}
    if expected == "PTQ":
        assert figures["PTQ"] > figures["QAT"] + 3, figures
        assert f"{figures['PTQ']:.2f} dB against {figures['QAT']:.2f} dB" in kept["why"] or \
            "top1_agreement" in kept["why"], kept["why"]
        assert "; the model is its PTQ start: it measures better than the trained epoch 1 on the 4 validation " \
               "samples" in report["verdict"]
    else:
        assert "PTQ start" not in report["verdict"] and kept["why"].startswith("the trained epoch 1 measures")
    comparison = results["comparison"]
    assert results["task_check"]["result"] == comparison[expected]  # the check judges the model written
    real_worst = {label: min(o["sqnr_db"] for o in row["outputs"]) for label, row in comparison.items()}
    if flipped == "held-out":
        real_worst = {label: 100 - value for label, value in real_worst.items()}
    assert real_worst["QAT"] < real_worst["PTQ"] - 3, real_worst  # held out too, the PTQ model is the better
    name = _input(tiny)
    float_session, written = make_session(onnx.load(str(tiny))), make_session(onnx.load(str(out)))
    ref = np.concatenate([float_session.run(None, {name: held_x[i:i + 1]})[0] for i in range(len(held_x))])
    got = np.concatenate([written.run(None, {name: held_x[i:i + 1]})[0] for i in range(len(held_x))])
    sqnr = 10 * np.log10(np.square(ref).sum() / np.square(ref - got).sum())
    assert abs(sqnr - real_worst[expected]) < 0.05, (sqnr, real_worst)  # the file is the model chosen


def test_the_model_written_is_the_one_validation_measures_better() -> None:
    """``_keep``: the trained model unless the PTQ model meets the check's floors where it does not, else has the
    higher task metric, else the higher worst output SQNR; a tie keeps the trained one. ``_start_kept``: where
    training kept its start, the validation losses that decided."""
    from types import SimpleNamespace

    from npukit.quant.qat.train import Epoch
    from npukit.tasks import QualityGate
    from npukit.tasks.base import OutputFidelity, TaskResult
    from npukit.verbs.qat import _keep, _start_kept

    def row(value: float, sqnr: float) -> TaskResult:
        return TaskResult("classify", 60, "top1_agreement", value, {}, (OutputFidelity("y", (1, 4), sqnr, 1.0, 0.0,
                                                                                       1.0),), ("y",))

    gate, trained, where = QualityGate(), SimpleNamespace(kept=2, start=None), "on the 6 validation samples"
    label, why = _keep({"PTQ": row(0.983, 40.3), "QAT": row(0.900, 24.9)}, gate, trained, where)
    assert label == "PTQ" and why == ("it measures better than the trained epoch 2 on the 6 validation samples "
                                      "(top1_agreement 0.983 against 0.900)")
    assert _keep({"PTQ": row(0.95, 30.0), "QAT": row(0.80, 40.0)}, gate, trained, where) == (  # 0.80 fails
        "PTQ", "it measures better than the trained epoch 2 on the 6 validation samples (it meets the check's floors "
               "and the trained one does not: top1_agreement 0.950 against 0.800, worst output SQNR 30.00 dB against "
               "40.00 dB)")
    assert _keep({"PTQ": row(1.0, 17.0), "QAT": row(1.0, 16.7)}, gate, trained, where)[1].endswith(
        "(worst output SQNR 17.00 dB against 16.70 dB)")
    assert _keep({"PTQ": row(0.95, 30.0), "QAT": row(0.95, 30.0)}, gate, trained, where)[0] == "QAT"
    label, why = _keep({"PTQ": row(0.95, 30.0), "QAT": row(0.97, 25.0)}, gate, trained, where)
    assert label == "QAT" and why == ("the trained epoch 2 measures at least as well as the PTQ model on the 6 "
                                      "validation samples (top1_agreement 0.970 (PTQ 0.950), worst output SQNR "
                                      "25.00 dB (PTQ 30.00 dB))")

    def epoch(n: int, loss: float) -> Epoch:
        return Epoch(n, loss, 1.0, "top-1 agreement", 8, 0.0, loss, 1.0)

    training = SimpleNamespace(kept=0, start=epoch(0, 0.0133), history=(epoch(1, 0.0141), epoch(2, 0.0137)))
    assert _start_kept(training, training.history[1]) == ("no epoch did better on the validation samples "
                                                           "(validation loss 0.0133 at the start; the lowest of the "
                                                           "epochs 0.0137, epoch 2)")


def test_without_validation_samples_the_trained_model_is_written_unchosen(tiny, tmp_path) -> None:
    """Fewer than 10 training samples leave none to validate on: the trained model is written, and the report says
    it was not chosen (the held-out samples do not choose in their place)."""
    data = tmp_path / "nine.npy"
    np.save(data, np.load(tiny.with_name("held.npy"))[:9])
    out = tmp_path / "t.qat.onnx"
    main(["qat", str(tiny), "-o", str(out), "--data", str(data), "--eval", str(tiny.with_name("held.npy")),
          "--epochs", "1", "--runs", "2", "--method", "minmax", "--accept-degraded"])
    report = json.loads((tmp_path / "t.qat.report.json").read_text())
    kept = report["results"]["kept"]
    assert kept["model"] == "QAT" and kept["chosen_on"] == "no validation samples" and not kept["figures"]
    assert kept["why"].startswith("no validation samples to choose on") and "PTQ start" not in report["verdict"]
    assert report["config"]["samples"]["validation"] == 0


def test_the_verdict_says_when_the_model_not_written_did_better_held_out() -> None:
    """PP-OCR cls, --bits w4a8: QAT was kept on 2 validation samples where it tied PTQ, then held out it read 15.3 dB
    against PTQ's 17.2 at the same top-1, under a PASS that said nothing of it."""
    from types import SimpleNamespace

    from npukit.verbs.qat import _other_better

    def row(value, *sqnrs):
        outputs = [SimpleNamespace(name=f"y{i}", sqnr_db=s) for i, s in enumerate(sqnrs)]
        return SimpleNamespace(metric="top1_agreement", value=value, outputs=outputs, samples=42)

    rows = {"PTQ": row(0.976, 17.19, 30.0), "QAT": row(0.976, 15.28, 31.0)}
    assert _other_better(rows, "QAT") == ("; note: the PTQ model did better on the held-out samples (worst output "
                                          "SQNR 17.2 dB against 15.3); the QAT one was chosen on the validation "
                                          "samples")
    assert _other_better(rows, "PTQ") == ""
    assert "top1_agreement 0.990 against 0.976" in _other_better({**rows, "PTQ": row(0.99, 10.0)}, "QAT")
    assert _other_better({**rows, "PTQ": row(0.976, 15.9)}, "QAT") == ""  # within 1 dB: no note
