"""The analyze verb: which nodes each target takes, and why not; safe substitutions with --fix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from npukit.errors import InputError
from npukit.report.finish import CommandResult, finish, report_path_for
from npukit.verbs.common import (check_output, check_report_path, is_qdq, keeps_module_modes, note_export_drift,
                                 scratch_export, torch_source)


@keeps_module_modes
def analyze(
    model: str | Path,
    *,
    targets: str | Sequence[str],
    input_shape: str | Sequence[int] | None = None,
    weights: str | Path | None = None,
    fix: bool = False,
    output: str | Path | None = None,
    report_path: str | Path | None = None,
    html: bool = False,
) -> CommandResult:
    """Per node and per target: supported or not and why, the partition, delegate<->fallback transitions, delegated
    MACs; with ``fix`` the safe substitutions are applied (verified numerically) and written to ``output``.

    ``input_shape`` (``InputSpec`` forms): an unnamed shape is the first input's (the targets' fix_input_shape);
    shapes by input name are fixed into the model before it is analyzed.

    ``model`` may also be a PyTorch model (torchvision:NAME, module:factory, .pt2, TorchScript; ``weights``: its
    state dict): what is analyzed is its ONNX export as ``npukit export`` writes it (torch.export, the dynamo
    exporter, opset 18), at ``input_shape`` (or the model's default shape), the export recorded in the report. The
    mobile profiles (executorch-xnnpack, litert, litert-xnnpack) were checked against the real partitioners on such
    exports."""
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.report.analyze import analyze_report
    from npukit.targets.api import analyze_model

    report_path = check_report_path(report_path)
    targets = [targets] if isinstance(targets, str) else list(targets)  # one target named alone, not its letters
    if output is not None and not fix:
        raise InputError("-o names the fixed model --fix writes; without --fix analyze writes no model",
                         hint="add --fix to write the fixed model there, or --report PATH.json for the report alone")
    if output is not None:
        output = check_output(output, source=model)
    elif fix:
        raise InputError("--fix writes the fixed model, so it needs -o OUTPUT.onnx", hint="add -o fixed.onnx")
    exported: dict[str, Any] | None = None
    export: Any = None  # the scratch export's ExportResult (a PyTorch model)
    if _is_onnx(model):
        if weights is not None:
            raise InputError("--weights is for a PyTorch model; an ONNX model carries its own",
                             hint="drop --weights, or pass the PyTorch model it belongs to")
        spec = InputSpec.parse(input_shape)
        source: onnx.ModelProto = load_with_inputs(model, spec if spec is not None and spec.first is None else None)
        first = spec.first if spec else None
    else:
        spec = None
        source, exported, export = _exported(model, weights, input_shape)
        first = None  # exported at that shape
    outcome = analyze_model(source, list(targets), input_shape=first, fix=fix)
    if exported is None and not fix:
        outcome = _mobile_on_program_graph(outcome, source, first)
    report = analyze_report(outcome, _write_fixed(outcome, output) if fix and output is not None else {})
    if spec is not None:
        report.config["input_shape"] = spec.as_dict()
    if exported is not None:
        report.config["input_shape"] = exported["input_shape"]
        report.add("export", exported)
        note_export_drift(report, export, consequence="the profiles read its graph (which operators, in which "
                          "forms), not its numbers")
    _describe(report, outcome, onnx_given=exported is None, float_model=not is_qdq(source))
    json_path = Path(report_path) if report_path else (report_path_for(output) if output else None)
    return finish(report, None, html=html, json_path=json_path, result=list(outcome.analyses), source=model)


def _describe(report: Any, outcome: Any, *, onnx_given: bool, float_model: bool) -> None:
    """The verdict of an analysis that checked nothing (what --fix checked stays first): symbolic input sizes said
    (the headline is then of a graph no NPU runs as is: YOLOv8n with symbolic sizes read 27/316 delegated, at
    1,3,320,320 233/233), and where to read what npukit compile builds for the targets."""
    if report.verdict is None and any(a.symbolic_inputs for a in outcome.analyses):
        named = sorted({name for a in outcome.analyses for name in a.symbolic_inputs})
        report.set_verdict(f"INFO analyze: a description of the model, whose input(s) {', '.join(named)} have "
                           "symbolic sizes: NPUs take static shapes, so pass --input-shape for what it would run; "
                           "nothing was checked", passed=True)
    notes = _compile_notes(outcome.profiles, onnx_given=onnx_given, float_model=float_model)
    if notes:
        report.add("compile_notes", notes)
        report.add_table("What npukit compile builds for these targets", ["target", "note"], list(notes.items()))
        see = f"see what npukit compile builds for {', '.join(notes)} (its table)"
        if report.verdict is None:  # nothing checked: the INFO line finish would write, with the pointer
            report.set_verdict(f"INFO analyze: a description of the model; nothing was checked; {see}", passed=True)
        else:  # --fix's verdict (its check) stays first
            report.set_verdict(f"{report.verdict}; {see}", passed=report.passed)


def _mobile_on_program_graph(outcome: Any, proto: onnx.ModelProto, shape: Sequence[int] | None) -> Any:
    """``outcome`` with the ExecuTorch and LiteRT analyses of an ONNX model redone on the graph compile turns into
    their torch program (``onnx_torch.program_graph``: at the input shape, constants folded): the graph as given
    kept shape arithmetic (YOLOv8n's Range and ConstantOfShape) that the program never runs, counted as fallbacks.
    A model compile would refuse (several inputs, a symbolic size) keeps the analysis of the graph as given."""
    import dataclasses

    from npukit.frontend.onnx_torch import program_graph, require_one_float_input
    from npukit.frontend.shapes import runtime_inputs
    from npukit.targets.api import analyze_model
    from npukit.verbs.compile_mobile import built_by

    which = [i for i, p in enumerate(outcome.profiles) if built_by(p.name) in ("executorch-xnnpack", "litert")]
    if not which:
        return outcome
    try:
        require_one_float_input(proto, "the model")
    except InputError:
        return outcome
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in runtime_inputs(proto)[0].type.tensor_type.shape.dim]
    shape = tuple(shape) if shape is not None else tuple(dims)
    if not shape or min(shape) <= 0:
        return outcome
    graph = program_graph(proto, shape)
    redone = analyze_model(graph, [outcome.profiles[i].name for i in which]).analyses
    analyses = list(outcome.analyses)
    note = (f"analyzed on the graph compile runs as a torch program: at input shape {list(shape)}, constants folded "
            f"({len(proto.graph.node)} -> {len(graph.graph.node)} nodes)")
    for i, analysis in zip(which, redone):
        analyses[i] = dataclasses.replace(analysis, notes=(*analysis.notes, note))
    return dataclasses.replace(outcome, analyses=tuple(analyses))


def _compile_notes(profiles: Any, *, onnx_given: bool, float_model: bool) -> dict[str, str]:
    """Per target analyzed, what a user reading its prediction should know of ``npukit compile`` for it: the
    mobile targets build from a torch program (a one-input ONNX model runs as one), coreml's profile is ONNX
    Runtime's CoreML EP while compile converts with coremltools, and the HTP's prediction for a float model counts
    the fp16 path where compile quantizes (it needs --calib)."""
    from npukit.verbs.compile_mobile import built_by

    notes: dict[str, str] = {}
    for profile in profiles:
        name = profile.name
        if name.startswith("qnn-htp") and float_model and profile.quantization.accepts_float:
            notes[name] = ("this predicts the float model on the HTP's fp16 path; `npukit compile --target qnn-htp` "
                           "quantizes it for the HTP's integer path (pass --calib), or takes a QDQ model from "
                           "`npukit quantize`")
            continue
        built = built_by(name)
        if built is None:
            continue
        parts = []
        if onnx_given:
            parts.append(f"`npukit compile --target {built}` runs this one-input ONNX file as a torch program (or "
                         "takes the PyTorch model it came from) and lowers that; this predicts what the runtime takes "
                         "of the same graph")
        if name == "coreml":
            parts.append("this profile is ONNX Runtime's CoreML EP; `npukit compile --target coreml` converts with "
                         "coremltools, whose op support differs (PReLU slopes, for one)")
        if parts:
            notes[name] = "; ".join(parts)
    return notes


def _write_fixed(outcome: Any, output: str | Path) -> dict[str, Path]:
    """Each target's fixed model, target -> where it went: ``output`` for one target; with several, those a fix
    changed, at ``<stem>.<target><suffix>`` beside it."""
    from npukit.frontend.onnx_io import save_onnx

    several = len(outcome.profiles) > 1
    written: dict[str, Path] = {}
    for name, result in outcome.fixes.items():
        if several and not result.changed:
            continue
        path = Path(output)
        if several:
            path = path.with_name(f"{path.stem}.{name.replace('@', '_')}{path.suffix or '.onnx'}")
        written[name] = save_onnx(result.model, path)
    return written


def _is_onnx(model: str | Path) -> bool:
    """An ONNX model by name (an .onnx path, existing or not: load_onnx says what is wrong with it)."""
    return str(model).strip().lower().endswith(".onnx")


def _exported(model: str | Path, weights: str | Path | None, input_shape: Any
              ) -> tuple[onnx.ModelProto, dict[str, Any], Any]:
    """The ONNX export of a PyTorch ``model`` (checked against torch by the exporter's check: a drift is noted, see
    ``scratch_export``), its record and its ``ExportResult``."""
    source, shape = torch_source(model, weights, input_shape, needs="analyze reads ONNX",
                                 otherwise="analyze the ONNX file directly")
    proto, result = scratch_export(source, shape, what="what the targets' profiles read")
    record = {k: v for k, v in result.as_dict().items() if k != "path"}  # a temporary file, gone
    return proto, {**record, "input_shape": list(shape), "from": str(model)}, result
