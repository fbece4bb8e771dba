"""SVG charts: valid XML for every kind and edge case, escaping, determinism, and input checks."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from npukit.errors import InputError
from npukit.report.core import Figure
from npukit.report.svg import bar_chart, line_chart, render_figure, scatter_chart, timeline_chart


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == "svg"
    assert "viewBox" in root.attrib
    return root


def _texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter("text")]


def _bars(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter("rect") if r.find("title") is not None]


def test_bar_chart_values_reference_and_negatives():
    root = _parse(bar_chart(["conv", "relu", "add"], [3.0, -1.5, 0.25], title="Ops", x_label="ms",
                            reference=2.0, reference_label="budget"))
    texts = _texts(root)
    assert {"Ops", "conv", "relu", "add", "3", "-1.5", "0.25", "budget 2", "ms"} <= set(texts)
    bars = _bars(root)
    assert len(bars) == 3
    # the negative bar ends where the positive bars start (at zero) and is drawn in another color
    conv, relu = bars[0], bars[1]
    assert float(relu.get("x")) + float(relu.get("width")) == pytest.approx(float(conv.get("x")), abs=0.01)
    assert relu.get("fill") != conv.get("fill")
    assert any(line.get("stroke-dasharray") for line in root.iter("line"))


def test_bar_chart_skips_non_finite_and_says_so():
    root = _parse(bar_chart(["a", "b", "c", "d"], [1.0, math.nan, math.inf, 2.0]))
    assert len(_bars(root)) == 2
    assert "2 values not shown (infinite or undefined)" in _texts(root)
    assert "b" not in _texts(root)


def test_bar_chart_bytes_unit_and_single_value():
    root = _parse(bar_chart(["weights"], [3 * 1024 * 1024], bytes_unit=True))
    assert "3 MiB" in _texts(root)
    assert len(_bars(root)) == 1


@pytest.mark.parametrize("draw", [
    lambda: bar_chart([], [], title="Empty"),
    lambda: bar_chart(["a"], [math.nan], title="Empty"),
    lambda: line_chart({}, title="Empty"),
    lambda: scatter_chart({"s": ([math.nan], [1.0])}, title="Empty"),
    lambda: timeline_chart([], title="Empty"),
])
def test_empty_charts_say_no_data(draw):
    texts = _texts(_parse(draw()))
    assert "no data" in texts and "Empty" in texts


def test_line_chart_series_legend_and_breaks():
    series = {"fp32": ([0, 1, 2, 3], [1.0, 2.0, math.nan, 4.0]), "int8": ([0, 1, 2, 3], [-1.0, 0.5, 0.7, -2.0])}
    root = _parse(line_chart(series, title="SQNR", x_label="step", y_label="dB"))
    texts = _texts(root)
    assert {"fp32", "int8", "step", "dB", "1 value not shown (infinite or undefined)"} <= set(texts)
    paths = [p.get("d") for p in root.iter("path")]
    assert len(paths) == 2  # fp32's run after the NaN is a single point: a marker, no path
    assert paths[0].count("M") == 1 and paths[1].count("L") == 3
    circles = list(root.iter("circle"))
    assert len(circles) == 7
    # negative y values: int8's lowest value (-2, its last point) is drawn lowest on the canvas
    int8 = [float(c.get("cy")) for c in root.findall("g")[1].iter("circle")]
    assert max(int8) == int8[-1] and min(int8) == int8[2]


def test_single_point_scatter_is_inside_the_plot():
    root = _parse(scatter_chart({"": ([5.0], [5.0])}))
    (circle,) = root.findall(".//circle")
    frame = [r for r in root.iter("rect") if r.get("fill") == "none"][0]
    x0, y0 = float(frame.get("x")), float(frame.get("y"))
    x1, y1 = x0 + float(frame.get("width")), y0 + float(frame.get("height"))
    assert x0 < float(circle.get("cx")) < x1 and y0 < float(circle.get("cy")) < y1


def test_text_is_escaped_and_output_deterministic():
    evil = '<script>alert("x")</script> & \x00'
    svg = bar_chart([evil], [1.0], title=evil)
    assert "<script>" not in svg
    root = _parse(svg)
    assert any("<script>" in t for t in _texts(root))
    assert svg == bar_chart([evil], [1.0], title=evil)


def test_timeline_chart_rectangles_and_peak():
    items = [
        {"label": "a", "start": 0, "end": 1, "offset": 0, "size": 1024},
        {"label": "b", "start": 1, "end": 3, "offset": 1024, "size": 2048},
        {"label": "c", "start": 2, "end": 2, "offset": 0, "size": 1024},
        {"label": "bad", "start": 0, "end": math.inf, "offset": 0, "size": 1},
    ]
    root = _parse(timeline_chart(items, title="Plan"))
    boxes = _bars(root)
    assert len(boxes) == 3
    a, b, c = (float(r.get("width")) for r in boxes)
    assert a == pytest.approx(2 * c) and b == pytest.approx(3 * c)  # inclusive end: steps 0-1, 1-3, 2-2
    assert "peak 3 KiB" in _texts(root)
    assert [ln for ln in root.iter("line") if ln.get("stroke-dasharray")]
    assert "1 value not shown (infinite or undefined)" in _texts(root)


@pytest.mark.parametrize("item", [
    {"label": "x", "start": 0, "end": 1, "offset": 0},
    {"label": "x", "start": 3, "end": 1, "offset": 0, "size": 4},
    {"label": "x", "start": 0, "end": 1, "offset": 0, "size": -4},
])
def test_timeline_rejects_bad_items(item):
    with pytest.raises(InputError):
        timeline_chart([item])


def test_render_figure_dispatches_on_kind():
    figures = [
        Figure("bars", "bar", {"labels": ["a"], "values": [1]}, x_label="size (bytes)"),
        Figure("lines", "line", {"series": {"s": {"x": [0, 1], "y": [0, 1]}}}),
        Figure("dots", "scatter", {"x": [0, 1], "y": [1, 0]}),
        Figure("plan", "timeline", {"items": [{"label": "t", "start": 0, "end": 0, "offset": 0, "size": 8}]}),
    ]
    for figure in figures:
        assert figure.title in _texts(_parse(render_figure(figure)))
    assert "1 B" in _texts(_parse(render_figure(figures[0])))
    with pytest.raises(InputError, match="unknown kind"):
        render_figure(Figure("pie", "pie", {}))
    with pytest.raises(InputError, match="series"):
        render_figure(Figure("lines", "line", {"series": {"s": [1, 2]}}))
    with pytest.raises(InputError, match="labels"):
        bar_chart(["a", "b"], [1.0])
