"""The analyze verb: which nodes each target takes, and why not; safe substitutions with --fix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from npukit.errors import InputError
from npukit.report.finish import CommandResult, finish, report_path_for
from npukit.verbs.common import check_output


def analyze(
    model: str | Path,
    *,
    targets: Sequence[str],
    input_shape: str | Sequence[int] | None = None,
    fix: bool = False,
    output: str | Path | None = None,
    report_path: str | Path | None = None,
    html: bool = False,
) -> CommandResult:
    """Per node and per target: supported or not and why, the partition, CPU<->NPU transitions, delegated MACs;
    with ``fix`` the safe substitutions are applied (verified numerically) and written to ``output``.

    ``input_shape`` (``InputSpec`` forms): an unnamed shape is the first input's (the targets' fix_input_shape);
    shapes by input name are fixed into the model before it is analyzed."""
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.targets.api import analyze_model

    if output is not None:
        output = check_output(output, source=model)
    elif fix:
        raise InputError("--fix writes the fixed model, so it needs -o OUTPUT.onnx", hint="add -o fixed.onnx")
    spec = InputSpec.parse(input_shape)
    source = load_with_inputs(model, spec) if spec is not None and spec.first is None else model
    analyses, report = analyze_model(source, list(targets), input_shape=spec.first if spec else None, fix=fix,
                                     output=output)
    if spec is not None:
        report.config["input_shape"] = spec.as_dict()
    json_path = Path(report_path) if report_path else (report_path_for(output) if output else None)
    return finish(report, None, html=html, json_path=json_path, result=analyses, source=model)
