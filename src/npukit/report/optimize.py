"""The optimize report: the search's trials, its Pareto front, the chosen trial and the plot of the front."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from npukit.report.core import Report


def _r(value: float, digits: int = 3) -> float | None:
    return round(value, digits) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _row(number: int, m: Any, *, front: set[int], chosen: int | None, first: dict[str, int]) -> list[Any]:
    mark = "chosen" if number == chosen else "front" if number in front else "yes" if m.feasible else "no"
    why = m.error or (m.failures[0] if m.failures else "")
    latency = f"{m.latency:.2f} (timed again)" if m.confirmed else _r(m.latency, 2)
    if m.digest and first.get(m.digest, number) != number:  # another recipe built the same bytes: measured once
        latency = f"{latency} (trial {first[m.digest]}'s artifact)"
    return [number, m.recipe.label(), _r(m.metric), _r(m.worst_sqnr_db, 1), latency, _r(m.latency_ms, 2),
            round(m.size_bytes / 1e6, 2) if m.size_bytes else None, round(m.peak_bytes / 1e6, 2) if m.peak_bytes
            else None, _r(m.energy, 2), round(m.seconds, 1), mark, why]


def add_search(report: Report, outcome: Any, config: Any, *, space: Any, pruned: Sequence[str],
               head: Sequence[str], ranking: Sequence[str]) -> None:
    front, chosen = set(outcome.front), outcome.chosen
    # a model without a task metric (generic: NaN for every trial) is held to the SQNR floor instead of --budget
    built = [m for m in outcome.trials if not m.error]
    generic = bool(built) and not any(math.isfinite(m.metric) for m in built)
    metric = "task metric (none)" if generic else next((m.metric_name for m in outcome.trials if m.metric_name),
                                                        "task metric")
    report.add("search", {
        "study": outcome.study_name, "stopped": outcome.stopped, "seconds": outcome.seconds,
        "measured_this_run": outcome.measured_now, "space": {"name": space.name, "size": space.size(),
                                                             "knobs": {k: list(v) for k, v in space.knobs().items()}},
        "pruned": list(pruned), "float_head": list(head), "sensitivity_ranking": list(ranking[:16]),
        "min_metric": config.min_metric, "prefer": config.prefer, "chosen": chosen, "front": sorted(front),
        "importance": {k: dict(v) for k, v in outcome.importance.items()},
        "trials": [{"number": n, **m.as_dict()} for n, m in zip(outcome.numbers, outcome.trials)]})
    # the ratio is what ranks: each trial timed against the float model in the same rounds; its ms are that round's,
    # and rounds minutes apart on a busy machine are not comparable (a faster ms beside a worse ratio)
    columns = ["trial", "recipe", metric, "worst SQNR dB", "latency x float", "ms (its own rounds)", "MB", "peak MB",
               "energy x float (estimate)", "s", "within budget", "first failure"]
    first: dict[str, int] = {}  # artifact digest -> the first trial that built it
    for n, m in sorted(zip(outcome.numbers, outcome.trials), key=lambda nm: nm[0]):
        first.setdefault(m.digest, n)
    ordered = sorted(zip(outcome.numbers, outcome.trials), key=lambda nm: (nm[0] != chosen, nm[0] not in front,
                                                                         nm[1].latency if nm[1].feasible else 9e9))
    bound = ("no task metric: every output held to the SQNR floor instead of --budget" if generic else
             f"{metric} >= {config.min_metric:.3f}")
    report.add_table(f"Pareto front within the budget ({bound}; objectives: {metric}, "
                     "latency, size, peak memory, estimated energy; chosen: best on " + config.prefer + ")", columns,
                     [_row(n, m, front=front, chosen=chosen, first=first) for n, m in ordered if n in front])
    gaps = sorted(set(range(max(outcome.numbers, default=-1) + 1)) - set(outcome.numbers))
    why = {n: outcome.unlisted.get(n, "stopped before it was measured (Ctrl-C), or a recipe already listed")
           for n in gaps}
    unlisted = "; no row for " + "; ".join(f"trial {', '.join(map(str, ns))}: {reason}" for reason, ns in
                                          _grouped(why).items()) if gaps else ""
    report.add_table(f"Every trial ({len(outcome.trials)}; {outcome.measured_now} measured in this run, stopped by "
                     f"{outcome.stopped}; trial 0 is the default recipe{unlisted})", columns,
                     [_row(n, m, front=front, chosen=chosen, first=first)
                      for n, m in zip(outcome.numbers, outcome.trials)])
    report.add_table(f"Search space '{space.name}': {space.size()} recipes", ["knob", "choices"],
                     [[k, ", ".join(str(c) for c in v)] for k, v in space.knobs().items()]
                     + [["pruned before timing", p] for p in pruned]
                     + [["float head (timed once, default recipe)", ", ".join(head) or "none"],
                        ["most sensitive layers (default recipe)", ", ".join(ranking[:8]) or "none"]])
    if outcome.importance:
        knobs = sorted({k for v in outcome.importance.values() for k in v},
                       key=lambda k: -max(v.get(k, 0.0) for v in outcome.importance.values()))
        report.add_table(f"What mattered on this model: each knob's share of the variance of {metric} and of latency "
                         f"over the {len(outcome.trials)} trials (fANOVA; rough with few trials)",
                         ["knob", metric, "latency"],
                         [[k, outcome.importance.get("metric", {}).get(k), outcome.importance.get("latency", {}).get(k)]
                          for k in knobs])
    series: dict[str, dict[str, list[float]]] = {}
    shown = "worst output SQNR dB" if generic else metric
    for n, m in zip(outcome.numbers, outcome.trials):
        y = m.worst_sqnr_db if generic else m.metric
        if m.error or not (math.isfinite(m.latency) and math.isfinite(y)):
            continue
        key = "chosen" if n == chosen else "Pareto front" if n in front else \
            "within budget" if m.feasible else "over budget"
        series.setdefault(key, {"x": [], "y": []})
        series[key]["x"].append(round(m.latency, 4))
        series[key]["y"].append(round(y, 4))
    if series:
        report.add_figure(f"Trials: {shown} against latency (x the float model's)", "scatter", {"series": series},
                          x_label="latency / float latency", y_label=shown)


def _grouped(reasons: Mapping[int, str]) -> dict[str, list[int]]:
    """{reason: the trial numbers it applies to}, in trial order."""
    out: dict[str, list[int]] = {}
    for number, reason in sorted(reasons.items()):
        out.setdefault(reason, []).append(number)
    return out
