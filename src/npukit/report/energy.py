"""Energy in a report: the per-operator estimate (labelled an estimate, with its source) and, where the host has a
readable RAPL counter, the measured CPU package energy beside it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npukit.report.core import Report


def add_energy(report: Report, estimates: Mapping[str, Any], *, measured: Mapping[str, Any] | None = None,
               top: int = 10) -> None:
    """``estimates``: role -> ``EnergyEstimate``; ``measured``: role -> ``MeasuredEnergy`` (RAPL), when tried."""
    from npukit.measure.energy import SOURCE

    report.add("energy", {"estimate": {role: e.as_dict() for role, e in estimates.items()},
                          "measured": {role: m.as_dict() for role, m in (measured or {}).items()}})
    rows = []
    for role, e in estimates.items():
        m = (measured or {}).get(role)
        rows.append([role + ("" if not e.unknown_shapes else f" (INCOMPLETE: {e.unknown_shapes} ops unsized)"),
                     round(e.total_uj, 1), round(e.compute_pj / 1e6, 1), round(e.memory_pj / 1e6, 1),
                     "on chip" if e.weights_on_chip else "DRAM", "on chip" if e.activations_on_chip else "DRAM",
                     round(m.uj_per_inference, 1) if m is not None and m.uj_per_inference is not None else "-"])
    report.add_table(f"Energy per inference: ESTIMATE from MACs by type and bytes by memory level ({SOURCE}); "
                     "compare ratios, not absolute values", ["model", "estimate µJ", "compute µJ", "memory µJ",
                                                             "weights from", "activations", "measured µJ (RAPL)"],
                     rows)
    first_role, first = next(iter(estimates.items()))
    total = first.total_pj or 1.0
    shown = min(top, len(first.ops))
    report.add_table(f"Where the estimated energy goes ({first_role}, the {shown} costliest of {len(first.ops)} "
                     f"operators; all of them sum to the model's {first.total_uj:.1f} µJ)",
                     ["node", "op", "type", "MACs", "µJ", "share"],
                     [[o.name, o.op, o.dtype, o.macs, round(o.total_pj / 1e6, 2), f"{o.total_pj / total:.1%}"]
                      for o in first.top(top)])
    notes = [f"{role}: {n}" for role, e in estimates.items() for n in e.notes]
    notes += [m.note for m in (measured or {}).values()]
    if notes:
        report.add_table("Energy: how it was estimated and measured", ["note"], [[n] for n in dict.fromkeys(notes)])
