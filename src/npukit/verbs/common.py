"""What several verbs share: output checks, the PyTorch model a verb converts, the refusal of quantized inputs, opset
upgrades for Q/DQ, the task check, data opening."""

from __future__ import annotations

import dataclasses
import functools
import sys
import zipfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from npukit._atomic import path_exists
from npukit.config import BenchConfig, PreprocessConfig
from npukit.data.subsets import Subset, every, spread
from npukit.errors import InputError
from npukit.report.core import Report
from npukit.report.graph import add_opset_upgrade
from npukit.report.progress import progress, step
from npukit.tasks import QualityGate


def check_output(output: str | Path, *, source: str | Path | None = None, suffix: str = ".onnx") -> Path:
    if str(output).endswith(("/", "\\")):  # Path() drops the slash: out/m.onnx/ would be written as a file
        raise InputError(f"output {output} ends in a slash, as a folder would",
                         hint=f"give a file name ending in {suffix}, without the slash")
    output = Path(output)
    if output.suffix.lower() != suffix:
        raise InputError(f"output {output} must end in {suffix}", hint=f"name the output like model{suffix}")
    if output.is_dir():
        raise InputError(f"output {output} is a directory", hint=f"give a file name ending in {suffix}")
    if isinstance(source, (str, Path)) and path_exists(source) and output.exists() \
            and output.resolve() == Path(source).resolve():
        raise InputError(f"output {output} is the input file", hint="write the result to a new file")
    return output


def check_report_path(report_path: str | Path | None) -> Path | None:
    """``report_path`` (a verb's JSON report, the CLI's --report / --json) as a Path, refused unless it ends in
    .json (the CLI refused x.txt; ``npukit.inspect(..., report_path="x.txt")`` wrote it, and plan_memory wrote JSON
    into pm.html); None stays None."""
    if report_path is None:
        return None
    path = Path(report_path)
    if path.suffix.lower() != ".json":
        raise InputError(f"report_path {report_path} must end in .json", hint=f"name it like {path.stem}.json")
    return path


def keeps_module_modes(verb: Callable[..., Any]) -> Callable[..., Any]:
    """``verb`` (whose first argument is the model) leaving a torch.nn.Module given in Python in the modes it came
    in: the verb evaluates it (``.eval()``, dropout and BatchNorm statistics off), and a caller exporting or
    compiling in the middle of training found its model, and every submodule, in eval mode afterwards."""

    @functools.wraps(verb)
    def run(model: Any, *args: Any, **kwargs: Any) -> Any:
        torch = sys.modules.get("torch")  # not imported: the model cannot be a module
        modes = ([(m, m.training) for m in model.modules()]
                 if torch is not None and isinstance(model, torch.nn.Module) else [])
        try:
            return verb(model, *args, **kwargs)
        finally:
            for module, training in modes:
                module.training = training

    return run


def torch_source(model: Any, weights: str | Path | None, input_shape: Any, *, needs: str,
                 otherwise: str, data: str | Path | None = None, from_onnx: bool = False
                 ) -> tuple[Any, tuple[int, ...]]:
    """(the resolved PyTorch model, its input shape) for a verb that ``needs`` a torch program (``model``: a spec, a
    file or a torch.nn.Module); an unknown shape is an InputError saying what to give (``data``: the verb's samples:
    without ``input_shape`` or a shape the model knows, one sample of a .npy gives it). An ONNX model is one too
    (``otherwise``: what to do with it), unless ``from_onnx``: then its graph, at that shape, becomes the torch
    program (``npukit.frontend.onnx_torch``, checked against ONNX Runtime; its note among the source's notes)."""
    from npukit.frontend.shapes import InputSpec
    from npukit.frontend.spec import model_label, source_of

    source = source_of(model, weights=str(weights) if weights else None)
    model = model_label(model)
    if (source.kind == "onnx" or source.module is None) and not (from_onnx and source.onnx_path is not None):
        raise InputError(f"{model} is an ONNX model; {needs}",
                         hint="give the PyTorch model (torchvision:NAME, module:factory, .pt2, TorchScript or a "
                              f"pickled module), or {otherwise}")
    graph = None
    if source.module is None:  # an ONNX model with more than one input is refused for that, not for its shapes
        from npukit.frontend.onnx_io import load_onnx
        from npukit.frontend.onnx_torch import require_one_float_input

        graph = load_onnx(source.onnx_path)
        require_one_float_input(graph, source.onnx_path.name)
    spec = InputSpec.parse(input_shape)
    shape = source.default_input_shape
    if spec is not None:  # one shape, named or not (the export names the inputs; a torch program takes them in order)
        if len(spec.shapes) != 1:
            raise InputError(f"{len(spec.shapes)} input shapes given; a PyTorch model is exported here with one input",
                             hint="pass one --input-shape, e.g. 1,3,224,224")
        shape = spec.shapes[0][1]
    if shape is None:
        shape = sample_shape(data)  # one sample of the verb's .npy: the shape the model is run at anyway
    if shape is None:
        raise InputError(f"no input shape is known for {model}", hint=_shape_hint(data))
    if graph is not None:
        source = _onnx_as_torch(source, graph, tuple(shape))
    return source, tuple(shape)


def _onnx_as_torch(source: Any, graph: onnx.ModelProto, shape: tuple[int, ...]) -> Any:
    """The ONNX ``source`` (its model ``graph``) at ``shape`` as its torch module (``torch_source``'s
    ``from_onnx``)."""
    from npukit.frontend.onnx_torch import torch_program

    with step("building a torch program from the ONNX graph (checked against ONNX Runtime)"):
        module, note = torch_program(graph, shape, label=source.onnx_path.name)
    return dataclasses.replace(source, kind="torch", module=module, notes=(*source.notes, note),
                               description=f"{source.description}, run as a torch program",
                               input_names=tuple(module.input_names), output_names=tuple(module.output_names))


def shape_origin(source: Any, input_shape: Any, data: str | Path | None) -> str:
    """Where ``torch_source``'s shape came from, for the report."""
    if input_shape is not None:
        return "--input-shape"
    if source.default_input_shape is not None:
        return "the model"
    return f"one sample of {data_name(data)}"


def note_shape_from_data(report: Report, origin: str, shape: Sequence[int]) -> None:
    """Where the input shape was taken from the data (``shape_origin``), the verdict says so: the artifact is fixed
    at that shape."""
    if origin.startswith("one sample of") and report.verdict:
        report.set_verdict(f"{report.verdict}; input shape {','.join(map(str, shape))} taken from {origin} (no "
                           "--input-shape given)", passed=report.passed)


def _npy_shape(data: str | Path | None) -> tuple[int, ...]:
    """The array shape of ``data`` where it is an array or a readable .npy file (its header only), else ()."""
    if isinstance(data, np.ndarray):
        return tuple(data.shape)
    if not isinstance(data, (str, Path)) or not str(data).lower().endswith(".npy") or not Path(str(data)).is_file():
        return ()
    try:
        return tuple(np.load(str(data), mmap_mode="r").shape)
    except (OSError, ValueError):
        return ()


def _channels_last(shape: Sequence[int]) -> bool:
    """(N, H, W, C) images: a PyTorch model takes them channels first."""
    return len(shape) == 4 and shape[3] in (1, 3, 4) and shape[1] > 4 and shape[2] > 4


def sample_shape(data: str | Path | None) -> tuple[int, ...] | None:
    """The input shape one sample of ``data`` gives (batch 1), where ``data`` is a .npy of stacked samples that a
    PyTorch model takes as they are; None for anything else (an image folder's size is the preprocessing's choice,
    not the model's; channels-last images need a transpose, which ``_shape_hint`` says)."""
    shape = _npy_shape(data)
    if len(shape) < 2 or _channels_last(shape):
        return None
    return (1, *shape[1:])


def _shape_hint(data: str | Path | None) -> str:
    """How to give a torch model's input shape: the transpose channels-last images in ``data`` need, else an
    example."""
    shape = _npy_shape(data)
    if _channels_last(shape):
        one = ",".join(map(str, (1, shape[3], shape[1], shape[2])))
        return (f"{data_name(data)} holds channels-last images {list(shape)}; PyTorch models take them "
                f"channels first: transpose the data to (N, C, H, W) (a.transpose(0, 3, 1, 2)) and pass "
                f"--input-shape {one}")
    return "pass the shape the model takes with --input-shape (e.g. 1,3,224,224 for an image model)"


def add_source(report: Report, source: Any) -> None:
    """What loading the model took (``source.notes``: an ONNX graph run as a torch program, a checkpoint
    unwrapped), in the report as a section and a table; nothing where there is nothing to say."""
    if source.notes:
        report.add("model_source", {"description": source.description, "notes": list(source.notes)})
        report.add_table("Model source", ["model", "how it was loaded"],
                         [[source.description, note] for note in source.notes])


def note_untrained(report: Report, source: Any) -> None:
    """Where ``source`` is a torchvision architecture built without ``--weights`` (untrained: random weights), the
    verdict says so: whatever the check held the artifact to, it says nothing of the trained model."""
    if getattr(source, "random_weights", False) and report.verdict:
        report.set_verdict(f"{report.verdict}; note: {source.spec} without --weights is the untrained architecture "
                           "(random weights), so the check says nothing of the trained model: pass --weights",
                           passed=report.passed)


def scratch_export(source: Any, shape: Sequence[int], *, what: str,
                   timings: dict[str, float] | None = None) -> tuple[onnx.ModelProto, Any]:
    """(the ONNX export of the PyTorch ``source`` at ``shape``, its ``ExportResult``): written as ``npukit export``
    writes it (verified against torch) into a scratch folder that is gone on return, and loaded. ``what``: what the
    export is for, on the progress line; ``timings``: where its seconds go (key "export").

    An export whose outputs line up with torch's but drift beyond the export check's tolerance is returned, not
    refused (``result.passed`` False): the verbs that export on the side read its graph or plan on it and check their
    own artifact against eager torch; ``note_export_drift`` says so in their report. Outputs that do not line up
    (another count or shape) stay an error."""
    import tempfile

    from npukit.config import ExportConfig
    from npukit.errors import NumericCheckError
    from npukit.frontend.export import export_model

    with tempfile.TemporaryDirectory(prefix="npukit-export-") as work, \
            step(f"exporting to ONNX ({what})", timings=timings, key="export"):
        try:
            # a program built from an ONNX model keeps that model's names (an empty one: the export's own)
            names = {"input_name": source.input_names[0]} if len(source.input_names) == 1 else {}
            config = ExportConfig(input_shape=tuple(shape), output_names=source.output_names, **names)
            result = export_model(source, Path(work) / "float.onnx", config=config)
        except NumericCheckError as exc:
            result = getattr(exc, "result", None)
            if result is None or result.max_rel_error is None:
                raise
        return onnx.load(str(result.path)), result


def export_drift(result: Any) -> str | None:
    """What a scratch export that drifts from torch (``scratch_export``) means for the verb, or None where it passed
    the export check."""
    if result.passed:
        return None
    from npukit.config import ExportConfig

    return (f"the ONNX export npukit made on the side differs from eager torch by up to {result.max_rel_error:.3g} "
            f"of the output range (max abs {result.max_abs_error:.3g}; npukit export refuses above "
            f"{ExportConfig.rtol:g}, {result.exporter} exporter)")


def note_export_drift(report: Report, result: Any, *, consequence: str) -> None:
    """The drift of a scratch export (``export_drift``) and what it touched (``consequence``) in the report; finish
    appends it to the verdict."""
    drift = export_drift(result)
    if drift is not None:
        report.add("export_drift", f"{drift}: {consequence}")


def short_number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


# the fewest calibration samples a check on those same samples is made on: fitted to fewer, 8-bit grids pass their own
# samples and fail others (MTCNN ONet: 4 samples checked 30.3 dB on themselves and 11.7 dB on 30 held-out crops, 1
# sample 29.5 and 5.9; fitted to 8, 22.2 dB held out)
MIN_SELF_CHECK = 8


def refuse_uniform_samples(samples: Any, label: str, role: str = "calibration") -> None:
    """Refuse, before any work, samples that are all one input (an array of zeros, one image copied), by ``role``:
    "calibration" (every grid fitted to that input alone; a held-out --data check then failed on the grids with the
    recovery recipe as its hint: PP-OCR cls on zeros, 0.786 agreement, 3.4 dB), "training" (qat on an array of
    zeros exited 0: its held-out fifth was zeros too) or "check" (a verdict on one input, said to be on N samples).
    Checked on up to 16 samples spread over them; ``samples``: a dataset or a list of batches."""
    from npukit.data.subsets import spread

    if len(samples) < 2:
        return
    picked = spread(samples, min(16, len(samples)))
    first: dict[str, np.ndarray] | None = None
    for batch in (picked if isinstance(picked, list) else picked.batches(1)):
        feeds = {k: np.asarray(v) for k, v in batch.feeds.items()}
        if first is None:
            first = feeds
        elif any(not np.array_equal(feeds[k], first[k]) for k in first):
            return
    assert first is not None
    values = {k: np.unique(v) for k, v in first.items()}
    what = ", ".join(f"{k} all {u[0]:g}" if u.size == 1 else f"{k} the same array" for k, u in values.items())
    harm = {"calibration": "every 8-bit grid would be fitted to that input alone",
            "check": "the check would judge the model on that input alone",
            "training": "training would fit the model to that input alone"}[role]
    raise InputError(f"the {role} samples of {label} are all one input ({what}): {harm}",
                     hint="give varied inputs of the model's kind, preprocessed as it expects (images, or the arrays "
                          "the model is fed)")


def refuse_tiny_self_check(count: int, *, held_out: str) -> None:
    """Refuse, before any work, a quantization fitted to fewer than ``MIN_SELF_CHECK`` calibration samples whose only
    check would be on those same samples; ``held_out``: how this verb takes held-out data instead ("" for none)."""
    if count >= MIN_SELF_CHECK:
        return
    raise InputError(f"{count} calibration sample(s): too few to fit 8-bit grids and check them on the same samples "
                     "(they pass themselves and fail other inputs)",
                     hint=f"give at least {MIN_SELF_CHECK} calibration samples"
                          + (f", or {held_out} with held-out samples to check on" if held_out else ""))


def refuse_nothing_left(proto: onnx.ModelProto, exclude: Sequence[str], *, hint: str) -> None:
    """--exclude naming every conv/matmul node leaves nothing for integer kernels: the "INT8" model would be the
    float one, checked against itself (it passed with SQNR inf). Refused before any work, nothing written."""
    from npukit.frontend.onnx_io import named_nodes
    from npukit.quant.qdq import FLOAT_COMPUTE_OPS

    # by the names quantize gives unnamed nodes (``<op_type>_<index>``, as inspect shows them): CenterFace has none
    compute = [n.name for n in named_nodes(proto).graph.node if n.op_type in FLOAT_COMPUTE_OPS]
    if exclude and compute and set(compute) <= set(exclude):
        raise InputError(f"--exclude names every conv/matmul node of the model ({len(compute)}): nothing would be "
                         "quantized, and the model written would be the float one", hint=hint)


def refuse_quantized(proto: onnx.ModelProto, model: str | Path, *, verb: str = "quantize") -> None:
    """An InputError (exit 2) when ``proto`` is quantized already (Q/DQ nodes, QLinear*/ConvInteger/... kernels),
    before ``verb`` would quantize it again: grids stacked on grids, and ORT's quantizer fails on it (KeyError on a
    '<tensor>_scale' it expects to have made)."""
    from npukit.frontend.onnx_io import QDQ_OPS, quantized_ops

    found = quantized_ops(proto)
    if not found:
        return
    ops = ", ".join(f"{op} x{n}" for op, n in found.items())
    where = ("bench it as it is (`npukit bench MODEL --data ...`) or compile it as it is (`npukit compile` takes "
             "a QDQ model)" if set(found) <= QDQ_OPS else
             "bench it as it is (`npukit bench MODEL --data ...`, ORT CPU runs these ops); the HTP takes float or "
             "QDQ models, not these ops")
    takes = "a float model (quantized here for the HTP) or a QDQ model" if verb == "compile" else "a float model"
    raise InputError(f"{Path(str(model)).name} is already quantized ({ops}); {verb} takes {takes}",
                     hint=f"{where}; to quantize it with npukit, start from its float original")


def given_onnx_file(model: Any) -> Path | None:
    """The ONNX file the user gave as the float model, whose size the reports' "float" rows show (qat and prune
    showed the model as preprocessed: BatchNorm folded, shapes inferred, 548,665 bytes for PP-OCR cls's 585,532);
    None for a PyTorch model or one given in memory."""
    path = Path(str(model)) if isinstance(model, (str, Path)) else None
    return path if path is not None and path.suffix.lower() == ".onnx" and path.is_file() else None


def given_file_bytes(model: Any) -> int | None:
    """The size of the ONNX file ``model`` names (``given_onnx_file``), external data included; None otherwise."""
    from npukit.measure.size import model_size

    path = given_onnx_file(model)
    return model_size(path).file_bytes if path is not None else None


def float_static_model(model: str | Path, input_shape: Any, *, verb: str,
                       data: Any = None) -> tuple[onnx.ModelProto, Any]:
    """(the float model ``verb`` quantizes or trains, its ``InputSpec``): ``input_shape`` fixed into it (without
    one, the sizes the model leaves open as one sample of ``data`` has them: ``shapes_from_data``), a quantized
    model refused and symbolic shapes refused (calibration and the trainers run static shapes), each in one line
    (exit 2)."""
    from npukit.frontend.shapes import InputSpec, load_with_inputs, require_static

    spec = InputSpec.parse(input_shape)
    proto = load_with_inputs(model, spec)
    if spec is None:
        proto, spec = shapes_from_data(proto, data)
    refuse_quantized(proto, model, verb=verb)
    refuse_unfitting_data(proto, data)
    require_static(proto, needs=verb)
    return proto, spec


def refuse_unfitting_data(proto: onnx.ModelProto, data: Any) -> None:
    """Where sizes are still open and ``data`` is arrays (not an image folder, whose size the preprocessing sets),
    read it against the model first: what is wrong with it (a rank that fits no input, a wrong key, a torch
    tensor) is said as such, not as "pass --input-shape", which then only led to that refusal."""
    from npukit.frontend.shapes import symbolic_inputs

    if data is None or not symbolic_inputs(proto) or (isinstance(data, (str, Path)) and Path(str(data)).is_dir()):
        return
    if isinstance(data, (str, Path)) and Path(str(data)).suffix.lower() not in (".npy", ".npz"):
        return
    open_data(data, proto, PreprocessConfig())


class InputShapeFromData(UserWarning):
    """No --input-shape was given and the model leaves sizes open: they were taken from one sample of the data
    (the report lists the message)."""


def shapes_from_data(proto: onnx.ModelProto, data: Any) -> tuple[onnx.ModelProto, Any]:
    """(``proto`` with the sizes it leaves open fixed as one sample of ``data`` has them, the ``InputSpec`` fixed
    in); ``proto`` and None where it leaves none open or ``data`` tells none (an image folder: its size is the
    preprocessing's; an array whose rank fits neither sample layout; sizes that contradict the model's). The
    data's layouts are those of ``--data``: (N, ...) along the input's batch axis 0, a sample being batch 1, or
    stacked whole samples (N, *shape). An ``InputShapeFromData`` warning names the shapes and where they came from,
    for the report."""
    from npukit.frontend.shapes import InputSpec, fix_inputs, input_dims

    shapes = _array_shapes(data)
    declared = input_dims(proto)
    if len(shapes) == 1 and len(declared) == 1:  # one array for one input, whatever its key (the readers map it)
        shapes = {next(iter(declared)): next(iter(shapes.values()))}
    taken = {}
    for name, dims in declared.items():
        shape = shapes.get(name)
        if not dims or all(isinstance(d, int) for d in dims) or shape is None:
            continue
        if len(shape) == len(dims):
            sample = (dims[0] if isinstance(dims[0], int) else 1, *shape[1:])
        elif len(shape) == len(dims) + 1:
            sample = tuple(shape[1:])
        else:
            continue
        if all(not isinstance(d, int) or d == n for d, n in zip(dims, sample)) and all(n > 0 for n in sample):
            taken[name] = tuple(int(n) for n in sample)
    if not taken:
        return proto, None
    spec = InputSpec.parse({name: list(shape) for name, shape in taken.items()})
    try:
        fixed = fix_inputs(proto, spec)
    except InputError as exc:
        raise InputError(f"{exc.message} (input shape taken from {data_name(data)}, no --input-shape given)",
                         hint=exc.hint) from None
    with warnings.catch_warnings():
        warnings.simplefilter("always", InputShapeFromData)
        shown = " ".join(f"{name}={','.join(map(str, shape))}" for name, shape in taken.items())
        warnings.warn(f"no --input-shape given: input shape {shown} taken from one sample of {data_name(data)}; "
                      "the artifact is fixed at it", InputShapeFromData, stacklevel=2)
    return fixed, spec


def _array_shapes(data: Any) -> dict[str | None, tuple[int, ...]]:
    """The array shapes ``data`` holds, by input name (None: the one array of a .npy or a bare array), read from
    the files' headers where it is a .npy or .npz; {} for anything else (an image folder, a missing file)."""
    if isinstance(data, np.ndarray):
        return {None: tuple(data.shape)}
    if isinstance(data, Mapping):
        return {str(k): tuple(np.shape(v)) for k, v in data.items() if k != "labels"}
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], Mapping):
        return {str(k): (len(data), *np.shape(v)) for k, v in data[0].items()}
    if not isinstance(data, (str, Path)) or not Path(str(data)).is_file():
        return {}
    suffix = Path(str(data)).suffix.lower()
    try:
        if suffix == ".npy":
            return {None: tuple(np.load(str(data), mmap_mode="r").shape)}
        if suffix == ".npz":
            with zipfile.ZipFile(str(data)) as archive:
                return {name[:-4]: _npy_header_shape(archive, name) for name in archive.namelist()
                        if name.endswith(".npy") and name[:-4] != "labels"}
    except (OSError, ValueError, zipfile.BadZipFile):
        return {}
    return {}


def _npy_header_shape(archive: zipfile.ZipFile, name: str) -> tuple[int, ...]:
    """The shape in the header of the .npy member ``name`` of ``archive`` (its data not read)."""
    with archive.open(name) as member:
        version = np.lib.format.read_magic(member)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        return tuple(reader(member)[0])


def quant_opset(report: Report, proto: onnx.ModelProto, config: Any, samples: Any, *,
                sixteen_bit: bool = False) -> onnx.ModelProto:
    """``proto`` at the opset its Q/DQ needs (16-bit: 21, per-channel: 13), converted and verified on the first
    calibration samples when below it; the conversion goes into ``report``. ``sixteen_bit``: a later step may
    choose 16-bit activations."""
    from npukit.frontend.opset import PER_CHANNEL_QDQ_OPSET, SIXTEEN_BIT_QDQ_OPSET

    if sixteen_bit or config.scheme.int16_nodes or config.scheme.int16_tensors or config.precision.int16_budget > 0:
        return upgrade_opset(report, proto, SIXTEEN_BIT_QDQ_OPSET, "16-bit Q/DQ", samples,
                              alternative="quantize without 16-bit activations")
    if config.scheme.per_channel:
        return upgrade_opset(report, proto, PER_CHANNEL_QDQ_OPSET, "per-channel Q/DQ", samples,
                              alternative="pass --per-tensor")
    return proto


def upgrade_opset(report: Report, proto: onnx.ModelProto, minimum: int, reason: str, samples: Any, *,
                   alternative: str = "") -> onnx.ModelProto:
    """``proto`` converted to opset ``minimum`` and verified on the first samples, when below it (``ensure_opset``);
    the conversion goes into ``report``."""
    from npukit.frontend.opset import ensure_opset

    feeds = list(samples[:4]) if isinstance(samples, list) else [samples.sample(i) for i in range(min(4, len(samples)))]
    with step(f"checking the opset ({reason} needs {minimum})", timings=report.timings, key="opset"):
        proto, upgrade = ensure_opset(proto, minimum, reason=reason, feeds=feeds, alternative=alternative)
    if upgrade is not None:
        add_opset_upgrade(report, upgrade)
    return proto


def task_check(report: Report, reference: Any, candidate: Any, samples: Sequence[Any], *, task: str | None,
                gate: QualityGate, what: str, where: str, threads: int = 1,
                extra_failures: Sequence[str] = (), reference_runner: Any = None, candidate_runner: Any = None,
                hint: str = "", against: str = "the float model", imposed: str = "",
                more_data: str = "give more data", sequence: Any = None):
    """Compare ``candidate`` with ``reference`` (models or paths on ORT CPU, or runners given; ``against`` names the
    reference in the tables) on ``samples`` with the model's task, judge it under ``gate`` (``hint``: what to try,
    said when it fails; ``more_data``: what a weak check says), and put the tables and the verdict into
    ``report``. ``imposed``: why the verb, not the user, chose ``task`` (the report said "given" for a task nobody
    gave). ``sequence``: the data in its order, which a recurrent model's state is rolled over
    (``measure.recurrent``; else ``samples``)."""
    from npukit.measure.recurrent import fed_back
    from npukit.measure.task_fidelity import compare_task, session_runner
    from npukit.report.task import add_rolled_check, add_task_check
    from npukit.runtime.ort import make_session
    from npukit.tasks import judge

    names = None
    if candidate_runner is None:
        session = make_session(candidate, threads=threads)
        names = [o.name for o in session.get_outputs()]
        candidate_runner = session_runner(session)
    if reference_runner is None:
        ref_session = make_session(reference, threads=threads)
        names = names or [o.name for o in ref_session.get_outputs()]
        reference_runner = session_runner(ref_session)
    if names is None:
        proto = reference if isinstance(reference, onnx.ModelProto) else onnx.load(str(reference),
                                                                                 load_external_data=False)
        names = [o.name for o in proto.graph.output]
    choice, result = compare_task(reference_runner, candidate_runner, samples, output_names=names, task=task)
    if imposed:
        choice = dataclasses.replace(choice, given=False, reason=imposed)
    rolled, drift = fed_back(reference_runner, candidate_runner, samples if sequence is None else sequence, names,
                             result, gate.min_sqnr_db)  # a recurrent state fed back, as in use
    verdict = judge(result, gate, what=what, extra_failures=[*extra_failures, *drift], hint=hint, more_data=more_data)
    if rolled is not None and not drift:
        verdict = dataclasses.replace(verdict, line=f"{verdict.line}; {rolled.summary(result.held_to_floor())}")
    add_task_check(report, choice, result, gate, verdict, where=where, against=against)
    if rolled is not None:
        add_rolled_check(report, rolled, result, result.held_to_floor())
    return choice, result, verdict


HOLD_BACK_EVERY = 4  # a search's check reads every 4th calibration sample, its calibration the others
MIN_HOLD_BACK = 8  # with fewer samples the search checks on the samples it calibrated on (and says so)


def held_back(samples: Any) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]], str]:
    """(fit, check, where): calibration ``samples`` (a dataset with ``sample``, or feed dicts) split for a search
    whose candidates are calibrated on ``fit`` and judged on ``check``, every ``HOLD_BACK_EVERY``-th sample: a
    check on the samples a candidate's grids were fitted to passes plans that fall short on other data
    (MobileNetV2 and RetinaFace plans 0.4-0.5 dB under their floors on held-out photos). Fewer than
    ``MIN_HOLD_BACK`` samples: both are all of them, and ``where`` says so."""
    feeds = list(samples)  # a dataset iterates its samples as feed dicts
    if len(feeds) < MIN_HOLD_BACK:
        return feeds, feeds, (f"all {len(feeds)} calibration samples, also calibrated on (fewer than "
                              f"{MIN_HOLD_BACK}: optimistic)")
    kept, held = every(len(feeds), HOLD_BACK_EVERY)
    fit, check = [feeds[i] for i in kept], [feeds[i] for i in held]
    return fit, check, (f"{len(check)} calibration samples held back from the {len(fit)} the candidates were "
                        f"calibrated on (every {HOLD_BACK_EVERY}th)")


def floor_check(reference: Any, samples: Sequence[Any], *, task: str | None, gate: QualityGate, what: str,
                session: Any = None, sequence: Any = None):
    """A function of a candidate model that says whether it passes ``gate``'s floors (never accepting a degraded
    one) against ``reference`` on ORT CPU, through the model's task on ``samples``; each candidate is run by
    ``session(model)`` (ORT CPU by default). For searches that build many candidates (mixed precision)."""
    from npukit.measure.recurrent import fed_back
    from npukit.measure.task_fidelity import compare_task, session_runner
    from npukit.quant.precision.layer_plan import Check
    from npukit.runtime.ort import make_session
    from npukit.tasks import judge

    reference_runner = session_runner(make_session(reference))
    outputs: dict[int, Sequence[np.ndarray]] = {}  # the reference's outputs, once per sample for every candidate

    def expected(feeds: Any) -> Sequence[np.ndarray]:
        if id(feeds) not in outputs:
            outputs[id(feeds)] = reference_runner(feeds)
        return outputs[id(feeds)]

    strict = dataclasses.replace(gate, accept_degraded=False)
    session = session or make_session

    def check(model: onnx.ModelProto) -> Check:
        made = session(model)
        candidate, names = session_runner(made), [o.name for o in made.get_outputs()]
        _, result = compare_task(expected, candidate, samples, output_names=names, task=task)
        _, drift = fed_back(reference_runner, candidate, samples if sequence is None else sequence, names, result,
                            strict.min_sqnr_db)  # a recurrent state fed back, as task_check
        verdict = judge(result, strict, what=what, extra_failures=drift)
        return Check(bool(verdict.passed), verdict.line)

    return check


def check_task_measurable(reference: onnx.ModelProto, samples: Sequence[Any], task: str | None, *, where: str,
                          threads: int = 1) -> Any:
    """Refuse, before any long step and before anything is written, ``samples`` (the task check's) on which the
    float model gives the task metric nothing to compare (a detector detecting nothing, a recognizer reading no
    character): every candidate's check would compare nothing and fail (``tasks.judge``). One float pass over them;
    the generic task, which has no metric, is never refused. Returns the float model's check against itself (its
    ``TaskResult``: what the samples hold, e.g. a detector's reference detections)."""
    from npukit.measure.task_fidelity import compare_task, session_runner
    from npukit.runtime.ort import make_session
    session = make_session(reference, threads=threads)
    run = session_runner(session)
    last: dict[str, Any] = {}

    def once(feeds: Any) -> Any:  # the float model against itself: run once per sample
        if last.get("feeds") is not feeds:
            last.update(feeds=feeds, outputs=run(feeds))
        return last["outputs"]

    choice, result = compare_task(once, once, samples, output_names=[o.name for o in session.get_outputs()],
                                  task=task)
    if result.compared_nothing:
        raise InputError(f"the {choice.name} check would compare nothing on {where}: {result.note} "
                         f"({result.samples} samples)",
                         hint="give data on which the float model finds something (images with the objects or "
                              "text it finds), or --task generic to hold every output to the SQNR floor alone")
    if result.constant_reference:
        raise InputError(f"the float model gives the same outputs (to 0.1% of their size) for each of "
                         f"{result.samples} samples ({where}): a check on them compares one answer",
                         hint="give varied inputs of the model's kind, preprocessed as it expects (a model whose "
                              "weights are random or broken may ignore its input)")
    return result


def check_task(reference: onnx.ModelProto, data: Any, task: str | None) -> None:
    """Refuse a ``task`` the reference's outputs cannot carry on the first sample of ``data`` (a dataset or feed
    dicts; or None: seeded inputs), before any long step and before anything is written."""
    if task is None or task == "auto":
        return
    from npukit.measure.task_fidelity import check_samples, feeds_and_labels

    first = next(feeds_and_labels(check_samples(data, 1)), None) if data is not None else None
    output_task(reference, dict(first[0]) if first else seeded_feeds(reference), task)


def output_task(reference: onnx.ModelProto, feeds: dict[str, np.ndarray], task: str | None):
    """The task of ``reference``'s outputs (``npukit.tasks.choose_task``), judged on one sample's ``feeds``."""
    from npukit.runtime.ort import make_session
    from npukit.tasks import choose_task

    outs = make_session(reference).run(None, feeds)
    return choose_task([o.shape for o in outs], [np.shape(v) for v in feeds.values()], task=task, sample=outs)


def held_outputs(reference: onnx.ModelProto, samples: Sequence[Any], task: str | None) -> tuple[str, ...]:
    """The outputs of ``reference`` the check holds to the SQNR floor (those its task metric does not cover), as the
    task check decides them on the float model against itself on a few of ``samples``."""
    from npukit.measure.task_fidelity import compare_task, session_runner
    from npukit.runtime.ort import make_session

    run = session_runner(make_session(reference))
    names = [o.name for o in reference.graph.output]
    _, result = compare_task(run, run, samples, output_names=names, task=task, limit=8)
    return tuple(names) if result.value is None else tuple(n for n in names if n not in result.decoded)


def summary_of(model: onnx.ModelProto, *, input_shape: Sequence[int] | None = None):
    """``measure.summary.summarize``; where shape inference leaves conv/matmul layers without shapes although the
    inputs are static (sizes the graph computes), the model is run once on seeded inputs for them."""
    from npukit.frontend.shapes import symbolic_inputs
    from npukit.measure.summary import summarize

    summary = summarize(model, input_shape=input_shape)
    if summary.unknown_mac_layers and not symbolic_inputs(model):
        try:
            summary = summarize(model, input_shape=input_shape, feeds=seeded_feeds(model))
        except Exception:  # noqa: BLE001 - a model that does not run on seeded inputs keeps the partial count
            pass
    return summary


def seeded_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    from npukit.runtime.ort import make_session, random_feeds

    return random_feeds(make_session(model), seed=0)


def is_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def _check_dataset(dataset: Any, inputs: Sequence[Any]) -> None:
    """The dataset's arrays against the model's inputs (names, shapes, types), and its values (finite)."""
    dataset.check_against({i.name: tuple(d.dim_value if d.HasField("dim_value") else None
                                         for d in i.type.tensor_type.shape.dim) for i in inputs},
                          dtypes={i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
                                  for i in inputs if i.type.tensor_type.elem_type})
    dataset.validate()


def preprocess_record(*datasets: Any) -> dict[str, Any] | str:
    """What a report's config says of image preprocessing: the settings where one of ``datasets`` (None: no data)
    is read from image files, else that none was applied (arrays are fed as given; a report listed ImageNet's mean
    and std for .npy data)."""
    from npukit.config import to_dict
    from npukit.data.readers import ImageDataset

    images = [d for d in datasets if isinstance(d, ImageDataset)]
    if images:  # as applied: the crop follows the model's input (open_data), not the flag's default
        return to_dict(images[0].preprocess)
    return "none: the data are arrays, fed as given" if any(d is not None for d in datasets) else "none: no data"


def samples_read(total: int, available: int) -> str:
    """How many samples a check read: "N samples", or "N samples (spread over its M)" when it read a share."""
    return f"{total} samples" if total >= available else f"{total} samples (spread over its {available})"


def data_label(data: Any, dataset: Any = None) -> str | None:
    """How a report names data: its path as given, what was given in Python (with ``dataset``, the dataset read from
    it: how many samples), or None for no data; a share of it taken (``--calib-samples``) is said."""
    if data is None:
        return None
    if isinstance(dataset, Subset):
        return f"{data_label(data, dataset.base)} ({len(dataset)} of its {len(dataset.base)} samples, spread evenly)"
    if isinstance(data, (str, Path)):
        return str(data)
    if dataset is not None:
        return f"{len(dataset)} samples given in memory"
    if isinstance(data, np.ndarray):
        return f"an array {tuple(data.shape)} given in memory"
    if isinstance(data, (list, tuple)):
        return f"{len(data)} feed dicts given in memory"
    return f"a {type(data).__name__} given in memory"


def data_name(data: Any) -> str:
    """How a sentence names data: a path's file name, else ``data_label``'s words."""
    return Path(str(data)).name if isinstance(data, (str, Path)) else str(data_label(data))


def open_data(data: Any, proto: onnx.ModelProto, preprocess: PreprocessConfig):
    """The dataset at ``data`` (a folder of images, an image, a .npy or .npz, or given in Python: an array, read as a
    .npy's, a dict of arrays or a list of feed dicts, read as a .npz's), checked against ``proto``'s inputs."""
    from npukit.data.readers import feeds_dataset, is_in_memory, open_dataset
    from npukit.frontend.onnx_io import graph_inputs

    inputs = graph_inputs(proto)
    if is_in_memory(data) and not isinstance(data, np.ndarray):
        dataset = feeds_dataset(data, [i.name for i in inputs])
        _check_dataset(dataset, inputs)
        return dataset
    if isinstance(data, np.ndarray):
        if len(inputs) != 1:
            raise InputError(f"the model has {len(inputs)} inputs; one array feeds only one",
                             hint="pass a list of feed dicts, or a .npz file with one array per input name")
        dataset = open_dataset(data, preprocess=preprocess, input_name=inputs[0].name)
        _check_dataset(dataset, inputs)
        return dataset
    if len(inputs) != 1 and Path(data).suffix != ".npz":
        raise InputError(f"the model has {len(inputs)} inputs; an image folder or .npy feeds only one",
                         hint="pass a .npz file with one array per input name")
    first = inputs[0]
    dims = [d.dim_value if d.HasField("dim_value") else None for d in first.type.tensor_type.shape.dim]
    if len(dims) == 4 and dims[1] in (1, 3) and Path(data).is_dir() and dims[2]:  # images cropped to the input
        if dims[2] != preprocess.size:
            resize = None if preprocess.resize is None else max(preprocess.resize, dims[2])
            preprocess = dataclasses.replace(preprocess, size=dims[2], resize=resize)
        if dims[3] and preprocess.crop != (dims[2], dims[3]):  # a crop as wide as the input (a text line's)
            preprocess = dataclasses.replace(preprocess, width=dims[3])
    if len(dims) == 4 and dims[1] == 1 and preprocess.channels != 1:
        preprocess = dataclasses.replace(preprocess, channels=1, mean=(preprocess.mean[0],), std=(preprocess.std[0],))
    dataset = open_dataset(data, preprocess=preprocess, input_name=first.name if len(inputs) == 1 else None)
    _check_dataset(dataset, inputs)
    if getattr(dataset, "kind", None) == "images":  # say how, so that a model not trained on ImageNet's is not
        p = dataset.preprocess                        # silently fed ImageNet's normalization
        with warnings.catch_warnings():
            warnings.simplefilter("always", ImagePreprocessing)
            (h, w), colour = p.crop, "RGB" if p.channels == 3 else "gray"
            resized = f"short side resized to {p.short_side}, center crop {h}x{w}" if h == w else \
                f"resized to cover {p.short_side}x{round(p.short_side * w / h)}, center crop {h}x{w} (height x width)"
            warnings.warn(f"{Path(data).name}: {len(dataset)} image(s), {resized}, {colour} in "
                          f"[0, 1], (x - mean) / std with mean {list(p.mean)}, std {list(p.std)} (ImageNet's unless "
                          "given)", ImagePreprocessing, stacklevel=2)
    return dataset


class ImagePreprocessing(UserWarning):
    """How image files were turned into the model's input (``report.finish`` lists it in the report)."""


def evaluate(proto: onnx.ModelProto, ref_proto: onnx.ModelProto | None, dataset, *, config: BenchConfig,
              threads: int, output: int = 0):
    """Top-k agreement of ``proto`` with ``ref_proto`` (and accuracy against the labels) on its output ``output``
    (the class scores: ``classified_output``)."""
    from npukit.measure.fidelity import AgreementMeter
    from npukit.runtime.ort import make_session

    session = make_session(proto, threads=threads)
    ref_session = make_session(ref_proto, threads=threads) if ref_proto is not None else None
    meter = AgreementMeter()
    total = len(dataset) if config.max_samples is None else min(config.max_samples, len(dataset))
    for batch in progress(spread(dataset, total).batches(config.batch_size), total=-(-total // config.batch_size),
                          description="evaluating"):
        cand = logits(session.run(None, batch.feeds), output)
        ref = logits(ref_session.run(None, batch.feeds), output) if ref_session is not None else cand
        meter.update(ref, cand, batch.labels)
    return meter.result()


def logits(outputs: list, output: int = 0) -> np.ndarray:
    """Output ``output`` of a run, one row per sample."""
    out = np.asarray(outputs[output], dtype=np.float32)
    return out.reshape(out.shape[0], -1)


def classified_output(proto: onnx.ModelProto, dataset: Any, task: str | None = None) -> int | None:
    """The index of ``proto``'s class scores as the task check finds them on the first sample of ``dataset`` (a face
    net's probabilities beside its box offsets), or None where its task is not classification."""
    first = next(iter(dataset.batches(1, limit=1)), None)
    if first is None:
        return None
    choice = output_task(proto, dict(first.feeds), task)
    return choice.output if choice.name == "classify" else None
