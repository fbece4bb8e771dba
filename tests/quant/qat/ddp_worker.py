"""Trains the tiny CNN's twin for the DDP test: ``python ddp_worker.py OUT [augment]`` alone or under torchrun; rank 0
saves the trained student's state to OUT. ``augment``: on 16x16 inputs (images, which training shifts) with half of
each batch blended (mixup)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from npukit.quant.config import CalibrationSpec, CpuKernels, QuantConfig  # noqa: E402
from npukit.quant.qat.program import OnnxProgram  # noqa: E402
from npukit.quant.qat.train import QatConfig, Trainer  # noqa: E402
from npukit.quant.qat.twin import split  # noqa: E402
from npukit.quant.qdq import quantize  # noqa: E402
from tests.quant.conftest import make_samples, tiny_cnn  # noqa: E402


def main(out: str, augment: bool = False) -> None:
    torch.set_num_threads(1)
    model = tiny_cnn(activation="Relu", spread=0.5)
    shape = (1, 4, 16, 16) if augment else (1, 4, 8, 8)
    for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, shape):  # convs and a global pool
        dim.dim_value = size
    train = np.concatenate([s["x"] for s in make_samples(64, seed=1, shape=shape)])
    quant_config = QuantConfig(calibration=CalibrationSpec(method="minmax"), cpu=CpuKernels(reduce_range=True))
    result = quantize(model, make_samples(16, seed=1, shape=shape), config=quant_config)
    twin = split(result.model, reduce_range=True)
    student, teacher = twin.program(), OnnxProgram(result.reference)
    config = QatConfig(weight_bits=4, epochs=2, batch_size=8, lr=3e-3, augment=augment, mixup=0.5 if augment else 0)
    trainer = Trainer(student, teacher, {"x": train}, None, config, classify_output=0, checkpoint=None,
                      fingerprint="ddp")
    trained = trainer.train()
    if trainer.rank == 0:
        torch.save({"state": student.state_dict(), "world": trained.world_size,
                    "seconds": [e.seconds for e in trained.history]}, out)


if __name__ == "__main__":
    main(sys.argv[1], augment=sys.argv[2:] == ["augment"])
