"""Pass infrastructure: the npukit pass base class and the pass manager that runs a pipeline and names a failing pass."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import onnx_ir as ir

from npukit.errors import NpukitError


class PassFailedError(NpukitError):
    """A pass raised or left a graph that does not check; the message names the pass."""

    exit_code = 1


class NpukitPass(ir.passes.InPlacePass):
    """An in-place rewrite of an ``ir.Model``.

    Subclasses implement ``call(model) -> ir.passes.PassResult`` and may append to ``self.notes`` a line for each
    candidate they looked at and did not rewrite, saying why ("Clip max is not constant"), so that a user can see
    why a pattern stayed as it was.
    """

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.rewrites = 0

    @property
    def name(self) -> str:
        return type(self).__name__

    def note(self, message: str) -> None:
        self.notes.append(message)


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """What one pass did in a pipeline run."""

    name: str
    modified: bool
    rewrites: int
    nodes_before: int
    nodes_after: int
    seconds: float
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PipelineResult:
    model: ir.Model
    records: tuple[PassRecord, ...]

    @property
    def modified(self) -> bool:
        return any(r.modified for r in self.records)


def count_nodes(model: ir.Model) -> int:
    return sum(1 for _ in model.graph.all_nodes())


def check_model(model: ir.Model) -> None:
    """Raise if the model is not valid ONNX (onnx.checker on the serialized proto; a model of 2 GB or more, which
    protobuf cannot serialize in one piece, is written with its weights as external data and checked from the path)."""
    import tempfile

    import onnx

    from npukit.frontend.onnx_io import SINGLE_FILE_LIMIT_BYTES, initializer_bytes, save_onnx

    if initializer_bytes(model) < SINGLE_FILE_LIMIT_BYTES:
        onnx.checker.check_model(ir.serde.serialize_model(model), full_check=False)
        return
    with tempfile.TemporaryDirectory(prefix="npukit-check-") as tmp:
        path = save_onnx(model, Path(tmp) / "model.onnx")
        onnx.checker.check_model(str(path), full_check=False)


def _output_shapes(model: ir.Model) -> dict[str, ir.Shape | None]:
    """Each graph output's shape as the pipeline receives it; an output without one (ONNX requires it on a graph
    output, and the checker after each pass would blame that pass) takes what shape inference knows of it."""
    shapes = {v.name: v.shape for v in model.graph.outputs if v.name}
    if any(s is None for s in shapes.values()):
        from npukit.frontend.onnx_io import complete_output_shapes

        repaired = complete_output_shapes(ir.serde.serialize_model(model))
        for output in repaired.graph.output:
            if shapes.get(output.name) is None and output.type.tensor_type.HasField("shape"):
                shapes[output.name] = ir.serde.deserialize_type_proto_for_shape(output.type)
    return shapes


def _restore_output_shapes(model: ir.Model, shapes: dict[str, ir.Shape | None]) -> None:
    """Give a graph output that has no shape (a pass put a new value there, or the input lacked it) the one it had
    on entry, in place: the graph's interface does not change in a pass."""
    for value in model.graph.outputs:
        if value.shape is None and shapes.get(value.name) is not None:
            value.shape = shapes[value.name]


class PassManager:
    """Runs a list of passes in order; after each, optionally checks the graph. A failure names the pass."""

    def __init__(self, passes: Sequence[ir.passes.PassBase], *, check_after_each: bool = True) -> None:
        self.passes = list(passes)
        self.check_after_each = check_after_each

    def __call__(self, model: ir.Model) -> PipelineResult:
        records: list[PassRecord] = []
        declared = _output_shapes(model)
        for pass_ in self.passes:
            name = getattr(pass_, "name", type(pass_).__name__)
            before = count_nodes(model)
            start = time.perf_counter()
            try:
                result = pass_(model)
            except NpukitError:
                raise
            except Exception as exc:
                raise PassFailedError(
                    f"pass {name} failed: {type(exc).__name__}: {exc}",
                    hint="run with --skip-pass " + name + " to leave that rewrite out, and report the model",
                ) from exc
            model = result.model
            _restore_output_shapes(model, declared)
            if self.check_after_each and result.modified:
                try:
                    check_model(model)
                except Exception as exc:
                    raise PassFailedError(
                        f"pass {name} produced an invalid graph: {type(exc).__name__}: {exc}",
                        hint="run with --skip-pass " + name + " to leave that rewrite out, and report the model",
                    ) from exc
            records.append(
                PassRecord(
                    name=name,
                    modified=result.modified,
                    rewrites=getattr(pass_, "rewrites", int(result.modified)),
                    nodes_before=before,
                    nodes_after=count_nodes(model),
                    seconds=time.perf_counter() - start,
                    notes=tuple(getattr(pass_, "notes", ())),
                )
            )
        return PipelineResult(model=model, records=tuple(records))
