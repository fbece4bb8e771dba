"""The HTML report: self-contained, complete, escaped and well-formed."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np

from npukit.report.core import Report
from npukit.report.html import render_html, write_html

_VOID = {"meta", "br", "hr", "img", "input", "link"}


class _TagBalance(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.svgs = 0

    def handle_starttag(self, tag, attrs):
        self.svgs += tag == "svg"
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def _report() -> Report:
    report = Report("quantize", config={"quant": {"scheme": "per-channel", "calibration": 42}})
    report.add_artifact("model", "/tmp/out/model_int8.onnx")
    report.add_table("Accuracy", ["model", "top-1 agreement", "size"], [["int8", 0.71, 3_600_000]])
    report.add_table("Nodes <b>", ["name", "value"], [["<script>alert(1)</script>", None]])
    report.add_table("Empty", ["a"], [])
    report.add_figure("Latency", "bar", {"labels": ["fp32", "int8"], "values": [4.1, 2.0]}, x_label="ms")
    report.add_figure("SQNR", "line", {"series": {"int8": {"x": [1, 2, 3], "y": [8.0, 10.0, 11.5]}}})
    report.add_figure("Plan", "timeline", {"items": [{"label": "t0", "start": 0, "end": 2, "offset": 0, "size": 64}]})
    report.add_figure("Broken", "pie", {})
    report.add("metrics", {"sqnr_db": np.float32(11.5), "nan": float("nan")})
    report.timings["quantize"] = 12.5
    return report


def test_html_is_self_contained_and_complete():
    report = _report()
    text = render_html(report)
    for forbidden in ("http://", "https://", "<script src", "<link", "<script", "@import", "url("):
        assert forbidden not in text, forbidden
    for title in ("Accuracy", "Nodes &lt;b&gt;", "Empty", "Latency", "SQNR", "Plan"):
        assert title in text
    parser = _TagBalance()
    parser.feed(text)
    parser.close()
    assert parser.errors == [] and parser.stack == []
    assert parser.svgs == 3  # one per drawable figure; the broken one says why instead
    assert "figure Broken could not be drawn" in text
    assert text.count("<details>") == 3
    for content in ("/tmp/out/model_int8.onnx", "3.433 MiB", "0.71", "no rows", "per-channel", "onnxruntime",
                    "12.50 s", "&quot;sqnr_db&quot;: 11.5"):
        assert content in text, content


def test_table_cells_are_escaped():
    text = render_html(_report())
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_write_html_is_atomic_and_matches_render(tmp_path):
    report = _report()
    path = write_html(report, tmp_path / "sub" / "report.html")
    assert path.read_text(encoding="utf-8") == render_html(report)
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]
    assert json.loads(report.to_json())["results"]["metrics"]["nan"] == "nan"


def test_a_run_without_html_removes_the_html_report_an_earlier_run_left_beside_its_json(tmp_path) -> None:
    """m.report.html from an earlier --html run described the artifact this run replaced: removed when this run
    writes no HTML; a file of that name npukit did not write is kept."""
    from npukit.report.finish import finish

    artifact = tmp_path / "m.onnx"
    artifact.write_bytes(b"model")
    first = Report("quantize")
    first.set_verdict("PASS quantize: the first run", passed=True)
    assert finish(first, artifact, html=True).html_path == tmp_path / "m.report.html"
    assert "the first run" in (tmp_path / "m.report.html").read_text()
    second = Report("quantize")
    second.set_verdict("PASS quantize: the second run", passed=True)
    finish(second, artifact, html=False)
    assert not (tmp_path / "m.report.html").exists()
    assert "the second run" in (tmp_path / "m.report.json").read_text()
    (tmp_path / "m.report.html").write_text("<!DOCTYPE html>\n<html><title>my notes</title></html>")
    finish(second, artifact, html=False)
    assert (tmp_path / "m.report.html").read_text().endswith("my notes</title></html>")
