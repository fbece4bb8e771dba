"""Quantization-aware training of a QDQ model's twin (``npukit.quant.qat.twin``) by distillation from the float model.

One step: a batch of training inputs (shifted at random when they are images and ``augment`` is on), the float
model's outputs on them (the teacher, no gradient) and the twin's (the student, fake-quantized on the plan's grids);
the loss is the task's: for a classifier the KL divergence of the softened class distributions (temperature
``temperature``; a model that ends in Softmax is distilled on the logits that Softmax reads where the caller names
them (``logits``), else on the log of its probabilities, which are its logits less a constant per row: softening
the probabilities themselves would flatten every target to near uniform), plus
cross-entropy on the labels when the data has them (weight ``label_weight``), plus the logits' squared error
divided by their variance (weight ``logit_weight``: the fidelity the check measures as SQNR); for every other
output, the squared error divided by its variance, so outputs of any scale weigh alike (the variances are the
teacher's on the first training samples, fixed for the run). Adam on the float weights (and on the grids' scales
with ``learn_scales``), cosine-decayed learning rate.

Bits lowered step by step: ``schedule`` lists the weight bits of equal parts of the training (e.g. 6 then 4); at
each change (the first one before any step) the weight grids are re-derived from the weights on the narrower rule,
and with ``lowering`` (``npukit.quant.qat.lower.lower_weights``) the weights are re-rounded onto them by GPTQ on
calibration samples, but for the weights in ``eight_bit`` (``npukit.quant.qat.bit_plan``: the most sensitive ones),
which keep their 8-bit grids. The lowered start is a candidate when it is already at the final bits.

BatchNorm is folded into the convolutions before the QDQ model is built (ONNX Runtime's pre-processing), so its
statistics are frozen from the first step and the folded weights train.

``masks`` hold pruned weights at zero: after every step each masked weight is multiplied by its mask. ``sparsity``
(``npukit.pruning.sparsity.GradualSparsity``) raises the sparsity step by step: at the steps where it says so, the masks
are recomputed from the weights as trained so far; an epoch counts as a candidate to keep only once the final
sparsity is reached. ``blend`` (``npukit.quant.qat.blend.GradualSubstitution``) moves a blended model from its
original ops to their substitutes the same way: candidates only once the substitutes are whole.

Checkpoints: after every epoch the student, the optimizer, the epoch and the loss history go to ``checkpoint``
atomically (an interrupted run keeps the last one); a run with the same fingerprint starts from it. Under
``torchrun`` (``WORLD_SIZE`` > 1) each process takes its share of every batch (the global batch stays
``batch_size``) and DistributedDataParallel averages the gradients (gloo on CPUs); only rank 0 writes. Every process
draws the shifts and blends of the whole batch, as one process does, and keeps its share: the processes together
train on the samples one process trains on (each drawing for its own share alone from the same seeded generator
gave other samples: RNet pruned by one process and by two differed by 20.6 dB, 133 dB without augmentation).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from npukit._atomic import write_bytes_atomic
from npukit.errors import InputError
from npukit.quant.qat.fake_quant import WeightQuant, set_weight_bits
from npukit.quant.qat.program import OnnxProgram

BITS = (8, 4)
SPREAD_SAMPLES = 32  # training samples whose teacher outputs set each output's loss scale
PROBABILITY_FLOOR = 1e-12  # a Softmax output's zeros, before its log is taken


def _resolution(probabilities: torch.Tensor) -> float:
    """Where the student's probabilities hold exact zeros (a quantized Softmax output: values under half its grid's
    step round to 0), half its smallest positive value, below which it cannot tell probabilities apart: the student
    and the teacher are both clamped there before the log (where the caller names no logits to distil on instead:
    ``Trainer``'s ``logits``). Else ``PROBABILITY_FLOOR``. At 1e-12 the zeros' log (-27.6
    against a teacher's -8) made a loss no training could move: MTCNN ONet's validation loss was 7.011 in every epoch
    and the PTQ start was kept; at its 8-bit output's resolution it falls 0.0133 -> 0.0108 over 3 epochs."""
    with torch.no_grad():
        positive = probabilities[probabilities > 0]
        if positive.numel() == probabilities.numel() or not positive.numel():
            return PROBABILITY_FLOOR
        return max(float(positive.min()) / 2, PROBABILITY_FLOOR)


@dataclasses.dataclass(frozen=True)
class QatConfig:
    """How the twin is trained; see the module docstring. ``lr`` None: 5e-5 for 8-bit weights, 1e-4 below.
    ``max_steps`` caps the steps of each epoch (None: every training sample once per epoch)."""

    weight_bits: int = 8
    schedule: tuple[int, ...] | None = None
    epochs: int = 3
    batch_size: int = 16
    lr: float | None = None
    learn_scales: bool = False
    temperature: float = 2.0
    label_weight: float = 0.5
    logit_weight: float = 1.0
    augment: bool = True
    # share of each batch's images blended (``_mixed``): off by default, as it bought nothing measured (MobileNetV2
    # w4a8, 10 epochs on the 7 calibration photos' crops, 208 held-out crops: 61.1% top-1 agreement / 10.1 dB
    # without, 60.6% / 10.1 dB with half of each batch blended)
    mixup: float = 0.0
    max_steps: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        def require(cond: bool, message: str, hint: str) -> None:
            if not cond:
                raise InputError(message, hint=hint)

        require(self.weight_bits in BITS, f"weight bits {self.weight_bits} are not trained",
                f"use {' or '.join(map(str, BITS))}")
        schedule = tuple(self.schedule) if self.schedule else (self.weight_bits,)
        require(all(4 <= b <= 8 for b in schedule) and list(schedule) == sorted(schedule, reverse=True)
                and schedule[-1] == self.weight_bits,
                f"bit schedule {list(schedule)} must go down from at most 8 and end at {self.weight_bits}",
                "e.g. 8,6,4 for 4-bit weights" if self.weight_bits == 4
                else "8-bit weights train at 8 bits throughout: leave the schedule out")
        object.__setattr__(self, "schedule", schedule)
        require(self.epochs >= 1, f"epochs {self.epochs} must be at least 1", "3 is the default")
        require(self.batch_size >= 1, f"batch size {self.batch_size} must be at least 1", "16 is the default")
        require(self.lr is None or 0 < self.lr < 1, f"learning rate {self.lr} must be in (0, 1)", "e.g. 1e-5")
        require(self.temperature > 0, f"temperature {self.temperature} must be positive", "2 is the default")
        require(0 <= self.label_weight <= 1, f"label weight {self.label_weight} must be in [0, 1]", "0.5")
        require(self.logit_weight >= 0, f"logit weight {self.logit_weight} must be at least 0", "1 is the default")
        require(self.max_steps is None or self.max_steps >= 1, "max_steps must be at least 1", "or leave it out")
        require(0 <= self.mixup <= 1, f"mixup share {self.mixup} must be in [0, 1]", "e.g. 0.5")

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (5e-5 if self.weight_bits == 8 else 1e-4)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"learning_rate": self.learning_rate}


@dataclasses.dataclass(frozen=True)
class Epoch:
    """One epoch's figures: mean loss, agreement with the teacher on the training batches (top-1 for a
    classifier, else SQNR in dB), the weight bits at its end, its wall time, and the loss and agreement on the
    validation samples after it (epoch 0: the start, before any training); with a blended substitution, the
    substitute's share at its end (``share``; None without one)."""

    epoch: int
    loss: float
    agreement: float
    metric: str
    bits: int
    seconds: float
    validation_loss: float | None = None
    validation_agreement: float | None = None
    share: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TrainResult:
    history: tuple[Epoch, ...]
    steps: int
    resumed_from: int  # epochs already done when this run started (0: a fresh start)
    world_size: int
    seconds: float
    kept: int  # the epoch whose weights the student holds at the end (0: the start; validation chose it)
    start: Epoch | None  # the start on the validation samples (None: no validation samples)
    lowered: tuple[dict[str, Any], ...] = ()  # each lowering of the weight bits (``Lowering.as_dict``)


def world() -> tuple[int, int]:
    """(rank, world size) under torchrun, else (0, 1); the process group is set up on first use (gloo)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), size


class Batched(nn.Module):
    """The program over a batch: each sample runs as the batch-1 graph it was exported as (``torch.vmap``);
    ``outputs``: the tensors it returns (None: the graph's outputs)."""

    def __init__(self, program: OnnxProgram, outputs: Sequence[str] | None = None) -> None:
        super().__init__()
        self.program = program
        self.outputs = tuple(outputs) if outputs is not None else None

    def forward(self, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        def run(sample: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
            if self.outputs is None:
                return self.program(sample)
            env = self.program.run(sample)
            return [env[name] for name in self.outputs]

        def one(sample: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
            return [o[0] if o.dim() and o.shape[0] == 1 else o for o in run({k: v[None] for k, v in sample.items()})]

        return torch.vmap(one)(dict(feeds))


def _shifted(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each image moved by up to 1/8 of its height and width (edges repeated): inputs of the model's kind that the
    calibration set does not hold exactly."""
    n, _, h, w = x.shape
    pad_h, pad_w = max(1, h // 8), max(1, w // 8)
    padded = F.pad(x, (pad_w, pad_w, pad_h, pad_h), mode="replicate")
    dy = torch.randint(0, 2 * pad_h + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * pad_w + 1, (n,), generator=generator)
    return torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])


def _mixed(feeds: dict[str, torch.Tensor], names: set[str], share: float, generator: torch.Generator) -> None:
    """``share`` of the samples (drawn at random) blended with another sample of the batch in every image input
    ``names``, x' = l x + (1 - l) y, l uniform in [0, 1] (mixup, Zhang et al. 2018, as distillation's function
    matching uses it: Beyer et al. 2022, "Knowledge distillation: a good teacher is patient and consistent"): teacher
    and student see the same blend, so every pair of training images gives new inputs to match on."""
    n = len(next(iter(feeds.values())))
    if n < 2 or share <= 0 or not names:
        return
    chosen = torch.rand(n, generator=generator) < share
    partner = torch.randint(0, n, (n,), generator=generator)
    weight = torch.where(chosen, torch.rand(n, generator=generator), torch.ones(n))
    for name in names:
        x = feeds[name]
        w = weight.to(x.dtype).reshape(-1, *[1] * (x.dim() - 1))
        feeds[name] = w * x + (1 - w) * x[partner]


def _reading(program: OnnxProgram, output: int | None, tensor: str | None) -> tuple[str, ...] | None:
    """The tensors ``program`` returns in training: its outputs with ``tensor`` in place of output ``output`` (None
    where nothing is replaced)."""
    if output is None or tensor is None:
        return None
    return tuple(tensor if i == output else name for i, name in enumerate(program.output_names))


def _is_image(x: np.ndarray) -> bool:
    return x.ndim == 4 and x.shape[1] in (1, 3, 4) and min(x.shape[2:]) >= 16 and x.dtype == np.float32


class Trainer:
    """Trains ``student`` (the twin's program) towards ``teacher`` (the float model's) on ``inputs`` (name ->
    array, samples on axis 0) with optional ``labels``; ``classify_output`` is the index of the class scores when
    the model is a classifier. ``logits``: where those scores are a Softmax's probabilities, the tensors that Softmax
    reads in the student and in the teacher (``program.logits_of``), distilled on in their place: a quantized
    student's probabilities are exactly 0 below half its output grid's step, where no loss on them has a gradient."""

    def __init__(self, student: OnnxProgram, teacher: OnnxProgram, inputs: Mapping[str, np.ndarray],
                 labels: np.ndarray | None, config: QatConfig, *, classify_output: int | None,
                 checkpoint: Path | None, fingerprint: str, payload: Mapping[str, Any] | None = None,
                 validation: Mapping[str, np.ndarray] | None = None,
                 validation_labels: np.ndarray | None = None, masks: Mapping[str, np.ndarray] | None = None,
                 sparsity: Any = None, blend: Any = None, eight_bit: frozenset[str] = frozenset(),
                 lowering: Callable[[OnnxProgram, int, frozenset[str]], Any] | None = None,
                 logits: tuple[str, str] | None = None) -> None:
        self.student, self.teacher, self.config = student, teacher, config
        self.eight_bit = eight_bit  # weight quantizers that keep 8 bits as the others are lowered (bit_plan)
        self.lowering = lowering  # (program, bits, kept) -> a Lowering: the weights re-rounded onto the new grids
        self.lowered: list[dict[str, Any]] = []
        self.masks: dict[str, np.ndarray] = {}
        self.sparsity, self.blend = sparsity, blend
        self._set_masks(masks or {})
        self.inputs = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in inputs.items()}
        self.count = len(next(iter(self.inputs.values())))
        self.labels = torch.from_numpy(np.asarray(labels).astype(np.int64)) if labels is not None else None
        self.classify_output, self.checkpoint, self.fingerprint = classify_output, checkpoint, fingerprint
        self.payload = dict(payload or {})  # saved with every checkpoint (the verb: the PTQ start it trains)
        self.validation = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in (validation or {}).items()}
        self.validation_labels = (torch.from_numpy(np.asarray(validation_labels).astype(np.int64))
                                  if validation_labels is not None else None)
        self.best: dict[str, Any] | None = None  # the best epoch at the final bits so far: loss, epoch, state
        self.start: Epoch | None = None
        self.rank, self.world = world()
        if config.batch_size % self.world:
            raise InputError(f"batch size {config.batch_size} does not split over {self.world} processes",
                             hint="use a batch size divisible by the number of processes")
        self.images = {k for k, v in inputs.items() if _is_image(v)} if config.augment else set()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.model = Batched(student, _reading(student, classify_output, logits and logits[0]))
        self.teaching = Batched(teacher, _reading(teacher, classify_output, logits and logits[1]))
        self.trainable = [p for p in student.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.trainable, lr=config.learning_rate)
        per_epoch = math.ceil(self.count / config.batch_size)
        self.steps_per_epoch = min(per_epoch, config.max_steps) if config.max_steps else per_epoch
        self.total = self.steps_per_epoch * config.epochs
        self.history: list[Epoch] = []
        self.epoch = 0
        self.bits = 8
        self.spread, self.probabilities = self._spread()
        self._check_labels()

    # ------------------------------------------------------------------------------------------- schedule
    def bits_at(self, step: int) -> int:
        stages = self.config.schedule
        return stages[min(len(stages) - 1, step * len(stages) // max(1, self.total))]

    def _set_bits(self, bits: int) -> None:
        if self.lowering is not None:
            self.lowered.append(self.lowering(self.student, bits, self.eight_bit).as_dict())
        else:
            set_weight_bits(self.student, bits, keep=self.eight_bit)
        self.bits = bits

    def _set_masks(self, masks: Mapping[str, np.ndarray]) -> None:
        """Initializer name -> where its weights may be non-zero; the masked weights are zeroed now and after every
        step."""
        self.masks = {name: np.asarray(mask, dtype=bool) for name, mask in masks.items()}
        self._applied = [(self.student.initializer(name), torch.from_numpy(mask)) for name, mask in self.masks.items()]
        self._apply_masks()

    def _apply_masks(self) -> None:
        with torch.no_grad():
            for weight, mask in self._applied:
                weight.mul_(mask)

    def _sparsify(self, step: int) -> None:
        if self.sparsity is None:
            return
        names = self.sparsity.names
        masks = self.sparsity.masks_at(step, self.total, lambda: {
            n: self.student.initializer(n).detach().cpu().numpy() for n in names})
        if masks is not None:
            self._set_masks(masks)

    # ------------------------------------------------------------------------------------------- loss
    def loss(self, student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor],
             labels: torch.Tensor | None) -> tuple[torch.Tensor, float]:
        """(loss, agreement) for one batch; see the module docstring."""
        total = student[0].new_zeros(())
        for i, (s, t) in enumerate(zip(student, teacher)):
            if not s.is_floating_point():
                continue
            if i == self.classify_output:
                s2, t2 = s.reshape(s.shape[0], -1), t.reshape(t.shape[0], -1)
                if self.probabilities:  # log p is the logits less a constant per row: the same softened targets
                    floor = _resolution(s2)
                    s2, t2 = s2.clamp_min(floor).log(), t2.clamp_min(floor).log()
                temp = self.config.temperature
                kd = F.kl_div(F.log_softmax(s2 / temp, -1), F.log_softmax(t2 / temp, -1), log_target=True,
                              reduction="batchmean") * temp * temp
                if labels is not None and self.config.label_weight > 0:
                    w = self.config.label_weight
                    kd = (1 - w) * kd + w * F.cross_entropy(s2, labels)
                if self.config.logit_weight > 0:
                    kd = kd + self.config.logit_weight * F.mse_loss(s2, t2) / self.spread[i]
                total = total + kd
            else:
                total = total + F.mse_loss(s, t) / self.spread[i]
        with torch.no_grad():
            if self.classify_output is not None:
                s, t = student[self.classify_output], teacher[self.classify_output]
                agree = (s.reshape(s.shape[0], -1).argmax(-1) == t.reshape(t.shape[0], -1).argmax(-1)).float().mean()
                return total, float(agree)
            num = sum(float(t.double().square().sum()) for t in teacher)
            den = sum(float((s.double() - t.double()).square().sum()) for s, t in zip(student, teacher))
            return total, 10 * math.log10(num / den) if den > 0 else 99.0

    # ------------------------------------------------------------------------------------------- loop
    # ------------------------------------------------------------------------------------------- validation
    def validate(self) -> tuple[float, float] | None:
        """(loss, agreement) of the student on the validation samples, as trained (no shifts), or None."""
        if not self.validation:
            return None
        count = len(next(iter(self.validation.values())))
        total_loss = total_agreement = 0.0
        with torch.no_grad():
            for first in range(0, count, self.config.batch_size):
                part = {k: v[first:first + self.config.batch_size] for k, v in self.validation.items()}
                labels = (self.validation_labels[first:first + self.config.batch_size]
                          if self.validation_labels is not None else None)
                loss, agreement = self.loss(self.model(part), self.teaching(part), labels)
                size = len(next(iter(part.values())))
                total_loss += float(loss) * size
                total_agreement += agreement * size
        return total_loss / count, total_agreement / count

    def _consider(self, epoch: int) -> tuple[float, float] | None:
        """Validate after ``epoch`` and remember the student when it is the best so far at the final bits."""
        figures = self.validate()
        if figures is None or self.bits != self.config.weight_bits or (self.sparsity and not self.sparsity.done) \
                or (self.blend and not self.blend.done):
            return figures
        if self.best is None or figures[0] < self.best["loss"]:
            self.best = {"loss": figures[0], "epoch": epoch,
                         "state": {k: v.detach().clone() for k, v in self.student.state_dict().items()},
                         "quant": self._rules()}
        return figures

    def _keep_best(self) -> int:
        """Put the best validated state back into the student; the epoch it is from (the last without
        validation)."""
        if self.best is None:
            return self.epoch
        self.student.load_state_dict(self.best["state"])
        self._set_rules(self.best["quant"])
        return int(self.best["epoch"])

    def _rules(self) -> dict[str, dict[str, Any]]:
        return {k: {"rule": m.rule, "levels": m.levels, "qmin": m.qmin, "qmax": m.qmax}
                for k, m in self.student.quant.items() if isinstance(m, WeightQuant)}

    def _set_rules(self, rules: Mapping[str, Mapping[str, Any]]) -> None:
        for key, rule in rules.items():
            module = self.student.quant[key]
            module.rule, module.levels, module.qmin, module.qmax = rule["rule"], rule["levels"], rule["qmin"], \
                rule["qmax"]

    def _check_labels(self) -> None:
        """Labels must be class indices of the model's class scores (cross-entropy failed on one beyond them,
        an internal error after the PTQ start was built)."""
        if self.classify_output is None:
            return
        from npukit.measure.fidelity import require_class_labels

        first = {k: v[:1] for k, v in self.inputs.items()}
        with torch.no_grad():
            classes = self.teaching(first)[self.classify_output].reshape(1, -1).shape[1]
        for labels in (self.labels, self.validation_labels):
            if labels is not None:
                require_class_labels(labels.numpy(), classes)

    def _spread(self) -> tuple[list[float], bool]:
        """Each output's variance under the teacher on the first training samples: the constant its squared error
        is divided by (the same on every process and in every batch; for class scores that are already
        probabilities, that of their logarithm, which the error is taken on: the probabilities' own spread made a
        PP-OCR classifier's loss 180x too large); and whether the class scores are already probabilities (a model
        ending in Softmax: every row non-negative and summing to 1)."""
        first = {k: v[:SPREAD_SAMPLES] for k, v in self.inputs.items()}
        with torch.no_grad():
            outputs = self.teaching(first)
        spread = [max(float(o.double().var()), 1e-12) if o.is_floating_point() and o.numel() > 1 else 1.0
                  for o in outputs]
        probabilities = False
        if self.classify_output is not None:
            scores = outputs[self.classify_output].double().reshape(len(outputs[self.classify_output]), -1)
            probabilities = bool(scores.min() >= 0 and torch.allclose(scores.sum(-1), torch.ones(len(scores),
                                                                                              dtype=scores.dtype),
                                                                      atol=1e-3))
            if probabilities:  # the squared error is taken on log p (``loss``): its spread is log p's
                spread[self.classify_output] = max(float(scores.clamp_min(PROBABILITY_FLOOR).log().var()), 1e-12)
        return spread, probabilities

    def train(self, *, progress: Callable[[int, int, float, float], None] | None = None) -> TrainResult:
        start = time.perf_counter()
        resumed = self._resume()
        model: nn.Module = self.model
        if self.world > 1:
            model = nn.parallel.DistributedDataParallel(self.model)
        generator = torch.Generator().manual_seed(self.config.seed)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, self.total) / self.total)))
        for _ in range(self.epoch * self.steps_per_epoch):
            schedule.step()
        if self.epoch == 0:  # the start, as a candidate where it is already at the final bits
            if self.bits_at(0) != self.bits:
                self._set_bits(self.bits_at(0))
            if self.blend is not None:  # the substituted model as it is
                self.blend.set_share(self.student, 1.0)
            figures = self._consider(0)
            if figures is not None:
                self.start = Epoch(0, figures[0], figures[1], self.measure, self.bits, 0.0, *figures,
                                   share=self._share())
        while self.epoch < self.config.epochs:
            generator.manual_seed(self.config.seed * 1000 + self.epoch)  # the same batches after a resume
            order = torch.randperm(self.count, generator=generator)
            began, losses, agreements = time.perf_counter(), [], []
            for step in range(self.steps_per_epoch):
                global_step = self.epoch * self.steps_per_epoch + step
                bits = self.bits_at(global_step)
                if bits != self.bits:
                    self._set_bits(bits)
                self._sparsify(global_step)
                if self.blend is not None:
                    self.blend.set(self.student, global_step, self.total)
                batch = order[(step * self.config.batch_size) % self.count:][:self.config.batch_size]
                feeds = {k: v[batch] for k, v in self.inputs.items()}
                for k in self.images:  # drawn for the whole batch on every process: one process's draws
                    feeds[k] = _shifted(feeds[k], generator)
                if self.labels is None:  # a blend has no single label
                    _mixed(feeds, self.images, self.config.mixup, generator)
                share = torch.arange(len(batch)).tensor_split(self.world)[self.rank]
                index = batch[share]
                feeds = {k: v[share] for k, v in feeds.items()}
                with torch.no_grad():
                    teacher = self.teaching(feeds)
                student = model(feeds)
                labels = self.labels[index] if self.labels is not None else None
                loss, agreement = self.loss(student, teacher, labels)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                self._apply_masks()
                schedule.step()
                losses.append(float(loss.detach()))
                agreements.append(agreement)
                if progress is not None:
                    progress(global_step + 1, self.total, losses[-1], agreement)
            seconds = time.perf_counter() - began
            figures = self._consider(self.epoch + 1) or (None, None)
            self.history.append(Epoch(self.epoch + 1, float(np.mean(losses)), float(np.mean(agreements)),
                                      self.measure, self.bits, seconds, *figures, share=self._share()))
            self.epoch += 1
            self.save()
        kept = self._keep_best()
        return TrainResult(tuple(self.history), self.total, resumed, self.world, time.perf_counter() - start, kept,
                           self.start, tuple(self.lowered))

    def _share(self) -> float | None:
        return self.blend.share if self.blend is not None else None

    @property
    def measure(self) -> str:
        """The agreement measure of training and validation: "top-1 agreement" (a classifier's) or "SQNR dB"."""
        return "top-1 agreement" if self.classify_output is not None else "SQNR dB"

    # ------------------------------------------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "payload": self.payload, "epoch": self.epoch, "bits": self.bits,
                "student": self.student.state_dict(), "optimizer": self.optimizer.state_dict(),
                "quant": self._rules(), "history": [e.as_dict() for e in self.history], "best": self.best,
                "start": self.start.as_dict() if self.start else None, "masks": self.masks,
                "sparsity_stage": self.sparsity.stage if self.sparsity is not None else None,
                "lowered": self.lowered}

    def save(self) -> None:
        if self.checkpoint is None or self.rank != 0:
            return
        buffer = io.BytesIO()
        torch.save(self.state(), buffer)
        write_bytes_atomic(self.checkpoint, buffer.getvalue())

    def _resume(self) -> int:
        state = read_checkpoint(self.checkpoint, self.fingerprint)
        if state is None:
            return 0
        self._set_rules(state["quant"])
        self.student.load_state_dict(state["student"])
        self.best = state.get("best")
        self.start = Epoch(**state["start"]) if state.get("start") else None
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch, self.bits = int(state["epoch"]), int(state["bits"])
        self.history = [Epoch(**e) for e in state["history"]]
        self.lowered = list(state.get("lowered") or [])
        self._set_masks(state.get("masks") or {})
        if self.sparsity is not None:
            self.sparsity.stage = state["sparsity_stage"]
        return self.epoch


def read_checkpoint(path: Path | None, fingerprint: str) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (None where there is none); one written by a run with another fingerprint (model,
    data or training setup) is refused."""
    if path is None or not Path(path).exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise InputError(f"checkpoint {path} cannot be read ({type(exc).__name__})",
                         hint="delete it (or pass --restart) to start again") from None
    if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
        raise InputError(f"checkpoint {path} is from another model, data or training setup",
                         hint="delete it (or pass --restart) to start again, or run the command that wrote it")
    return state
