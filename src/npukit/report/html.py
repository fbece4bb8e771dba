"""A report as ONE self-contained HTML file: inline CSS and SVG charts, no scripts, fonts or external URLs."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from npukit._atomic import write_text_atomic
from npukit.errors import InputError
from npukit.report.core import Figure, Report, Table
from npukit.report.svg import render_figure
from npukit.report.terminal import MISSING, format_cell, format_seconds, numeric_columns, table_cells

_CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f6f8fa; color: #1f2328; font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto,
  "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 20px 48px; }
header { margin-bottom: 20px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 10px; padding-bottom: 4px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 14px; margin: 0 0 8px; }
.meta { color: #57606a; margin: 0; }
.card { background: #ffffff; border: 1px solid #d0d7de; border-radius: 8px; padding: 14px 16px; margin: 0 0 16px; }
.scroll { max-height: 480px; overflow: auto; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; border-bottom: 1px solid #eaeef2; text-align: left; vertical-align: top; }
th { position: sticky; top: 0; background: #f6f8fa; font-weight: 600; }
td { overflow-wrap: anywhere; }
tbody tr:hover { background: #f6f8fa; }
td.num, th.num { text-align: right; }
td.num { white-space: nowrap; }
td.missing { color: #8c959f; }
.kv th { position: static; width: 1%; background: none; }
.path { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px;
  word-break: break-all; }
figure { margin: 0; }
figure svg { display: block; max-width: 100%; height: auto; }
.note { color: #57606a; }
.error { color: #cf222e; }
.verdict { font-weight: 600; padding: .5rem .75rem; border-radius: 6px; border: 1px solid; }
.verdict.pass { color: #1a7f37; border-color: #1a7f37; }
.verdict.warn { color: #9a6700; border-color: #9a6700; }
.verdict.fail { color: #cf222e; border-color: #cf222e; }
details { background: #ffffff; border: 1px solid #d0d7de; border-radius: 8px; padding: 8px 16px; margin: 0 0 12px; }
summary { cursor: pointer; font-weight: 600; }
pre { margin: 8px 0 4px; padding: 10px; background: #f6f8fa; border-radius: 6px; overflow: auto; max-height: 560px;
  font: 12px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
footer { margin-top: 32px; color: #8c959f; font-size: 12px; }
"""


_NUM = ' class="num"'
_PATH = ' class="path"'


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table_html(table: Table) -> str:
    numeric = numeric_columns(table)
    columns = zip(table.columns, numeric, strict=True)
    head = "".join(f"<th{_NUM if num else ''}>{_e(name)}</th>" for name, num in columns)
    rows = []
    for cells in table_cells(table):
        tds = []
        for i, cell in enumerate(cells):
            classes = [c for c, on in (("num", i < len(numeric) and numeric[i]), ("missing", cell == MISSING)) if on]
            attr = f' class="{" ".join(classes)}"' if classes else ""
            tds.append(f"<td{attr}>{_e(cell)}</td>")
        rows.append("<tr>" + "".join(tds) + "</tr>")
    body = "\n".join(rows) if rows else f'<tr><td class="note" colspan="{max(len(table.columns), 1)}">no rows</td></tr>'
    return (f'<section class="card"><h3>{_e(table.title)}</h3><div class="scroll"><table>\n'
            f"<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table></div></section>")


def _kv_table(pairs: list[tuple[str, Any]], *, path_values: bool = False) -> str:
    rows = "\n".join(
        f"<tr><th>{_e(k)}</th><td{_PATH if path_values else ''}>{_e(format_cell(v))}</td></tr>"
        for k, v in pairs
    )
    return f'<table class="kv"><tbody>\n{rows}\n</tbody></table>'


def _figure_html(figure: Figure) -> str:
    try:
        svg = render_figure(figure)
    except InputError as error:
        svg = f'<p class="error">figure {_e(figure.title)} could not be drawn: {_e(error.one_line())}</p>'
    return f'<figure class="card">\n{svg}\n</figure>'


def _json_block(summary: str, value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return f"<details><summary>{_e(summary)}</summary><pre>{_e(text)}</pre></details>"


GENERATOR = "npukit"  # the head's generator: how a later run knows a report of its own (``report.finish``)


def render_html(report: Report) -> str:
    """The whole report as one HTML document: header, artifacts, tables, figures, timings, and collapsible
    blocks with the resolved config, the environment and the raw JSON results."""
    doc = json.loads(report.to_json())
    env = doc["environment"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta name="generator" content="{GENERATOR}">',
        f"<title>{_e(report.title)}</title>",
        f"<style>{_CSS}</style>",
        "</head><body><main>",
        f'<header><h1>{_e(report.title)}</h1><p class="meta">{_e(report.command)} · created {_e(doc["created"])}'
        + (f" · total {_e(format_seconds(sum(report.timings.values())))}" if report.timings else "")
        + "</p></header>",
    ]
    if report.verdict:
        kind = "pass" if report.passed and report.verdict.startswith("PASS") else "warn" if report.passed else "fail"
        parts.append(f'<p class="verdict {kind}">{_e(report.verdict)}</p>')
    if report.artifacts:
        parts += ["<h2>Artifacts</h2>", '<section class="card">', _kv_table(list(report.artifacts.items()),
                                                                            path_values=True), "</section>"]
    if report.tables:
        parts += ["<h2>Tables</h2>", *(_table_html(t) for t in report.tables)]
    if report.figures:
        parts += ["<h2>Figures</h2>", *(_figure_html(f) for f in report.figures)]
    if report.timings:
        timings = [(name, format_seconds(seconds)) for name, seconds in report.timings.items()]
        parts += ["<h2>Timings</h2>", '<section class="card">', _kv_table(timings), "</section>"]
    environment = [("python", env["python"]), ("platform", env["platform"]), ("machine", env["machine"])]
    environment += [(name, version if version is not None else "not installed")
                    for name, version in env["packages"].items()]
    parts += [
        "<h2>Details</h2>",
        _json_block("Configuration (resolved)", doc["config"]),
        f"<details><summary>Environment</summary>{_kv_table(environment)}</details>",
        _json_block("Results (raw JSON)", doc["results"]),
        f"<footer>npukit report format {_e(doc['npukit_report'])}</footer>",
        "</main></body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_html(report: Report, path: str | Path) -> Path:
    """Write ``render_html(report)`` to ``path`` atomically and return the path."""
    return write_text_atomic(path, render_html(report))
