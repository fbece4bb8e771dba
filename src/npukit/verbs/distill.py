"""What prune and substitute share after they change a float model: distillation fine-tuning of the changed model
from the unchanged one, the result written, and both the changed model (before fine-tuning) and the fine-tuned one
held to the task check against the unchanged model on samples training never saw; or, where the change needs no
recovery (substitutions that are all exact), the changed model written as it is and held to the same check."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import onnx

from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish
from npukit.report.progress import step, training_bar
from npukit.tasks import QualityGate
from npukit.verbs.common import given_onnx_file, output_task
from npukit.verbs.qat import TrainingSamples


class Distillation:
    """One verb's fine-tuning run: ``label`` names the changed model in the report ("pruned", "substituted"),
    ``hint`` says what to try when the fine-tuned model fails its check."""

    def __init__(self, report: Report, samples: TrainingSamples, config: Any, task: str | None, gate: QualityGate,
                 threads: int | None, runs: int, *, label: str, hint: str) -> None:
        self.report, self.samples, self.config, self.task, self.gate = report, samples, config, task, gate
        self.threads, self.runs, self.label, self.hint = threads, runs, label, hint

    def run(self, reference: onnx.ModelProto, start: onnx.ModelProto, output: Path, checkpoint: Path, *,
            before: onnx.ModelProto | None = None, sparsity: Any = None, blended: onnx.ModelProto | None = None,
            blend: Any = None, key: dict | None = None, html: bool, source: Path) -> CommandResult:
        """Fine-tune ``start`` by distillation from ``reference`` and write it to ``output``. ``before``: the changed
        model as the user would get it without fine-tuning (``start`` when None; the one-shot sparse model when
        ``sparsity``, a ``GradualSparsity``, raises zeros while training). ``blended``: the model trained in place of
        ``start`` (its changes blended in by ``blend``, a ``GradualSubstitution``), whose weights ``start`` takes at the
        end. ``key``: what else makes the checkpoint this run's."""
        import torch

        from npukit.frontend.onnx_io import save_onnx
        from npukit.quant.qat.program import OnnxProgram, with_logits, with_trained_weights
        from npukit.quant.qat.train import Trainer
        from npukit.report.qat import add_training

        report = self.report
        if self.threads:
            torch.set_num_threads(self.threads)
        torch.manual_seed(self.config.seed)
        choice = output_task(reference, self.samples.held[0].feeds, self.task)
        trained_model = blended if blended is not None else start
        digest = {"model": hashlib.sha256(trained_model.SerializeToString()).hexdigest(),
                  "teacher": hashlib.sha256(reference.SerializeToString()).hexdigest(), **(key or {}),
                  "train": self.config.as_dict(), "data": self.samples.fingerprint()}
        fingerprint = hashlib.sha256(json.dumps(digest, sort_keys=True, default=str).encode()).hexdigest()
        classify = choice.name == "classify"
        student_model, teacher_model = trained_model, reference
        if classify:  # both on logits, or (where one's Softmax is not found) both on probabilities
            student_model, teacher_model = with_logits(trained_model, choice.output), with_logits(reference,
                                                                                                  choice.output)
            if (student_model is trained_model) != (teacher_model is reference):
                student_model, teacher_model = trained_model, reference
        student, teacher = OnnxProgram(student_model), OnnxProgram(teacher_model)
        trainer = Trainer(student, teacher, self.samples.train, self.samples.labels, self.config,
                          classify_output=choice.output if classify else None,
                          checkpoint=checkpoint, fingerprint=fingerprint, validation=self.samples.validation,
                          validation_labels=self.samples.validation_labels, sparsity=sparsity, blend=blend)
        with step(f"fine-tuning by distillation ({self.config.epochs} epochs x {trainer.steps_per_epoch} steps)",
                  timings=report.timings, key="train"), training_bar(trainer.total, trainer.measure) as bar:
            trained = trainer.train(progress=bar)
        if trainer.rank != 0:
            report.set_verdict(f"INFO {report.command}: process {trainer.rank} trained its share of every batch; "
                               "process 0 checks and writes the artifact", passed=True)
            return CommandResult(report=report)
        student.eval()
        tuned = with_trained_weights(start, student)
        save_onnx(tuned, output)
        add_training(report, trained, bits=False)
        self._compare(reference, before if before is not None else start, output, choice)
        checkpoint.unlink(missing_ok=True)
        return finish(report, output, html=html, result=trained, source=source)

    def check(self, reference: onnx.ModelProto, changed: onnx.ModelProto, output: Path, *, why: str, hint: str,
              html: bool, source: Path) -> CommandResult:
        """Write ``changed`` to ``output`` without fine-tuning it (``why``: the reason, said in the report and its
        verdict) and hold it to the task check against ``reference`` on the held-out samples, the check ``run``
        holds the fine-tuned model to; ``hint``: what to try when it fails. Under torchrun only process 0 does."""
        from npukit.frontend.onnx_io import save_onnx
        from npukit.report.prune import add_no_training

        report = self.report
        rank = int(os.environ.get("RANK", "0"))
        if rank != 0:
            report.set_verdict(f"INFO {report.command}: process {rank} has nothing to train ({why}); process 0 "
                               "checks and writes the artifact", passed=True)
            return CommandResult(report=report)
        choice = output_task(reference, self.samples.held[0].feeds, self.task)
        save_onnx(changed, output)
        add_no_training(report, why)
        self._compare(reference, changed, output, choice, untuned=why, hint=hint)
        return finish(report, output, html=html, source=source)

    def _compare(self, reference: onnx.ModelProto, changed: onnx.ModelProto, output: Path, choice: Any, *,
                 untuned: str | None = None, hint: str | None = None) -> None:
        """The changed model and the fine-tuned one written to ``output`` against ``reference`` on the held-out
        samples, the fine-tuned one judged; ``untuned`` (why nothing was fine-tuned): ``output`` is ``changed``,
        which is judged (failing with ``hint``)."""
        from npukit.measure.task_fidelity import compare_task, session_runner
        from npukit.report.prune import add_comparison
        from npukit.report.task import add_task_check
        from npukit.runtime.ort import make_session
        from npukit.tasks import judge

        report, held, label = self.report, self.samples.held, self.label
        threads = self.threads or 1
        ref = session_runner(make_session(reference, threads=threads))
        names = [o.name for o in reference.graph.output]
        models = {"float": reference, label: changed} | ({} if untuned else {"fine-tuned": onnx.load(str(output))})
        rows = {}
        for name in list(models)[1:]:
            with step(f"task check of the {name} model on {len(held)} held-out samples", timings=report.timings,
                      key=f"check_{name}"):
                _, rows[name] = compare_task(ref, session_runner(make_session(models[name], threads=threads)),
                                             held, output_names=names,
                                             task=choice.name if choice.given else self.task)
        latency, figures = self._costs(reference, models, output)
        add_comparison(report, rows, latency, figures, label=label, untuned=untuned)
        judged = rows[label if untuned else "fine-tuned"]
        what = f"{report.command} without fine-tuning ({untuned})" if untuned else report.command
        verdict = judge(judged, self.gate, what=what, hint=hint or self.hint)
        add_task_check(report, choice, judged, self.gate, verdict, where=self.samples.held_from)

    def _costs(self, reference: onnx.ModelProto, models: dict[str, onnx.ModelProto],
               output: Path) -> tuple[dict[str, Any], dict[str, dict]]:
        """The float model and the one written to ``output`` timed side by side on ORT CPU (the latter under the
        changed model's label), and each of ``models``' MACs, parameters and sizes."""
        from npukit.measure.latency import measure_latency_interleaved
        from npukit.measure.size import compressed_bytes, model_size
        from npukit.measure.summary import summarize

        report, label, threads = self.report, self.label, self.threads or 1
        with step(f"timing float vs {label}, {threads} thread(s)", timings=report.timings, key="latency"):
            latency = measure_latency_interleaved({"float": reference, label: str(output)}, threads=threads,
                                                  runs=self.runs, feeds=self.samples.held[0].feeds)
        figures = {}
        for name, model in models.items():
            summary = summarize(model)
            figures[name] = {"macs": summary.macs, "params": summary.parameters,
                             "bytes": model_size(model).serialized_bytes, "deflated": compressed_bytes(model)}
        given = given_onnx_file(report.config["model"])
        if given is not None:  # the float row is the user's file, not the model as preprocessed (BatchNorm folded)
            figures["float"] |= {"bytes": model_size(given).file_bytes, "deflated": compressed_bytes(given)}
        return latency, figures
