"""Export a ModelSource to one verified ONNX file: dynamo exporter first, TorchScript exporter as the fallback."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnx_ir as ir
import torch

from npukit.config import ExportConfig
from npukit.errors import InputError, NpukitError, NumericCheckError
from npukit.frontend._messages import first_line
from npukit.frontend.onnx_io import (graph_inputs, load_onnx, mark_untrained, refuse_context_model, save_onnx,
                                     static_input_shape)
from npukit.frontend.opset import ensure_opset, onnx_opset
from npukit.frontend.shapes import fix_input_shape
from npukit.frontend.spec import ModelSource
from npukit.frontend.verify import flatten_outputs, seeded_samples, stack_samples, verify_against_torch
from npukit.measure.compare import OutputErrors, compare_outputs
from npukit.runtime.ort import batch_problem, make_session, random_feeds, run

ExporterName = Literal["dynamo", "torchscript", "passthrough"]

# The TorchScript-based exporter stops at this opset (torch.onnx._constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET).
TORCHSCRIPT_MAX_OPSET = 20
DEFAULT_OPSET = 18  # what a torch model is exported at unless --opset says otherwise
_REASON_MAX_CHARS = 300


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What an export produced and how closely ONNX Runtime matches torch on seeded inputs."""

    path: Path
    source_kind: str
    exporter: ExporterName
    fallback_reason: str | None  # why the dynamo exporter failed when "auto" fell back to TorchScript
    opset: int
    input_shape: tuple[int, ...] | None
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    max_abs_error: float | None  # None when there was nothing to compare against
    max_rel_error: float | None
    passed: bool
    seconds: float
    node_count: int
    opset_upgrade: Any = None  # frontend.opset.OpsetUpgrade: an .onnx file converted for --opset, and its check

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["path"] = str(self.path)
        data["input_shape"] = list(self.input_shape) if self.input_shape is not None else None
        data["input_names"] = list(self.input_names)
        data["output_names"] = list(self.output_names)
        return data


def export_model(source: ModelSource, output: str | Path, *, config: ExportConfig) -> ExportResult:
    """Write ``source`` as ONNX to ``output`` and verify it; nothing is left at ``output`` if anything fails.

    A failed numeric check still writes the file, then raises NumericCheckError with ``exc.result`` set.
    """
    start = time.perf_counter()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=f".{output.name}.") as work:
        staged = Path(work) / output.name
        if source.kind == "onnx":
            fields = _passthrough(source, staged, config=config)
        else:
            fields = _export_torch(source, staged, Path(work), config=config)
        written = onnx.load_model(str(staged), load_external_data=False)
        data = staged.with_name(staged.name + ".data")
        if data.exists():
            os.replace(data, output.with_name(output.name + ".data"))
        os.replace(staged, output)
    result = ExportResult(
        path=output,
        source_kind=source.kind,
        opset=next(o.version for o in written.opset_import if o.domain in ("", "ai.onnx")),
        input_names=tuple(i.name for i in graph_inputs(written)),
        output_names=tuple(o.name for o in written.graph.output),
        node_count=len(written.graph.node),
        seconds=time.perf_counter() - start,
        **fields,
    )
    if not result.passed:
        figures = (f"max rel error {result.max_rel_error:.3g} > rtol {config.rtol:g} "
                   f"(max abs {result.max_abs_error:.3g})" if result.max_rel_error is not None
                   else "its outputs do not line up with torch's")
        alternative = "torchscript" if result.exporter == "dynamo" else "dynamo"
        exc = NumericCheckError(f"the ONNX model written to {output} does not match torch: {figures}",
                                hint=f"try --exporter {alternative}, or raise --rtol if this error is acceptable")
        exc.result = result  # type: ignore[attr-defined]
        raise exc
    return result


# ------------------------------------------------------------------------------------------------------- torch


def _export_torch(source: ModelSource, staged: Path, work: Path, *, config: ExportConfig) -> dict[str, Any]:
    module = source.module
    assert module is not None, "a torch ModelSource carries its module"
    shape = config.input_shape or source.default_input_shape
    if shape is None:
        extra = _non_tensor_arguments(module)
        if extra:  # a shape would not help: say what would
            raise _takes_more_than_a_tensor(extra)
        raise InputError(f"no input shape is known for {source.spec}",
                         hint="pass the shape the model takes with --input-shape (e.g. 1,3,224,224 for an image "
                              "model)")
    outputs = _check_shape_fits(module, shape)
    input_names = [config.input_name]
    output_names = ["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))]
    if config.output_names:
        if len(config.output_names) != len(outputs):
            raise InputError(f"{len(config.output_names)} output names given for a model with {len(outputs)} "
                             "outputs", hint="give one name per output")
        output_names = list(config.output_names)
    if config.dynamic_batch and source.fixed_batch is not None:  # its graph guards the batch: both exporters fail
        raise InputError(f"{source.spec} was exported with a fixed batch of {source.fixed_batch}, so it cannot take "
                         "a dynamic batch", hint="drop --dynamic-batch, or export the program again with "
                         "dynamic_shapes (a torch.export.Dim on the batch axis)")
    # A batch of 1 invites torch to specialize the batch dim; trace a dynamic batch with 2.
    trace_shape = (max(shape[0], 2), *shape[1:]) if config.dynamic_batch else tuple(shape)
    example = (torch.from_numpy(seeded_samples(trace_shape, samples=1, seed=config.seed)[0]),)

    fallback_reason: str | None = None
    exporter: ExporterName
    if config.exporter in ("auto", "dynamo"):
        try:
            model = _run_dynamo(module, example, input_names, output_names, config=config)
            exporter = "dynamo"
        except Exception as exc:
            _reraise_interrupt(exc)
            if config.exporter == "dynamo":
                raise NpukitError(f"the dynamo exporter failed: {_failure_summary(exc)}",
                                  hint="try --exporter torchscript") from exc
            fallback_reason = _failure_summary(exc)
    if config.exporter == "torchscript" or fallback_reason is not None:
        try:
            model = _run_torchscript(module, example, input_names, output_names, work, config=config)
            exporter = "torchscript"
        except Exception as exc:
            _reraise_interrupt(exc)
            before = f"the dynamo exporter failed ({fallback_reason}), then " if fallback_reason else ""
            raise NpukitError(f"{before}the TorchScript exporter failed: {_failure_summary(exc)}",
                              hint="simplify the model's forward (tensors in and out) until torch.onnx exports "
                                   "it; the verbs that read ONNX also take a model you export yourself") from exc
    if source.random_weights:
        mark_untrained(model, str(source.spec))
    save_onnx(model, staged)
    try:
        errors: OutputErrors | None = verify_against_torch(module, staged, shape=shape,
                                                           samples=config.verify_samples, seed=config.seed)
    except NumericCheckError:
        errors = None
    if config.dynamic_batch:  # a trace may still bake the batch into a Reshape: run two samples at once
        _check_batch(onnx.load(str(staged)), tuple(shape), config=config,
                     hint="the model's forward fixes its batch (e.g. x.view(1, -1)): write x.flatten(1) or "
                          "x.view(x.size(0), -1), or export without --dynamic-batch")
    return {
        "exporter": exporter,
        "fallback_reason": fallback_reason,
        "input_shape": tuple(shape),
        "max_abs_error": errors.max_abs if errors else None,
        "max_rel_error": errors.max_rel if errors else None,
        "passed": errors is not None and errors.within(config.rtol),
    }


def _non_tensor_arguments(module: torch.nn.Module) -> list[str]:
    """The arguments of ``module``'s forward after the first that are not tensors and have no default ("sr: int"),
    from its TorchScript schema or its Python signature; [] when neither can be read."""
    try:
        if isinstance(module, torch.jit.ScriptModule):
            args = module.forward.schema.arguments[2:]  # self, the input
            return [f"{a.name}: {a.type}" for a in args if not a.has_default_value()
                    and "Tensor" not in str(a.type)]
        import inspect

        params = list(inspect.signature(module.forward).parameters.values())[1:]
        return [p.name if p.annotation is inspect.Parameter.empty
                else f"{p.name}: {getattr(p.annotation, '__name__', p.annotation)}" for p in params
                if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.annotation is not torch.Tensor]
    except Exception:  # noqa: BLE001 - a best-effort diagnosis only
        return []


def _takes_more_than_a_tensor(extra: list[str]) -> InputError:
    return InputError(f"the model's forward takes arguments besides its input tensor ({', '.join(extra)}), and "
                      "npukit exports a model called with one tensor",
                      hint="export a wrapper module whose forward(x) calls the model with those arguments fixed (a "
                           "stateful TorchScript model may not trace; use its ONNX release if it has one)")


# words of torch's errors for an input of the wrong shape ("mat1 and mat2 shapes cannot be multiplied", "expected
# input[1, 3, 7] to have 3 channels", "size mismatch", "Sizes of tensors must match", "out of range", ...)
_SHAPE_WORDS = ("shape", "size", "channel", "dimension", "mat1", "expected input", "out of range", "mismatch", "dim")


def _check_shape_fits(module: torch.nn.Module, shape: tuple[int, ...]) -> list[torch.Tensor]:
    x = torch.zeros(tuple(shape), dtype=torch.float32)
    try:
        with torch.no_grad(), _quiet():
            outputs = flatten_outputs(module(x))
    except Exception as exc:
        extra = _non_tensor_arguments(module)
        if extra:
            raise _takes_more_than_a_tensor(extra) from exc
        shown, said = ",".join(map(str, shape)), first_line(exc)
        if not any(word in said.lower() for word in _SHAPE_WORDS):  # not a shape error: say what the model raised
            raise InputError(f"the model's forward raised {type(exc).__name__} on an input of shape ({shown}): "
                             f"{said}", hint="fix the model's forward (or, if it takes another shape, pass that "
                                              "with --input-shape)") from exc
        raise InputError(f"input shape ({shown}) does not fit the model: {said}",
                         hint=_first_conv_hint(module, shape) or "pass the shape the model expects with --input-shape"
                         ) from exc
    if not outputs:
        raise InputError("the model returns no tensors", hint="return the model's outputs as tensors")
    return outputs


def _first_conv_hint(module: torch.nn.Module, shape: tuple[int, ...]) -> str:
    """Where the model's first layer is a convolution whose input ``shape`` does not fit (its rank or channels), the
    shape it takes, as --input-shape (a conv model given 1,3,64 got torch's 'expected input[1, 1, 3, 64] to have 3
    channels'); "" otherwise."""
    first = next(((name, m) for name, m in module.named_modules() if isinstance(m, torch.nn.modules.conv._ConvNd)),
                 None)
    if first is None:
        return ""
    name, conv = first
    rank = 2 + len(conv.kernel_size)
    if len(shape) == rank and shape[1] == conv.in_channels:
        return ""
    dims = {3: "L", 4: "H,W", 5: "D,H,W"}[rank]
    return (f"pass --input-shape 1,{conv.in_channels},{dims} with its sizes: the model's first convolution "
            f"({type(conv).__name__} {name!r}) reads N,{conv.in_channels},{dims}")


def _run_dynamo(module: torch.nn.Module, example: tuple[torch.Tensor, ...], input_names: list[str],
                output_names: list[str], *, config: ExportConfig) -> ir.Model:
    dynamic_shapes = tuple({0: "batch"} for _ in example) if config.dynamic_batch else None
    with _quiet():
        program = torch.onnx.export(
            module, example, dynamo=True, external_data=False, opset_version=config.opset or DEFAULT_OPSET,
            optimize=True, input_names=input_names, output_names=output_names, dynamic_shapes=dynamic_shapes,
        )
    return program.model


def _run_torchscript(module: torch.nn.Module, example: tuple[torch.Tensor, ...], input_names: list[str],
                     output_names: list[str], work: Path, *, config: ExportConfig) -> onnx.ModelProto:
    dynamic_axes = {name: {0: "batch"} for name in (*input_names, *output_names)} if config.dynamic_batch else None
    path = work / "torchscript.onnx"
    with _quiet():
        torch.onnx.export(
            module, example, str(path), dynamo=False,
            opset_version=min(config.opset or DEFAULT_OPSET, TORCHSCRIPT_MAX_OPSET), input_names=input_names,
            output_names=output_names, dynamic_axes=dynamic_axes, do_constant_folding=True,
        )
    return onnx.load_model(str(path))


def _reraise_interrupt(exc: BaseException) -> None:
    """An exporter error caused by an interrupt (Ctrl-C wrapped on its way out) is the interrupt, not a failure to
    fall back from: raise it as KeyboardInterrupt. (A bare KeyboardInterrupt passes ``except Exception`` already.)"""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt from exc
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__


def _failure_summary(exc: BaseException) -> str:
    """The first sentence of an exporter's error, plus the root cause from its "Exception summary" if any."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    head = first_line(text) or type(exc).__name__
    head = head.split(". ")[0].rstrip(".")
    lines = [ln.strip() for ln in text.splitlines()]
    if "## Exception summary" in lines:
        cause = next((ln for ln in lines[lines.index("## Exception summary") + 1:] if ln), "")
        cause = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", cause)
        if cause:
            head = f"{head}: {cause}"
    elif type(exc).__name__ not in head:
        head = f"{type(exc).__name__}: {head}"
    return head if len(head) <= _REASON_MAX_CHARS else head[: _REASON_MAX_CHARS - 3] + "..."


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Swallow what the exporters print: Python warnings and everything written to file descriptors 1 and 2."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with tempfile.TemporaryFile() as sink, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                yield
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


# -------------------------------------------------------------------------------------------------------- onnx


def _passthrough(source: ModelSource, staged: Path, *, config: ExportConfig) -> dict[str, Any]:
    assert source.onnx_path is not None, "an onnx ModelSource carries its path"
    original = load_onnx(source.onnx_path)
    refuse_context_model(original, source.onnx_path)  # compiled already: nothing to export
    if config.opset is not None and onnx_opset(original) > config.opset:
        raise InputError(f"the model is at opset {onnx_opset(original)}; --opset {config.opset} would convert it down",
                         hint="drop --opset to keep the model's own, or ask for a later one")
    shape = config.input_shape or (source.default_input_shape if config.dynamic_batch else None)
    if config.dynamic_batch and shape is None:  # the two-sample check needs sizes to feed
        raise InputError("--dynamic-batch on a model with symbolic sizes besides the batch needs --input-shape: the "
                         "model is run on two samples at once to check it batches",
                         hint="pass the shape of one sample, e.g. --input-shape 1,3,640,640")
    inputs = graph_inputs(original)
    if config.dynamic_batch and len(inputs) != 1:  # only the first input is made batch-dynamic (Silero VAD's
        # state has its batch at axis 1: the check's seeded inputs could not be sized, "pass the full shape")
        raise InputError(f"--dynamic-batch makes an .onnx file's first input batch-dynamic; this model has "
                         f"{len(inputs)} inputs ({', '.join(i.name for i in inputs)}), whose batches cannot be "
                         "made dynamic and checked together that way",
                         hint="export it without --dynamic-batch (optimize-graph fixes every input's shape), or "
                              "re-export it from its source with a dynamic batch")
    model = original
    errors: OutputErrors | None = None
    if shape is not None:
        model = fix_input_shape(original, shape, dynamic_batch=config.dynamic_batch)
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as exc:
            raise InputError(f"the model with input shape {tuple(shape)} fails the ONNX checker: {first_line(exc)}",
                             hint="pass the shape the model was made for with --input-shape") from exc
        if _accepts(original, shape):
            errors = _compare_onnx(original, model, shape, config=config)
        if config.dynamic_batch:
            _check_batch(model, shape, config=config)
    upgrade = None
    if config.opset is not None:  # asked for: converted up by onnx's converter, verified on seeded inputs
        model, upgrade = ensure_opset(model, config.opset, reason=f"--opset {config.opset}",
                                      alternative="drop --opset to keep the model's own")
    save_onnx(model, staged)
    return {
        "opset_upgrade": upgrade,
        "exporter": "passthrough",
        "fallback_reason": None,
        "input_shape": tuple(shape) if shape is not None else static_input_shape(original),
        "max_abs_error": errors.max_abs if errors else None,
        "max_rel_error": errors.max_rel if errors else None,
        "passed": errors is None or errors.within(config.rtol),
    }


def _check_batch(model: onnx.ModelProto, shape: tuple[int, ...], *, config: ExportConfig,
                 hint: str = "export it without --dynamic-batch (batch 1), or re-export it from its source with a "
                             "dynamic batch") -> None:
    """With --dynamic-batch: the model run on two samples at once must give each what it gives it alone
    (``runtime.ort.batch_problem``): one that does not is an InputError (exit 2, nothing written)."""
    session = make_session(model)
    inputs = session.get_inputs()
    problem = batch_problem(session, {inputs[0].name: (1, *shape[1:])}, seed=config.seed, rtol=config.rtol)
    if problem:
        raise InputError(f"--dynamic-batch: {problem}", hint=hint)


def _accepts(model: onnx.ModelProto, shape: tuple[int, ...]) -> bool:
    """Whether the model's first input, as declared, takes ``shape`` (symbolic dims take any size, and so does a
    size of -1 or 0, Paddle's way of writing a dynamic one)."""
    dims = graph_inputs(model)[0].type.tensor_type.shape.dim
    return len(dims) == len(shape) and all(not d.HasField("dim_value") or d.dim_value <= 0 or d.dim_value == s
                                           for d, s in zip(dims, shape))


def _compare_onnx(before: onnx.ModelProto, after: onnx.ModelProto, shape: tuple[int, ...], *,
                  config: ExportConfig) -> OutputErrors:
    """The reshaped model against the model as loaded, both on ONNX Runtime CPU with the same seeded inputs."""
    reference, candidate = make_session(before), make_session(after)
    shapes = {graph_inputs(after)[0].name: shape}
    refs: list[list[np.ndarray]] = []
    gots: list[list[np.ndarray]] = []
    for i in range(config.verify_samples):
        feeds = random_feeds(candidate, seed=config.seed + i, shapes=shapes)
        refs.append(run(reference, feeds))
        gots.append(run(candidate, feeds))
    return compare_outputs(stack_samples(refs), stack_samples(gots))
