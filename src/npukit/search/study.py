"""The multi-objective study: Optuna samples recipes from the space, each trial is measured on the target, the
feasible trials' Pareto front is kept, and the chosen point is the best on the objective the user ranks first.

The default recipe (what ``npukit quantize`` does with no flags) is always trial 0, so the search can only improve on
it; the seed recipes (``space.SEEDS``) follow, then the sampler's proposals. Trials live in Optuna's SQLite storage
when a path is given: a search stopped by its time budget, by Ctrl-C or by a crash continues where it was when run
again with the same inputs (the study's name is a digest of them; a measured trial is never repeated). Samplers: TPE
(multi-objective, Optuna's default for small budgets) or NSGA-II, both seeded; the budget is a constraint (Optuna's
``Trial.set_constraint``: <= 0 is feasible), so the sampler learns where it fails.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from npukit.errors import InputError
from npukit.search.space import DEFAULT, SEEDS, Recipe, RecipeSpace
from npukit.search.trial import NOISE, OBJECTIVES, Measured, pareto_front

PREFER = ("latency", "size", "memory", "energy")
SAMPLERS = ("tpe", "nsga2")


def fraction(text: str) -> float:
    """A budget as text: "1%" -> 0.01, "0.01" -> 0.01; an InputError for anything else."""
    value = text.strip()
    try:
        return float(value[:-1]) / 100.0 if value.endswith("%") else float(value)
    except ValueError:
        raise InputError(f"budget {text!r} is not a fraction", hint="e.g. --budget 1% or --budget 0.01") from None


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """``budget``: the task metric may fall this fraction below the float model's (0.01: within 1%); ``prefer``: the
    objective the chosen point is best on among those that meet the budget; ``trials``: trials in the study in all
    (a resumed study counts those it has); ``timeout_s``: no new batch starts after this many seconds of this run;
    ``batch``: recipes proposed at once and measured before the sampler sees any of their figures (what a parallel
    search needs; the same batch size and seed propose the same recipes however the batch is measured)."""

    budget: float = 0.01  # a fraction, or given as text: "1%" or "0.01" (``fraction``)
    prefer: str = "latency"
    trials: int = 12
    timeout_s: float | None = None
    seed: int = 0
    sampler: str = "tpe"
    space: str = "quick"
    batch: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.budget, str):  # the Python API takes "1%" as the CLI does (it was a TypeError)
            object.__setattr__(self, "budget", fraction(self.budget))
        if isinstance(self.budget, bool) or not isinstance(self.budget, (int, float)):
            raise InputError(f"budget {self.budget!r} is not a fraction", hint="e.g. budget='1%' or budget=0.01")
        if not 0.0 <= self.budget < 1.0:
            raise InputError(f"budget {self.budget:g} must be a fraction in [0, 1)", hint="e.g. --budget 1%")
        if self.prefer not in PREFER:
            raise InputError(f"unknown objective {self.prefer!r} to prefer", hint=f"use one of {', '.join(PREFER)}")
        if self.trials < 1:
            raise InputError(f"trials {self.trials} must be at least 1", hint="e.g. --trials 12")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise InputError(f"time budget {self.timeout_s:g} s must be positive", hint="e.g. --time-budget 10m")
        if self.batch < 1:
            raise InputError(f"batch {self.batch} must be at least 1", hint="e.g. --batch 2 (the workers by default)")
        if self.sampler not in SAMPLERS:
            raise InputError(f"unknown sampler {self.sampler!r}", hint=f"use one of {', '.join(SAMPLERS)}")

    @property
    def min_metric(self) -> float:
        return 1.0 - self.budget

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SearchOutcome:
    """Every trial of the study (resumed ones included, in trial order), the feasible Pareto front, the chosen trial
    (None: no trial met the budget), how many trials this run measured, and why it stopped."""

    trials: tuple[Measured, ...]
    numbers: tuple[int, ...]
    front: tuple[int, ...]
    chosen: int | None
    measured_now: int
    stopped: str
    study_name: str
    seconds: float
    importance: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    unlisted: Mapping[int, str] = dataclasses.field(default_factory=dict)  # trial number -> why it has no figures

    def trial(self, number: int) -> Measured:
        return self.trials[self.numbers.index(number)]


def study_name(parts: Mapping[str, Any]) -> str:
    """A digest of everything a trial's figures depend on (model bytes, data, space, target, budget, ...)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return "npukit-" + hashlib.sha256(text.encode()).hexdigest()[:16]


TIE = NOISE["latency"]  # two latencies within 3% are a tie (the timing's noise)


def choose(trials: list[tuple[int, Measured]], prefer: str) -> int | None:
    """The trial of the feasible Pareto front best on ``prefer``; ties go to the higher task metric, then the higher
    worst-output SQNR (closer to the float model where the task metric cannot tell them apart), then the better on
    ``prefer``, then the earlier trial. Latencies within ``TIE`` are a tie (the timing's noise); sizes, predicted
    peaks and estimated energies are exact, so only equal ones are (--prefer size chose a trial 0.1% larger and
    1.15x slower for its SQNR, and called it best on size)."""
    front = pareto_front([m for _, m in trials])
    feasible = [(n, m) for n, m in trials if any(m is f for f in front)]
    if not feasible:
        return None
    best = min(getattr(m, prefer) for _, m in feasible)
    band = TIE if prefer == "latency" else 0.0
    close = [(n, m) for n, m in feasible if getattr(m, prefer) <= best * (1.0 + band)]
    def fidelity(m: Measured) -> float:
        return m.worst_sqnr_db if m.worst_sqnr_db == m.worst_sqnr_db else float("-inf")

    return max(close, key=lambda nm: (nm[1].metric, fidelity(nm[1]), -getattr(nm[1], prefer), -nm[0]))[0]


def _sampler(config: SearchConfig) -> Any:
    import optuna

    if config.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=config.seed, population_size=max(4, min(20, config.trials // 2)))
    # constant_liar: the proposals of one batch see each other as running, not as free (it changes nothing with a
    # batch of one: nothing is running when the sampler proposes)
    return optuna.samplers.TPESampler(seed=config.seed, multivariate=True, n_startup_trials=max(3, config.trials // 4),
                                      constant_liar=True)


def _measured(trial: Any) -> Measured | None:
    data = trial.user_attrs.get("measured")
    return Measured.from_dict(data) if data else None


def run_study(evaluate: Callable[[Recipe], Measured], space: RecipeSpace, config: SearchConfig, *, name: str,
              storage: Path | None = None, baseline: Measured | None = None,
              drive: Callable[[StudyLoop], None] | None = None, started: float | None = None) -> SearchOutcome:
    """Run the study until it holds ``config.trials`` trials or the time budget is spent. ``evaluate`` measures a
    recipe; ``baseline``, when given, is the default recipe's measurement, reused as trial 0 instead of measuring it
    again; ``started`` (``time.perf_counter()``), when given, is when the time budget began (before the baseline
    was measured: it counts), else now.

    The sampler proposes ``config.batch`` recipes at a time (``StudyLoop``). Here each batch's recipes are measured
    one after the other; ``drive``, when given, runs the loop instead (``npukit.search.distributed`` measures a
    batch on Ray Tune). The proposals depend on the batch size, the seed and the figures told, never on how a batch
    was measured, so a search on Ray proposes what the serial one with the same batch size and figures does."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{storage}" if storage is not None else None
    study = optuna.create_study(storage=url, study_name=name, directions=[way for _, way in OBJECTIVES],
                                sampler=_sampler(config), load_if_exists=True)
    if not study.trials:  # the default first, then the seed recipes the space holds, as far as the trials go
        for recipe in [DEFAULT, *(s for s in SEEDS if space.contains(s))][: config.trials]:
            study.enqueue_trial(_known_params(space, recipe))
    loop = StudyLoop(study, space, config, baseline, started=started)
    if drive is None:
        while (batch := loop.next_batch()) is not None:
            loop.tell(batch, [evaluate(r) for r in batch.to_measure])
    else:
        drive(loop)
    outcome = outcome_of(_unique(study), config.prefer, measured_now=loop.measured_now, stopped=loop.stopped,
                         name=name, seconds=time.perf_counter() - loop.start, importance=importance(study))
    confirmed = {int(k): (ms, float_ms) for k, (ms, float_ms) in study.user_attrs.get(CONFIRMED, {}).items()}
    outcome = dataclasses.replace(outcome, unlisted=_unlisted(study, outcome.numbers))
    return confirm_latency(outcome, config.prefer, confirmed) if confirmed else outcome


def _unlisted(study: Any, listed: Sequence[int]) -> dict[int, str]:
    """Why each trial of ``study`` not in ``listed`` has no figures: a proposal of a recipe already measured (told
    that one's figures), or a trial stopped before it was measured (the report said "Ctrl-C, or a recipe already
    listed" of a run nobody interrupted)."""
    import optuna

    states = optuna.trial.TrialState
    return {t.number: "a recipe already listed, proposed again" if t.state == states.COMPLETE else
            "stopped before it was measured (Ctrl-C)" if t.state in (states.RUNNING, states.WAITING) else
            f"{t.state.name.lower()} before it was measured" for t in study.trials if t.number not in set(listed)}


CONFIRMED = "confirmed_latency"  # the study's record of trials timed again together: number -> [ms, float ms]


def keep_confirmed(storage: Path, name: str, timed: Mapping[int, tuple[float, float]]) -> None:
    """Record in the study ``timed`` (trial number -> (ms, float ms), timed again together; ``confirm_latency``),
    over what earlier runs recorded for the same trials, so that a resumed study's outcome keeps them: a trial an
    earlier run timed again keeps that latency (and the choice made on it) though this run does not build it."""
    import optuna

    study = optuna.load_study(study_name=name, storage=f"sqlite:///{storage}")
    kept = dict(study.user_attrs.get(CONFIRMED, {}))
    kept.update({str(number): [ms, float_ms] for number, (ms, float_ms) in timed.items()})
    study.set_user_attr(CONFIRMED, kept)


class StudyLoop:
    """The study's ask / measure / tell loop, a batch at a time: ``next_batch`` asks the sampler for up to
    ``config.batch`` proposals (None once the study holds its trials, the time budget is spent, the space is
    exhausted or the sampler keeps repeating itself: ``stopped`` says which); the caller measures the batch's
    ``to_measure`` recipes and hands their figures, in that order, to ``tell``. A proposal already measured (by an
    earlier trial, or twice in one batch) is told the figures it has; the default recipe, when ``baseline`` is
    given, its figures."""

    def __init__(self, study: Any, space: RecipeSpace, config: SearchConfig, baseline: Measured | None, *,
                 started: float | None = None) -> None:
        self.study, self.space, self.config, self.baseline = study, space, config, baseline
        self.start = time.perf_counter() if started is None else started
        self.measured_now = 0
        self.asked = 0
        self.stopped = "trials"

    def next_batch(self) -> Batch | None:
        done = len(_unique(self.study))
        config = self.config
        if done >= config.trials:
            return None
        if config.timeout_s is not None and time.perf_counter() - self.start >= config.timeout_s:
            self.stopped = "time budget"
        elif done >= self.space.size():
            self.stopped = "space exhausted"
        elif self.asked >= 4 * config.trials:
            self.stopped = "the sampler kept proposing recipes already measured"
        else:
            trials = [self.study.ask() for _ in range(min(config.batch, config.trials - done))]
            self.asked += len(trials)
            return Batch.of(self.study, trials, [self.space.suggest(t) for t in trials], self.baseline)
        return None

    def tell(self, batch: Batch, results: Sequence[Measured]) -> None:
        batch.record(results)
        self.measured_now += len(batch.first)  # the baseline's too: measured by this run, before the study
        directions = [way for _, way in OBJECTIVES]
        for trial, recipe in zip(batch.trials, batch.recipes):
            result, repeat_of = batch.figures(recipe, trial.number)
            if repeat_of is None:
                trial.set_user_attr("measured", json.loads(json.dumps(result.as_dict())))
            else:  # the sampler proposed a recipe already measured: its figures, not a new trial
                trial.set_user_attr("repeat_of", repeat_of)
            metric = result.metric if math.isfinite(result.metric) else -1.0
            # <= 0 feasible: how far below the floor the metric is (a small positive value where another check failed)
            trial.set_constraint("budget", 0.0 if result.feasible else max(self.config.min_metric - metric, 1e-3))
            self.study.tell(trial, [v if math.isfinite(v) and not result.error else (-1.0 if way == "maximize" else 1e9)
                                    for v, way in zip(result.objectives(), directions)])


@dataclasses.dataclass
class Batch:
    """One batch of proposals: which recipes need measuring (not measured before, not twice in the batch, not the
    baseline given), and each proposal's figures once they are."""

    trials: list[Any]
    recipes: list[Recipe]
    earlier: dict[Recipe, tuple[int, Measured]]  # measured by an earlier trial: (its number, its figures)
    first: dict[Recipe, int]  # recipe -> the number of the batch's trial that measures it
    to_measure: list[Recipe]
    known: dict[Recipe, Measured]

    @classmethod
    def of(cls, study: Any, trials: list[Any], recipes: list[Recipe], baseline: Measured | None) -> Batch:
        earlier = {m.recipe: (n, m) for n, m in _unique(study)}
        first: dict[Recipe, int] = {}
        known: dict[Recipe, Measured] = {}
        for recipe, trial in zip(recipes, trials):
            if recipe in earlier or recipe in first:
                continue
            first[recipe] = trial.number
            if baseline is not None and recipe == DEFAULT:
                known[recipe] = baseline
        return cls(trials, recipes, earlier, first, [r for r in first if r not in known], known)

    def record(self, results: Sequence[Measured]) -> None:
        if len(results) != len(self.to_measure):
            raise RuntimeError(f"{len(self.to_measure)} recipes to measure, {len(results)} results")
        self.known.update(zip(self.to_measure, results))

    def figures(self, recipe: Recipe, number: int) -> tuple[Measured, int | None]:
        """The figures of the proposal ``number`` and, for a repeat, the trial whose they are."""
        if recipe in self.earlier:
            return self.earlier[recipe][1], self.earlier[recipe][0]
        return self.known[recipe], None if self.first[recipe] == number else self.first[recipe]


def importance(study: Any) -> dict[str, dict[str, float]]:
    """Objective -> knob -> its share of the objective's variance over the measured trials (fANOVA, Optuna's
    ``FanovaImportanceEvaluator``, seeded), for the task metric and latency; empty with fewer than 4 measured trials
    or nothing that varied. Trials whose recipes built the same artifact count with their mean latency, so a knob
    that changed nothing (CLE on a model without the pairs it equalizes) gets none of their timing noise. A dozen
    trials give a rough picture, not a ranking to trust to the second digit."""
    import optuna

    measured = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and _measured(t) is not None
                and not _measured(t).error]
    if len(measured) < 4:
        return {}
    out: dict[str, dict[str, float]] = {}
    digests = {t.number: _measured(t).digest for t in measured}
    same: dict[str, list[float]] = {}  # recipes that built one artifact: their latencies differ by timing noise alone
    for t in measured:
        if digests[t.number]:
            same.setdefault(digests[t.number], []).append(t.values[1])
    latency = {t.number: sum(same[d]) / len(same[d]) for t in measured if (d := digests[t.number])}
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
    for index, name in ((0, "metric"), (1, "latency")):
        try:
            values = optuna.importance.get_param_importances(
                study, evaluator=evaluator,
                target=lambda t, i=index: latency.get(t.number, t.values[i]) if i == 1 else t.values[i])
        except (RuntimeError, ValueError):  # e.g. no parameter varied among the trials
            continue
        out[name] = {k: round(float(v), 3) for k, v in values.items()}
    return out


def outcome_of(trials: list[tuple[int, Measured]], prefer: str, *, measured_now: int, stopped: str, name: str,
               seconds: float, importance: Mapping[str, Mapping[str, float]] | None = None) -> SearchOutcome:
    """The outcome of (trial number, figures) pairs: their feasible front and the choice on ``prefer``."""
    front = pareto_front([m for _, m in trials])
    return SearchOutcome(trials=tuple(m for _, m in trials), numbers=tuple(n for n, _ in trials),
                         front=tuple(n for n, m in trials if any(m is f for f in front)),
                         chosen=choose(trials, prefer), measured_now=measured_now, stopped=stopped,
                         study_name=name, seconds=seconds, importance=dict(importance or {}))


def confirm_latency(outcome: SearchOutcome, prefer: str, timed: Mapping[int, tuple[float, float]]) -> SearchOutcome:
    """``outcome`` with the latency of the trials in ``timed`` (number -> (candidate ms, float ms), timed again
    together with more runs) replacing what each trial measured on its own, and the front and choice made again."""
    pairs = []
    for number, measured in zip(outcome.numbers, outcome.trials):
        if number in timed:
            ms, float_ms = timed[number]
            measured = dataclasses.replace(measured, latency=ms / float_ms, latency_ms=ms, float_latency_ms=float_ms,
                                           confirmed=True)
        pairs.append((number, measured))
    return dataclasses.replace(outcome_of(pairs, prefer, measured_now=outcome.measured_now, stopped=outcome.stopped,
                                          name=outcome.study_name, seconds=outcome.seconds,
                                          importance=outcome.importance), unlisted=outcome.unlisted)


def _unique(study: Any) -> list[tuple[int, Measured]]:
    """(trial number, figures) of every complete trial that measured its recipe (repeats left out)."""
    import optuna

    out = []
    for t in study.trials:
        measured = _measured(t) if t.state == optuna.trial.TrialState.COMPLETE else None
        if measured is not None:
            out.append((t.number, measured))
    return out


def _known_params(space: RecipeSpace, recipe: Recipe) -> dict[str, Any]:
    """``recipe``'s parameters that are knobs of ``space`` (a knob with one choice is not a parameter)."""
    if not space.contains(recipe):
        raise ValueError(f"{recipe.label()} is not in the space {space.name}")
    return {k: v for k, v in recipe.params().items() if len(space.knobs()[k]) > 1}
