"""Magnitude sparsity: the per-tensor shares add up to the model's sparsity with small tensors kept denser, the masks
keep the largest weights, the gradual schedule reaches its final sparsity where it says, and the trainer holds
pruned weights at zero through training and a resumed run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from npukit.pruning.sparsity import GradualSparsity, densities, magnitude_masks, sparsify, weight_tensors
from npukit.quant.qat.program import OnnxProgram
from npukit.quant.qat.train import QatConfig, Trainer
from npukit.quant.qdq import preprocess
from tests.quant.conftest import make_samples, tiny_cnn


def test_densities_keep_the_share_asked_for_and_small_tensors_denser() -> None:
    shapes = {"first": (8, 1, 3, 3), "depthwise": (64, 1, 3, 3), "pointwise": (128, 64, 1, 1), "fc": (10, 128)}
    keep = densities(shapes, 0.9)
    sizes = {k: int(np.prod(v)) for k, v in shapes.items()}
    assert sum(keep[k] * sizes[k] for k in shapes) == pytest.approx(0.1 * sum(sizes.values()))
    assert keep["pointwise"] < keep["fc"] < keep["depthwise"] < keep["first"] < 1.0
    capped = densities({"tiny": (2, 1, 1, 1), "big": (100, 100)}, 0.5)  # the scale would make "tiny" over-dense
    assert capped["tiny"] == 1.0 and capped["big"] * 10000 + 2 == pytest.approx(0.5 * 10002)


def test_magnitude_masks_keep_the_largest_weights() -> None:
    rng = np.random.default_rng(0)
    weights = {"a": rng.standard_normal((32, 16)), "b": rng.standard_normal((16, 4, 3, 3))}
    masks = magnitude_masks(weights, 0.7)
    kept = sum(int(m.sum()) for m in masks.values())
    assert kept == pytest.approx(0.3 * sum(w.size for w in weights.values()), abs=2)
    for name, weight in weights.items():
        assert np.abs(weight[masks[name]]).min() >= np.abs(weight[~masks[name]]).max()


def test_the_gradual_schedule_rises_to_its_final_sparsity_by_the_end_of_the_ramp() -> None:
    schedule = GradualSparsity(0.9, ("w",), stages=4, ramp=0.5)
    targets = [schedule.target(s) for s in range(4)]
    assert targets == sorted(targets) and targets[-1] == pytest.approx(0.9)
    assert [schedule.stage_at(step, 80) for step in (0, 9, 10, 39, 40, 79)] == [0, 0, 1, 3, 3, 3]
    weights = {"w": np.random.default_rng(1).standard_normal((20, 20))}
    assert schedule.masks_at(0, 80, lambda: weights) is not None
    assert schedule.masks_at(5, 80, lambda: weights) is None  # same stage: masks unchanged
    final = schedule.masks_at(45, 80, lambda: weights)
    assert schedule.done and (~final["w"]).mean() == pytest.approx(0.9)


@pytest.mark.parametrize("total", [1, 2, 3, 5, 11, 80])
def test_the_schedule_reaches_its_final_sparsity_however_few_the_steps(total: int) -> None:
    schedule = GradualSparsity(0.5, ("w",), stages=8, ramp=0.75)
    stages = [schedule.stage_at(step, total) for step in range(total)]
    assert stages == sorted(stages) and stages[-1] == 7
    weights = {"w": np.random.default_rng(2).standard_normal((40, 40))}
    masks: dict = {}
    for step in range(total):
        masks = schedule.masks_at(step, total, lambda: weights) or masks
    assert schedule.done and (~masks["w"]).mean() == pytest.approx(0.5)


def _trainer(tmp_path, epochs: int) -> tuple[Trainer, OnnxProgram, GradualSparsity]:
    torch.manual_seed(0)
    model = preprocess(tiny_cnn())
    sparse = sparsify(model, 0.8)
    schedule = GradualSparsity(0.8, tuple(sparse.masks), stages=4)
    student = OnnxProgram(model)
    train = np.concatenate([s["x"] for s in make_samples(48, seed=2)])
    config = QatConfig(epochs=epochs, batch_size=8, lr=3e-3, augment=False)
    trainer = Trainer(student, OnnxProgram(model), {"x": train}, None, config, classify_output=None,
                      checkpoint=tmp_path / "run.prune.pt", fingerprint="s", sparsity=schedule)
    return trainer, student, schedule


def test_training_holds_pruned_weights_at_zero_and_a_resumed_run_keeps_its_masks(tmp_path) -> None:
    whole, student, _ = _trainer(tmp_path / "a", epochs=3)
    whole.train()
    names = list(weight_tensors(preprocess(tiny_cnn())))
    zeros = sum(int((student.initializer(n) == 0).sum()) for n in names)
    assert zeros >= 0.8 * sum(student.initializer(n).numel() for n in names) - 2

    first, _, _ = _trainer(tmp_path / "b", epochs=3)

    class Stop(Exception):
        pass

    def interrupt(step: int, total: int, loss: float, agreement: float) -> None:
        if step == first.steps_per_epoch * 2 + 1:
            raise Stop

    with pytest.raises(Stop):
        first.train(progress=interrupt)
    second, resumed, schedule = _trainer(tmp_path / "b", epochs=3)
    result = second.train()
    assert result.resumed_from == 2 and schedule.done
    for name in names:
        torch.testing.assert_close(resumed.initializer(name), student.initializer(name), rtol=1e-5, atol=1e-6)
