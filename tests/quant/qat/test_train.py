"""Training the twin by distillation brings the quantized model closer to the float model; checkpoints resume to the
same result; a checkpoint of another run is refused."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from npukit.errors import InputError
from npukit.quant.config import CalibrationSpec, CpuKernels, QuantConfig
from npukit.quant.qat.fake_quant import set_weight_bits
from npukit.quant.qat.program import OnnxProgram
from npukit.quant.qat.train import QatConfig, Trainer
from npukit.quant.qat.twin import split
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, tiny_cnn


def _sqnr(student: OnnxProgram, teacher: OnnxProgram, x: np.ndarray) -> float:
    with torch.no_grad():
        s = torch.cat([student({"x": torch.from_numpy(x[i:i + 1])})[0] for i in range(len(x))])
        t = torch.cat([teacher({"x": torch.from_numpy(x[i:i + 1])})[0] for i in range(len(x))])
    return float(10 * torch.log10(t.square().sum() / (s - t).square().sum()))


def _setup(tmp_path, *, bits: int, epochs: int = 4, seed: int = 0, checkpoint: bool = True, fingerprint="a"):
    torch.manual_seed(0)
    model = tiny_cnn(activation="Relu", spread=0.5)
    train = np.concatenate([s["x"] for s in make_samples(64, seed=1)])
    result = quantize(model, make_samples(16, seed=1), config=QuantConfig(calibration=CalibrationSpec(method="minmax"),
                                                                          cpu=CpuKernels(reduce_range=True)))
    twin = split(result.model, reduce_range=True)
    student, teacher = twin.program(), OnnxProgram(result.reference)
    config = QatConfig(weight_bits=bits, epochs=epochs, batch_size=8, lr=3e-3, augment=False, seed=seed)
    trainer = Trainer(student, teacher, {"x": train}, None, config, classify_output=None,
                      checkpoint=tmp_path / "run.qat.pt" if checkpoint else None, fingerprint=fingerprint)
    return trainer, student, teacher


def test_distillation_brings_four_bit_weights_closer_to_the_float_model(tmp_path):
    trainer, student, teacher = _setup(tmp_path, bits=4, epochs=6)
    held = np.concatenate([s["x"] for s in make_samples(32, seed=7)])
    probe = copy.deepcopy(student)
    set_weight_bits(probe, 4)  # the untrained 4-bit start (rounded to nearest on the clipped 4-bit grids)
    before = _sqnr(probe, teacher, held)
    result = trainer.train()
    after = _sqnr(student, teacher, held)
    assert [e.bits for e in result.history][-1] == 4
    assert result.history[-1].loss < result.history[3].loss  # the 4-bit part of the schedule learns too
    assert after > before + 1.0, (before, after)


def test_resumed_training_ends_where_an_uninterrupted_one_does(tmp_path):
    whole, student_whole, _ = _setup(tmp_path / "a", bits=4, epochs=3)
    whole.train()
    first, _, _ = _setup(tmp_path / "b", bits=4, epochs=3)

    class Stop(Exception):
        pass

    def interrupt(step: int, total: int, loss: float, agreement: float) -> None:
        if step == first.steps_per_epoch * 2 + 1:  # in the third epoch: the checkpoint holds two
            raise Stop

    with pytest.raises(Stop):
        first.train(progress=interrupt)
    assert (tmp_path / "b" / "run.qat.pt").exists()
    second, student_second, _ = _setup(tmp_path / "b", bits=4, epochs=3)
    result = second.train()
    assert result.resumed_from == 2 and len(result.history) == 3
    for (name, a), b in zip(student_whole.state_dict().items(), student_second.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    trainer, _, _ = _setup(tmp_path, bits=8, epochs=1)
    trainer.train()
    other, _, _ = _setup(tmp_path, bits=8, epochs=1, fingerprint="b")
    with pytest.raises(InputError, match="another model"):
        other.train()


def test_config_refuses_what_it_cannot_train():
    with pytest.raises(InputError, match="weight bits"):
        QatConfig(weight_bits=2)
    with pytest.raises(InputError, match="schedule"):
        QatConfig(weight_bits=4, schedule=(4, 6))
    assert QatConfig(weight_bits=4).schedule == (4,)  # the GPTQ-lowered start: no steps between (quant.qat.lower)


def test_validation_keeps_the_start_when_training_only_hurts(tmp_path):
    """8-bit weights: the start is a candidate, so a harmful run (a learning rate far too high) writes the start."""
    import dataclasses

    trainer, student, teacher = _setup(tmp_path, bits=8, epochs=2, checkpoint=False)
    start = {k: v.clone() for k, v in student.state_dict().items()}
    trainer.config = dataclasses.replace(trainer.config, lr=0.5)
    for group in trainer.optimizer.param_groups:
        group["lr"] = 0.5
    trainer.validation = {"x": torch.from_numpy(np.concatenate([s["x"] for s in make_samples(8, seed=9)]))}
    result = trainer.train()
    assert result.kept == 0 and result.start is not None
    assert all(e.validation_loss > result.start.validation_loss for e in result.history)
    for name, value in student.state_dict().items():
        torch.testing.assert_close(value, start[name], msg=name)


def _with_softmax(model):
    """``model`` with a Softmax after its first output (named "p")."""
    import onnx
    from onnx import helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output[0].name = "p"
    out.graph.node.append(helper.make_node("Softmax", ["y"], ["p"], name="softmax", axis=-1))
    return out


def test_a_classifier_that_ends_in_softmax_is_distilled_on_its_logits(tmp_path):
    """Softened probabilities of probabilities are near uniform; the log of a Softmax output is its logits less a
    constant per row, so the loss on a Softmax model equals the loss on the same model without it."""
    x = np.concatenate([s["x"] for s in make_samples(16, seed=3)])
    config = QatConfig(epochs=1, batch_size=8, augment=False, logit_weight=0.0)
    losses = {}
    for kind, wrap in (("logits", lambda m: m), ("probabilities", _with_softmax)):
        teacher, student = OnnxProgram(wrap(tiny_cnn(seed=0))), OnnxProgram(wrap(tiny_cnn(seed=1)))
        trainer = Trainer(student, teacher, {"x": x}, None, config, classify_output=0, checkpoint=None,
                          fingerprint="a")
        assert trainer.probabilities == (kind == "probabilities")
        with torch.no_grad():
            batch = {"x": torch.from_numpy(x)}
            losses[kind] = float(trainer.loss(student(batch), teacher(batch), None)[0])
    assert losses["probabilities"] == pytest.approx(losses["logits"], rel=1e-4)


def test_a_softmax_output_s_squared_error_is_scaled_by_its_log_s_spread(tmp_path):
    """The squared error on a Softmax model's class scores is taken on log p, and was divided by the spread of p:
    on PP-OCR's classifier that made the loss 180x too large (242 against 0.7 once scaled by log p's spread)."""
    x = np.concatenate([s["x"] for s in make_samples(16, seed=3)])
    config = QatConfig(epochs=1, batch_size=8, augment=False, logit_weight=1.0)
    teacher, student = OnnxProgram(_with_softmax(tiny_cnn(seed=0))), OnnxProgram(_with_softmax(tiny_cnn(seed=1)))
    trainer = Trainer(student, teacher, {"x": x}, None, config, classify_output=0, checkpoint=None, fingerprint="a")
    with torch.no_grad():
        p = teacher({"x": torch.from_numpy(x)})[0].double()
    assert trainer.spread[0] == pytest.approx(float(p.clamp_min(1e-12).log().var()), rel=1e-6)
    assert trainer.spread[0] > 10 * float(p.var())  # the probabilities' own spread is far smaller


def test_mixup_blends_the_chosen_share_of_a_batch_alike_in_every_image_input():
    from npukit.quant.qat.train import _mixed

    x = torch.arange(8, dtype=torch.float32).reshape(8, 1, 1, 1).expand(8, 3, 16, 16).contiguous()
    feeds = {"a": x.clone(), "b": x.clone() * 2, "n": torch.ones(8, 5)}
    _mixed(feeds, {"a", "b"}, 0.5, torch.Generator().manual_seed(0))
    torch.testing.assert_close(feeds["b"], feeds["a"] * 2)  # one blend per sample across the image inputs
    torch.testing.assert_close(feeds["n"], torch.ones(8, 5))  # not an image: as it was
    blended = (feeds["a"] != x).flatten(1).any(1)
    assert 0 < int(blended.sum()) < 8
    lo = torch.minimum(x, torch.zeros_like(x)).min()
    assert float(feeds["a"].min()) >= float(lo) and float(feeds["a"].max()) <= 7.0  # convex blends of the batch
    untouched = {"a": x.clone()}
    _mixed(untouched, {"a"}, 0.0, torch.Generator().manual_seed(0))
    torch.testing.assert_close(untouched["a"], x)
    assert QatConfig(mixup=0.5).mixup == 0.5
    with pytest.raises(InputError, match="mixup"):
        QatConfig(mixup=1.5)


def test_probabilities_the_student_rounds_to_zero_weigh_nothing_in_the_loss() -> None:
    """A student ending in an 8-bit Softmax output rounds probabilities under half a step to 0; their log at a floor
    of 1e-12 (-27.6 against the teacher's -18) made a loss no training could move (MTCNN ONet: 7.011 in every
    epoch, the PTQ start kept). Below the floor both sides are one value: the loss is what the grid can show."""
    trainer = Trainer.__new__(Trainer)  # the loss alone: what it reads of a trainer
    trainer.classify_output, trainer.probabilities, trainer.config, trainer.spread = 0, True, QatConfig(), [1.0]
    teacher = torch.tensor([[0.9, 0.1 - 2e-8, 1e-8, 1e-8]])
    student = torch.tensor([[0.9, 0.1, 0.0, 0.0]])  # the tiny ones rounded to 0 on the output grid
    loss, agreement = trainer.loss([student], [teacher], None)
    assert agreement == 1.0 and float(loss) < 1e-4
    worse = torch.tensor([[0.6, 0.4, 0.0, 0.0]])  # what the grid does show still costs
    assert float(trainer.loss([worse], [teacher], None)[0]) > 100 * float(loss)


def test_a_quantized_softmax_is_distilled_on_its_logits_where_its_probabilities_are_zero(softmax_twin):
    """The twin's 8-bit probabilities of a confident classifier are 0 or 1: a loss on them (clamped at the output's
    resolution) is 0 with no gradient, and training cannot move (MTCNN ONet: 7.011 in every epoch at a 1e-12 floor).
    Given the logits the Softmax reads (``logits``), the trainer distils on them, and every class's weights learn."""
    from npukit.quant.qat.program import logits_of

    result, twin = softmax_twin
    student, teacher = twin.program(), OnnxProgram(result.reference)
    x = np.concatenate([s["x"] for s in make_samples(16, seed=3)])
    feeds = {"x": torch.from_numpy(x)}
    assert set(student(feeds)[0].unique().tolist()) <= {0.0, 1.0}
    weight = next(p for name, p in student.trained_initializers().items() if name.startswith("w4"))
    config = QatConfig(epochs=1, batch_size=8, augment=False)
    seen = {}
    for kind, logits in (("probabilities", None), ("logits", (logits_of(twin.model, 0), logits_of(result.reference,
                                                                                                    0)))):
        trainer = Trainer(student, teacher, {"x": x}, None, config, classify_output=0, checkpoint=None,
                          fingerprint="a", logits=logits)
        assert trainer.probabilities == (kind == "probabilities")
        student.zero_grad()
        loss, agreement = trainer.loss(trainer.model(feeds), trainer.teaching(feeds), None)
        loss.backward()
        seen[kind] = float(loss.detach()), weight.grad.abs().sum(1)
    assert seen["probabilities"][0] == 0 and not seen["probabilities"][1].any()
    assert seen["logits"][0] > 0 and bool((seen["logits"][1] > 0).all())  # every class's row has a gradient
