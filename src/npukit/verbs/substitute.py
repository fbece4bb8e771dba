"""The substitute verb: replace operators by others that compute a different function (HardSwish -> ReLU6,
GroupNorm -> InstanceNorm: what a target without the original op, or a faster int8 kernel, needs), measure what
that costs on the task, and recover it by distillation fine-tuning from the unchanged model, held to the task
check on data it was not trained on. Substitutions that are all exact (HardSigmoid -> Clip, ...) cost nothing to
recover: the substituted model is written as it is, held to the same check."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from npukit.config import PreprocessConfig
from npukit.errors import InputError
from npukit.report.core import Report
from npukit.report.finish import CommandResult, report_path_for
from npukit.report.progress import step
from npukit.report.prune import add_substitutions
from npukit.tasks import QualityGate
from npukit.verbs.common import check_output, float_static_model
from npukit.verbs.distill import Distillation
from npukit.verbs.qat import TrainingSamples

RAMP = 0.5  # the share of the training steps an inexact substitution is blended in over (npukit.quant.qat.blend)
LEARNING_RATE = 1e-4  # Adam, cosine-decayed, as prune: the changed model starts close to the teacher
EXACT = "every substitution is exact"  # why nothing is fine-tuned when no rule applied changes the function


def substitute(
    model: str | Path,
    output: str | Path,
    *,
    rules: Sequence[str],
    data: str | Path,
    eval_data: str | Path | None = None,
    epochs: int = 3,
    batch_size: int = 16,
    lr: float | None = None,
    ramp: float | None = None,
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
    """Apply the substitutions ``rules`` (``npukit.targets.fix.FIXES`` names, e.g. ``hardswish_to_relu6``) to every
    node they serve, then fine-tune the result by distillation from ``model`` on ``data`` and write it (float).

    The samples split as in ``npukit qat`` (every tenth training sample validates, the best epoch is kept, the
    substituted start included; the check reads ``eval_data``, else every 5th sample of ``data``). ``ramp``: an inexact
    substitution is blended in over this share of the training steps (``npukit.quant.qat.blend``: the original ops'
    outputs and their substitutes' in shares moving from the first to the second; None: ``RAMP``), 0 to fine-tune
    the substituted model as it is from the first step; only epochs with the substitutes whole are kept. The report
    shows the substituted model before and after fine-tuning beside the original: task metric, worst output SQNR,
    MACs, ORT CPU latency. ``<output stem>.substitute.pt`` keeps the last finished epoch.

    Where every substitution applied is exact (``targets.fix.FixRule.exact``), nothing is fine-tuned: the substituted
    model is written as it is and the verdict is its own task check on the held-out samples."""
    from npukit.quant.qat.train import QatConfig
    from npukit.quant.qdq import preprocess as pre_process  # (``preprocess`` is the data's PreprocessConfig here)
    from npukit.targets.fix import substitute as apply_substitutions

    ramp = _checked_ramp(rules, ramp)
    output = check_output(output, source=model)
    train_config = QatConfig(weight_bits=8, epochs=epochs, batch_size=batch_size, lr=lr or LEARNING_RATE,
                             augment=augment, mixup=mixup, max_steps=max_steps, seed=seed)
    proto, spec = float_static_model(model, input_shape, verb="substitute", data=data)
    changed = apply_substitutions(proto, list(rules))  # before pre-processing, which inlines HardSwish
    samples = TrainingSamples.open(proto, data, eval_data, None, preprocess or PreprocessConfig(), max_samples)
    report = _report(model, data, eval_data, rules, samples, train_config=train_config, ramp=ramp, task=task,
                     gate=gate, seed=seed, spec=spec)
    add_substitutions(report, changed.applied)
    checkpoint = report_path_for(output, ".substitute.pt")
    if restart:
        checkpoint.unlink(missing_ok=True)
    run = Distillation(report, samples, train_config, task, gate or QualityGate(), threads, runs, label="substituted",
                       hint="fine-tune longer (--epochs) or on more data, or keep the original op (it may run on "
                            "the CPU beside the target: npukit analyze)")
    with step("pre-processing (BatchNorm folded, shapes inferred)", timings=report.timings, key="preprocess"):
        reference, start = pre_process(proto), pre_process(changed.model)
    if all(a["exact"] for a in changed.applied):
        return run.check(reference, start, output, why=EXACT, html=html, source=Path(str(model)),
                         hint="lower floors (--min-sqnr, --min-task-metric): the substitutes compute the same "
                              "function, so only float rounding separates the models")
    blended, blend = _blended(report, proto, rules, start, ramp)
    return run.run(reference, start, output, checkpoint, blended=blended, blend=blend,
                   key={"rules": list(rules), "ramp": ramp if blend else 0}, html=html, source=Path(str(model)))


def _checked_ramp(rules: Sequence[str], ramp: float | None) -> float:
    """The ramp (``RAMP`` where not given); no rule, or a ramp outside [0, 1], is refused before any work."""
    if not rules:
        raise InputError("no substitution given", hint="pass --rule hardswish_to_relu6 (or groupnorm_to_instancenorm)")
    ramp = RAMP if ramp is None else ramp
    if not 0 <= ramp <= 1:
        raise InputError(f"ramp {ramp} must be between 0 and 1", hint="e.g. --ramp 0.5 (0: the substitute at once)")
    return ramp


def _report(model: str | Path, data: str | Path, eval_data: str | Path | None, rules: Sequence[str],
            samples: TrainingSamples, *, train_config: Any, ramp: float, task: str | None, gate: QualityGate | None,
            seed: int, spec: Any) -> Report:
    """The report, its config recording what ``substitute`` was asked and resolved, so a run can be repeated."""
    return Report("substitute", config={"model": str(model), "data": str(data), "rules": list(rules),
                                        "eval": str(eval_data) if eval_data else f"last 20% of {data}",
                                        "train": train_config.as_dict(), "ramp": ramp, "task": task or "auto",
                                        "gate": (gate or QualityGate()).as_dict(), "seed": seed,
                                        "input_shape": spec.as_dict() if spec else None,
                                        "samples": samples.describe()})


def _blended(report: Report, proto: Any, rules: Sequence[str], start: Any, ramp: float) -> tuple[Any, Any]:
    """With a ``ramp``, the model that blends the substitutes in and the schedule that does it; else (None, None):
    the substituted model is fine-tuned as it is from the first step."""
    blended, blend = None, None
    if ramp:
        from npukit.quant.qat.blend import GradualSubstitution, blended_model

        with step(f"blending the substitution in over {ramp:.0%} of the steps", timings=report.timings,
                  key="blend"):
            blended, blend = blended_model(proto, list(rules), start), GradualSubstitution(ramp)
    return blended, blend
