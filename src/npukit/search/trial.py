"""One trial of the search: build a recipe's artifact and measure it on the target against the float model.

Every figure is measured except two: the peak activation memory (predicted: ORT CPU's own allocation planner replayed
on the graph it executes, ``npukit.memory.layout.ort_predicted_peak``) and the energy (estimated per operator,
``npukit.measure.energy``). Measured: the task metric and every output's SQNR on the held-out samples
(``npukit.tasks``), the latency as a ratio to the float model timed in the same interleaved rounds (so a slow spell
of a shared host hits both), the serialized size, and the integer-kernel fraction.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
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


Compare = Callable[[onnx.ModelProto], TaskResult]


@dataclasses.dataclass
class TrialRunner:
    """Builds and measures recipes on ORT CPU. ``quantize(config) -> QuantResult`` builds one (npukit's pipeline
    on the calibration samples); ``compare(model) -> TaskResult`` runs it beside the float model on the
    held-out samples; ``base``: quantize's default configuration with the float head off; ``head`` and ``ranking``:
    what the default recipe chose and measured (``Recipe.config``)."""

    reference: onnx.ModelProto
    quantize: Callable[[QuantConfig], Any]
    compare: Compare
    gate: QualityGate
    base: QuantConfig
    head: tuple[str, ...]
    ranking: tuple[str, ...]
    floats: FloatFigures
    feeds: Mapping[str, np.ndarray]
    threads: int = 1
    runs: int = 20

    def run(self, recipe: Recipe) -> tuple[Measured, onnx.ModelProto | None]:
        """The recipe's measured figures and its model (None where it could not be built)."""
        start = time.perf_counter()
        try:
            config = recipe.config(self.base, head=self.head, ranking=self.ranking)
            result = self.quantize(config)
            return self.measure(recipe, result, config, start=start), result.model
        except NpukitError as exc:  # a recipe this model cannot take (e.g. a step refused): a failed trial
            error = exc.one_line()
        except Exception as exc:  # noqa: BLE001 - one recipe's crash (e.g. ORT refusing its model) ends that trial
            # alone; the trial log shows it, and a search where every trial failed exits 1
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        return Measured(recipe, False, error=error, seconds=time.perf_counter() - start), None

    def measure(self, recipe: Recipe, result: Any, config: QuantConfig, *, start: float) -> Measured:
        from npukit.measure.energy import estimate_energy
        from npukit.measure.latency import measure_latency_interleaved
        from npukit.memory.layout import ort_predicted_peak
        from npukit.quant.qdq import integer_failures, integer_kernel_report

        model = result.model
        kernels = integer_kernel_report(model)
        outcome = self.compare(model)
        failures = list(integer_failures(kernels, result, config))
        if not failures and kernels["integer_fraction"] == 0.0:
            failures.append("runs no integer kernel: nothing gained over the float model")
        verdict = judge(outcome, self.gate, what="trial", extra_failures=failures)
        timed = measure_latency_interleaved({"float": self.reference, "candidate": model}, threads=self.threads,
                                            warmup=3, runs=self.runs, rounds=min(5, self.runs), feeds=self.feeds)
        size = model.ByteSize()
        peak = ort_predicted_peak(model)
        energy = estimate_energy(model, peak_bytes=peak, feeds=self.feeds).total_uj
        sqnrs = [o.sqnr_db for o in outcome.outputs if not math.isnan(o.sqnr_db)]
        return Measured(
            recipe, verdict.passed and not verdict.degraded, metric_name=outcome.metric,
            metric=float(outcome.value) if outcome.value is not None else float("nan"),
            worst_sqnr_db=min(sqnrs) if sqnrs else float("nan"),
            latency=timed["candidate"].median_ms / timed["float"].median_ms, latency_ms=timed["candidate"].median_ms,
            float_latency_ms=timed["float"].median_ms, size=size / self.floats.size_bytes, size_bytes=size,
            memory=peak / self.floats.peak_bytes if self.floats.peak_bytes else float("nan"), peak_bytes=peak,
            energy=energy / self.floats.energy_uj if self.floats.energy_uj else float("nan"), energy_uj=energy,
            integer_fraction=float(kernels["integer_fraction"]), seconds=time.perf_counter() - start,
            failures=tuple(verdict.failures))


def dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[str]) -> bool:
    """``a`` is at least as good as ``b`` on every objective and better on one."""
    better = False
    for x, y, way in zip(a, b, directions):
        if way == "maximize":
            x, y = -x, -y
        if x > y:
            return False
        better = better or x < y
    return better


def pareto_front(points: Sequence[Measured]) -> list[Measured]:
    """The feasible points no other feasible point dominates, in the given order (ties kept)."""
    directions = [way for _, way in OBJECTIVES]
    feasible = [p for p in points if p.feasible]
    return [p for p in feasible
            if not any(dominates(q.objectives(), p.objectives(), directions) for q in feasible if q is not p)]
