"""Terminal rendering: formatting rules, rich tables, one-line errors and before/after tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rich.console import Console

from npukit.report.core import Report, Table
from npukit.report.terminal import (
    before_after_table,
    format_bytes,
    format_cell,
    format_number,
    is_bytes_column,
    numeric_columns,
    print_error,
    print_report,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1234567, "1,234,567"), (np.int64(-4200), "-4,200"), (3.14159265, "3.142"), (0.000123456, "0.0001235"),
     (123456.7, "123,457"), (2.0, "2"), (0.0, "0"), (math.nan, "nan"), (-math.inf, "-inf"), (1e20, "1e+20")],
)
def test_format_number(value, expected):
    assert format_number(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(512, "512 B"), (1536, "1.5 KiB"), (14_000_000, "13.35 MiB"), (-2048, "-2 KiB"), (1024**3 * 3, "3 GiB"),
     (1024 * 1024 - 1, "1 MiB")],
)
def test_format_bytes(value, expected):
    assert format_bytes(value) == expected


def test_format_cell_by_column_and_type():
    assert format_cell(None) == "—"
    assert format_cell(True) == "yes"
    assert format_cell(3_000_000, column="model size") == "2.861 MiB"
    assert format_cell(3_000_000, column="peak_bytes") == "2.861 MiB"
    assert format_cell(3_000_000, column="params") == "3,000,000"
    assert format_cell(32, column="batch size") == "32"
    assert format_cell([1, 3, 224, 224]) == "[1, 3, 224, 224]"
    assert is_bytes_column("Size (bytes)") and not is_bytes_column("kernel_size")
    assert not is_bytes_column("Resize") and is_bytes_column("file_size")  # an op named Resize counts no bytes
    assert not is_bytes_column("per-size session p50 ms") and is_bytes_column("the model's size")  # another unit


def test_numeric_columns_ignore_missing_values():
    table = Table("t", ["name", "ms", "change", "note"],
                  [["a", 1.5, "-12 (-3.1%)", "x"], ["b", None, "+1.5 MiB (new)", None]])
    assert numeric_columns(table) == [False, True, True, False]


def _report() -> Report:
    report = Report("bench", title="Latency of mobilenet")
    report.add_artifact("model", "/tmp/out/model_int8.onnx")
    report.add_table("Latency", ["model", "p50 ms", "size", "runs", "note"],
                     [["fp32", 4.123456, 14_000_000, 12000, None], ["int8", 2.01, 3_600_000, 12000, "[bold]x[/bold]"]])
    report.timings["bench"] = 3.5
    return report


def test_print_report_shows_tables_units_and_artifacts():
    console = Console(record=True, width=120)
    print_report(_report(), console=console)
    text = console.export_text()
    for expected in ("Latency of mobilenet", "/tmp/out/model_int8.onnx", "Latency", "p50 ms", "4.123", "2.01",
                     "13.35 MiB", "3.433 MiB", "12,000", "—", "[bold]x[/bold]", "bench 3.50 s"):
        assert expected in text, expected
    # numbers right-aligned: the shorter value ends where the longer one does
    rows = [ln for ln in text.splitlines() if ln.strip().startswith(("fp32", "int8"))]
    assert rows[0].index("4.123") + len("4.123") == rows[1].index("2.01") + len("2.01")


def test_print_error_is_one_red_line_on_stderr(capsys):
    print_error("no such file: model.onnx.\n  Check the path")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "error: no such file: model.onnx. Check the path"
    console = Console(record=True, force_terminal=True, color_system="standard", width=40)
    print_error("x" * 100, console=console)
    assert "\x1b[31m" in console.export_text(styles=True, clear=False)
    assert console.export_text().count("\n") == 1


def test_before_after_table():
    table = before_after_table(
        {"nodes": 152, "size": 14_000_000, "MACs": 300_000_000, "latency ms": 4.0, "Relu": 3},
        {"nodes": 140, "size": 14_000_000, "MACs": 290_700_000, "latency ms": 3.2, "Clip": 2},
        title="Model", key_label="metric",
    )
    assert table.columns == ["metric", "before", "after", "change"]
    rows = {r[0]: r[1:] for r in table.rows}
    assert rows["nodes"] == [152, 140, "-12 (-7.9%)"]
    assert rows["size"] == ["13.35 MiB", "13.35 MiB", "0"]
    assert rows["MACs"][2] == "-9,300,000 (-3.1%)"
    assert rows["latency ms"][2] == "-0.8 (-20.0%)"
    assert rows["Relu"] == [3, None, "-3 (removed)"]
    assert rows["Clip"] == [None, 2, "+2 (new)"]
    assert list(rows) == ["nodes", "size", "MACs", "latency ms", "Relu", "Clip"]


def test_a_narrow_terminal_wraps_a_figure_and_never_cuts_it() -> None:
    """optimize's trial tables in an 80-column terminal read 'tri… rec… 0.…': each figure cut to an ellipsis."""
    import io

    columns = ["trial", "recipe", "top1_agreement_confident", "worst SQNR dB", "latency x float",
               "ms (its own rounds)", "MB", "peak MB", "energy x float (estimate)", "s", "within budget",
               "first failure"]
    table = Table("Every trial", columns, [[0, "pc auto", 1.0, 29.4, "1.36 (timed again)", 1.25, 0.34, 0.44, 0.18,
                                            5.2, "front", ""]])
    out = io.StringIO()
    report = Report("optimize")
    report.tables.append(table)
    print_report(report, console=Console(file=out, width=80))
    printed = out.getvalue()
    assert "…" not in printed and "29.4" in printed and "1.25" in printed  # 0.18 wraps as 0.1 / 8, 1.36 as 1.3 / 6
