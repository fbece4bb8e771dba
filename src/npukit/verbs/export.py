"""The export verb: a PyTorch or ONNX model to a verified ONNX model."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from npukit.config import ExportConfig, to_dict
from npukit.errors import InputError
from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish
from npukit.report.graph import add_export, add_opset_upgrade
from npukit.report.progress import step
from npukit.verbs.common import check_output, keeps_module_modes, note_untrained, short_number


@keeps_module_modes
def export(
    model: str | Any,
    output: str | Path,
    *,
    weights: str | Path | None = None,
    input_shape: str | Sequence[int] | None = None,
    dynamic_batch: bool = False,
    opset: int | None = None,
    exporter: str = "auto",
    rtol: float = 1e-4,
    html: bool = False,
) -> CommandResult:
    """Export MODEL (a spec string or a torch.nn.Module) to a verified single-file ONNX model at ``output``.

    ``input_shape`` takes the ``InputSpec`` forms; a torch model has one input (``input``), an .onnx file passed
    through gets the shape of one of its inputs fixed (its first, or the one named)."""
    from npukit.frontend.export import export_model
    from npukit.frontend.shapes import InputSpec
    from npukit.frontend.spec import source_of
    from npukit.measure.summary import summarize

    spec = InputSpec.parse(input_shape)
    config = ExportConfig(input_shape=spec.first if spec else None, dynamic_batch=dynamic_batch,
                          opset=opset, exporter=exporter, rtol=rtol)
    output = check_output(output, source=model if isinstance(model, (str, Path)) else None)
    if not isinstance(model, (str, Path)) and config.input_shape is None:
        raise InputError("exporting a torch module needs an input shape", hint="pass input_shape=(1, 3, 224, 224)")
    source = source_of(model, weights=str(weights) if weights else None)
    if source.kind == "onnx" and exporter != "auto":  # an ONNX model, told by its content as the spec is
        raise InputError(f"--exporter {exporter} chooses how a PyTorch model is exported; an .onnx file is passed "
                         "through as it is", hint="drop --exporter (--opset converts the file, verified)")
    if spec is not None and spec.first is None:
        name, shape = _export_input_shape(spec, source)
        config = dataclasses.replace(config, input_shape=shape, **({"input_name": name} if name else {}))
    report = Report("export", config={"export": to_dict(config), "model": str(source.spec),
                                      "weights": str(weights) if weights else None})
    report.add("model", {"description": source.description, "notes": list(source.notes)})
    with step(f"exporting {source.description}", timings=report.timings, key="export"):
        result = export_model(source, output, config=config)
    add_export(report, source, result, summarize(onnx.load(str(output)), input_shape=result.input_shape))
    if result.opset_upgrade is not None:
        add_opset_upgrade(report, result.opset_upgrade)
    if source.kind == "onnx":  # no torch model: the file as reshaped against the file as given, where it was
        converted = f"converted to opset {result.opset} (verified), " if config.opset is not None else ""
        checked = converted + (
            "outputs not compared (the file as given, the ONNX checker passed)" if result.max_abs_error is None
            else "outputs against the file as given on seeded inputs (ONNX Runtime): max abs error "
                 f"{short_number(result.max_abs_error)}, rel {short_number(result.max_rel_error)}")
    else:
        checked = (f"outputs against torch's on seeded inputs: max abs error {short_number(result.max_abs_error)}, "
                   f"rel {short_number(result.max_rel_error)}")
    if config.dynamic_batch:
        checked += "; batch dynamic: two samples at once give what each gives alone"
    report.set_verdict(f"{'PASS' if result.passed else 'FAIL'} export: {source.description} with the "
                       f"{result.exporter} exporter, {checked} (rtol {config.rtol:g})", passed=result.passed)
    note_untrained(report, source)
    return finish(report, output, html=html, result=result)


def _export_input_shape(spec, source) -> tuple[str | None, tuple[int, ...]]:
    """(the ONNX input's name, its shape) that ``export`` fixes, from a spec that names its input: an .onnx file's
    first input keeps its name (None); a torch model's one input takes the name given."""
    (name, shape), *more = spec.shapes
    if source.kind == "onnx":
        from npukit.frontend.onnx_io import load_onnx
        from npukit.frontend.shapes import runtime_inputs

        proto = load_onnx(source.onnx_path)
        resolved = spec.resolve(proto, override_static=True)
        if list(resolved) == [runtime_inputs(proto)[0].name]:
            return None, resolved[runtime_inputs(proto)[0].name]
        raise InputError(f"export fixes the shape of an .onnx file's first input only, not of {spec.describe()}",
                         hint="fix several or other inputs with `npukit optimize-graph MODEL.onnx -o OUT.onnx "
                              "--input-shape NAME=... --input-shape NAME=...`")
    if more:
        raise InputError(f"npukit exports a torch model with one tensor input, not {spec.describe()}",
                         hint=f"pass the one input's shape, e.g. --input-shape {name}="
                              + ",".join(map(str, shape)))
    return name, shape
