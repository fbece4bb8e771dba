"""The auto-optimize benchmark's checks: dominance over the anchor, tuning time, the 0.55x point, and its table.
(The comparison itself needs .venv-inc and the zoo; none is needed here.)"""

from __future__ import annotations

from ._load import load_benchmark

ao = load_benchmark("auto_optimize")


def _row(npk: dict, inc: dict, *, npk_s: float = 100.0, inc_s: float = 50.0, trials=None) -> dict:
    log = trials or [{"feasible": True, "latency": 0.6}, {"feasible": False, "latency": 0.5}]
    return {"model": "m", "npukit": {"seconds": npk_s, "trials": len(log), "trial_log": log, "verdict": "PASS x"},
            "inc": {"seconds": inc_s, "trials": 2, "found": True},
            "side_by_side": {"npukit": {"metric": "top1_agreement", **npk}, "inc": {"metric": "top1_agreement", **inc},
                             "float": {"ms": 10.0, "bytes": 1000}}}


def test_dominance_needs_accuracy_and_speed_or_size() -> None:
    same = {"value": 1.0, "latency_x_float": 0.7, "bytes": 100}
    assert ao._checks(_row({**same, "latency_x_float": 0.6}, same), 0.01)["dominates_inc"]
    assert ao._checks(_row({**same, "bytes": 90}, same), 0.01)["dominates_inc"]
    assert not ao._checks(_row({**same, "value": 0.995, "latency_x_float": 0.5}, same), 0.01)["dominates_inc"]
    assert not ao._checks(_row(same, same), 0.01)["dominates_inc"]  # equal is not better


def test_time_and_the_fast_point_within_the_budget() -> None:
    row = _row({"value": 1.0, "latency_x_float": 0.6, "bytes": 1}, {"value": 1.0, "latency_x_float": 0.7,
                                                                      "bytes": 1}, npk_s=10.0, inc_s=20.0)
    checks = ao._checks(row, 0.01)
    assert checks["less_tuning_time"] and not checks["front_point_within_budget_at_0.55x"]  # 0.5 is over budget
    assert checks["fastest_within_budget_x_float"] == 0.6
    fast = _row({"value": 1.0, "latency_x_float": 0.6, "bytes": 1}, {"value": 1.0, "latency_x_float": 0.7, "bytes": 1},
                trials=[{"feasible": True, "latency": 0.54}])
    assert ao._checks(fast, 0.01)["front_point_within_budget_at_0.55x"]


def test_the_table_names_the_cpu_and_every_tool(tmp_path) -> None:
    row = _row({"value": 1.0, "latency_x_float": 0.6, "bytes": 1000, "ms": 6.0, "worst_sqnr_db": 30.0},
               {"value": 1.0, "latency_x_float": 0.7, "bytes": 900, "ms": 7.0, "worst_sqnr_db": 28.0})
    row["checks"] = ao._checks(row, 0.01)
    ao.write([row], tmp_path, "t", note="n", trials=12, budget=0.01)
    text = (tmp_path / "t.md").read_text()
    assert "| m | npukit |" in text and "| m | inc |" in text and "| m | float |" in text
    assert ao.zoo._cpu() in text.splitlines()[0]
