"""The end of every verb: the report written (JSON beside the artifact, HTML on request), library messages and
input-shape notes added, and the verb's result handed back as a ``CommandResult``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from npukit.report.core import Report


@dataclasses.dataclass
class CommandResult:
    """What a verb produced: its report, the artifact and report files it wrote, and its main result object."""

    report: Report
    artifact: Path | None = None
    report_path: Path | None = None
    html_path: Path | None = None
    result: Any = None


def report_path_for(artifact: str | Path, suffix: str = ".report.json") -> Path:
    artifact = Path(artifact)
    stem = artifact.name[: -len(artifact.suffix)] if artifact.suffix else artifact.name
    return artifact.with_name(stem + suffix)


def study_path_for(artifact: str | Path) -> Path:
    """Where optimize keeps its study for ``artifact``, named as its report is (``report_json_for``): a search for
    ``m.tflite`` resumed the study of one for ``m.onnx`` in the same ``m.optimize.db``."""
    return _beside(artifact, ".optimize.db")


def report_json_for(artifact: str | Path) -> Path:
    """Where an artifact's report goes: ``model.report.json`` beside ``model.onnx``; a phone runtime's artifact
    keeps its suffix (``model.pte.report.json``), so that it does not replace the report of the ONNX model of the
    same name (``npukit export -o m.onnx`` then ``npukit compile -o m.tflite``)."""
    return _beside(artifact, ".report.json")


def _beside(artifact: str | Path, suffix: str) -> Path:
    """``suffix`` in place of an ONNX model's own, after a phone runtime's artifact's (its name kept whole)."""
    artifact = Path(artifact)
    if artifact.suffix.lower() in ("", ".onnx"):
        return report_path_for(artifact, suffix)
    return artifact.with_name(artifact.name + suffix)


def html_path_for(json_path: Path) -> Path:
    """The HTML report beside the JSON one: ``m.report.json`` -> ``m.report.html``."""
    json_path = Path(json_path)
    return json_path.with_name(json_path.name.replace(".json", "") + ".html") \
        if json_path.name.endswith(".json") else json_path.with_suffix(".html")


# npukit's own notes, raised as warnings of these classes where they arise: class name -> (report key, table title)
NOTES = {"InputShapeOverride": ("input_shape_override",
                                "Input shape: the model's static sizes overridden by --input-shape"),
         "InputShapeFromData": ("input_shape_from_data", "Input shape: taken from the data (no --input-shape)"),
         "UntrainedWeights": ("untrained_weights", "Weights: the model read is an untrained architecture"),
         "ImagePreprocessing": ("image_preprocessing",
                                "Images: how they were turned into the model's input (--size, --resize, --mean, "
                                "--std change it)"),
         "DataMapping": ("data_mapping", "Data: arrays fed to inputs of another name"),
         "DataCast": ("data_cast", "Data: integer arrays fed to float inputs (unscaled)")}


def finish(report: Report, artifact: Path | None, *, html: bool, json_path: Path | None = None,
            result: Any = None, source: str | Path | None = None) -> CommandResult:
    """Write the report: beside ``artifact`` (or at ``json_path``); a verb without an artifact that was asked for
    HTML writes both beside its input ``source`` (``<stem>.<verb>.report.json`` / ``.html``)."""
    from npukit.report.capture import drain
    from npukit.report.html import write_html

    json_path = json_path or (report_json_for(artifact) if artifact else None)
    if json_path is None and html and source is not None and Path(str(source)).is_file():
        json_path = report_path_for(_report_home(Path(str(source))), f".{report.command}.report.json")

    if json_path is not None and source is not None:
        from npukit._atomic import check_writes

        check_writes([json_path] + ([html_path_for(json_path)] if html else []), [source])
    messages = drain()
    for kind, (key, title) in NOTES.items():  # npukit's own notes, warned where they arise, not a library's
        notes = [m.split(": ", 1)[1] for m in messages if m.startswith(f"{kind}: ")]
        if notes:
            messages = {m: n for m, n in messages.items() if not m.startswith(f"{kind}: ")}
            report.add(key, notes[0])
            report.add_table(title, ["note"], [[m] for m in notes])
    if messages:
        report.add("library_messages", messages)
        report.add_table("Library messages while this ran (counted, not printed)", ["message", "times"],
                         [[m, n] for m, n in list(messages.items())[:20]])
    untrained = report.sections.get("untrained_weights")
    if untrained and report.verdict and "random weights" not in report.verdict:
        report.set_verdict(f"{report.verdict}; note: {untrained}", passed=report.passed)
    if report.verdict is None:  # a verb that checks nothing (inspect, analyze, plan-memory, devices) says so
        what = "this machine" if report.command == "devices" else "the model"
        report.set_verdict(f"INFO {report.command}: a description of {what}; nothing was checked", passed=True)
    drift = report.sections.get("export_drift")  # verbs.common.note_export_drift
    if drift and drift not in report.verdict:
        report.set_verdict(f"{report.verdict}; note: {drift}", passed=report.passed)
    html_path = None
    if artifact is not None:
        report.add_artifact("model", artifact)
    if json_path is not None:
        report.add_artifact("report", json_path)
        if html:
            html_path = html_path_for(json_path)
            report.add_artifact("html", html_path)
        report.write_json(json_path)
        if html_path is not None:
            write_html(report, html_path)
        else:
            _remove_earlier_html(html_path_for(json_path))
    return CommandResult(report=report, artifact=artifact, report_path=json_path, html_path=html_path,
                         result=result)


def _report_home(source: Path) -> Path:
    """Where a verb without an artifact writes the reports --html asked for: beside its input, or in the current
    folder (same name) where the input lies inside a Python installation (a model shipped in a package's
    site-packages folder) or in a folder this user cannot write."""
    import os
    import sys
    import sysconfig

    resolved = source.resolve()
    installs = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sysconfig.get_paths()["purelib"],
                                            sysconfig.get_paths()["platlib"])} - {Path("/")}
    inside = any(resolved.is_relative_to(root) for root in installs) or "site-packages" in resolved.parts
    if inside or not os.access(resolved.parent, os.W_OK):
        return Path.cwd() / source.name
    return source


def remove_earlier_artifact(artifact: Path) -> bool:
    """An earlier run's artifact at ``artifact`` removed, for a run that writes none there (it failed) and whose
    report replaces the earlier one beside it: left, it would stand beside a report that FAILs and describes another
    run. Only a file the earlier npukit report at ``report_json_for(artifact)`` names as its model is removed, never
    another file of that name. True where one was removed."""
    import json

    try:
        with open(report_json_for(artifact), encoding="utf-8") as stream:
            earlier = json.load(stream)
    except (OSError, ValueError):
        return False
    named = earlier.get("artifacts", {}).get("model") if isinstance(earlier, dict) else None
    if "npukit_report" not in earlier or not isinstance(named, str) or Path(named).name != artifact.name \
            or not artifact.is_file():
        return False
    artifact.unlink()
    return True


def _remove_earlier_html(path: Path) -> None:
    """An earlier run's HTML report at ``path`` (beside the JSON this run wrote without HTML) is removed: it described
    what this run replaced. Only a report npukit wrote (its head's generator, or the header of reports made before
    the generator was written) is removed, never another file of that name."""
    from npukit.report.html import GENERATOR

    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            head = stream.read(4096)
    except OSError:
        return
    ours = f'<meta name="generator" content="{GENERATOR}">' in head or (
        head.startswith("<!DOCTYPE html>") and "\n<title>npukit " in head)
    if ours:
        path.unlink(missing_ok=True)
