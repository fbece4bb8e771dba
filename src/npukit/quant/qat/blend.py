"""An inexact substitution blended in while fine-tuning, not applied at once.

A substitution that changes the function (HardSwish -> ReLU6 on the 28 activations of the zoo's PP-LCNet orientation
classifier) can leave a network the fine-tuning cannot bring back: that one's outputs no longer depend on its input
(one class for every image, 25% on four classes), and distillation from there moved nothing in 4 to 8 epochs. So the
student is the model with each rewritten node kept beside its substitute (``npukit.targets.fix.substitute(...,
blend=True)``), their outputs added in shares held by two scalar initializers: the substitute's share ``t`` rises from
0 (the original function) to 1 over the first ``ramp`` of the training steps, linearly, the original's is ``1 - t``;
the network follows a function that changes a little at each step. The rest of the training runs at ``t = 1``,
where the blend is the substituted model exactly (0 x original + 1 x substitute), and only those epochs are
candidates to keep; the trained weights are then written into the substituted model (the same initializers).

The share is a function of the step alone, so a resumed run sets it again from its step.

``blended_model`` builds the student as ONNX Runtime's pre-processing leaves it (the form every trained model has
here, BatchNorm folded): the shares are given placeholder values first (0.75 and 0.25; its optimizer drops a
multiplication by 1 and merges equal constants), and the result is checked to keep every share and every trained
weight of the substituted model under the same name.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from npukit.errors import InputError
from npukit.targets.fix import BLEND, substitute

PLACEHOLDERS = (0.75, 0.25)  # the shares through ORT's pre-processing (see the module docstring)


@dataclasses.dataclass
class GradualSubstitution:
    """The substitute's share at each step (see the module docstring); ``done`` once it is whole."""

    ramp: float = 0.5
    share: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.ramp <= 1:
            raise ValueError(f"ramp {self.ramp} must be in (0, 1]")

    def share_at(self, step: int, total: int) -> float:
        """The substitute's share during ``step`` (0-based) of ``total``: whole from the last step of the ramp on."""
        return min(1.0, (step + 1) / max(1.0, self.ramp * total))

    @property
    def done(self) -> bool:
        return self.share >= 1.0

    def set(self, program: torch.nn.Module, step: int, total: int) -> None:
        """Put the shares of ``step`` into ``program`` (an ``OnnxProgram`` of a blended model)."""
        self.set_share(program, self.share_at(step, total))

    def set_share(self, program: torch.nn.Module, share: float) -> None:
        """The substitute's share ``share``, the original's ``1 - share``, in ``program``."""
        self.share = share
        original, substituted = (program.initializer(name) for name in BLEND)  # type: ignore[operator]
        with torch.no_grad():
            original.fill_(1.0 - share)
            substituted.fill_(share)


def _readers(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(name for node in model.graph.node for name in node.input if name in BLEND)


def blended_model(model: onnx.ModelProto, rules: Sequence[str], start: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (the original, not pre-processed) with the substitutions ``rules`` blended in, pre-processed, the
    shares at 1 and 0 (the original function); ``start`` is the substituted model pre-processed, whose trained
    weights the blended one must hold under the same names (see the module docstring; constants such as a Clip's
    bounds may be shared differently)."""
    from npukit.quant.qat.program import OnnxProgram
    from npukit.quant.qdq import preprocess

    built = substitute(model, rules, blend=True).model
    readers = _readers(built)
    for init in built.graph.initializer:
        if init.name in BLEND:
            init.CopyFrom(numpy_helper.from_array(np.asarray(PLACEHOLDERS[BLEND.index(init.name)], np.float32),
                                                  init.name))
    out = preprocess(built)
    shapes = {i.name: tuple(i.dims) for i in out.graph.initializer}
    weights = OnnxProgram._trained(start, {i.name: numpy_helper.to_array(i) for i in start.graph.initializer})
    lost = sorted(i.name for i in start.graph.initializer if i.name in weights and shapes.get(i.name) != tuple(i.dims))
    if _readers(out) != readers or lost:
        raise InputError("the substitution cannot be blended in step by step on this model (ONNX Runtime's "
                         f"pre-processing changed {'its weights ' + ', '.join(lost[:3]) if lost else 'the blend'})",
                         hint="pass --ramp 0 to fine-tune the substituted model as it is")
    for init in out.graph.initializer:
        if init.name in BLEND:
            init.CopyFrom(numpy_helper.from_array(np.asarray(1.0 if init.name == BLEND[0] else 0.0, np.float32),
                                                  init.name))
    return out
