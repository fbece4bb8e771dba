"""The prune verb: structured channel pruning (whole channels of convolutions removed: fewer MACs, a smaller and
faster dense model) and/or unstructured magnitude sparsity (zeros that a 4-bit model stores compactly), then
distillation fine-tuning from the unpruned model, held to the task check on data it was not trained on."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from npukit.config import PreprocessConfig
from npukit.errors import InputError
from npukit.report.core import Report
from npukit.report.finish import CommandResult, report_path_for
from npukit.report.progress import step
from npukit.tasks import QualityGate
from npukit.verbs.common import check_output, float_static_model
from npukit.verbs.distill import Distillation
from npukit.verbs.qat import TrainingSamples

LEARNING_RATE = 1e-4  # Adam, cosine-decayed: the pruned float model starts close to the teacher
# high sparsity trains the model again more than it nudges it: the MNIST CNN at 90% reached 95.4% at 1e-3 and 96.3%
# at 3e-3, the rate it was trained at (float 96.9%; benchmarks/results/pruning.md)
SPARSE_HINT = ", at a higher --lr for a high --sparsity (up to the rate the model was trained at)"


def prune(
    model: str | Path,
    output: str | Path,
    *,
    data: str | Path,
    macs: float | None = None,
    sparsity: float | None = None,
    eval_data: str | Path | None = None,
    calib: str | Path | None = None,
    epochs: int = 3,
    batch_size: int = 16,
    lr: float | None = None,
    augment: bool = True,
    mixup: float = 0.0,
    max_steps: int | None = None,
    restart: bool = False,
    task: str | None = None,
    gate: QualityGate | None = None,
    seed: int = 0,
    threads: int | None = None,
    runs: int = 20,
    max_samples: int | None = None,
    input_shape: str | Sequence[Any] | None = None,
    preprocess: PreprocessConfig | None = None,
    html: bool = False,
) -> CommandResult:
    """Prune ``model`` (float) and fine-tune it by distillation from itself on ``data``; write the float result.

    ``macs``: structured channel pruning to this fraction of the model's MACs (``npukit.pruning.channels``: whole
    channels of the convs whose channels stand alone, the least important by their effect on the next layer on
    calibration samples, each next 1x1 conv or Gemm refitted by least squares). ``sparsity``: this share of every
    Conv / Gemm / MatMul weight tensor set to zero by magnitude and held at zero while fine-tuning (``npukit qat
    --bits w4a8`` of the result keeps the zeros: 4-bit weights whose runs of zeros deflate). Both may be given
    (channels first). The samples split as in ``npukit qat``: every tenth training sample validates (the best
    epoch is kept, the pruned start included), the check reads ``eval_data`` (else every 5th sample of ``data``).
    The report shows the model before and after fine-tuning beside the float one: task metric, MACs, parameters,
    ORT CPU latency, file size and deflated size. ``<output stem>.prune.pt`` keeps the last finished epoch."""
    from npukit.quant.qat.train import QatConfig

    if macs is None and sparsity is None:
        raise InputError("nothing to prune", hint="pass --macs 0.7 (channels, to 70% of the MACs) and/or "
                                                  "--sparsity 0.9 (90% of the weights zero)")
    if macs is not None and not 0 < macs < 1:
        raise InputError(f"MAC fraction {macs} must be between 0 and 1", hint="e.g. --macs 0.7 keeps 70% of the MACs")
    if sparsity is not None and not 0 < sparsity < 1:
        raise InputError(f"sparsity {sparsity} must be between 0 and 1", hint="e.g. --sparsity 0.9")
    output = check_output(output, source=model)
    train_config = QatConfig(weight_bits=8, epochs=epochs, batch_size=batch_size, lr=lr or LEARNING_RATE,
                             augment=augment, mixup=mixup, max_steps=max_steps, seed=seed)
    proto, spec = float_static_model(model, input_shape, verb="prune", data=data)
    samples = TrainingSamples.open(proto, data, eval_data, calib, preprocess or PreprocessConfig(), max_samples)
    report = Report("prune", config={"model": str(model), "data": str(data), "macs": macs, "sparsity": sparsity,
                                     "eval": str(eval_data) if eval_data else f"last 20% of {data}",
                                     "calib": str(calib) if calib else f"{len(samples.calib)} training samples",
                                     "train": train_config.as_dict(), "task": task or "auto",
                                     "gate": (gate or QualityGate()).as_dict(), "seed": seed,
                                     "input_shape": spec.as_dict() if spec else None, "samples": samples.describe()})
    checkpoint = report_path_for(output, ".prune.pt")
    if restart:
        checkpoint.unlink(missing_ok=True)
    return _prune_and_tune(proto, output, checkpoint, Distillation(
        report, samples, train_config, task, gate or QualityGate(), threads, runs, label="pruned",
        hint="prune less (--macs nearer 1, a lower --sparsity) or fine-tune longer (--epochs)"
             + (SPARSE_HINT if sparsity is not None else "")),
        macs=macs, sparsity=sparsity, html=html, source=Path(str(model)))


def _prune_and_tune(proto: onnx.ModelProto, output: Path, checkpoint: Path, run: Distillation, *,
                    macs: float | None, sparsity: float | None, html: bool, source: Path) -> CommandResult:
    """The verb's straight line: preprocess -> prune -> fine-tune -> write -> before/after check."""
    from npukit.quant.qdq import preprocess

    with step("pre-processing (BatchNorm folded, shapes inferred)", timings=run.report.timings, key="preprocess"):
        reference = preprocess(proto)
    start, pruned, schedule = _prune(run, reference, macs, sparsity)
    return run.run(reference, start, output, checkpoint, before=pruned, sparsity=schedule,
                   key={"sparsity": sparsity}, html=html, source=source)


def _prune(run: Distillation, reference: onnx.ModelProto, macs: float | None, sparsity: float | None
           ) -> tuple[Any, Any, Any]:
    """(the model fine-tuning starts from, the pruned model before fine-tuning, the sparsity schedule or None):
    channels are pruned before training; sparsity is raised step by step during it (the model before
    fine-tuning is the one-shot sparse one)."""
    from npukit.pruning.channels import prune_channels
    from npukit.pruning.sparsity import GradualSparsity, sparsify
    from npukit.report.prune import add_channels, add_sparsity

    start = reference
    if macs is not None:
        with step(f"pruning channels to {macs:.0%} of the MACs", timings=run.report.timings, key="channels"):
            channels = prune_channels(reference, run.samples.calib, macs)
        add_channels(run.report, channels)
        start = channels.model
    if sparsity is None:
        return start, start, None
    sparse = sparsify(start, sparsity)
    add_sparsity(run.report, sparse)
    return start, sparse.model, GradualSparsity(sparsity, tuple(sparse.masks))
