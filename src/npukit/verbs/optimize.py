"""The optimize verb: a multi-objective search over npukit's quantization recipes on the target, under a budget on
the task metric, with the Pareto front, the full trial log and the chosen artifact re-checked before it is written."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npukit.config import PreprocessConfig
from npukit.data.subsets import every, spread
from npukit.errors import InputError
from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish, remove_earlier_artifact, report_json_for, study_path_for
from npukit.report.progress import step
from npukit.tasks import QualityGate
from npukit.verbs.common import (add_source, check_output, check_task_measurable, data_name, float_static_model,
                                 keeps_module_modes, note_export_drift, note_untrained, open_data,
                                 refuse_uniform_samples, upgrade_opset)

CONFIRM = 4  # the fastest trials within the budget timed again together at the end
CONFIRM_ROUNDS = 3  # rounds of that while the choice falls on a trial not timed again
# searched today: ORT CPU (an ONNX model or a PyTorch model's export) and the mobile runtimes that run here (a PyTorch
# model; npukit.search.mobile), each with the artifact suffix it writes; the others are refused with what to use
TARGETS = {"cpu": ".onnx", "executorch-xnnpack": ".pte", "litert": ".tflite"}
MOBILE = {"executorch-xnnpack": "executorch", "litert": "litert"}  # target -> its npukit.runtime module
LATER = {"qnn-htp": "npukit compile --soc SOC --calib DATA builds the HTP's recipe (its emulator here is too slow "
                    "to time a search on)",
         "coreml": "npukit compile --target coreml exports one (Core ML runs only on macOS, so nothing can be "
                   "measured here)"}


@keeps_module_modes
def optimize(
    model: str | Path,
    output: str | Path,
    *,
    data: str | Path,
    calib: str | Path | None = None,
    target: str = "cpu",
    budget: float | str = 0.01,
    prefer: str = "latency",
    trials: int = 12,
    timeout_s: float | None = None,
    space: str = "quick",
    sampler: str = "tpe",
    seed: int = 0,
    workers: int = 1,
    batch: int | None = None,
    ray_address: str | None = None,
    exclude: Sequence[str] = (),
    task: str | None = None,
    min_sqnr_db: float | None = None,
    threads: int = 1,
    runs: int = 20,
    max_samples: int | None = None,
    input_shape: str | Sequence[Any] | None = None,
    preprocess: PreprocessConfig | None = None,
    html: bool = False,
    weights: str | Path | None = None,
) -> CommandResult:
    """Search npukit's quantization recipes for ``model`` on ``target`` and write the best artifact that
    keeps the task metric within ``budget`` of the float model (0.01: within 1%), best on ``prefer`` (latency, size,
    memory or energy) among those. Each trial builds a recipe's QDQ model on the calibration data and measures it
    against the float model: task metric and output SQNR on ``data`` (held out), latency (ratio to the float model,
    timed in the same rounds), size, predicted peak activation memory, estimated energy (``npukit.measure.energy``).
    Without ``calib`` every other sample of ``data`` calibrates (1st, 3rd, ...), the rest evaluate (data may be sorted).

    ``target`` cpu: ORT CPU, an ONNX model (``output`` .onnx). executorch-xnnpack / litert: a PyTorch ``model``
    (torchvision:NAME, module:factory, .pt2, TorchScript; ``weights`` its state dict) or a one-input ONNX model run as
    a torch program, each trial's plan carried onto the program, lowered by the runtime and measured on it against
    its fp32 artifact (``output`` .pte / .tflite; ``npukit.search.mobile``).

    The study (Optuna, ``sampler`` tpe or nsga2, seeded) is kept in ``study_path_for(output)``: run the same
    command again to continue it (``trials`` counts the study's trials in all; ``timeout_s`` bounds this run).
    The report holds every trial, the Pareto front and the chosen trial, whose model is checked again on ``data``
    before it is written; no trial within the budget: no artifact, exit 1.

    ``workers`` > 1 builds that many trials at once on Ray Tune (``npukit.search.distributed``: a local Ray instance
    started for the search, or the cluster at ``ray_address``); the sampler then proposes ``batch`` recipes at a time
    (default: ``workers``), and the same batch size and seed propose the same recipes serially or on Ray."""
    from npukit.search.space import get_space
    from npukit.search.study import SearchConfig

    if any(p.exists() and not p.is_dir() for p in Path(output).parents):
        raise InputError(f"output {output} is under a file, not a folder", hint="give a path in a folder")
    _refuse_target(target)
    output = check_output(output, source=model, suffix=TARGETS[target])
    _refuse_unrunnable(target, weights=weights, workers=workers, ray_address=ray_address)
    config = SearchConfig(budget=budget, prefer=prefer, trials=trials, timeout_s=timeout_s, seed=seed,
                          sampler=sampler, space=space, batch=batch or workers)
    space_ = get_space(space)
    gate = QualityGate(min_metric=config.min_metric, **({} if min_sqnr_db is None else {"min_sqnr_db": min_sqnr_db}))
    inputs = _Inputs.open(model, data, calib, input_shape, preprocess or PreprocessConfig(), max_samples,
                          torch_program=target in MOBILE, weights=weights)
    _refuse_nothing_to_find(inputs, data, task, threads=threads)
    report = _report(model, target, data, calib, config, space_, gate, inputs, task=task, exclude=exclude,
                     threads=threads, runs=runs, workers=workers, ray_address=ray_address)
    if inputs.export is not None:
        note_export_drift(report, inputs.export, consequence="each trial's plan was made on it; trials were judged "
                          "on the runtime against its fp32 artifact, built from the torch program")
    return _Search(report, inputs, config, space_, gate, task, tuple(exclude), threads, runs, workers=workers,
                   ray_address=ray_address, runtime=MOBILE.get(target)).run(output, html)


def _refuse_target(target: str) -> None:
    """A target that is not searched is refused before any work, with what to use for it instead."""
    if target not in TARGETS:
        from npukit.targets.registry import TARGETS as KNOWN, named

        ours = named(target)  # another name of a target (tflite: litert)
        kind = (ours or target).split("@")[0]
        if kind in TARGETS or kind not in KNOWN:
            raise InputError(f"unknown target {target!r}", hint=f"did you mean --target {ours}?" if ours else
                             f"optimize searches --target {' | '.join(TARGETS)}")
        hint = f"for {kind}, {LATER[kind]}" if kind in LATER else f"use --target {' | '.join(TARGETS)}"
        raise InputError(f"optimize searches --target {', '.join(TARGETS)}; {target!r} is not searched yet",
                         hint=hint)


def _refuse_unrunnable(target: str, *, weights: str | Path | None, workers: int, ray_address: str | None) -> None:
    """What the search could not run (weights without a PyTorch model, a runtime not installed, too few workers for
    Ray, a Ray address that does not answer) is refused before any work."""
    if weights is not None and target not in MOBILE:
        raise InputError("--weights is for a PyTorch MODEL searched on a mobile runtime (--target "
                         f"{' or '.join(MOBILE)})", hint="give --target cpu an .onnx model with its weights in it")
    if target in MOBILE:
        from npukit.search.mobile import runtime_module

        runtime_module(MOBILE[target]).require()
    if workers < 1:
        raise InputError(f"workers {workers} must be at least 1", hint="e.g. --workers 2")
    if ray_address and workers < 2:
        raise InputError("--ray-address runs trials on a Ray cluster, which needs --workers 2 or more",
                         hint="e.g. --workers 8 --ray-address HEAD:6379")
    if ray_address:
        from npukit.search.distributed import reachable

        reachable(ray_address)  # before any work: Ray retries a wrong address for minutes


def _refuse_nothing_to_find(inputs: _Inputs, data: str | Path, task: str | None, *, threads: int) -> None:
    """Held-out samples on which every trial's task check would compare nothing are refused before the search; the
    check's own warning that they hold too little (few samples or detections) is kept for a failing verdict."""
    half = "every 2nd sample of " if inputs.split else ""
    itself = check_task_measurable(inputs.proto, inputs.evaluation, task, threads=threads,  # nothing to find?
                                   where=f"the held-out samples ({half}{Path(str(data)).name})")
    inputs.weak = _weak(itself)


def _report(model: str | Path, target: str, data: str | Path, calib: str | Path | None, config: Any, space: Any,
            gate: QualityGate, inputs: _Inputs, *, task: str | None, exclude: Sequence[str], threads: int, runs: int,
            workers: int, ray_address: str | None) -> Report:
    """The report, its config recording what ``optimize`` was asked and resolved, so a search can be repeated, and
    what loading a mobile search's model took (``add_source``: an ONNX graph run as a torch program)."""
    calib_label = str(calib) if calib else f"every other sample of {data} (1st, 3rd, ...)"
    report = Report("optimize", config={"model": str(model), "target": target, "data": str(data),
                                        "calib": calib_label, "search": config.as_dict(), "space": space.name,
                                        "task": task or "auto", "gate": gate.as_dict(), "exclude": list(exclude),
                                        "threads": threads, "runs": runs, "input_shape": inputs.spec,
                                        "workers": workers, "ray_address": ray_address})
    if inputs.source is not None:
        add_source(report, inputs.source)
    return report


@dataclasses.dataclass
class _Inputs:
    """The float model (shapes fixed) and the calibration and held-out samples (lists of (feeds, labels)); for a
    mobile runtime also the torch module the float model is the ONNX export of."""

    path: Path
    proto: Any
    calib: list[Any]
    evaluation: list[Any]
    spec: Any
    split: bool
    source: Any = None  # the resolved PyTorch model (a mobile runtime's search)
    export: Any = None  # its scratch ONNX export's ExportResult (a drift from torch is noted in the report)
    weak: str = ""  # the task check's note that the held-out samples hold too little ("; note: ..."), or ""
    sequence: list[Any] = dataclasses.field(default_factory=list)  # --data in its order (a recurrent state's roll)

    @property
    def module(self) -> Any:
        return self.source.module if self.source is not None else None

    @classmethod
    def open(cls, model: str | Path, data: str | Path, calib: str | Path | None, input_shape: Any,
             preprocess: PreprocessConfig, max_samples: int | None, *, torch_program: bool = False,
             weights: str | Path | None = None) -> _Inputs:
        from npukit.data.readers import same_data

        if same_data(calib, data):
            raise InputError(f"--calib {calib} and --data {data} are the same data: every recipe would be judged on "
                             "the samples it was calibrated on, and the budget check would be optimistic",
                             hint="give held-out samples in --data, or leave --calib out (every other sample of "
                                  "--data calibrates, the rest judge)")
        source = export = None
        if torch_program:
            source, proto, spec, export = _torch_program(model, input_shape, weights, data)
        else:
            proto, spec = float_static_model(model, input_shape, verb="optimize",
                                             data=calib if calib is not None else data)
        held = sequence = list(open_data(data, proto, preprocess).batches(1))
        if calib is None:
            if len(held) < 4:
                raise InputError(f"{data} holds {len(held)} samples; without --calib half of them calibrate and "
                                 "half evaluate, which needs at least 4", hint="pass --calib with other samples")
            kept, judged = every(len(held), 2)  # not halves: a folder sorted by class would split by class
            calibration, held = [held[i] for i in kept], [held[i] for i in judged]
        else:
            opened = open_data(calib, proto, preprocess)
            refuse_uniform_samples(opened, data_name(calib))
            calibration = list(opened.batches(1))
        if max_samples is not None:
            held = spread(held, max_samples)
        return cls(Path(str(model)), proto, calibration, held, spec.as_dict() if spec else None, calib is None,
                   source, export, sequence=sequence)


def _torch_program(model: str | Path, input_shape: Any, weights: str | Path | None,
                   data: str | Path | None = None) -> tuple[Any, Any, Any, Any]:
    """(the resolved PyTorch source, its ONNX export checked against it, the input spec, the export's result) for a
    mobile runtime's search: the export is what each trial's plan is made on, the source's module what the plan is
    carried onto."""
    from npukit.frontend.shapes import InputSpec
    from npukit.verbs.common import scratch_export, torch_source

    source, shape = torch_source(model, weights, input_shape, needs="a mobile runtime's search carries plans onto "
                                 "a PyTorch program", otherwise="search the ONNX model with --target cpu", data=data,
                                 from_onnx=True)
    proto, export = scratch_export(source, shape, what="the model each trial's plan is made on")
    source.module.eval()
    return source, proto, InputSpec(((None, shape),)), export


class _Search:
    """The verb's straight line: baseline (the default recipe) -> pruned space -> study -> chosen -> check -> write."""

    def __init__(self, report: Report, inputs: _Inputs, config: Any, space: Any, gate: QualityGate,
                 task: str | None, exclude: tuple[str, ...], threads: int, runs: int, *, workers: int = 1,
                 ray_address: str | None = None, runtime: str | None = None) -> None:
        self.report, self.inputs, self.config, self.space, self.gate = report, inputs, config, space, gate
        self.task, self.exclude, self.threads, self.runs = task, exclude, threads, runs
        self.workers, self.ray_address = workers, ray_address  # trials built at once, on Ray where more than one
        self.runtime = runtime  # the npukit.runtime module of a mobile target (None: ORT CPU)
        self.models = _Kept()  # recipe -> model, for the trials within the budget measured in this run
        self.proto: Any = None  # the float model at the opset the space needs (set by _baseline)
        self.unpriced = 0  # operators of the float model the energy estimate could not price (set by _runner)

    def run(self, output: Path, html: bool) -> CommandResult:
        from npukit.report.optimize import add_search
        from npukit.search.study import run_study, study_name

        report = self.report
        started = time.perf_counter()  # the time budget counts the default recipe's baseline (1m 23s of a 4m one)
        runner, baseline, refused = self._baseline()
        space, pruned = self.space.pruned(rankable=len(runner.builder.ranking), has_head=bool(runner.builder.head))
        for kind, why in refused.items():  # lifts the model or the target cannot take
            space = dataclasses.replace(space, lift=tuple(v for v in space.lift if not v.startswith(kind)) or ("none",))
            pruned.append(why)
        storage = study_path_for(output)
        storage.parent.mkdir(parents=True, exist_ok=True)  # as every verb does for its artifact's folder
        name = study_name({"model": hashlib.sha256(self.inputs.proto.SerializeToString()).hexdigest(),
                           # the samples' bytes, not the paths: a file changed in place (or the same data moved)
                           # must not resume a study its trials were measured on
                           "calib": _digest(self.inputs.calib), "data": _digest(self.inputs.evaluation),
                           "samples": [len(self.inputs.calib), len(self.inputs.evaluation)],
                           "space": dataclasses.asdict(space), "gate": self.gate.as_dict(), "task": self.task,
                           "exclude": self.exclude, "budget": self.config.budget, "threads": self.threads,
                           "sampler": self.config.sampler, "seed": self.config.seed,
                           "base": runner.builder.base.as_dict(),
                           **({"runtime": self.runtime} if self.runtime else {}),
                           # the head's timing may choose otherwise on another run: then the trials differ
                           "head": runner.builder.head, "ranking": runner.builder.ranking,
                           # batches of several proposals propose other recipes (one: as before batches existed)
                           **({"batch": self.config.batch} if self.config.batch > 1 else {})})
        done = [0]

        def evaluate(recipe: Any) -> Any:
            done[0] += 1
            with step(f"trial {done[0]} (of up to {self.config.trials}): {recipe.label()}", timings=report.timings,
                      key="trials"):
                measured, artifact = runner.run(recipe)
            if artifact is not None and measured.feasible:
                self.models.keep(recipe, artifact)
            return measured

        try:
            with self._pool(runner) as pool:
                outcome = run_study(evaluate, space, self.config, name=name, storage=storage, baseline=baseline,
                                    drive=None if pool is None else self._on(pool, runner, done), started=started)
            outcome = self._confirm(outcome, runner, storage)
            report.add_artifact("study", storage)
            artifact, verdict = self._check(outcome, runner)
        finally:
            self.models.close()
            runner.close()
        add_search(report, outcome, self.config, space=space, pruned=pruned, head=runner.builder.head,
                   ranking=runner.builder.ranking)
        if artifact is None:
            report.set_verdict(verdict, passed=False)
            note_untrained(report, self.inputs.source)
            if remove_earlier_artifact(output):  # it would stand beside a report that FAILs and describes another
                report.add("earlier_artifact", f"{output} from an earlier run was removed: this run's report "
                                               "replaces the one that described it, and no trial passed this run")
                report.set_verdict(f"{report.verdict}; {output.name} of an earlier run was removed",
                                   passed=False)
            return finish(report, None, html=html, json_path=report_json_for(output), result=outcome)
        runner.write(artifact, output)
        note_untrained(report, self.inputs.source)
        return finish(report, output, html=html, result=outcome)

    @contextlib.contextmanager
    def _pool(self, runner: Any) -> Iterator[Any]:
        """Ray Tune's trials for the search where ``workers`` > 1 (None: built here, one after the other)."""
        if self.workers < 2:
            yield None
            return
        try:
            from npukit.search.distributed import RayTrials
        except ImportError as exc:
            raise InputError(f"--workers {self.workers} runs trials on Ray Tune, which does not import here ({exc})",
                             hint="pip install 'ray[tune]' (scripts/setup.sh installs it), or leave --workers at 1") \
                from exc
        where = f"the Ray cluster at {self.ray_address}" if self.ray_address else "a local Ray instance"
        with step(f"starting {where} for {self.workers} trials at a time", timings=self.report.timings, key="ray"):
            pool = RayTrials(runner.builder, workers=self.workers, address=self.ray_address).__enter__()
        try:
            yield pool
        finally:
            pool.__exit__(None, None, None)

    def _on(self, pool: Any, runner: Any, done: list[int]) -> Any:
        """The study's loop on ``pool``: built there, timed here one at a time, kept where within the budget."""

        def finish(built: Any) -> Any:
            measured = runner.finish(built)
            artifact = runner.artifact(built)
            if artifact is not None and measured.feasible:
                self.models.keep(built.recipe, artifact)
            return measured

        def announce(recipes: Sequence[Any]) -> None:
            done[0] += len(recipes)

        def drive(loop: Any) -> None:
            with step(f"trials on Ray, {self.workers} at a time (up to {self.config.trials} in all)",
                      timings=self.report.timings, key="trials"):
                pool.drive(loop, finish, announce)

        return drive

    def _baseline(self) -> tuple[Any, Any, dict[str, str]]:
        """The default recipe built and measured once: its float head and layer ranking fix two knobs for every
        trial; the model at the opset the space needs. Returns the trial runner, the default recipe's figures and
        the lifts that cannot be searched, with why (they are then dropped): int16 where the model does not convert
        to the 16-bit Q/DQ opset or the target's integer kernels take no 16-bit activations; float where the
        target's converter would quantize the float layers anyway (LiteRT)."""
        from npukit.quant.config import QuantConfig, Scheme
        from npukit.quant.precision.sensitivity import layer_sensitivity
        from npukit.quant.qdq import quantize
        from npukit.search.space import DEFAULT
        from npukit.verbs.quantize import cpu_scheme, on_cpu

        inputs, report = self.inputs, self.report
        calib = [b.feeds for b in inputs.calib]
        refused: dict[str, str] = {}
        proto = inputs.proto
        if self.runtime is not None and any(v.startswith("int16") for v in self.space.lift):
            refused["int16"] = "int16 lifts: XNNPACK's integer kernels take no 16-bit activations"
        elif any(v.startswith("int16") for v in self.space.lift):
            try:
                proto = upgrade_opset(report, proto, 21, "16-bit Q/DQ (int16 lifts in the space)", calib)
            except InputError as exc:
                refused["int16"] = f"int16 lifts: the model does not convert to opset 21 ({exc.message})"
        if self.runtime == "litert" and any(v.startswith("float") for v in self.space.lift):
            refused["float"] = ("float lifts: LiteRT's converter quantizes a float layer between quantized tensors "
                                "itself, so the plan's float layers would not stay float")
        if "int16" in refused or not any(v.startswith("int16") for v in self.space.lift):
            proto = upgrade_opset(report, proto, 13, "per-channel Q/DQ", calib, alternative="")
        if self.runtime is None:
            scheme = cpu_scheme()
            base = on_cpu(QuantConfig(scheme=Scheme(exclude=self.exclude)), scheme)
            report.add("cpu_scheme", scheme)
        else:
            from npukit.quant.precision.scored_head import held_to_floor
            from npukit.search.mobile import XNNPACK_BASE
            from npukit.verbs.common import held_outputs

            # the head held to the gate's floor for the outputs it holds there, as compile's plan is
            base = held_to_floor(XNNPACK_BASE.with_scheme(exclude=self.exclude), self.gate.min_sqnr_db,
                                 held_outputs(proto, calib, self.task))
        # calibrated as the default recipe says (quantize's default, "auto"), so trial 0 is the recipe it is labelled
        base = base.with_calibration(method=DEFAULT.method)
        started = time.perf_counter()
        with step("baseline: the default recipe" + (", float head timed once" if base.precision.timed_head else
                                                    ", float head chosen once" if base.precision.head_share else ""),
                  timings=report.timings, key="baseline"):
            first = quantize(proto, calib, config=base)
        report.add("baseline_calibration", first.steps.calibration)  # the method "auto" chose for the default recipe
        head = first.steps.float_head_nodes
        with step("layer sensitivity of the default recipe", timings=report.timings, key="sensitivity"):
            ranking = tuple(n for n, _ in layer_sensitivity(first, calib[:4], limit=4))
        float_base = base.with_precision(float_head=None)
        runner = self._runner(proto, calib, float_base, head, ranking)
        with step("measuring the default recipe", timings=report.timings, key="baseline"):
            baseline, artifact = runner.measure(DEFAULT, first, base, start=started)
        if baseline.feasible and artifact is not None:
            self.models.keep(DEFAULT, artifact)
        self.proto = proto
        return runner, baseline, refused

    def _runner(self, proto: Any, calib: list[Any], base: Any, head: tuple[str, ...],
                ranking: tuple[str, ...]) -> Any:
        """The trial runner of the target: ORT CPU against the float model as given (an opset upgrade can slow it),
        or a mobile runtime against its own fp32 artifact (``npukit.search.mobile``)."""
        from npukit.measure.energy import estimate_energy
        from npukit.memory.layout import ort_predicted_peak
        from npukit.search.trial import FloatFigures, TrialBuilder, TrialRunner

        given = self.inputs.proto
        peak = ort_predicted_peak(given)
        estimate = estimate_energy(given, peak_bytes=peak, feeds=calib[0])
        energy, self.unpriced = estimate.total_uj, estimate.unknown_shapes  # the verdict says an incomplete one
        common = dict(model=proto, calib=calib, evaluation=self.inputs.evaluation, gate=self.gate, base=base,
                      head=head, ranking=ranking, task=self.task, threads=self.threads)
        if self.runtime is None:
            return TrialRunner(reference=given, builder=TrialBuilder(**common, sequence=self.inputs.sequence),
                               floats=FloatFigures(self._float_bytes(given), peak, energy), feeds=calib[0],
                               threads=self.threads, runs=self.runs)
        from npukit.frontend.onnx_io import graph_inputs
        from npukit.search.mobile import MobileBuilder, MobileRunner, runtime_module

        names = (tuple(i.name for i in graph_inputs(proto)), tuple(o.name for o in proto.graph.output))
        builder = MobileBuilder(**common, module=self.inputs.module, runtime=self.runtime, names=names)
        with step("lowering the float model: the fp32 artifact every trial is timed against",
                  timings=self.report.timings, key="fp32"):
            fp32 = runtime_module(self.runtime).lower(self.inputs.module, builder.example(), names=names)
        self.report.add("fp32_artifact", fp32.summary())
        return MobileRunner(reference=given, builder=builder, floats=FloatFigures(len(fp32.buffer), peak, energy),
                            feeds=calib[0], threads=self.threads, runs=self.runs, fp32=fp32.buffer,
                            runtime=self.runtime)

    def _float_bytes(self, given: Any) -> int:
        """The float model's size every trial's is a ratio of: its file's (external data included), as the
        artifact's is its file's; the model in memory where it came from elsewhere (a PyTorch model). PP-OCR's
        classifier with its shapes fixed and inferred read 606,950 bytes, its file 585,532 (size 0.55x, not 0.575x)."""
        from npukit.measure.size import model_size

        path = self.inputs.path
        if path.suffix.lower() == ".onnx" and path.is_file():
            return model_size(path).file_bytes or given.ByteSize()
        return given.ByteSize()

    @property
    def _float_name(self) -> str:
        """What every ratio is against."""
        return "the float model" if self.runtime is None else f"the fp32 {self.report.config['target']} artifact"

    def _confirm(self, outcome: Any, runner: Any, storage: Path) -> Any:
        """The fastest trials within the budget (up to ``CONFIRM``, those built in this run) timed again together
        with the float model, with more runs: one trial's own timing (20 runs) can be off by a fifth on a shared host,
        and the choice should not rest on it. Where the choice then falls on a trial not timed again (the confirmed
        ones came out slower: PP-OCR cls chose trial 8 on its one 1.47x, and a rerun timing it again found 1.48x
        against another's 1.39x), the fastest not yet timed again are timed again too (up to ``CONFIRM_ROUNDS``
        rounds). Kept in the study (``storage``) for a run that resumes it."""
        for again in range(CONFIRM_ROUNDS):
            outcome, timed = self._confirm_round(outcome, runner, storage, again=again > 0)
            chosen = outcome.trial(outcome.chosen) if outcome.chosen is not None else None
            if not timed or chosen is None or chosen.confirmed:
                break
        return outcome

    def _confirm_round(self, outcome: Any, runner: Any, storage: Path, *, again: bool) -> tuple[Any, bool]:
        """One round of ``_confirm`` (``again``: a later one, which times only trials not yet timed again); the
        outcome and whether it timed anything."""
        from npukit.search.study import confirm_latency, keep_confirmed

        feasible = sorted(((n, m) for n, m in zip(outcome.numbers, outcome.trials) if m.feasible
                           and not (again and m.confirmed)), key=lambda nm: nm[1].latency)
        same: dict[str, list[int]] = {}  # artifact -> the trials that built it (timed once, for all of them)
        for n, m in feasible:
            key = m.digest or str(n)
            if key not in same and len(same) >= CONFIRM and (n != 0 or again):  # the default recipe is always timed
                continue  # again: the plain `npukit quantize` a user compares the pick with (it read 12% slower)
            if m.recipe not in self.models:
                if m.confirmed:  # timed again by the run that built it: kept as the study has it
                    continue
                # an earlier run stopped before timing it again (Ctrl-C): built again, or the choice would compare
                # its one timing with the others' confirmed ones
                with step(f"building trial {n} ({m.recipe.label()}) again to time it with the others",
                          timings=self.report.timings, key="rebuild"):
                    _, artifact = runner.run(m.recipe)
                if artifact is None:
                    continue
                self.models.keep(m.recipe, artifact)
            same.setdefault(key, []).append(n)
        if not same:
            return outcome, False
        recipes = {n: m.recipe for n, m in feasible}
        artifacts = {digest: self.models.load(recipes[numbers[0]]) for digest, numbers in same.items()}
        runs = max(100, 5 * self.runs)
        with step(f"timing the {len(artifacts)} fastest trials within the budget again, {runs} runs each",
                  timings=self.report.timings, key="confirm"):
            again = runner.time_again(artifacts, runs=runs)
        timed = {n: again[digest] for digest, numbers in same.items() for n in numbers}
        keep_confirmed(storage, outcome.study_name, timed)
        return confirm_latency(outcome, self.config.prefer, timed), True

    def _check(self, outcome: Any, runner: Any) -> tuple[Any, str]:
        """The chosen trial's model (this run's, or built again for a trial of an earlier run) checked on the
        held-out samples with the budget's gate; (None, the failing verdict) when no trial met the budget."""
        from npukit.search.mobile import float_share_note
        from npukit.verbs.common import task_check

        if outcome.chosen is None:
            best = max(outcome.trials, key=_closest_to_passing)
            if best.error:
                return None, (f"FAIL optimize: none of {len(outcome.trials)} trials could be built (first: "
                              f"{best.recipe.label()}: {best.error})")
            failed, advice = shortfall(best.metric_name or "task metric", best.metric, best.failures,
                                       self.config.min_metric)
            budget = (f"the task metrics at most {self.config.budget:.1%} below the float model's, each >= "
                      f"{self.config.min_metric:.3f}" if best.metric == best.metric else
                      f"no task metric: every output held to the SQNR floor, {self.gate.min_sqnr_db:g} dB")
            return None, (f"FAIL optimize: none of {len(outcome.trials)} trials passed the budget's check "
                          f"({budget}; closest: {best.recipe.label()}, {failed}); try {advice}, more --trials, or "
                          f"--space full{self.inputs.weak}")
        chosen = outcome.trial(outcome.chosen)
        if chosen.recipe in self.models:
            artifact = self.models.load(chosen.recipe)
        else:
            with step(f"building the chosen recipe again ({chosen.recipe.label()})", timings=self.report.timings,
                      key="rebuild"):
                _, artifact = runner.run(chosen.recipe)
        half = "every 2nd sample of " if self.inputs.split else ""
        where = f"held-out samples ({half}{Path(str(self.report.config['data'])).name}; the search chose on them too)"
        _, result, verdict = task_check(self.report, self.proto, None, self.inputs.evaluation, task=self.task,
                                        gate=self.gate, what="optimize", where=where, threads=self.threads,
                                        candidate_runner=runner.candidate(artifact),
                                        sequence=self.inputs.sequence or None)
        if not verdict.passed:
            return None, verdict.line
        within = sum(m.feasible for m in outcome.trials)
        lowest = min(result.gated().items(), key=lambda kv: kv[1], default=None)
        binds = (f"; lowest held: {lowest[0]} {lowest[1]:.3f}" if lowest is not None and lowest[0] !=
                 chosen.metric_name and lowest[1] < chosen.metric else "")  # YOLOv8n: map50 1.000 quoted, F1 0.706
        held = (f"{chosen.metric_name} {chosen.metric:.3f} (budget >= {self.config.min_metric:.3f}{binds})"
                if chosen.metric == chosen.metric else  # a generic model's task has no metric for --budget to bound
                f"no task metric (every output held to the SQNR floor instead of --budget: worst "
                f"{chosen.worst_sqnr_db:.1f} dB >= {self.gate.min_sqnr_db:g} dB)")
        line = (f"PASS optimize: trial {outcome.chosen} ({chosen.recipe.label()}): {held}, latency "
                f"{chosen.latency:.2f}x, size "
                f"{chosen.size:.2f}x, peak memory {chosen.memory:.2f}x, energy {chosen.energy:.2f}x (estimates"
                + (f"; the energy estimate is incomplete, {self.unpriced} operators of the float model unpriced"
                   if self.unpriced else "") + ") "
                f"{self._float_name}'s; best on {self.config.prefer} of {within} trials within the budget "
                f"({len(outcome.trials)} in all)"
                + _not_better(chosen, self.config.prefer, self._float_name)
                + float_share_note(chosen.integer_fraction) + _weak(result))
        self.report.set_verdict(line, passed=True)
        return artifact, line


# how the verdict says that the best trial on an objective loses to the float model: (the comparison, the figure)
_WORSE = {"latency": ("the fastest within the budget runs slower than", "time on this CPU"),
          "size": ("the smallest within the budget is larger than", "size"),
          "memory": ("the least memory within the budget predicts a higher peak than", "predicted peak"),
          "energy": ("the least energy within the budget is estimated above", "estimated energy")}


def _not_better(chosen: Any, prefer: str, float_name: str) -> str:
    """The verdict's note where the chosen trial is no better than the float model: on ``prefer`` (then even the
    best the search found loses, and the float model is the one to keep where that matters), or on latency."""
    ratio = getattr(chosen, prefer)
    if ratio > 1.0:
        best, what = _WORSE[prefer]
        return (f"; even {best} {float_name} ({ratio:.2f}x its {what}): keep {float_name} where {prefer} "
                "matters")
    if chosen.latency > 1.0:
        return f"; it runs {chosen.latency:.2f}x {float_name}'s time on this CPU (slower)"
    return ""


def _digest(samples: Sequence[Any]) -> str:
    """sha256 of the samples' feeds (names, dtypes, shapes, bytes) and labels, in order."""
    digest = hashlib.sha256()
    for sample in samples:
        for name, array in sorted(sample.feeds.items()):
            array = np.ascontiguousarray(array)
            digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(array.tobytes())
        if sample.labels is not None:
            digest.update(b"labels|" + np.ascontiguousarray(sample.labels).tobytes())
    return digest.hexdigest()


def _weak(result: Any) -> str:
    """The task check's own warning that it rests on too little (few samples or detections, ``tasks.weakness``),
    for optimize's verdict, which is its own line (a YOLOv8 search PASSed on 5 reference detections without a
    word)."""
    from npukit.tasks import weakness

    weak = weakness(result)
    return f"; note: {weak}" if weak else ""


class _Kept:
    """The artifacts (bytes: a QDQ model, a .pte, a .tflite) of the trials within the budget, on disk in a temporary
    folder (not in memory: a search of a large model keeps dozens), gone when the search ends."""

    def __init__(self) -> None:
        import tempfile

        self._folder = tempfile.TemporaryDirectory(prefix="npukit-optimize-")
        self._paths: dict[Any, Path] = {}

    def keep(self, recipe: Any, artifact: bytes) -> None:
        path = Path(self._folder.name) / f"{len(self._paths)}.bin"
        path.write_bytes(artifact)
        self._paths[recipe] = path

    def __contains__(self, recipe: Any) -> bool:
        return recipe in self._paths

    def load(self, recipe: Any) -> bytes:
        return self._paths[recipe].read_bytes()

    def close(self) -> None:
        self._folder.cleanup()


def _closest_to_passing(m: Any) -> tuple:
    """How near a failed trial came to the budget, for naming the closest: built, fewest floors missed, the higher
    task metric, the higher worst-output SQNR (the best on the headline metric alone missed two floors where
    others missed one)."""
    return (not m.error, -len(m.failures), m.metric if m.metric == m.metric else -1.0,
            m.worst_sqnr_db if m.worst_sqnr_db == m.worst_sqnr_db else -math.inf)


def shortfall(name: str, metric: float, failures: Sequence[str], floor: float) -> tuple[str, str]:
    """What kept the best trial out of the budget, and what to try: a larger --budget when the task metric, or
    another metric of the task the budget's floor holds too (a detector's F1 beside its mAP), is below the floor;
    else what its check says, e.g. a lower --min-sqnr. A model without a task metric (generic: NaN) is held to
    the SQNR floor alone."""
    if metric != metric:
        return (failures[0] if failures else "its check failed"), "a lower --min-sqnr"
    if metric < floor or not failures:
        return f"{name} {metric:.3f}, needed {floor:.3f}", "a larger --budget"
    held = next((f for f in failures if f.endswith(f"< {floor:g}")), None)
    if held:
        return f"{name} {metric:.3f} but {held}", "a larger --budget (the budget's floor holds that metric too)"
    return f"{name} {metric:.3f} but {failures[0]}", ("what that check says (the budget was met), e.g. a lower "
                                                     "--min-sqnr")

