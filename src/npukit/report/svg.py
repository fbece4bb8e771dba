"""Small, dependency-free SVG charts for the HTML report: bars, lines, scatter points and memory timelines.

Every function returns one ``<svg>`` element as text, ready to inline in HTML (no xmlns, no ids, no scripts).
The output is deterministic; non-finite values are left out (and counted in a footnote); an empty chart says
"no data". Colors come from the Okabe-Ito palette, which stays distinct for colorblind readers.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from npukit.errors import InputError
from npukit.report.core import Figure
from npukit.report.terminal import format_bytes, format_number, is_bytes_column

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
_DARK_TEXT_ON = {"#E69F00", "#56B4E9", "#F0E442"}  # fills light enough for dark labels
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
WIDTH = 720
_TEXT = "#1f2328"
_MUTED = "#57606a"
_GRID = "#e1e4e8"
_AXIS = "#8c959f"
_CHAR_W = 0.6  # a glyph's average width relative to the font size, for layout estimates
_MAX_LABEL = 32
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]


def _esc(text: object) -> str:
    return html.escape(_XML_INVALID.sub("\ufffd", str(text)), quote=True)


def _n(x: float) -> str:
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _finite(*values: Any) -> bool:
    try:
        return all(math.isfinite(float(v)) for v in values)
    except (TypeError, ValueError):
        return False


def _truncate(text: str, limit: int = _MAX_LABEL) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text_width(text: str, size: float) -> float:
    return len(text) * size * _CHAR_W


def _text(x: float, y: float, content: str, *, size: float = 12, anchor: str = "start", color: str = _TEXT,
          weight: str | None = None, rotate: bool = False) -> str:
    attrs = f'x="{_n(x)}" y="{_n(y)}" font-size="{_n(size)}" fill="{color}"'
    if anchor != "start":
        attrs += f' text-anchor="{anchor}"'
    if weight:
        attrs += f' font-weight="{weight}"'
    if rotate:
        attrs += f' transform="rotate(-90 {_n(x)} {_n(y)})"'
    return f"<text {attrs}>{_esc(content)}</text>"


def _line(x1: float, y1: float, x2: float, y2: float, *, color: str = _GRID, width: float = 1,
          dashed: bool = False) -> str:
    dash = ' stroke-dasharray="6 4"' if dashed else ""
    return (f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" stroke="{color}" '
            f'stroke-width="{_n(width)}"{dash}/>')


def _document(width: float, height: float, title: str, body: list[str]) -> str:
    label = _esc(title or "chart")
    head = (f'<svg viewBox="0 0 {_n(width)} {_n(height)}" width="{_n(width)}" height="{_n(height)}" '
            f'role="img" aria-label="{label}" font-family="{_esc(FONT)}">')
    parts = [head, f"<title>{label}</title>", f'<rect width="{_n(width)}" height="{_n(height)}" fill="#ffffff"/>']
    if title:
        parts.append(_text(12, 22, title, size=15, weight="600"))
    return "\n".join(parts + body + ["</svg>"])


def _title_height(title: str) -> float:
    return 38 if title else 12


def no_data_chart(title: str = "") -> str:
    top = _title_height(title)
    return _document(WIDTH, top + 60, title, [_text(WIDTH / 2, top + 30, "no data", size=14, anchor="middle",
                                                      color=_MUTED)])


def _footnote(skipped: int) -> str:
    return f"{skipped} value{'s' if skipped != 1 else ''} not shown (infinite or undefined)" if skipped else ""


# ---------------------------------------------------------------------------------------------------------- axes
def _step_for(span: float, count: int, *, integer: bool) -> float:
    raw = span / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if raw <= m * magnitude * (1 + 1e-9))
    return max(step, 1.0) if integer else step


def _decimals(step: float) -> int:
    for d in range(0, 10):
        if abs(round(step, d) - step) <= 1e-9 * step:
            return d
    return 10


def _axis(lo: float, hi: float, *, bytes_unit: bool = False, integer: bool = False,
          count: int = 5) -> tuple[float, float, list[tuple[float, str]]]:
    """Round ``[lo, hi]`` out to nice tick values; return the new bounds and (value, label) ticks."""
    if lo == hi:
        pad = 1.0 if (integer or lo == 0) else abs(lo) * 0.1
        lo, hi = lo - pad, hi + pad
    scale, unit = 1.0, ""
    if bytes_unit:
        biggest = max(abs(lo), abs(hi))
        power = min(int(math.log(biggest, 1024)) if biggest >= 1024 else 0, 5)
        scale, unit = 1024.0**power, " " + ("B", "KiB", "MiB", "GiB", "TiB", "PiB")[power]
    step = _step_for((hi - lo) / scale, count, integer=integer and scale == 1)
    first = math.floor(lo / scale / step + 1e-9)
    last = math.ceil(hi / scale / step - 1e-9)
    values = [(first + i) * step for i in range(last - first + 1)]
    suffix_div, suffix = 1.0, ""
    if not bytes_unit:
        biggest = max(abs(values[0]), abs(values[-1]))
        for div, name in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")):
            if biggest >= div:
                suffix_div, suffix = (1e3, "k") if name == "k" else (div, name)
                break
    decimals = _decimals(step / suffix_div)
    ticks = []
    for value in values:
        shown = value / suffix_div
        label = f"{shown:.{decimals}f}" if decimals < 6 else f"{shown:.2g}"
        ticks.append((value * scale, "0" if float(label) == 0 else f"{label}{suffix}{unit}"))
    return values[0] * scale, values[-1] * scale, ticks


def _scale(lo: float, hi: float, start: float, end: float):
    span = hi - lo
    return lambda v: start + (v - lo) / span * (end - start)


# ---------------------------------------------------------------------------------------------------------- bars
def bar_chart(labels: Sequence[str], values: Sequence[float], *, title: str = "", x_label: str = "",
              reference: float | None = None, reference_label: str = "", bytes_unit: bool = False) -> str:
    """Horizontal bars, one per label, with the value printed at the right; an optional dashed reference line.

    Negative values extend left of zero (in a second color). ``bytes_unit`` shows values and ticks in KiB/MiB.
    """
    if len(labels) != len(values):
        raise InputError(f"bar chart has {len(labels)} labels but {len(values)} values",
                         hint="give one value per label")
    bars = [(str(label), float(v)) for label, v in zip(labels, values, strict=True) if _finite(v)]
    skipped = len(values) - len(bars)
    if not bars:
        return no_data_chart(title)
    if reference is not None and not _finite(reference):
        reference = None
    fmt = format_bytes if bytes_unit else format_number
    shown_labels = [_truncate(label) for label, _ in bars]
    shown_values = [fmt(v) for _, v in bars]
    left = 16 + max(_text_width(s, 12) for s in shown_labels)
    right = WIDTH - 16 - max(_text_width(s, 12) for s in shown_values)
    top = _title_height(title) + (18 if reference is not None else 4)
    row = 24
    plot_bottom = top + row * len(bars)
    numbers = [v for _, v in bars] + ([reference] if reference is not None else [])
    lo, hi, ticks = _axis(min(0.0, *numbers), max(0.0, *numbers), bytes_unit=bytes_unit)
    sx = _scale(lo, hi, left, right)
    body: list[str] = []
    for value, label in ticks:
        body.append(_line(sx(value), top, sx(value), plot_bottom))
        body.append(_text(sx(value), plot_bottom + 16, label, size=11, anchor="middle", color=_MUTED))
    for i, ((label, value), short, shown) in enumerate(zip(bars, shown_labels, shown_values, strict=True)):
        y = top + i * row
        x0, x1 = sx(0.0), sx(value)
        color = PALETTE[0] if value >= 0 else PALETTE[3]
        body.append(f'<rect x="{_n(min(x0, x1))}" y="{_n(y + 3)}" width="{_n(max(abs(x1 - x0), 0.5))}" '
                    f'height="{row - 6}" fill="{color}"><title>{_esc(label)}: {_esc(shown)}</title></rect>')
        body.append(_text(left - 8, y + row / 2 + 4, short, anchor="end"))
        body.append(_text(WIDTH - 12, y + row / 2 + 4, shown, anchor="end"))
    body.append(_line(sx(0.0), top, sx(0.0), plot_bottom, color=_AXIS))
    if reference is not None:
        body.append(_line(sx(reference), top - 6, sx(reference), plot_bottom, color=PALETTE[3], width=1.5,
                          dashed=True))
        caption = f"{reference_label or 'reference'} {fmt(reference)}"
        anchor = "end" if sx(reference) > (left + right) / 2 else "start"
        body.append(_text(sx(reference) + (-4 if anchor == "end" else 4), top - 8, caption, size=11,
                          anchor=anchor, color=PALETTE[3]))
    height = plot_bottom + 24
    if x_label:
        height += 16
        body.append(_text((left + right) / 2, height - 4, x_label, size=12, anchor="middle", color=_MUTED))
    if skipped:
        height += 18
        body.append(_text(12, height - 6, _footnote(skipped), size=11, color=_MUTED))
    return _document(WIDTH, height + 6, title, body)


# ---------------------------------------------------------------------------------------------- lines and points
def line_chart(series: Series, *, title: str = "", x_label: str = "", y_label: str = "", x_bytes: bool = False,
               y_bytes: bool = False) -> str:
    """One polyline per named series ``name -> (xs, ys)``, with axes, ticks and a legend.

    A non-finite point breaks the line; points are marked when a series has at most 40 of them.
    """
    return _xy_chart(series, scatter=False, title=title, x_label=x_label, y_label=y_label, x_bytes=x_bytes,
                     y_bytes=y_bytes)


def scatter_chart(series: Series, *, title: str = "", x_label: str = "", y_label: str = "", x_bytes: bool = False,
                  y_bytes: bool = False) -> str:
    """One set of dots per named series ``name -> (xs, ys)``, with axes, ticks and a legend."""
    return _xy_chart(series, scatter=True, title=title, x_label=x_label, y_label=y_label, x_bytes=x_bytes,
                     y_bytes=y_bytes)


def _xy_chart(series: Series, *, scatter: bool, title: str, x_label: str, y_label: str, x_bytes: bool,
              y_bytes: bool) -> str:
    runs: list[tuple[str, list[list[tuple[float, float]]]]] = []  # per series: unbroken runs of finite points
    skipped = 0
    for name, pair in series.items():
        if len(pair) != 2 or len(pair[0]) != len(pair[1]):
            raise InputError(f"series {name!r} needs two sequences of equal length (xs, ys)",
                             hint="give each series as (xs, ys)")
        pieces: list[list[tuple[float, float]]] = [[]]
        for x, y in zip(*pair, strict=True):
            if _finite(x, y):
                pieces[-1].append((float(x), float(y)))
            else:
                skipped += 1
                if pieces[-1]:
                    pieces.append([])
        runs.append((str(name), [p for p in pieces if p]))
    points = [pt for _, pieces in runs for piece in pieces for pt in piece]
    if not points:
        return no_data_chart(title)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    y_lo, y_hi, y_ticks = _axis(min(ys), max(ys), bytes_unit=y_bytes)
    x_lo, x_hi, x_ticks = _axis(min(xs), max(xs), bytes_unit=x_bytes)
    named = [name for name, _ in runs if name]
    legend_w = (24 + max(_text_width(_truncate(n, 24), 12) for n in named)) if named else 0
    left = 24 + max(_text_width(label, 11) for _, label in y_ticks) + (18 if y_label else 0)
    right = WIDTH - 16 - legend_w
    top = _title_height(title) + 8
    bottom = top + 300
    sx, sy = _scale(x_lo, x_hi, left, right), _scale(y_lo, y_hi, bottom, top)
    body: list[str] = []
    for value, label in y_ticks:
        body.append(_line(left, sy(value), right, sy(value)))
        body.append(_text(left - 6, sy(value) + 4, label, size=11, anchor="end", color=_MUTED))
    for value, label in x_ticks:
        body.append(_line(sx(value), top, sx(value), bottom))
        body.append(_text(sx(value), bottom + 16, label, size=11, anchor="middle", color=_MUTED))
    body.append(f'<rect x="{_n(left)}" y="{_n(top)}" width="{_n(right - left)}" height="{_n(bottom - top)}" '
                f'fill="none" stroke="{_AXIS}"/>')
    for index, (name, pieces) in enumerate(runs):
        color = PALETTE[index % len(PALETTE)]
        count = sum(len(p) for p in pieces)
        group = [f'<g fill="{color}" stroke="{color}">', f"<title>{_esc(name or 'series')}</title>"]
        for piece in pieces:
            if not scatter and len(piece) > 1:
                path = " ".join(f"{'M' if i == 0 else 'L'}{_n(sx(x))} {_n(sy(y))}" for i, (x, y) in enumerate(piece))
                group.append(f'<path d="{path}" fill="none" stroke-width="2" stroke-linejoin="round"/>')
            if scatter or count <= 40 or len(piece) == 1:
                radius = 3.5 if scatter else 3
                group.extend(f'<circle cx="{_n(sx(x))}" cy="{_n(sy(y))}" r="{radius}" stroke="none" '
                             f'fill-opacity="{"0.75" if scatter else "1"}"/>' for x, y in piece)
        group.append("</g>")
        body.extend(group)
    for slot, (index, name) in enumerate((i, n) for i, (n, _) in enumerate(runs) if n):
        y = top + 8 + slot * 20
        color = PALETTE[index % len(PALETTE)]
        body.append(f'<rect x="{_n(right + 14)}" y="{_n(y - 5)}" width="12" height="10" fill="{color}"/>')
        body.append(_text(right + 32, y + 4, _truncate(name, 24)))
    height = bottom + 26
    if x_label:
        height += 16
        body.append(_text((left + right) / 2, height - 4, x_label, anchor="middle", color=_MUTED))
    if y_label:
        body.append(_text(16, (top + bottom) / 2, y_label, anchor="middle", color=_MUTED, rotate=True))
    if skipped:
        height += 18
        body.append(_text(12, height - 6, _footnote(skipped), size=11, color=_MUTED))
    return _document(WIDTH, height + 6, title, body)


# ------------------------------------------------------------------------------------------------------ timeline
_TIMELINE_KEYS = ("start", "end", "offset", "size")


def timeline_chart(items: Sequence[Mapping[str, Any]], *, title: str = "", peak: float | None = None,
                   x_label: str = "step", y_label: str = "offset") -> str:
    """A memory plan: each item ``{label, start, end, offset, size}`` is a rectangle over steps ``start`` through
    ``end`` (inclusive) and bytes ``offset`` to ``offset + size``; a dashed line marks the peak (by default the
    highest ``offset + size``)."""
    boxes = []
    skipped = 0
    for item in items:
        missing = [k for k in _TIMELINE_KEYS if k not in item]
        if missing:
            raise InputError(f"timeline item {item.get('label', '')!r} lacks {', '.join(missing)}",
                             hint="give each item label, start, end, offset and size")
        start, end, offset, size = (item[k] for k in _TIMELINE_KEYS)
        if not _finite(start, end, offset, size):
            skipped += 1
            continue
        if end < start or size < 0 or offset < 0:
            raise InputError(f"timeline item {item.get('label', '')!r} has end < start or a negative size/offset",
                             hint="end is the last step (inclusive) the buffer is live; sizes are bytes >= 0")
        boxes.append((str(item.get("label", "")), float(start), float(end) + 1, float(offset), float(size)))
    if not boxes:
        return no_data_chart(title)
    top_byte = max(b[3] + b[4] for b in boxes)
    peak = top_byte if peak is None or not _finite(peak) else float(peak)
    y_lo, y_hi, y_ticks = _axis(0.0, max(top_byte, peak, 1.0), bytes_unit=True)
    x_lo, x_hi, x_ticks = _axis(min(b[1] for b in boxes), max(b[2] for b in boxes), integer=True)
    left = 24 + max(_text_width(label, 11) for _, label in y_ticks) + 18
    right = WIDTH - 16
    top = _title_height(title) + 20
    bottom = top + 320
    sx, sy = _scale(x_lo, x_hi, left, right), _scale(y_lo, y_hi, bottom, top)
    body: list[str] = []
    for value, label in y_ticks:
        body.append(_line(left, sy(value), right, sy(value)))
        body.append(_text(left - 6, sy(value) + 4, label, size=11, anchor="end", color=_MUTED))
    for value, label in x_ticks:
        body.append(_line(sx(value), top, sx(value), bottom))
        body.append(_text(sx(value), bottom + 16, label, size=11, anchor="middle", color=_MUTED))
    for index, (label, start, stop, offset, size) in enumerate(boxes):
        color = PALETTE[index % (len(PALETTE) - 1)]
        x, w = sx(start), sx(stop) - sx(start)
        y, h = sy(offset + size), max(sy(offset) - sy(offset + size), 0.5)
        tip = f"{label}: steps {format_number(int(start))}–{format_number(int(stop) - 1)}, " \
              f"offset {format_bytes(offset)}, size {format_bytes(size)}"
        body.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" fill="{color}" '
                    f'fill-opacity="0.85" stroke="#ffffff" stroke-width="0.75"><title>{_esc(tip)}</title></rect>')
        short = _truncate(label, 20)
        if short and w > _text_width(short, 10) + 6 and h >= 14:
            body.append(_text(x + w / 2, y + h / 2 + 3.5, short, size=10, anchor="middle",
                              color=_TEXT if color in _DARK_TEXT_ON else "#ffffff"))
    body.append(f'<rect x="{_n(left)}" y="{_n(top)}" width="{_n(right - left)}" height="{_n(bottom - top)}" '
                f'fill="none" stroke="{_AXIS}"/>')
    body.append(_line(left, sy(peak), right, sy(peak), color=PALETTE[3], width=1.5, dashed=True))
    body.append(_text(right - 4, sy(peak) - 5, f"peak {format_bytes(peak)}", size=11, anchor="end",
                      color=PALETTE[3], weight="600"))
    height = bottom + 42
    body.append(_text((left + right) / 2, height - 4, x_label, anchor="middle", color=_MUTED))
    body.append(_text(16, (top + bottom) / 2, y_label, anchor="middle", color=_MUTED, rotate=True))
    if skipped:
        height += 18
        body.append(_text(12, height - 6, _footnote(skipped), size=11, color=_MUTED))
    return _document(WIDTH, height + 6, title, body)


# ------------------------------------------------------------------------------------------------------ figures
def _series_of(figure: Figure) -> dict[str, tuple[Sequence[float], Sequence[float]]]:
    data = figure.data
    if isinstance(data.get("series"), Mapping):
        out = {}
        for name, points in data["series"].items():
            if not (isinstance(points, Mapping) and "x" in points and "y" in points):
                raise InputError(f"figure {figure.title!r}: series {name!r} needs 'x' and 'y'",
                                 hint='give data as {"series": {name: {"x": [...], "y": [...]}}}')
            out[str(name)] = (points["x"], points["y"])
        return out
    if "x" in data and "y" in data:
        return {"": (data["x"], data["y"])}
    raise InputError(f"figure {figure.title!r} has no series",
                     hint='give data as {"series": {name: {"x": [...], "y": [...]}}} or {"x": [...], "y": [...]}')


def render_figure(figure: Figure) -> str:
    """Draw a report Figure by kind. Its ``data``:

    - bar: ``{"labels": [...], "values": [...], "reference": number?, "reference_label": str?}``
    - line / scatter: ``{"series": {name: {"x": [...], "y": [...]}}}`` or one unnamed ``{"x": [...], "y": [...]}``
    - timeline: ``{"items": [{label, start, end, offset, size}, ...], "peak": bytes?}``

    Axes whose label names bytes or a size (see ``is_bytes_column``) are shown in KiB/MiB.
    """
    data = figure.data
    if figure.kind == "bar":
        if "labels" not in data or "values" not in data:
            raise InputError(f"bar figure {figure.title!r} needs 'labels' and 'values'",
                             hint='give data as {"labels": [...], "values": [...]}')
        return bar_chart(data["labels"], data["values"], title=figure.title, x_label=figure.x_label,
                         reference=data.get("reference"), reference_label=str(data.get("reference_label", "")),
                         bytes_unit=is_bytes_column(figure.x_label))
    if figure.kind in ("line", "scatter"):
        draw = scatter_chart if figure.kind == "scatter" else line_chart
        return draw(_series_of(figure), title=figure.title, x_label=figure.x_label, y_label=figure.y_label,
                    x_bytes=is_bytes_column(figure.x_label), y_bytes=is_bytes_column(figure.y_label))
    if figure.kind == "timeline":
        if "items" not in data:
            raise InputError(f"timeline figure {figure.title!r} needs 'items'",
                             hint='give data as {"items": [{"label", "start", "end", "offset", "size"}, ...]}')
        return timeline_chart(data["items"], title=figure.title, peak=data.get("peak"),
                              x_label=figure.x_label or "step", y_label=figure.y_label or "offset")
    raise InputError(f"figure {figure.title!r} has unknown kind {figure.kind!r}",
                     hint="use 'bar', 'line', 'scatter' or 'timeline'")
