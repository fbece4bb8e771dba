"""An inexact substitution blended in while fine-tuning: the substitute's share rises over the ramp and stays whole;
the blended student is the original model at share 0 and the substituted one at share 1 (after ORT's
pre-processing, weights under the same names); training keeps only epochs with the substitute whole, and the
substituted model written with the trained weights computes what the student computes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from npukit.errors import InputError
from npukit.quant.qat.blend import GradualSubstitution, blended_model
from npukit.quant.qat.program import OnnxProgram, with_trained_weights
from npukit.quant.qat.train import QatConfig, Trainer
from npukit.quant.qdq import preprocess
from npukit.runtime.ort import make_session
from npukit.targets.fix import BLEND, substitute
from tests.pruning.test_channels import PruneNet

RULES = ["hardswish_to_relu6"]


class TwoHardSwish(torch.nn.Module):
    """PruneNet's stem and a second HardSwish: ORT's pre-processing shares the substitutes' equal Clip bounds."""

    def __init__(self) -> None:
        super().__init__()
        self.body = PruneNet()
        self.act = torch.nn.Hardswish()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.body(x))


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> onnx.ModelProto:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("blend") / "net.onnx"
    torch.onnx.export(TwoHardSwish().eval(), torch.zeros(1, 3, 32, 32), str(path), input_names=["x"], dynamo=False,
                      opset_version=17)
    return onnx.load(str(path))


def _inputs(n: int, seed: int) -> np.ndarray:
    return (2 * np.random.default_rng(seed).standard_normal((n, 3, 32, 32))).astype(np.float32)


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = make_session(model)
    return np.concatenate([session.run(None, {"x": s[None]})[0] for s in x])


def _program(program: OnnxProgram, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return np.concatenate([program({"x": torch.from_numpy(s[None])})[0].numpy() for s in x])


def test_the_share_rises_over_the_ramp_then_stays_whole() -> None:
    schedule = GradualSubstitution(ramp=0.5)
    assert [schedule.share_at(step, 40) for step in (0, 9, 18, 19, 39)] == [0.05, 0.5, 0.95, 1.0, 1.0]
    assert not schedule.done
    with pytest.raises(ValueError):
        GradualSubstitution(ramp=0.0)


def test_the_blended_student_is_the_original_then_the_substituted_model(net) -> None:
    start = preprocess(substitute(net, RULES).model)
    blended = blended_model(net, RULES, start)
    assert {i.name for i in start.graph.initializer} <= {i.name for i in blended.graph.initializer}
    assert sum(name in BLEND for n in blended.graph.node for name in n.input) == 4  # two HardSwish, two shares each
    x = _inputs(4, seed=1)
    program, schedule = OnnxProgram(blended), GradualSubstitution()
    np.testing.assert_allclose(_program(program, x), _ort(net, x), rtol=1e-4, atol=1e-5)  # as built: share 0
    schedule.set_share(program, 1.0)
    np.testing.assert_allclose(_program(program, x), _ort(start, x), rtol=1e-4, atol=1e-5)
    assert np.max(np.abs(_ort(start, x) - _ort(net, x))) > 1e-2  # the substitution does change the function


def test_training_keeps_only_epochs_with_the_substitute_whole_and_writes_what_it_trained(net) -> None:
    torch.manual_seed(0)
    start = preprocess(substitute(net, RULES).model)
    student = OnnxProgram(blended_model(net, RULES, start))
    schedule = GradualSubstitution(ramp=1.0)  # whole only at the last step: epoch 1 of 2 is no candidate
    config = QatConfig(epochs=2, batch_size=8, lr=1e-3, augment=False)
    trainer = Trainer(student, OnnxProgram(preprocess(net)), {"x": _inputs(32, seed=2)}, None, config,
                      classify_output=None, checkpoint=None, fingerprint="blend",
                      validation={"x": _inputs(8, seed=3)}, blend=schedule)
    result = trainer.train()
    assert schedule.done and result.kept in (0, 2)
    assert result.start is not None  # the start was judged as the substituted model (share 1)
    written = with_trained_weights(start, student)
    x = _inputs(4, seed=4)
    np.testing.assert_allclose(_ort(written, x), _program(student, x), rtol=1e-4, atol=1e-5)


def _renamed(model: onnx.ModelProto, op_type: str, index: int) -> onnx.ModelProto:
    """``model`` with input ``index`` of its first ``op_type`` node read from a renamed copy of that initializer."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    node = next(n for n in out.graph.node if n.op_type == op_type)
    copy = next(i for i in out.graph.initializer if i.name == node.input[index])
    tensor = onnx.TensorProto()
    tensor.CopyFrom(copy)
    tensor.name = node.input[index] = copy.name + "_elsewhere"
    out.graph.initializer.append(tensor)
    return out


def test_the_blended_model_must_hold_the_trained_weights_not_every_constant(net) -> None:
    """ORT's pre-processing shares equal constants (the substitutes' Clip bounds) one way in the substituted model
    and another in the blended one (the MNIST CNN's nine); only the trained weights must keep their names."""
    start = preprocess(substitute(net, RULES).model)
    blended_model(net, RULES, _renamed(start, "Clip", 1))  # a bound under another name: fine
    with pytest.raises(InputError, match="cannot be blended in step by step.*changed its weights"):
        blended_model(net, RULES, _renamed(start, "Conv", 1))
