"""The qat verb: post-training quantization on this CPU's scheme, then quantization-aware training of its twin by
distillation from the float model, the trained model written back onto the same grids, checked to compute what
training simulated, and held to the task check on data it was not trained on."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from npukit.config import PreprocessConfig
from npukit.data.subsets import every, spread
from npukit.errors import InputError
from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish, report_path_for
from npukit.report.graph import add_opset_upgrade
from npukit.report.progress import step, training_bar
from npukit.report.quantize import slower_note
from npukit.tasks import QualityGate
from npukit.verbs.common import (check_output, data_name, float_static_model, given_onnx_file, open_data,
                                 output_task, refuse_nothing_left, refuse_uniform_samples, upgrade_opset)

HOLD_OUT_EVERY = 5  # every 5th sample of --data is held out for the check when no --eval is given
VALIDATION = 0.1  # of the training samples set aside to choose the epoch kept (the start included, 8-bit weights)
MAX_VALIDATION = 256
CALIB = 64  # training samples (spread evenly) that calibrate the PTQ start when no --calib is given
EXPORT_CHECK = 4  # held-out samples on which the exported model is compared with the training simulation
INT4_OPSET = 21
EIGHT_BIT_SHARE = 0.05  # w4a8: at most this fraction of the weights keeps 8 bits, the most sensitive (bit_plan)
PLAN_SAMPLES = 16  # calibration samples on which each weight's 4-bit sensitivity is measured


def qat(
    model: str | Path,
    output: str | Path,
    *,
    data: str | Path,
    eval_data: str | Path | None = None,
    calib: str | Path | None = None,
    bits: str = "w8a8",
    schedule: Sequence[int] | None = None,
    epochs: int = 3,
    batch_size: int = 16,
    lr: float | None = None,
    learn_scales: bool = False,
    augment: bool = True,
    mixup: float = 0.0,
    max_steps: int | None = None,
    eight_bit_share: float | None = None,
    method: str = "auto",
    per_tensor: bool = False,
    exclude: Sequence[str] = (),
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
    """Quantization-aware training of ``model`` to ``bits`` (w8a8 or w4a8: 8- or 4-bit weights, 8-bit activations)
    on ``data`` (its labels used where the data has them), starting from npukit's PTQ model on this CPU's scheme
    (calibrated on ``calib``, else on 64 training samples spread evenly), trained ``epochs`` times over ``data`` by
    distillation from the float model (``npukit.quant.qat.train``), and written back as a QDQ model on the same
    grids (4-bit weights stored as int4, opset 21). With 4-bit weights, the most sensitive weights keep 8 bits, at
    most ``eight_bit_share`` of all weights (default 5%; ``npukit.quant.qat.bit_plan``, each weight's sensitivity
    measured alone on the first 16 calibration samples), and the others are lowered onto clipped grids and re-rounded
    by GPTQ on the calibration samples (``npukit.quant.qat.lower``) before the first step and at each step of
    ``schedule``. Every tenth training sample is set aside: after each epoch the student is validated on them, and
    the best epoch at the final bits is kept (a start already at the final bits is a candidate too, as with the
    default schedule: training never writes a model worse than its start on the validation samples). The PTQ model
    of the same bits and the trained one are then measured on the same validation samples by what the task check
    measures, and the one measured better is written (a tie: the trained one; ``_choose``), the report saying which
    and the validation figures that decided it. The written model is held to the task check on ``eval_data`` (else
    every 5th sample of ``data``, never trained on), never used to choose: its figures are what the report gives. The
    report shows the PTQ and trained models side by side there, each epoch's loss and agreement, and how far ONNX
    Runtime's integer model is from the training simulation.

    ``<output stem>.qat.pt`` holds the PTQ start and the last finished epoch: an interrupted run continues from it
    when the same command runs again (``restart`` starts over); it is removed once the artifact is written. Under
    ``torchrun`` the processes share every batch (DistributedDataParallel, gloo) and rank 0 writes."""
    from npukit.quant.qat.train import QatConfig, world

    output = check_output(output, source=model)
    weight_bits, eight_bit_share = _bit_options(bits, eight_bit_share)
    train_config = QatConfig(weight_bits=weight_bits, schedule=tuple(schedule) if schedule else None, epochs=epochs,
                             batch_size=batch_size, lr=lr, learn_scales=learn_scales, augment=augment, mixup=mixup,
                             max_steps=max_steps, seed=seed)
    proto, spec = float_static_model(model, input_shape, verb="qat", data=data)
    refuse_nothing_left(proto, exclude, hint="exclude fewer nodes: qat trains the quantized layers")
    samples = TrainingSamples.open(proto, data, eval_data, calib, preprocess or PreprocessConfig(), max_samples)
    rank, size = world()
    report = _report(model, data, eval_data, calib, samples, bits=bits, train_config=train_config,
                     eight_bit_share=eight_bit_share, method=method, per_tensor=per_tensor, exclude=exclude,
                     task=task, gate=gate, seed=seed, processes=size, spec=spec)
    checkpoint = _checkpoint(output, restart=restart, rank=rank)
    run = _Run(report, samples, train_config, task, gate or QualityGate(), threads, runs, rank, eight_bit_share)
    return run.run(proto, output, checkpoint, method=method, per_tensor=per_tensor, exclude=tuple(exclude),
                   html=html, source=Path(str(model)))


def _bit_options(bits: str, eight_bit_share: float | None) -> tuple[int, float]:
    """The weights' bits and the share of them kept at 8 bits (its default where not given), refused before any
    work where they do not fit together."""
    weight_bits = _weight_bits(bits)
    if eight_bit_share is not None and weight_bits != 4:  # it was taken and ignored
        raise InputError(f"--eight-bit-share keeps a share of a 4-bit model's weights at 8 bits; --bits {bits} has "
                         "every weight at 8 bits already", hint="leave --eight-bit-share out, or use --bits w4a8")
    eight_bit_share = EIGHT_BIT_SHARE if eight_bit_share is None else eight_bit_share
    if not 0 <= eight_bit_share < 1:
        raise InputError(f"8-bit share {eight_bit_share} must be in [0, 1)",
                         hint="e.g. --eight-bit-share 0.05 (0: every weight at 4 bits)")
    return weight_bits, eight_bit_share


def _report(model: str | Path, data: str | Path, eval_data: str | Path | None, calib: str | Path | None,
            samples: TrainingSamples, *, bits: str, train_config: Any, eight_bit_share: float, method: str,
            per_tensor: bool, exclude: Sequence[str], task: str | None, gate: QualityGate | None, seed: int,
            processes: int, spec: Any) -> Report:
    """The report, its config recording what ``qat`` was asked and resolved, so a run can be repeated."""
    return Report("qat", config={"model": str(model), "data": str(data), "eval": str(eval_data) if eval_data else
                                 f"every {HOLD_OUT_EVERY}th sample of {data}", "calib": str(calib) if calib else
                                 f"{len(samples.calib)} training samples, spread evenly", "bits": bits,
                                 "train": train_config.as_dict(), "eight_bit_share": eight_bit_share,
                                 "method": method, "per_tensor": per_tensor,
                                 "exclude": list(exclude), "task": task or "auto",
                                 "gate": (gate or QualityGate()).as_dict(), "seed": seed, "processes": processes,
                                 "input_shape": spec.as_dict() if spec else None,
                                 "samples": samples.describe()})


def _checkpoint(output: Path, *, restart: bool, rank: int) -> Path:
    """Where the run's checkpoint is kept (beside ``output``); ``restart`` removes it (rank 0), to start over."""
    checkpoint = report_path_for(output, ".qat.pt")
    if restart and rank == 0:
        checkpoint.unlink(missing_ok=True)
    return checkpoint


def _weight_bits(bits: str) -> int:
    forms = {"w8a8": 8, "w4a8": 4}
    if bits not in forms:
        raise InputError(f"--bits {bits!r} is not trained here", hint=f"use one of {', '.join(forms)}")
    return forms[bits]


@dataclasses.dataclass
class TrainingSamples:
    """Training inputs (name -> array, samples on axis 0) and labels, the calibration feeds, the held-out check
    samples (feeds, labels) and where they came from, and the validation samples (every tenth training sample,
    not trained on) that choose the epoch kept."""

    train: dict[str, np.ndarray]
    labels: np.ndarray | None
    calib: list[dict[str, np.ndarray]]
    held: list[Any]
    held_from: str
    validation: dict[str, np.ndarray]
    validation_labels: np.ndarray | None

    @classmethod
    def open(cls, proto: onnx.ModelProto, data: str | Path, eval_data: str | Path | None, calib: str | Path | None,
             preprocess: PreprocessConfig, max_samples: int | None) -> TrainingSamples:
        batches = list(open_data(data, proto, preprocess).batches(1))
        refuse_uniform_samples(batches, data_name(data), "training")
        if eval_data is None:
            kept, picked = every(len(batches), HOLD_OUT_EVERY)  # spread: a folder sorted by class
            which = f"every {HOLD_OUT_EVERY}th"
            if not picked:  # fewer than 5
                kept, picked, which = kept[:-1], kept[-1:], "the last"
            if len(kept) < 2:
                raise InputError(f"{data} holds {len(batches)} samples: too few to train on and hold a fifth out",
                                 hint="pass more samples, or --eval with held-out samples")
            batches, held = [batches[i] for i in kept], [batches[i] for i in picked]
            held_from = f"{len(held)} samples of {Path(str(data)).name}, {which} (not trained on)"
        else:
            from npukit.data.readers import same_data

            held = list(open_data(eval_data, proto, preprocess).batches(1))
            refuse_uniform_samples(held, data_name(eval_data), "check")
            held_from = (f"{Path(str(eval_data)).name}, the training data again (--eval is --data: optimistic, the "
                         "model was trained on them)" if same_data(eval_data, data)
                         else f"held-out data {Path(str(eval_data)).name}")
        if max_samples is not None:
            held = spread(held, max_samples)
        names = list(batches[0].feeds)
        _require_batch_axis(batches[0].feeds)
        # every k-th training sample validates (spread: data may be sorted)
        picked = set(every(len(batches), max(2, round(1 / VALIDATION)))[1][:MAX_VALIDATION])
        validation = [b for i, b in enumerate(batches) if i in picked]
        batches = [b for i, b in enumerate(batches) if i not in picked]
        train = {n: np.concatenate([b.feeds[n] for b in batches]) for n in names}
        for name, array in train.items():
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise InputError(f"training input {name!r} holds NaN or infinite values", hint="check the data")
        labels = _labels(batches)
        valid = {n: np.concatenate([b.feeds[n] for b in validation]) for n in names} if validation else {}
        calibration = list(open_data(calib, proto, preprocess).batches(1)) if calib else spread(batches, CALIB)
        if calib:  # else spread over the training data (it may be sorted), which was checked above
            refuse_uniform_samples(calibration, data_name(calib))
        calib_feeds = [b.feeds for b in calibration]
        return cls(train, labels, calib_feeds, held, held_from, valid, _labels(validation) if validation else None)

    def describe(self) -> dict[str, Any]:
        return {"train": len(next(iter(self.train.values()))), "labels": self.labels is not None,
                "validation": len(next(iter(self.validation.values()))) if self.validation else 0,
                "calibration": len(self.calib), "held_out": len(self.held), "held_out_from": self.held_from}

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for name, array in sorted(self.train.items()):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        if self.labels is not None:
            digest.update(self.labels.tobytes())
        return digest.hexdigest()


def _require_batch_axis(feeds: Mapping[str, np.ndarray]) -> None:
    """Training stacks samples along axis 0 of every input: an input without that batch axis (a scalar such as
    Silero VAD's sample rate; a recurrent state batched on another axis) is refused in one line."""
    for name, array in feeds.items():
        if array.ndim == 0 or array.shape[0] != 1:
            shape = "a scalar" if array.ndim == 0 else f"shaped {list(array.shape)} per sample"
            raise InputError(f"input {name!r} is {shape}: training stacks samples along a batch axis 0, which it "
                             "does not have", hint="train a model whose every input is batched on axis 0 (a "
                                                   "stateful or streaming model: wrap it so its state is internal)")


def _labels(batches: Sequence[Any]) -> np.ndarray | None:
    if batches and all(b.labels is not None for b in batches):
        return np.concatenate([np.asarray(b.labels).reshape(-1) for b in batches])
    return None


class _Run:
    """The verb's straight line: PTQ -> twin -> train -> write back -> export check -> PTQ vs QAT -> task check."""

    def __init__(self, report: Report, samples: TrainingSamples, config: Any, task: str | None, gate: QualityGate,
                 threads: int | None, runs: int, rank: int, eight_bit_share: float) -> None:
        self.report, self.samples, self.config, self.task, self.gate = report, samples, config, task, gate
        self.threads, self.runs, self.rank, self.eight_bit_share = threads, runs, rank, eight_bit_share

    def run(self, proto: onnx.ModelProto, output: Path, checkpoint: Path, *, method: str, per_tensor: bool,
            exclude: tuple[str, ...], html: bool, source: Path) -> CommandResult:
        import torch

        from npukit.pruning.sparsity import zero_masks
        from npukit.quant.qat.export_check import check_export
        from npukit.quant.qat.lower import lower_weights
        from npukit.quant.qat.program import OnnxProgram
        from npukit.quant.qat.train import Trainer, read_checkpoint
        from npukit.quant.qat.twin import split, write_back
        from npukit.report.qat import add_export_check, add_sparsity_kept, add_training

        report = self.report
        if self.threads:
            torch.set_num_threads(self.threads)
        torch.manual_seed(self.config.seed)
        quant_config = self._quant_config(method=method, per_tensor=per_tensor, exclude=exclude)
        fingerprint = self._fingerprint(proto, quant_config)
        result, payload = self._ptq(proto, quant_config, read_checkpoint(checkpoint, fingerprint))
        twin = split(result.model, reduce_range=quant_config.cpu.reduce_range, learn_scales=self.config.learn_scales)
        student = twin.program()
        teacher = OnnxProgram(result.reference)
        masks = zero_masks(twin.model, set(student.trained_initializers()))  # a pruned model's zeros stay zero
        if masks:
            add_sparsity_kept(report, masks)
        choice = output_task(result.reference, self.samples.held[0].feeds, self.task)
        logits = _logits(twin.model, result.reference, choice)
        if logits is not None:
            report.add("distilled_on", {"output": choice.output, "student": logits[0], "teacher": logits[1]})
        eight_bit = self._bit_plan(student, teacher)
        ptq_model, done = self._ptq_at_bits(result.model, twin, student, eight_bit, frozenset(masks))
        ready = {done.bits: done} if done is not None else {}  # the student already holds this lowering
        trainer = Trainer(student, teacher, self.samples.train, self.samples.labels, self.config,
                          classify_output=choice.output if choice.name == "classify" else None,
                          checkpoint=checkpoint, fingerprint=fingerprint, payload=payload,
                          validation=self.samples.validation, validation_labels=self.samples.validation_labels,
                          masks=masks, eight_bit=eight_bit, logits=logits,
                          lowering=lambda program, bits, keep: ready.pop(bits, None) or lower_weights(
                              program, bits, self.samples.calib, keep=keep, sparse=frozenset(masks),
                              seed=self.config.seed))
        with step(f"training ({self.config.epochs} epochs x {trainer.steps_per_epoch} steps, batch "
                  f"{self.config.batch_size})", timings=report.timings, key="train"), \
                training_bar(trainer.total, trainer.measure) as bar:
            trained = trainer.train(progress=bar)
        if self.rank != 0:  # rank 0 checks and writes; this process trained its share of every batch
            report.set_verdict(f"INFO qat: process {self.rank} trained its share of every batch; process 0 checks "
                               "and writes the artifact", passed=True)
            return CommandResult(report=report)
        student.eval()
        exported = write_back(result.model, twin, student)
        with step("checking the exported model against the training simulation", timings=report.timings,
                  key="export_check"):
            export = check_export(exported, student, [b.feeds for b in self.samples.held[:EXPORT_CHECK]])
        from npukit.frontend.onnx_io import save_onnx

        save_onnx(exported, output)
        add_training(report, trained)
        add_export_check(report, export)
        written, why = self._choose(result.reference, ptq_model, exported, choice, trained)
        self._compare(result.reference, ptq_model, exported, output, choice, export, written)
        if written == "PTQ":  # the verdict says so
            what = ("its PTQ start" if self.config.schedule[0] == self.config.weight_bits else
                    "the PTQ model of its bits (not trained)")
            report.set_verdict(f"{report.verdict}; the model is {what}: {why}", passed=report.passed)
        checkpoint.unlink(missing_ok=True)
        report.add("checkpoint", {"path": str(checkpoint), "removed": True, "resumed_from_epoch":
                                  trained.resumed_from})
        return finish(report, output, html=html, result=trained, source=source)

    # --------------------------------------------------------------------------------------------- steps
    def _fingerprint(self, proto: onnx.ModelProto, quant_config: Any) -> str:
        """The run's identity: a checkpoint of the same one holds the PTQ start (whose float head is timed: it is not
        built again, it might differ), the student and the optimizer."""
        return hashlib.sha256(json.dumps({"model": hashlib.sha256(proto.SerializeToString()).hexdigest(),
                                          "quant": quant_config.as_dict(), "train": self.config.as_dict(),
                                          "eight_bit_share": self.eight_bit_share,
                                          "data": self.samples.fingerprint()}, sort_keys=True,
                                         default=str).encode()).hexdigest()

    def _quant_config(self, *, method: str, per_tensor: bool, exclude: tuple[str, ...]):
        from npukit.quant.config import CalibrationSpec, QuantConfig, Scheme
        from npukit.verbs.quantize import cpu_scheme, on_cpu

        scheme = cpu_scheme()
        # the conv kernel choice shifts weight integers off a symmetric grid: a kernel choice, not trained
        config = on_cpu(QuantConfig(scheme=Scheme(per_channel=not per_tensor, exclude=exclude),
                                    calibration=CalibrationSpec(method=method)), scheme, gemm_convs=False)
        self.report.config["quant"] = config.as_dict()
        self.report.config["cpu_scheme"] = scheme
        return config

    def _ptq(self, proto: onnx.ModelProto, config: Any, saved: dict | None) -> tuple[_Start, dict[str, Any]]:
        """The PTQ start: from the checkpoint of this run where there is one (the opset upgrade made before it
        reported again, as a fresh run reports it), else built on the model at the opset its Q/DQ needs (on rank 0,
        sent to the others under torchrun); and what the checkpoint keeps of it: the serialized start and the
        upgrade's record (None where the model needed none)."""
        from npukit.quant.qdq import quantize
        from npukit.quant.steps import QuantSteps
        from npukit.report.quantize import add_steps

        payload = saved.get("payload", {}) if saved is not None else {}
        if payload.get("start"):
            model, reference, steps = payload["start"]
            upgrade = payload.get("opset_upgrade")
            if upgrade is not None:
                from npukit.frontend.opset import OpsetUpgrade

                add_opset_upgrade(self.report, OpsetUpgrade(**upgrade))
            self.report.add("resumed_start", "the PTQ start and the training were read from the checkpoint")
        else:
            proto, upgrade = self._at_quant_opset(proto, config)

            def build() -> tuple[bytes, bytes, dict]:
                result = quantize(proto, self.samples.calib, config=config)
                return result.model.SerializeToString(), result.reference.SerializeToString(), result.steps.as_dict()

            with step("post-training quantization (the start)", timings=self.report.timings, key="ptq"):
                model, reference, steps = _broadcast(build, self.rank)
        add_steps(self.report, QuantSteps.from_dict(steps), plan_of="the PTQ start, before training (the artifact's "
                  "weight bits: the bit plan's)" if self.config.weight_bits < 8 else "the PTQ start, before training")
        start = _Start(onnx.load_from_string(model), onnx.load_from_string(reference))
        return start, {"start": (model, reference, steps), "opset_upgrade": upgrade}

    def _at_quant_opset(self, proto: onnx.ModelProto, config: Any) -> tuple[onnx.ModelProto, dict | None]:
        """``proto`` at the opset its Q/DQ needs (int4 weights: 21; else ``quant_opset``'s), the conversion reported;
        and the conversion's record for the checkpoint (None where the model was at that opset already)."""
        from npukit.verbs.common import quant_opset

        if self.config.weight_bits == 4:
            proto = upgrade_opset(self.report, proto, INT4_OPSET, "int4 weights", self.samples.calib,
                                  alternative="train 8-bit weights (--bits w8a8)")
        else:
            proto = quant_opset(self.report, proto, config, self.samples.calib)
        return proto, self.report.sections.get("opset_upgrade")  # add_opset_upgrade's record, where it converted

    def _bit_plan(self, student: Any, teacher: Any) -> frozenset[str]:
        """For weights below 8 bits, the most sensitive ones that keep 8 bits (``quant.qat.bit_plan``), measured on
        the first calibration samples and reported; none for 8-bit weights or a share of 0."""
        if self.config.weight_bits == 8 or self.eight_bit_share == 0:
            return frozenset()
        from npukit.quant.qat.bit_plan import plan_bits
        from npukit.report.qat import add_bit_plan

        feeds = self.samples.calib[:PLAN_SAMPLES]
        stacked = {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}
        with step(f"measuring each weight's {self.config.weight_bits}-bit sensitivity on {len(feeds)} samples",
                  timings=self.report.timings, key="bit_plan"):
            plan = plan_bits(student, teacher, stacked, bits=self.config.weight_bits, share=self.eight_bit_share)
        add_bit_plan(self.report, plan)
        return plan.eight_bit

    def _ptq_at_bits(self, qdq: onnx.ModelProto, twin: Any, student: Any, eight_bit: frozenset[str],
                     sparse: frozenset[str]) -> tuple[onnx.ModelProto, Any]:
        """The PTQ model at the trained bits: the QDQ model itself for 8-bit weights; for fewer bits its weights
        lowered to them at once (clipped grids, GPTQ on the calibration samples: ``quant.qat.lower``; no training;
        the weights of ``eight_bit`` keep 8 bits), as a baseline. Where training starts at those bits (the default
        schedule) ``student`` itself is lowered, and the ``Lowering`` is returned for the trainer to start from
        instead of computing the same one again; else a copy is lowered and None returned."""
        import copy

        from npukit.quant.qat.lower import lower_weights
        from npukit.quant.qat.twin import write_back
        from npukit.report.qat import add_lowering

        if self.config.weight_bits == 8:
            return qdq, None
        at_start = self.config.schedule[0] == self.config.weight_bits
        probe = student if at_start else copy.deepcopy(student)
        with step(f"lowering the weights to {self.config.weight_bits} bits (clipped grids, GPTQ on "
                  f"{len(self.samples.calib)} samples) for the PTQ baseline", timings=self.report.timings,
                  key="lower"):
            lowered = lower_weights(probe, self.config.weight_bits, self.samples.calib, keep=eight_bit,
                                    sparse=sparse, seed=self.config.seed)
        add_lowering(self.report, lowered)
        return write_back(qdq, twin, probe), lowered if at_start else None

    def _choose(self, reference: onnx.ModelProto, ptq: onnx.ModelProto, trained: onnx.ModelProto, choice: Any,
                training: Any) -> tuple[str, str]:
        """Which of the PTQ model (``ptq``) and the trained one (``trained``) is written ("PTQ" or "QAT"), and why,
        chosen on the validation samples (every tenth training sample, never trained on), as the epoch kept is: never
        on the held-out check samples, whose figures the report gives as the written model's (choosing on them is
        selection on the test set, and flatters the figures reported). Where training kept its start, that is the
        PTQ model: its validation loss decided. Else both are measured on the validation samples by what the task
        check measures (``_keep``): the validation loss, with labels mostly cross-entropy on them, is not fidelity to
        the float model (a small CNN's kept epoch checked 0.900 top-1 agreement / 24.9 dB against its PTQ start's
        0.983 / 40.3 dB). No validation samples: the trained model, unchosen. The choice and its figures go to the
        report (``add_kept``)."""
        from npukit.report.qat import add_kept

        count = len(next(iter(self.samples.validation.values()))) if self.samples.validation else 0
        where = (f"the {count} validation samples (every tenth training sample, not trained on; not the held-out "
                 "check samples)")
        if training.kept == 0 and training.start is not None:  # the trained model is the start
            best = min((e for e in training.history if e.validation_loss is not None),
                       key=lambda e: e.validation_loss, default=None)
            figures = {"PTQ": {"validation_loss": training.start.validation_loss}}
            if best is not None:
                figures["QAT"] = {"epoch": best.epoch, "validation_loss": best.validation_loss}
            why = _start_kept(training, best)
            add_kept(self.report, "PTQ", why, where, figures)
            return "PTQ", why
        if not count:
            why = ("no validation samples to choose on (every tenth training sample validates; fewer than 10 were "
                   "given): the trained model is written unchosen")
            add_kept(self.report, "QAT", why, "no validation samples", {})
            return "QAT", why
        rows = self._task_rows(reference, {"PTQ": ptq, "QAT": trained}, _validation_samples(self.samples), choice,
                               "validation")
        written, why = _keep(rows, self.gate, training, f"on the {count} validation samples")
        add_kept(self.report, written, why, where, {label: _figures(result) for label, result in rows.items()})
        return written, why

    def _task_rows(self, reference: onnx.ModelProto, models: Mapping[str, Any], samples: Sequence[Any], choice: Any,
                   what: str) -> dict[str, Any]:
        """Each of ``models`` (label -> model) against the float model on ``samples`` by the task check."""
        from npukit.measure.task_fidelity import compare_task, session_runner
        from npukit.runtime.ort import make_session

        threads = self.threads or 1
        ref = session_runner(make_session(reference, threads=threads))
        names = [o.name for o in reference.graph.output]
        rows = {}
        for label, model in models.items():
            key = f"check_{label.lower()}" if what == "held-out" else f"{what}_{label.lower()}"
            with step(f"task check of the {label} model on {len(samples)} {what} samples",
                      timings=self.report.timings, key=key):
                _, rows[label] = compare_task(ref, session_runner(make_session(model, threads=threads)), samples,
                                              output_names=names, task=choice.name if choice.given else self.task)
        return rows

    def _compare(self, reference: onnx.ModelProto, ptq: onnx.ModelProto, trained: onnx.ModelProto, output: Path,
                 choice: Any, export: Any, written: str) -> None:
        """The PTQ and trained models (``trained``, written to ``output``) held to the task check on the held-out
        samples, timed and sized; ``written`` ("PTQ" or "QAT", ``_choose``'s choice, made on the validation samples)
        is the artifact, the one judged: the PTQ model is written to ``output`` in place of the trained one where it
        was chosen."""
        from npukit.frontend.onnx_io import save_onnx
        from npukit.measure.latency import measure_latency_interleaved
        from npukit.quant.qdq import integer_kernel_report
        from npukit.report.qat import add_comparison
        from npukit.tasks import judge
        from npukit.report.task import add_task_check

        report, held = self.report, self.samples.held
        threads = self.threads or 1
        rows = self._task_rows(reference, {"PTQ": ptq, "QAT": trained}, held, choice, "held-out")
        with step(f"timing float vs PTQ vs QAT, {threads} thread(s)", timings=report.timings, key="latency"):
            latency = measure_latency_interleaved({"float": reference, "PTQ": ptq, "QAT": str(output)},
                                                  threads=threads, runs=self.runs, feeds=held[0].feeds)
        sizes, deflated = _stored_sizes({"float": given_onnx_file(report.config["model"]) or reference, "PTQ": ptq,
                                         "QAT": output})  # the float model as the user's file, where it is one
        kernels = integer_kernel_report(ptq if written == "PTQ" else trained)  # the artifact's
        add_comparison(report, rows, latency, sizes, deflated, kernels, bits=self.config.weight_bits, written=written)
        if written == "PTQ":
            save_onnx(ptq, output)
        failures = [] if export.exact else [f"the exported model differs from the training simulation by up to "
                                             f"{export.max_steps:.1f} steps at {export.worst_tensor} (layer by layer)"]
        if self.config.weight_bits == 8 and not kernels["integer_compute"]:
            failures.append("no conv or matmul runs on an integer kernel (ORT computes them all in float)")
        verdict = judge(rows[written], self.gate, what="qat", extra_failures=failures, hint=_hint(rows, self.config))
        add_task_check(report, choice, rows[written], self.gate, verdict, where=self.samples.held_from)
        if report.passed:  # what the headline left out: the other model did better held out; slower than float
            ratio = latency[written].median_ms / latency["float"].median_ms
            notes = _other_better(rows, written) + slower_note(ratio, threads=threads).replace("INT8", written)
            report.set_verdict(report.verdict + notes, passed=True)


def _other_better(rows: Mapping[str, Any], written: str) -> str:
    """A note where the model not written (PTQ or QAT) did better on the held-out samples: a higher task metric, or
    the same and a worst-output SQNR 1 dB higher (QAT chosen on 2 validation samples where they tied held out
    at 15.3 dB against PTQ's 17.2); "" otherwise."""
    other = "PTQ" if written == "QAT" else "QAT"
    mine, theirs = _figures(rows[written]), _figures(rows[other])
    value, their_value = mine["value"], theirs["value"]
    worst, their_worst = mine["worst_sqnr_db"], theirs["worst_sqnr_db"]
    higher = value is not None and their_value is not None and their_value > value
    closer = (value == their_value and worst is not None and their_worst is not None and their_worst >= worst + 1.0)
    if not (higher or closer):
        return ""
    what = (f"{mine['metric']} {their_value:.3f} against {value:.3f}" if higher else
            f"worst output SQNR {their_worst:.1f} dB against {worst:.1f}")
    return (f"; note: the {other} model did better on the held-out samples ({what}); the {written} one was chosen "
            "on the validation samples")


def _validation_samples(samples: TrainingSamples) -> list[tuple[dict[str, np.ndarray], Any]]:
    """The validation samples one by one, as the held-out ones are checked: (feeds, labels or None)."""
    count = len(next(iter(samples.validation.values())))
    labels = samples.validation_labels
    return [({name: array[i:i + 1] for name, array in samples.validation.items()},
             labels[i:i + 1] if labels is not None else None) for i in range(count)]


def _figures(result: Any) -> dict[str, Any]:
    """What ``_keep`` weighs of a task check ``result``, for the report."""
    return {"metric": result.metric, "value": result.value,
            "worst_sqnr_db": min((o.sqnr_db for o in result.outputs if not math.isnan(o.sqnr_db)), default=None),
            "sqnr_db": {o.name: o.sqnr_db for o in result.outputs}, "samples": result.samples}


def _start_kept(training: Any, best: Any) -> str:
    """Why training kept its start (the PTQ model): its validation loss was not moved at all, or no epoch's was lower
    (``best``: the epoch of the lowest)."""
    from npukit.report.qat import validation_unmoved

    unmoved = validation_unmoved(training)
    if unmoved:
        return unmoved
    start = f"validation loss {training.start.validation_loss:.4g} at the start"
    return (f"no epoch did better on the validation samples ({start}; the lowest of the epochs "
            f"{best.validation_loss:.4g}, epoch {best.epoch})" if best is not None
            else f"no epoch did better on the validation samples ({start})")


def _standing(result: Any, gate: QualityGate) -> tuple[bool, float, float]:
    """What the task check measures of ``result``, best last when sorted: whether it meets every floor of ``gate``,
    the task metric, the worst output's SQNR."""
    from npukit.tasks import judge

    measured = [o.sqnr_db for o in result.outputs if not math.isnan(o.sqnr_db)]
    return (not judge(result, gate, what="qat").failures, -math.inf if result.value is None else result.value,
            min(measured, default=-math.inf))


def _keep(rows: Mapping[str, Any], gate: QualityGate, training: Any, where: str) -> tuple[str, str]:
    """Which of the PTQ model and the trained one is written ("PTQ" or "QAT"), and why: the trained one unless the
    PTQ model measures better by what the task check measures (``_standing``) in ``rows``, their task check results
    on the validation samples (``where`` says so)."""
    ptq, qat = _standing(rows["PTQ"], gate), _standing(rows["QAT"], gate)
    trained = f"the trained epoch {training.kept}" if training.kept else "the trained model"
    figures = (f"{rows['QAT'].metric} {qat[1]:.3f} (PTQ {ptq[1]:.3f}), worst output SQNR {qat[2]:.2f} dB (PTQ "
               f"{ptq[2]:.2f} dB)")
    if ptq <= qat:
        return "QAT", f"{trained} measures at least as well as the PTQ model {where} ({figures})"
    by = (f"it meets the check's floors and the trained one does not: {rows['PTQ'].metric} {ptq[1]:.3f} against "
          f"{qat[1]:.3f}, worst output SQNR {ptq[2]:.2f} dB against {qat[2]:.2f} dB" if ptq[0] != qat[0] else
          f"{rows['PTQ'].metric} {ptq[1]:.3f} against {qat[1]:.3f}" if ptq[1] != qat[1] else
          f"worst output SQNR {ptq[2]:.2f} dB against {qat[2]:.2f} dB")
    return "PTQ", f"it measures better than {trained} {where} ({by})"


def _logits(twin: onnx.ModelProto, reference: onnx.ModelProto, choice: Any) -> tuple[str, str] | None:
    """Where a classifier's class scores are a Softmax's, the logits it reads in the twin and in the float model:
    what training distils on, as prune and substitute do (``quant.qat.program.logits_of``). The twin's probabilities
    are its 8-bit output, exactly 0 below half a step, and no loss on them has a gradient there. On MTCNN ONet (3
    epochs) they made a validation loss of 7.011 that no epoch moved; clamped at the output's resolution it moved
    (0.0133 -> 0.0108) but the kept epoch's probabilities fell to 34.2 dB against the float model on the held-out
    crops, from the PTQ start's 36.7; on the logits they rise to 39.2 dB (validation loss 0.0144 -> 0.0137). None
    where no such Softmax is found in both."""
    from npukit.quant.qat.program import logits_of

    if choice.name != "classify":
        return None
    student, teacher = logits_of(twin, choice.output), logits_of(reference, choice.output)
    return (student, teacher) if student is not None and teacher is not None else None


def _hint(rows: dict[str, Any], config: Any) -> str:
    """What to try after a failing QAT check: where training left the model worse than its PTQ start on the held-out
    samples, fewer or gentler steps and more data, not longer training; 8-bit weights only after a 4-bit run."""
    ptq, qat = rows["PTQ"], rows["QAT"]
    worse = ptq.value is not None and qat.value is not None and qat.value < ptq.value
    if worse:
        hint = (f"more training samples (at least 10 leave every tenth to choose the epoch on), a lower --lr or fewer "
                f"steps: training left the model worse than its PTQ start ({qat.metric} {ptq.value:.3f} -> "
                f"{qat.value:.3f}), and the PTQ model itself is `npukit quantize`'s")
    else:
        hint = "train longer (--epochs), try --learn-scales"
    return hint + (", or 8-bit weights (--bits w8a8)" if config.weight_bits < 8 else "")


def _stored_sizes(models: Mapping[str, onnx.ModelProto | Path]) -> tuple[dict[str, int], dict[str, int]]:
    """Each model's bytes and deflated bytes as a file written by ``frontend.onnx_io.save_onnx`` (a path: that file),
    the writer of the QAT artifact and of ``quantize``'s: the models compared alike. onnx-ir writes a shape
    annotation (value_info) for every intermediate tensor whose type it knows; a proto's own serialization
    carries only those it holds, which made the PTQ model of ppocr_cls look 14 KiB smaller than the same graph
    written as the QAT artifact (321.8 vs 335.9 KiB; as files 335.9 KiB both)."""
    import tempfile

    from npukit.frontend.onnx_io import save_onnx
    from npukit.measure.size import compressed_bytes, model_size

    with tempfile.TemporaryDirectory(prefix="npukit-qat-") as scratch:
        paths = {label: model if isinstance(model, Path) else save_onnx(model, Path(scratch) / f"{label}.onnx")
                 for label, model in models.items()}
        return ({label: model_size(path).file_bytes for label, path in paths.items()},
                {label: compressed_bytes(path) for label, path in paths.items()})


@dataclasses.dataclass(frozen=True)
class _Start:
    """The PTQ model training starts from, and the float model it mirrors tensor for tensor."""

    model: onnx.ModelProto
    reference: onnx.ModelProto


def _broadcast(build, rank: int):
    """``build()`` on rank 0, its result sent to the other processes under torchrun (one PTQ, the same start)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return build()
    import torch.distributed as dist

    box = [build() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
