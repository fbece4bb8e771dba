"""Lowering the twin's weights below 8 bits: clipped grids have less rounding error than an edge at max|w|, GPTQ on
them brings the model's outputs closer to the float model's than nearest rounding on the same grids, the lowered
weights lie on their grids (the int4 model ONNX Runtime runs computes the simulation), the kept weights keep 8 bits,
and the trainer lowers with it before the first step."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import torch

from npukit.frontend.opset import ensure_opset
from npukit.quant.config import CalibrationSpec, QuantConfig
from npukit.quant.grids import clipped_weight_scale
from npukit.quant.qat.export_check import check_export
from npukit.quant.qat.fake_quant import set_weight_bits
from npukit.quant.qat.lower import lower_weights
from npukit.quant.qat.program import OnnxProgram
from npukit.quant.qat.train import QatConfig, Trainer
from npukit.quant.qat.twin import split, write_back
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, tiny_cnn


def _twin():
    model, _ = ensure_opset(tiny_cnn(activation="Relu", spread=0.5), 21, reason="int4", feeds=make_samples(2))
    result = quantize(model, make_samples(16, seed=1), config=QuantConfig(calibration=CalibrationSpec(
        method="minmax")))
    twin = split(result.model, reduce_range=False)
    return result, twin, twin.program(), OnnxProgram(result.reference)


def _sqnr(student: OnnxProgram, teacher: OnnxProgram, samples) -> float:
    with torch.no_grad():
        s = torch.cat([student({"x": torch.from_numpy(f["x"])})[0] for f in samples])
        t = torch.cat([teacher({"x": torch.from_numpy(f["x"])})[0] for f in samples])
    return float(10 * torch.log10(t.square().sum() / (s - t).square().sum()))


def _weight_keys(program: OnnxProgram) -> list[str]:
    return [n.attrs["key"] for n in program.nodes if n.op_type == "FakeQuant" and n.attrs.get("kind") == "weight"]


def test_clipped_scales_round_with_less_error_than_an_edge_at_the_largest_weight():
    rng = np.random.default_rng(0)
    w = rng.laplace(size=(16, 8, 3, 3))  # heavy tails: the largest weight of a channel is an outlier
    w[3] = 0.0  # a channel of zeros

    def error(scale: np.ndarray) -> np.ndarray:
        s = scale.reshape(-1, 1, 1, 1)
        return (np.abs(np.clip(np.rint(w / s), -7, 7) * s - w) ** 3).reshape(16, -1).sum(axis=1)  # the power used

    top = np.abs(w).reshape(16, -1).max(axis=1)
    scale = clipped_weight_scale(w, 0, 7)
    edge = np.where(top > 0, top / 7, 1.0)
    assert scale.shape == (16,) and scale[3] == 1.0
    live = top > 0
    assert (scale[live] <= edge[live]).all() and (scale[live] < edge[live]).mean() > 0.5
    assert (error(scale) <= error(edge) * (1 + 1e-5)).all()  # the edge at max|w| is among the candidates
    assert error(scale)[live].sum() < 0.9 * error(edge)[live].sum()
    assert clipped_weight_scale(w, None, 7).shape == (1,)


def test_gptq_on_the_clipped_grids_is_closer_to_the_float_model_than_nearest_rounding():
    _, _, student, teacher = _twin()
    calib, held = make_samples(32, seed=1), make_samples(32, seed=9)
    nearest = copy.deepcopy(student)
    set_weight_bits(nearest, 4)
    lowered = lower_weights(student, 4, calib)
    assert lowered.bits == 4 and lowered.samples == 32 and lowered.gains_db
    assert all(gain > 0 for gain in lowered.gains_db.values())
    assert _sqnr(student, teacher, held) > _sqnr(nearest, teacher, held) + 0.5
    weights = student.trained_initializers()
    for node in student.nodes:  # every lowered weight lies on its grid
        if node.op_type == "FakeQuant" and node.attrs.get("kind") == "weight":
            module, w = student.quant[node.attrs["key"]], weights[node.inputs[0]].detach()
            assert module.rule == "clipped" and module.qmax == 7
            ints, scale, _ = module.exported(w)
            shape = [-1] + [1] * (w.dim() - 1) if module.axis == 0 and scale.size > 1 else [1] * w.dim()
            if scale.size > 1 and module.axis != 0:
                shape = [1] * w.dim()
                shape[module.axis] = -1
            np.testing.assert_allclose(ints * scale.reshape(shape), w.numpy(), rtol=0, atol=1e-6)


def test_lowered_weights_written_back_as_int4_compute_the_simulation():
    result, twin, student, _ = _twin()
    samples = make_samples(16, seed=2)
    lower_weights(student, 4, samples)
    exported = write_back(result.model, twin, student)
    assert [i for i in exported.graph.initializer if i.data_type == onnx.TensorProto.INT4]
    check = check_export(exported, student, samples[:8])
    assert check.exact, check


def test_kept_weights_keep_their_eight_bit_grid_and_values():
    _, _, student, _ = _twin()
    keys = _weight_keys(student)
    kept = frozenset(keys[:1])
    weights = student.trained_initializers()
    tensor = next(n.inputs[0] for n in student.nodes if n.op_type == "FakeQuant" and n.attrs.get("key") == keys[0])
    before = weights[tensor].detach().clone()
    rule = student.quant[keys[0]].rule
    lowered = lower_weights(student, 4, make_samples(16, seed=1), keep=kept)
    assert student.quant[keys[0]].rule == rule and student.quant[keys[0]].qmax > 7
    torch.testing.assert_close(weights[tensor].detach(), before, rtol=0, atol=0)
    assert all(student.quant[key].qmax == 7 for key in keys[1:])
    assert len(lowered.gains_db) + len(lowered.nearest) == len(keys) - 1


def test_the_trainer_lowers_before_the_first_step_and_the_start_is_a_candidate(tmp_path):
    _, _, student, teacher = _twin()
    train = np.concatenate([s["x"] for s in make_samples(40, seed=1)])
    calib = make_samples(16, seed=1)
    config = QatConfig(weight_bits=4, schedule=(4,), epochs=1, batch_size=8, lr=1e-3, augment=False)
    trainer = Trainer(student, teacher, {"x": train[:32]}, None, config, classify_output=None, checkpoint=None,
                      fingerprint="a", validation={"x": train[32:]},
                      lowering=lambda program, bits, keep: lower_weights(program, bits, calib, keep=keep))
    result = trainer.train()
    assert [lowering["bits"] for lowering in result.lowered] == [4]
    assert result.start is not None and result.start.bits == 4  # the GPTQ start competes with the epochs
    assert result.kept in (0, 1)


def test_a_pruned_weight_keeps_its_zeros():
    _, _, student, _ = _twin()
    weights = student.trained_initializers()
    name = next(n.inputs[0] for n in student.nodes if n.op_type == "FakeQuant" and n.attrs.get("kind") == "weight")
    with torch.no_grad():
        w = weights[name]
        w.mul_((torch.arange(w.numel()).reshape(w.shape) % 2 == 0).to(w.dtype))  # half of them zero
    zeros = weights[name].detach() == 0
    lowered = lower_weights(student, 4, make_samples(16, seed=1), sparse=frozenset({name}))
    assert (weights[name].detach()[zeros] == 0).all()
    assert len(lowered.nearest) >= 1 and lowered.gains_db
