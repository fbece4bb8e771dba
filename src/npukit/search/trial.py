"""One trial of the search: build a recipe's artifact and measure it on the target against the float model.

Every figure is measured except two: the peak activation memory (predicted: ORT CPU's own allocation planner replayed
on the graph it executes, ``npukit.memory.layout.ort_predicted_peak``) and the energy (estimated per operator,
``npukit.measure.energy``). Measured: the task metric and every output's SQNR on the held-out samples
(``npukit.tasks``), the latency as a ratio to the float model timed in the same interleaved rounds (so a slow spell
of a shared host hits both), the serialized size, and the integer-kernel fraction.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from npukit.errors import NpukitError
from npukit.quant.config import QuantConfig
from npukit.search.space import Recipe
from npukit.tasks import QualityGate, TaskResult, judge

# the objectives, in the study's order, and which way is better
OBJECTIVES: tuple[tuple[str, str], ...] = (("metric", "maximize"), ("latency", "minimize"), ("size", "minimize"),
                                           ("memory", "minimize"), ("energy", "minimize"))
# how much better a timed figure must be to count as better in the front: the latency ratios of one model move about
# 3% between trials on a quiet host (each trial times float and candidate in the same rounds); the other figures are
# counted, not timed
NOISE: dict[str, float] = {"latency": 0.03}


@dataclasses.dataclass(frozen=True)
class Measured:
    """A trial's figures. ``latency``, ``size``, ``memory`` and ``energy`` (an estimate: ``npukit.measure.energy``)
    are ratios to the float model (lower is better); ``metric`` is the task metric against the float model (1.0: the
    same outputs). ``feasible``: the artifact passed the budget's gate and runs integer kernels; ``failures`` says
    why not. ``error``: the recipe could not be built (the message), with no figures."""

    recipe: Recipe
    feasible: bool
    metric_name: str = ""
    metric: float = float("nan")
    worst_sqnr_db: float = float("nan")
    latency: float = float("nan")
    latency_ms: float = float("nan")
    float_latency_ms: float = float("nan")
    size: float = float("nan")
    size_bytes: int = 0
    memory: float = float("nan")
    peak_bytes: int = 0
    energy: float = float("nan")
    energy_uj: float = float("nan")
    integer_fraction: float = 0.0
    seconds: float = 0.0
    confirmed: bool = False  # latency timed again beside the other best trials with more runs
    failures: tuple[str, ...] = ()
    error: str = ""
    digest: str = ""  # the artifact's bytes (sha256, 16 hex digits): recipes that built the same artifact share it

    def objectives(self) -> tuple[float, ...]:
        return tuple(float(getattr(self, name)) for name, _ in OBJECTIVES)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["recipe"] = self.recipe.as_dict()
        out["label"] = self.recipe.label()
        out["failures"] = list(self.failures)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measured:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["recipe"] = Recipe(**data["recipe"])
        values["failures"] = tuple(data.get("failures", ()))
        return cls(**{k: (float("nan") if v is None and k in _FLOATS else v) for k, v in values.items()})


_FLOATS = {f.name for f in dataclasses.fields(Measured) if f.type == "float"}


@dataclasses.dataclass(frozen=True)
class FloatFigures:
    """The float model's size, predicted peak and estimated energy (the ratios' denominators; its latency is timed
    with each trial)."""

    size_bytes: int
    peak_bytes: int
    energy_uj: float


@dataclasses.dataclass(frozen=True)
class Built:
    """A recipe built and checked, before anything is timed: its model (None: it could not be built, ``error`` says
    why), the task metric and worst output SQNR on the held-out samples, the integer-kernel fraction, whether it
    passed the budget's gate (``failures`` says why not) and the seconds it took. What a worker hands back."""

    recipe: Recipe
    model: onnx.ModelProto | None
    passed: bool = False
    artifact: bytes | None = None  # what a mobile runtime loads (a .pte, a .tflite); None: the ONNX model itself
    metric_name: str = ""
    metric: float = float("nan")
    worst_sqnr_db: float = float("nan")
    integer_fraction: float = 0.0
    failures: tuple[str, ...] = ()
    error: str = ""
    seconds: float = 0.0


@dataclasses.dataclass
class TrialBuilder:
    """Builds recipes and checks them against the float model; everything a worker needs, and picklable (a Ray
    worker gets a copy). ``model``: the float model at the opset the space needs; ``calib``: the calibration feeds;
    ``evaluation``: the held-out samples; ``base``: quantize's default configuration with the float head off;
    ``head`` and ``ranking``: what the default recipe chose and measured (``Recipe.config``); ``task`` as quantize
    takes it. The float model's outputs on the held-out samples are computed once and travel with the builder (a
    worker, even one Ray starts anew between batches, never runs the float model)."""

    model: onnx.ModelProto
    calib: Sequence[Mapping[str, np.ndarray]]
    evaluation: Sequence[Any]
    gate: QualityGate
    base: QuantConfig
    head: tuple[str, ...] = ()
    ranking: tuple[str, ...] = ()
    task: str | None = None
    threads: int = 1
    sequence: Sequence[Any] = ()  # the data in its order: a recurrent model's state is rolled over it (task_check's)
    _reference: Any = dataclasses.field(default=None, repr=False, compare=False)  # the float model's runner
    # the float model's outputs on the held-out samples, in their order: computed once (in the driver, by the
    # baseline's check) and shipped with the builder, so that a Ray worker, new or not, never runs the float model
    _reference_outputs: list[Any] = dataclasses.field(default_factory=list, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:  # a session does not pickle; a worker makes its own where it needs one
        return {**self.__dict__, "_reference": None}

    def quantize(self, config: QuantConfig) -> Any:
        from npukit.quant.qdq import quantize

        return quantize(self.model, self.calib, config=config)

    def compare(self, candidate: Any) -> TaskResult:
        """``candidate`` (a function of one feed dict, all outputs in order) against the float model on the held-out
        samples (the task metric and every output)."""
        from npukit.measure.task_fidelity import compare_task, session_runner
        from npukit.runtime.ort import make_session

        names = [o.name for o in self.model.graph.output]
        outputs, position = self._reference_outputs, itertools.count()

        def reference(feeds: Any) -> Any:
            i = next(position)  # compare_task reads self.evaluation in its order, every time
            if i == len(outputs):
                if self._reference is None:
                    self._reference = session_runner(make_session(self.model, threads=self.threads))
                outputs.append(self._reference(feeds))
            return outputs[i]

        _, result = compare_task(reference, candidate, self.evaluation, output_names=names, task=self.task)
        return result

    def drift(self, candidate: Any, result: TaskResult) -> list[str]:
        """The floors a recurrent model misses with each model fed its own state over ``sequence`` (the final
        check holds them; every Silero trial was 'within budget', then the chosen one failed there)."""
        from npukit.measure.recurrent import fed_back
        from npukit.measure.task_fidelity import session_runner
        from npukit.runtime.ort import make_session

        if not self.sequence:
            return []
        if self._reference is None:
            self._reference = session_runner(make_session(self.model, threads=self.threads))
        return fed_back(self._reference, candidate, self.sequence, [o.name for o in self.model.graph.output], result,
                        self.gate.min_sqnr_db)[1]

    def build(self, recipe: Recipe) -> Built:
        """The recipe's model, built and checked; a recipe this model cannot take, or one that crashes, is a failed
        trial (``Built.error``), never the end of the search."""
        start = time.perf_counter()
        try:
            config = recipe.config(self.base, head=self.head, ranking=self.ranking)
            return self.check(recipe, self.quantize(config), config, start=start)
        except NpukitError as exc:  # a recipe this model cannot take (e.g. a step refused): a failed trial
            error = exc.one_line()
        except Exception as exc:  # noqa: BLE001 - one recipe's crash (e.g. ORT refusing its model) ends that trial
            # alone; the trial log shows it, and a search where every trial failed exits 1
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        return Built(recipe, None, error=error, seconds=time.perf_counter() - start)

    def check(self, recipe: Recipe, result: Any, config: QuantConfig, *, start: float) -> Built:
        """``result`` (a QuantResult of ``config``) against the float model with the budget's gate; no integer
        kernel at all fails it too (nothing gained over the float model)."""
        from npukit.measure.task_fidelity import session_runner
        from npukit.quant.qdq import integer_failures, integer_kernel_report
        from npukit.runtime.ort import make_session

        model = result.model
        kernels = integer_kernel_report(model)
        candidate = session_runner(make_session(model, threads=self.threads))
        outcome = self.compare(candidate)
        failures = [*integer_failures(kernels, result), *self.drift(candidate, outcome)]
        if not failures and kernels["integer_fraction"] == 0.0:
            failures.append("runs no integer kernel: nothing gained over the float model")
        verdict = judge(outcome, self.gate, what="trial", extra_failures=failures)
        sqnrs = [o.sqnr_db for o in outcome.outputs if not math.isnan(o.sqnr_db)]
        return Built(recipe, model, passed=verdict.passed and not verdict.degraded, metric_name=outcome.metric,
                     metric=float(outcome.value) if outcome.value is not None else float("nan"),
                     worst_sqnr_db=min(sqnrs) if sqnrs else float("nan"),
                     integer_fraction=float(kernels["integer_fraction"]), failures=tuple(verdict.failures),
                     seconds=time.perf_counter() - start)


@dataclasses.dataclass
class TrialRunner:
    """Measures recipes on ORT CPU: ``builder`` builds and checks one (here, or in a worker), ``finish`` times it
    against the float model ``reference`` (as given: what every ratio is against) on ``feeds`` in the same
    interleaved rounds and adds its size, predicted peak and estimated energy. Timing stays in this process, one
    model at a time, so that parallel builds never share the CPU with a timing."""

    reference: onnx.ModelProto
    builder: TrialBuilder
    floats: FloatFigures
    feeds: Mapping[str, np.ndarray]
    threads: int = 1
    runs: int = 20
    # digest -> the figures of an artifact measured in this run: another recipe that builds the same bytes (a knob
    # that changed nothing on this model) gets them again instead of a second timing whose noise alone would tell
    # the two apart (and the sampler and fANOVA would read that noise as the knob's effect)
    _seen: dict[str, Measured] = dataclasses.field(default_factory=dict, repr=False)

    def run(self, recipe: Recipe) -> tuple[Measured, bytes | None]:
        """The recipe's measured figures and its artifact's bytes (None where it could not be built)."""
        built = self.builder.build(recipe)
        return self.finish(built), self.artifact(built)

    def artifact(self, built: Built) -> bytes | None:
        """The bytes of what the target loads: the QDQ model here, as ``write`` writes it (its size the file's)."""
        from npukit.frontend.onnx_io import onnx_bytes

        return onnx_bytes(built.model) if built.model is not None else None

    def candidate(self, artifact: bytes) -> Any:
        """The artifact as a function of one feed dict (all outputs, in order), for the final check."""
        from npukit.measure.task_fidelity import session_runner
        from npukit.runtime.ort import make_session

        return session_runner(make_session(onnx.load_from_string(artifact), threads=self.threads))

    def write(self, artifact: bytes, output: Any) -> None:
        from npukit.frontend.onnx_io import save_onnx

        save_onnx(onnx.load_from_string(artifact), output)

    def time_again(self, artifacts: Mapping[str, bytes], *, runs: int) -> dict[str, tuple[float, float]]:
        """Each artifact's median latency and the float model's, ms, timed together again with ``runs`` runs each."""
        from npukit.measure.latency import measure_latency_interleaved

        timed = measure_latency_interleaved({"float": self.reference, **artifacts}, threads=self.threads, warmup=10,
                                            runs=runs, rounds=10, feeds=self.feeds)
        return {k: (timed[k].median_ms, timed["float"].median_ms) for k in artifacts}

    def measure(self, recipe: Recipe, result: Any, config: QuantConfig, *,
                start: float) -> tuple[Measured, bytes | None]:
        """The figures of ``result``, already built from ``config``, and its artifact's bytes."""
        built = self.builder.check(recipe, result, config, start=start)
        return self.finish(built), self.artifact(built)

    def close(self) -> None:
        """Nothing to release here (a mobile runner removes the files its runtimes loaded)."""

    def finish(self, built: Built) -> Measured:
        """``built`` timed against the float model, with its size, predicted peak and estimated energy (or the
        figures of the same artifact measured earlier in this run)."""
        start = time.perf_counter()
        artifact = self.artifact(built)
        if artifact is None:
            return Measured(built.recipe, False, error=built.error, seconds=built.seconds)
        digest = artifact_digest(artifact)
        seen = self._seen.get(digest)
        if seen is not None:
            return dataclasses.replace(seen, recipe=built.recipe, seconds=built.seconds, confirmed=False)
        latency_ms, float_ms = self._timed_once(built, artifact)
        size = len(artifact)
        measured = Measured(
            built.recipe, built.passed, metric_name=built.metric_name, metric=built.metric,
            worst_sqnr_db=built.worst_sqnr_db, latency=latency_ms / float_ms, latency_ms=latency_ms,
            float_latency_ms=float_ms, size=size / self.floats.size_bytes, size_bytes=size,
            integer_fraction=built.integer_fraction, failures=built.failures, digest=digest,
            **self._estimates(built.model))
        measured = dataclasses.replace(measured, seconds=built.seconds + time.perf_counter() - start)
        self._seen[digest] = measured
        return measured

    def _timed_once(self, built: Built, artifact: bytes) -> tuple[float, float]:
        """(the candidate's median ms, the float model's), timed in the same interleaved rounds."""
        from npukit.measure.latency import measure_latency_interleaved

        timed = measure_latency_interleaved({"float": self.reference, "candidate": built.model},
                                            threads=self.threads, warmup=3, runs=self.runs,
                                            rounds=min(5, self.runs), feeds=self.feeds)
        return timed["candidate"].median_ms, timed["float"].median_ms

    def _estimates(self, model: onnx.ModelProto) -> dict[str, Any]:
        """The QDQ model's predicted peak and estimated energy, and their ratios to the float model's."""
        from npukit.measure.energy import estimate_energy
        from npukit.memory.layout import ort_predicted_peak

        peak = ort_predicted_peak(model)
        energy = estimate_energy(model, peak_bytes=peak, feeds=self.feeds).total_uj
        return {"memory": peak / self.floats.peak_bytes if self.floats.peak_bytes else float("nan"),
                "peak_bytes": peak, "energy_uj": energy,
                "energy": energy / self.floats.energy_uj if self.floats.energy_uj else float("nan")}


def artifact_digest(data: bytes) -> str:
    """``Measured.digest`` of an artifact's bytes."""
    import hashlib

    return hashlib.sha256(data).hexdigest()[:16]


def dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[str],
              noise: Sequence[float] | None = None) -> bool:
    """``a`` is at least as good as ``b`` on every objective and better on one; with ``noise`` (a relative margin
    per objective, for positive figures), better on one by more than its margin."""
    better = False
    for i, (x, y, way) in enumerate(zip(a, b, directions)):
        if way == "maximize":
            x, y = -x, -y
        if x > y:
            return False
        margin = noise[i] * abs(y) if noise else 0.0
        better = better or x < y - margin
    return better


def pareto_front(points: Sequence[Measured]) -> list[Measured]:
    """The feasible points no other feasible point dominates, in the given order (ties kept); a timed figure better
    by less than its ``NOISE`` does not dominate (a trial 1% faster by its own timing does not hide one 5 dB closer
    to the float model)."""
    directions = [way for _, way in OBJECTIVES]
    noise = [NOISE.get(name, 0.0) for name, _ in OBJECTIVES]
    feasible = [p for p in points if p.feasible]
    return [p for p in feasible
            if not any(dominates(q.objectives(), p.objectives(), directions, noise) for q in feasible if q is not p)]
