"""Does the exported QDQ model compute what training simulated? Layer by layer: ONNX Runtime runs the exported model
as its Q/DQ nodes say (graph optimizations off, every dequantized activation read out), and the training program
runs on the same input with each quantized activation replaced by ONNX Runtime's value once it has been compared,
so that every layer is judged on the same inputs: the largest difference of any quantized activation, in steps of
its grid, must be at most ``TOLERANCE_STEPS`` (a value exactly between two levels may round either way when the two
sum in a different order).

End to end, the outputs of ONNX Runtime's integer kernels against the simulation are reported as SQNR beside the
same figure for ONNX Runtime's own two runs of the model (integer kernels against the Q/DQ nodes in float): in a
deep network one flipped rounding early on spreads, so neither pair agrees exactly, and the simulation is as
faithful as the runtime is to itself when the two figures are close.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch

from npukit.quant.qat.fake_quant import ActivationQuant
from npukit.quant.qat.program import OnnxProgram

TOLERANCE_STEPS = 1.0


@dataclasses.dataclass(frozen=True)
class ExportCheck:
    """``layers``: quantized activations compared; ``max_steps``: the largest layer-wise difference in steps (and
    where); ``sqnr_db``: outputs of the integer kernels against the simulation; ``runtime_sqnr_db``: the integer
    kernels against ORT's float run of the same Q/DQ model."""

    samples: int
    layers: int
    max_steps: float
    worst_tensor: str
    sqnr_db: float
    runtime_sqnr_db: float

    @property
    def exact(self) -> bool:
        return self.max_steps <= TOLERANCE_STEPS + 1e-3

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"exact": self.exact, "tolerance_steps": TOLERANCE_STEPS}


def _sqnr(reference: list[np.ndarray], other: list[np.ndarray]) -> float:
    signal = sum(float(np.square(r.astype(np.float64)).sum()) for r in reference)
    noise = sum(float(np.square(r.astype(np.float64) - o).sum()) for r, o in zip(reference, other))
    return float("inf") if noise == 0 else 10 * np.log10(signal / noise) if signal > 0 else float("-inf")


def check_export(exported: onnx.ModelProto, program: OnnxProgram, samples: Sequence[dict[str, np.ndarray]]
                 ) -> ExportCheck:
    """Compare ``exported`` with ``program`` (its training simulation) on ``samples``; see the module docstring."""
    from npukit.runtime.ort import make_session

    steps: dict[str, float] = {}  # dequantized activation -> its grid's step
    for node in program.nodes:
        if node.op_type == "FakeQuant":
            module = program.quant[node.attrs["key"]]
            if isinstance(module, ActivationQuant):
                steps[node.outputs[0]] = float(module.scale().detach().min())
    probe = onnx.ModelProto()
    probe.CopyFrom(exported)
    present = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in steps if name not in present)
    in_float = make_session(probe, optimization="disable")
    names = [o.name for o in in_float.get_outputs()]
    integer = make_session(exported)
    out_names = [o.name for o in integer.get_outputs()]
    worst, where = 0.0, ""
    sim_out, int_out, float_out = [], [], []
    with torch.no_grad():
        for feeds in samples:
            values = dict(zip(names, in_float.run(names, dict(feeds))))
            forced = {n: torch.from_numpy(np.asarray(values[n])) for n in steps}
            seen: dict[str, torch.Tensor] = {}
            program.run({k: torch.from_numpy(np.asarray(v)) for k, v in feeds.items()}, forced=forced, seen=seen)
            for name, value in seen.items():
                diff = float((value - forced[name]).abs().max()) / steps[name]
                if diff > worst:
                    worst, where = diff, name
            clean = program({k: torch.from_numpy(np.asarray(v)) for k, v in feeds.items()})
            sim_out += [t.numpy() for t in clean]
            int_out += list(integer.run(out_names, dict(feeds)))
            float_out += [np.asarray(values[n]) for n in out_names]
    return ExportCheck(len(samples), len(steps), worst, where, _sqnr(sim_out, int_out), _sqnr(float_out, int_out))
