"""Terminal output through rich: a report's header, tables and timings, one-line errors, and before/after tables.

The cell formatting here (numbers, byte sizes, missing values) is shared with the HTML report and the SVG charts.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from npukit.report.core import Report, Table

MISSING = "—"
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
# "size" names a byte count unless it is one of these counts of something else.
_NOT_BYTES = re.compile(r"(batch|kernel|group|window|step|sample|vocab|population|font)[ _-]?sizes?\b")
# "size" as a word of its own ("file_size", "size bytes"), not inside one ("Resize", "Downsize")
_SIZE_WORD = re.compile(r"(?<![a-z])sizes?(?![a-z])")
# a column that names another unit holds that ("per-size session p50 ms": milliseconds)
_OTHER_UNIT = re.compile(r"(?<![a-z])(ms|us|µs|seconds|db|µj|pj|mj)(?![a-z])|\(s\)|%")
# Text that reads as a number, a signed change, a percentage or a byte size ("-12 (-3.1%)", "1.5 MiB", "+3 (new)").
_NUMERIC_TEXT = re.compile(
    r"^[+-]?(\d[\d,]*(\.\d+)?([eE][+-]?\d+)?|nan|inf)\s*(%|x|B|KiB|MiB|GiB|TiB|PiB|s|ms)?"
    r"(\s*\(([+-]?\d[\d,]*(\.\d+)?([eE][+-]?\d+)?%|new|removed)\))?$"
)


def is_bytes_column(name: str) -> bool:
    """A column (or axis, or before/after key) holds byte counts when its name says "bytes" or "size"."""
    lowered = name.lower()
    return "bytes" in lowered or (_SIZE_WORD.search(lowered) is not None and not _NOT_BYTES.search(lowered)
                                  and not _OTHER_UNIT.search(lowered))


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def format_number(value: float | int) -> str:
    """Integers with thousands separators; floats to 4 significant digits (big ones as whole numbers)."""
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    v = float(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    if 1e4 <= abs(v) < 1e15:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def format_bytes(value: float | int) -> str:
    """A byte count in binary units: 512 -> '512 B', 1536 -> '1.5 KiB', 14_000_000 -> '13.35 MiB'."""
    v = float(value)
    if not math.isfinite(v):
        return format_number(v)
    sign = "-" if v < 0 else ""
    v = abs(v)
    unit = 0
    while unit < len(_BYTE_UNITS) - 1 and float(f"{v:.4g}") >= 1024:
        v /= 1024
        unit += 1
    if unit == 0:
        return f"{sign}{v:,.0f} B" if v == int(v) else f"{sign}{v:.4g} B"
    return f"{sign}{v:.4g} {_BYTE_UNITS[unit]}"


def format_seconds(seconds: float) -> str:
    if not math.isfinite(seconds):
        return format_number(seconds)
    if seconds >= 60:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes)}m {rest:04.1f}s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.3g} ms"


def _plain(value: Any) -> str:
    if _is_number(value):
        return str(int(value)) if isinstance(value, numbers.Integral) else f"{float(value):.4g}"
    return format_cell(value)


def format_cell(value: Any, *, column: str = "") -> str:
    """How a table cell reads, in the terminal and in HTML: None as "—", numbers per ``format_number``, byte
    columns (see ``is_bytes_column``) in KiB/MiB, booleans as yes/no, lists as ``[a, b]``."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if _is_number(value):
        return format_bytes(value) if is_bytes_column(column) else format_number(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_plain(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_plain(v)}" for k, v in value.items())
    return str(value)


def _is_numeric_like(value: Any) -> bool:
    return _is_number(value) or (isinstance(value, str) and bool(_NUMERIC_TEXT.match(value.strip())))


def numeric_columns(table: Table) -> list[bool]:
    """For each column: True when every present value reads as a number (such columns are right-aligned)."""
    flags = []
    for index in range(len(table.columns)):
        present = [row[index] for row in table.rows if index < len(row) and row[index] not in (None, MISSING)]
        flags.append(bool(present) and all(_is_numeric_like(v) for v in present))
    return flags


def table_cells(table: Table) -> list[list[str]]:
    """Every row of ``table`` as formatted text, padded with "—" to the number of columns."""
    width = len(table.columns)
    out = []
    for row in table.rows:
        cells = [format_cell(v, column=table.columns[i] if i < width else "") for i, v in enumerate(row)]
        out.append(cells + [MISSING] * (width - len(cells)))
    return out


def to_rich_table(table: Table) -> RichTable:
    rich_table = RichTable(
        title=Text(table.title, style="bold"),
        box=box.SIMPLE_HEAD,
        caption=Text("no rows", style="dim") if not table.rows else None,
    )
    for name, numeric in zip(table.columns, numeric_columns(table), strict=True):
        rich_table.add_column(Text(name), justify="right" if numeric else "left", header_style="bold",
                              overflow="fold")  # a narrow terminal wraps a figure, never cuts it to "0.…"
    for cells in table_cells(table):
        rich_table.add_row(*(Text(c, style="dim") if c == MISSING else Text(c) for c in cells))
    return rich_table


def timings_line(timings: Mapping[str, float]) -> str:
    return " · ".join(f"{name} {format_seconds(seconds)}" for name, seconds in timings.items())


def print_report(report: Report, *, console: Console | None = None) -> None:
    """Print the report's verdict (when it has one), title, command, artifacts, every table, and the timings."""
    console = console or Console()
    if report.verdict:
        style = "bold green" if report.passed and report.verdict.startswith("PASS") else \
            "bold yellow" if report.passed else "bold red"
        console.print(Text(report.verdict, style=style), soft_wrap=True)
    console.print(Text(report.title, style="bold"))
    console.print(Text(f"{report.command} · {report.started.isoformat(timespec='seconds')}", style="dim"))
    for role, path in report.artifacts.items():
        console.print(Text.assemble(("  " + role + ": ", "dim"), (path, "cyan")), soft_wrap=True)
    for table in report.tables:
        console.print()
        console.print(to_rich_table(table))
    if report.timings:
        console.print(Text("timings: " + timings_line(report.timings), style="dim"))


def print_error(message: str, *, console: Console | None = None) -> None:
    """One red line on stderr: ``error: <message>``."""
    console = console or Console(stderr=True, highlight=False)
    console.print(Text.assemble(("error: ", "bold red"), (" ".join(message.split()), "red")), soft_wrap=True)


def _change(before: float | None, after: float | None, *, as_bytes: bool) -> str:
    b = 0 if before is None else before
    a = 0 if after is None else after
    if not (math.isfinite(b) and math.isfinite(a)):
        return MISSING
    diff = a - b
    if diff == 0:
        return "0"
    sign = "+" if diff > 0 else "-"
    if as_bytes:
        text = sign + format_bytes(abs(diff))
    elif isinstance(diff, numbers.Integral):
        text = f"{diff:+,}"
    else:
        text = sign + format_number(abs(diff))
    if before is None:
        return text + " (new)"
    if after is None:
        return text + " (removed)"
    if b != 0:
        percent = diff / abs(b) * 100
        text += f" ({percent:+.2g}%)" if abs(percent) < 0.1 else f" ({percent:+.1f}%)"
    return text


def before_after_table(
    before: Mapping[str, int | float],
    after: Mapping[str, int | float],
    *,
    title: str,
    key_label: str = "metric",
) -> Table:
    """A table of ``key_label | before | after | change`` over the keys of both dicts (``before``'s order first).

    A key missing on one side counts as 0 for the change ("+3 (new)", "-52 (removed)"); keys naming byte
    counts ("size", "bytes") are shown in KiB/MiB. The change reads like "-12 (-3.1%)".
    """
    keys = list(before) + [k for k in after if k not in before]
    rows: list[list[Any]] = []
    for key in keys:
        b, a = before.get(key), after.get(key)
        as_bytes = is_bytes_column(key)
        shown = [format_bytes(v) if as_bytes and v is not None else v for v in (b, a)]
        rows.append([key, *shown, _change(b, a, as_bytes=as_bytes)])
    return Table(title, [key_label, "before", "after", "change"], rows)
