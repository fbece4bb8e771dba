"""The prune report: which channels went from which convs (and which convs could not lose any, with why), the
weights set to zero, the float, pruned and fine-tuned models side by side, and the substitutions ``npukit
substitute`` made before fine-tuning the same way."""

from __future__ import annotations

from typing import Any

from npukit.report.core import Report
from npukit.report.qat import noisy_timing, rounded


def add_channels(report: Report, pruning: Any) -> None:
    report.add("channels", {"groups": list(pruning.rows), "macs_before": pruning.macs_before,
                            "macs_after": pruning.macs_after, "left_whole": pruning.refused})
    report.add_table(f"Channels pruned: conv and Gemm MACs {pruning.macs_before:,} -> {pruning.macs_after:,} "
                     f"({pruning.macs_after / pruning.macs_before:.1%})",
                     ["conv", "channels", "kept", "importance lost", "depthwise convs that follow", "read by"],
                     [[r["conv"], r["channels"], r["kept"], f"{r['importance_lost']:.1%}", ", ".join(r["depthwise"]),
                       ", ".join(r["readers"])] for r in pruning.rows])
    if pruning.refused:
        report.add_table("Convs and Gemms left whole (their channels are tied to channels elsewhere)", ["node", "why"],
                         [[k, v] for k, v in pruning.refused.items()])


def add_sparsity(report: Report, sparse: Any) -> None:
    report.add("sparsity", {"overall": sparse.sparsity, "tensors": list(sparse.rows)})
    report.add_table(f"Weights set to zero by magnitude: {sparse.sparsity:.1%} of "
                     f"{sum(r['weights'] for r in sparse.rows):,}",
                     ["weight", "node", "weights", "zero before", "zero now"],
                     [[r["weight"], r["node"], r["weights"], r["zeros_before"], f"{r['zeros'] / r['weights']:.1%}"]
                      for r in sparse.rows])


def add_comparison(report: Report, rows: dict[str, Any], latency: dict[str, Any], figures: dict[str, dict], *,
                   label: str = "pruned", untuned: str | None = None) -> None:
    """The changed model (``label``: pruned, substituted) before and after fine-tuning on the held-out samples (task
    metric against the float model), and the float and fine-tuned models' MACs, parameters, sizes and ORT CPU
    latency; ``untuned`` (why nothing was fine-tuned): the float and changed models alone, the changed one timed."""
    report.add("comparison", {k: v.as_dict() for k, v in rows.items()})
    report.add("latency", {k: v.as_dict() for k, v in latency.items()})
    report.add("figures", figures)
    metric = next(iter(rows.values())).metric
    base = latency["float"].median_ms
    timed = {"float": "float", label if untuned else "fine-tuned": label}  # the row -> its timing
    table = []
    for name in ("float", label) if untuned else ("float", label, "fine-tuned"):
        f = figures[name]
        result = rows.get(name)
        worst = min((o.sqnr_db for o in result.outputs), default=None) if result else None
        ms = latency[timed[name]].median_ms if name in timed else None
        table.append([name, rounded(result.value) if result else None, rounded(worst, 2), f["macs"], f["params"],
                      round(ms, 3) if ms else None, round(ms / base, 3) if ms else None, f["bytes"], f["deflated"]])
    speed = (f"not fine-tuned: {untuned}" if untuned else
             f"the {label} model before fine-tuning has the fine-tuned one's speed")
    report.add_table(f"{f'Float and {label}' if untuned else f'Float, {label} and fine-tuned'} on the held-out "
                     f"samples ({metric} against the float model; ORT CPU latency, interleaved medians; {speed}"
                     f"{noisy_timing(latency['float'], latency[label])})",
                     ["model", metric, "worst output SQNR dB", "MACs", "parameters", "median ms", "x float",
                      "bytes", "bytes deflated (zip)"], table)


def add_no_training(report: Report, why: str) -> None:
    """The training section of a run that fine-tuned nothing (``why``), with the keys of ``report.qat.add_training``'s
    that say how much ran, and a table saying so where the training table would be."""
    report.add("training", {"skipped": why, "history": [], "steps": 0, "seconds": 0.0, "kept_epoch": None,
                            "start": None})
    report.add_table(f"Training: none ({why})", ["note"],
                     [[f"no fine-tuning was run: {why}, so there was nothing to recover; the model is written as "
                       "it is and held to the task check a fine-tuned one is held to"]])


def add_substitutions(report: Report, applied: list[dict[str, Any]]) -> None:
    """The substitutions ``npukit substitute`` applied (``targets.fix.substitute(...).applied``)."""
    report.add("substitutions", applied)
    report.add_table("Substitutions applied", ["rule", "what", "exact", "nodes rewritten", "notes"],
                     [[a["fix"], a["description"], "yes" if a["exact"] else "no: changes the function",
                       a["rewrites"], "; ".join(grouped_notes(a["notes"])) or "-"] for a in applied])


def grouped_notes(notes: list[str]) -> list[str]:
    """A pass's notes with the nodes kept for the same reason said once: "ReduceMean x10 ('a', 'b', ...) kept: why"
    for ten of "ReduceMean 'a' is kept: why" (the JSON keeps every note)."""
    import re

    groups: dict[tuple[str, str], list[str]] = {}
    other = []
    for note in notes:
        found = re.fullmatch(r"(\S+) '(.*)' is kept: (.*)", note)
        if found:
            groups.setdefault((found[1], found[3]), []).append(found[2])
        else:
            other.append(note)
    said = [f"{op} {names[0]!r} is kept: {why}" if len(names) == 1 else
            f"{op} x{len(names)} ({', '.join(map(repr, names[:2]))}{', ...' if len(names) > 2 else ''}) kept: {why}"
            for (op, why), names in groups.items()]
    return said + other
