"""Input shapes for every verb: one spec, fixed into the model first.

``--input-shape 1,3,640,640`` gives the first input's shape; ``--input-shape name=1,3,640,640`` (repeatable) gives one
per named input. :func:`apply_input_spec` writes those sizes into the model (a symbolic dimension's name shared with
another input takes the same size there) and redoes ONNX shape inference, so that every later step (verification,
ORT's quantizer, calibration data checks, memory planning, MAC counts) sees the same static shapes.
:func:`require_static` is the one-line error of a verb that needs static shapes and was given none.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import onnx

from npukit.config import parse_shape
from npukit.errors import InputError
from npukit.frontend._messages import first_line

Dim = int | str | None
FIRST_INPUT = "<first input>"  # how an unnamed shape is shown in reports


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """Static input shapes: ``((None, shape),)`` for the first input, or ``((name, shape), ...)`` per input.

    Build one with :meth:`parse` from what a user wrote (``"1,3,640,640"``, ``"x=1,3,640,640"``, a list of those,
    a tuple of ints, or a ``{name: shape}`` mapping)."""

    shapes: tuple[tuple[str | None, tuple[int, ...]], ...]

    def __post_init__(self) -> None:
        shapes = tuple((None if name is None else str(name), parse_shape(shape)) for name, shape in self.shapes)
        object.__setattr__(self, "shapes", shapes)
        if not shapes:
            raise InputError("no input shape given", hint="write it like 1,3,224,224 or NAME=1,3,224,224")
        names = [name for name, _ in shapes]
        if None in names and len(names) > 1:
            raise InputError("an input shape without a name can only be given alone",
                             hint="name each input: --input-shape NAME=1,3,224,224 once per input")
        duplicates = sorted({n for n in names if n is not None and names.count(n) > 1})
        if duplicates:
            raise InputError(f"input {duplicates[0]!r} is given more than one shape", hint="give each input once")

    @classmethod
    def parse(cls, value: InputSpec | str | Sequence[Any] | Mapping[str, Any] | None) -> InputSpec | None:
        """None stays None; see the class docstring for the forms taken."""
        if value is None or isinstance(value, InputSpec):
            return value
        if isinstance(value, Mapping):
            return cls(tuple((str(k), v) for k, v in value.items()))
        if isinstance(value, str):
            return cls((_parse_one(value),))
        items = list(value)
        if not items:
            return None
        if all(isinstance(v, str) for v in items):
            return cls(tuple(_parse_one(v) for v in items))
        return cls(((None, tuple(items)),))

    @property
    def first(self) -> tuple[int, ...] | None:
        """The shape of an unnamed spec (the first input's), else None."""
        return self.shapes[0][1] if self.shapes[0][0] is None else None

    def describe(self) -> str:
        """As --input-shape is written: "1,3,640,640", or "x=1,3,640,640 y=1,4" per input."""
        return " ".join(("" if name is None else f"{name}=") + ",".join(map(str, shape)) for name, shape in self.shapes)

    def as_dict(self) -> dict[str, list[int]]:
        return {FIRST_INPUT if name is None else name: list(shape) for name, shape in self.shapes}

    def resolve(self, model: onnx.ModelProto, *, override_static: bool = True) -> dict[str, tuple[int, ...]]:
        """``{input name: shape}`` for ``model``: names checked against its inputs, ranks and static sizes against
        what it declares (a symbolic dimension takes any size; a static one too unless ``override_static`` is off:
        the user gives the full shape, and some exporters declare a placeholder size that their users overwrite,
        such as CenterFace's 10x3x32x32; whether the model runs at it is ORT's to say, see ``apply_input_spec``)."""
        declared = input_dims(model)
        if not declared:
            raise InputError("the model has no inputs whose shape could be set", hint="leave out --input-shape")
        resolved: dict[str, tuple[int, ...]] = {}
        for name, shape in self.shapes:
            key = next(iter(declared)) if name is None else name
            if key not in declared:
                raise InputError(f"the model has no input named {name!r}",
                                 hint=f"its inputs: {', '.join(map(repr, declared))}")
            dims = declared[key]
            if dims is not None and len(dims) != len(shape):
                raise InputError(f"input shape {shape} has rank {len(shape)} but input {key!r} "
                                 f"of the model has rank {len(dims)} ({show_dims(dims)})",
                                 hint=f"input {key!r} is a scalar: it takes no --input-shape, leave it out"
                                 if not dims else f"pass --input-shape {key}= with {len(dims)} dimensions: "
                                 f"{key}={_shape_template(dims)}")
            for axis, (want, have) in enumerate(zip(shape, dims or ())):
                if isinstance(have, int) and have != want and not override_static:
                    raise InputError(f"input shape {shape} does not fit input {key!r} of the "
                                     f"model ({show_dims(dims)}): axis {axis} is fixed to {have}",
                                     hint="here only symbolic dimensions can be set; keep the others as they are")
            resolved[key] = tuple(shape)
        return resolved


def _shape_template(dims: Sequence[int | str | None]) -> str:
    """The declared ``dims`` as an --input-shape to fill in: static sizes as they are, a symbolic batch (axis 0) as
    1, every other open size by its name (or N), said to be filled in (a 1 there, as before, would not run)."""
    names = [str(d) if isinstance(d, int) and d > 0 else "1" if axis == 0 else
             (d if isinstance(d, str) and d and not is_anonymous_dim(d) else "N") for axis, d in enumerate(dims)]
    open_sizes = [n for n in names[1:] if not n.isdigit()]
    return ",".join(names) + (f" with {', '.join(dict.fromkeys(open_sizes))} the sizes you run it at"
                              if open_sizes else "")


def _parse_one(text: str) -> tuple[str | None, tuple[int, ...]]:
    name, sep, dims = text.strip().rpartition("=")
    if sep and not name.strip():
        raise InputError(f"input shape {text!r} has an empty input name", hint="write it like x=1,3,224,224")
    return (name.strip() if sep else None), parse_shape(dims)  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------- model inputs

def runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs fed at run time (older models also list their initializers as inputs)."""
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def input_dims(model: onnx.ModelProto) -> dict[str, tuple[Dim, ...] | None]:
    """Per runtime input: its dims (a positive int, the name of a symbolic dim, or None when unknown); None when its
    rank is unknown."""
    out: dict[str, tuple[Dim, ...] | None] = {}
    for value in runtime_inputs(model):
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
            out[value.name] = None
            continue
        out[value.name] = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                                else (d.dim_param or None) for d in tensor.shape.dim)
    return out


_ANONYMOUS_DIM = re.compile(r"\?*|[-+]?\d+")


def is_anonymous_dim(name: str | None) -> bool:
    """A symbolic dimension whose name says "unknown" rather than naming a size: none, '', '?', or a number such as
    '-1' (Paddle2ONNX names every unknown dim '?', as in ``x: [-1, 3, '?', '?']``). Such a dim is its own: two of
    them are not one size, unlike two dims that share a real name ('batch', 'height')."""
    return name is None or _ANONYMOUS_DIM.fullmatch(name.strip()) is not None


def show_dims(dims: Sequence[Dim] | None) -> str:
    return "rank unknown" if dims is None else "x".join("?" if d is None else str(d) for d in dims)


def symbolic_inputs(model: onnx.ModelProto, *, allow_batch: bool = True) -> dict[str, tuple[Dim, ...] | None]:
    """The runtime inputs whose shape is not static: a symbolic or unknown dimension (``allow_batch``: other than
    axis 0, which npukit runs as 1), or an unknown rank."""
    return {name: dims for name, dims in input_dims(model).items()
            if dims is None or any(not isinstance(d, int) for d in dims[1 if allow_batch else 0:])}


def require_static(model: onnx.ModelProto, *, needs: str, allow_batch: bool = True) -> None:
    """InputError naming each input with symbolic dimensions and the ``--input-shape`` to pass, unless every input
    is static (``allow_batch``: a symbolic axis 0 alone is fine; it runs as 1). ``needs`` says what needs them."""
    symbolic = symbolic_inputs(model, allow_batch=allow_batch)
    if not symbolic:
        return
    shown = "; ".join(f"input {name!r} is {show_dims(dims)}" for name, dims in symbolic.items())
    flags = " ".join(f"--input-shape {name}={_placeholder(dims)}" for name, dims in symbolic.items())
    raise InputError(f"{needs} needs static input shapes and the model's are symbolic ({shown})",
                     hint=f"pass the sizes to use: {flags}, with each symbolic name replaced by a number")


def _placeholder(dims: tuple[Dim, ...] | None) -> str:
    if dims is None:
        return "N,C,H,W"
    # a batch axis anywhere (Silero's state [2, batch, 128]): 1; an anonymous dim (Paddle2ONNX's '?'): D<axis>
    return ",".join("1" if not isinstance(d, int) and (axis == 0 or "batch" in str(d).lower()) else
                    str(d) if isinstance(d, int) else
                    (d if len(d or "") <= 8 and not is_anonymous_dim(d) else f"D{axis}")
                    for axis, d in enumerate(dims))


# ------------------------------------------------------------------------------------------------- fixing shapes

class InputShapeOverride(UserWarning):
    """A static input dimension of the model was set to another size because the user's ``--input-shape`` said so;
    the verb's report lists it (as a message counted while the verb ran)."""


def apply_input_spec(model: onnx.ModelProto, spec: InputSpec | None, *, dynamic_batch: bool = False,
                     override_static: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` with the shapes of ``spec`` written into its inputs and shapes inferred afresh;
    ``model`` itself when ``spec`` is None.

    A symbolic dimension's name is one size everywhere: an input not in ``spec`` that shares it takes the size too,
    and two sizes for one name are an error; a dim whose name only says "unknown" ('?', '', '-1': see
    ``is_anonymous_dim``) is its own. ``dynamic_batch`` keeps (or makes) axis 0 of the given inputs symbolic
    ("batch"). A static dimension given another size (unless ``override_static`` is off, then an error) is
    overridden: an ``InputShapeOverride`` warning says so (the report lists it) and the model is run once in ORT on
    seeded inputs of the new shape, so that a model that cannot run at it is an InputError naming the failing node.
    Every value_info and output shape is inferred afresh; an output whose shape inference cannot work out keeps its
    declared rank (dims sized from the inputs where they share a name, else unknown), since ONNX requires a shape on
    a graph output. Shapes that do not fit the model (shape inference fails) are an InputError."""
    if spec is None:
        return model
    resolved = spec.resolve(model, override_static=override_static)
    sizes, overridden = _named_sizes(model, resolved, dynamic_batch=dynamic_batch)
    fixed = _with_input_shapes(model, resolved, sizes, dynamic_batch=dynamic_batch)
    # Shapes recorded for the old inputs would conflict with the new ones: infer them afresh.
    outputs_declared = {o.name: _copy_shape(o) for o in fixed.graph.output}
    fixed.graph.ClearField("value_info")
    for output in fixed.graph.output:
        if output.type.tensor_type.HasField("shape"):
            output.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(fixed, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        where = _failing_node(fixed, first_line(exc))
        raise InputError(f"input shape {spec.describe()} does not fit the model"
                         + (f" (static input size(s) overridden: {'; '.join(overridden)})" if overridden else "")
                         + f": {where or first_line(exc)}",
                         hint="pass the shape the model was made for with --input-shape") from exc
    _keep_output_ranks(inferred, outputs_declared, {d: size for d, (size, _) in sizes.items()},
                       keep_static=not overridden)
    declared = input_dims(model)
    filled = [f"{name} axis {axis}: {d or '?'} -> {size}" for name, shape in resolved.items()
              for axis, (d, size) in enumerate(zip(declared.get(name) or (), shape))
              if axis > 0 and not isinstance(d, int)]
    if overridden or filled:
        _check_runs(inferred, spec, overridden, filled)
    if overridden:
        with warnings.catch_warnings():
            warnings.simplefilter("always", InputShapeOverride)
            warnings.warn(f"static input size(s) overridden by --input-shape ({'; '.join(overridden)}): the model "
                          "declared other sizes; it was run once at the new shape in ONNX Runtime, and output "
                          "shapes were inferred afresh", InputShapeOverride, stacklevel=2)
    return inferred


def _named_sizes(model: onnx.ModelProto, resolved: Mapping[str, Sequence[int]], *,
                 dynamic_batch: bool) -> tuple[dict[str, tuple[int, str]], list[str]]:
    """The size each named symbolic dim takes from the given shapes (dim_param -> (size, the input that set it)),
    refusing two sizes for one name, and the static dims the shapes override ("input.1 axis 0: 10 -> 1")."""
    declared = input_dims(model)
    sizes: dict[str, tuple[int, str]] = {}  # dim_param -> (size, the input that set it)
    overridden: list[str] = []  # "input.1 axis 0: 10 -> 1"
    for name, shape in resolved.items():
        for axis, (d, size) in enumerate(zip(declared[name] or (), shape)):
            if isinstance(d, int) and d != size:
                overridden.append(f"{name} axis {axis}: {d} -> {size}")
            if isinstance(d, str) and not is_anonymous_dim(d) and not (dynamic_batch and axis == 0):
                # a batch kept symbolic is no size: an output declared with its name keeps it (RetinaFace's outputs,
                # which shape inference cannot follow, were pinned to batch 1 and every batched request failed)
                if d in sizes and sizes[d][0] != size:
                    raise InputError(f"symbolic dimension {d!r} is {sizes[d][0]} for input {sizes[d][1]!r} but "
                                     f"{size} for input {name!r}",
                                     hint="give one size per symbolic dimension across the inputs")
                sizes.setdefault(d, (size, name))
    return sizes, overridden


def _with_input_shapes(model: onnx.ModelProto, resolved: Mapping[str, Sequence[int]],
                       sizes: Mapping[str, tuple[int, str]], *, dynamic_batch: bool) -> onnx.ModelProto:
    """A copy of ``model`` whose given inputs have the ``resolved`` shapes and whose other inputs take the sizes of
    the symbolic dims they share (axis 0 kept "batch" with ``dynamic_batch``); nothing else is changed yet."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in runtime_inputs(fixed):
        tensor = value.type.tensor_type
        if value.name in resolved:
            shape = resolved[value.name]
            tensor.shape.ClearField("dim")
            for axis, size in enumerate(shape):
                dim = tensor.shape.dim.add()
                if axis == 0 and dynamic_batch:
                    dim.dim_param = "batch"
                else:
                    dim.dim_value = int(size)
        elif tensor.HasField("shape"):
            for axis, dim in enumerate(tensor.shape.dim):
                if dim.dim_param in sizes and not (dynamic_batch and axis == 0):
                    size = sizes[dim.dim_param][0]
                    dim.Clear()
                    dim.dim_value = size
    return fixed


def _copy_shape(value: onnx.ValueInfoProto) -> onnx.TensorShapeProto | None:
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return None
    shape = onnx.TensorShapeProto()
    shape.CopyFrom(tensor.shape)
    return shape


def _keep_output_ranks(model: onnx.ModelProto, declared: Mapping[str, onnx.TensorShapeProto | None],
                       sizes: Mapping[str, int], *, keep_static: bool) -> None:
    """Graph outputs that shape inference left without a shape get their declared rank back, in place: a dim named
    like a fixed input dim takes its size, another symbolic name stays, a static size stays when ``keep_static``
    (no static input size was changed, so the model's own claim still holds), else the dim is unknown."""
    for output in model.graph.output:
        tensor = output.type.tensor_type
        shape = declared.get(output.name)
        if not output.type.HasField("tensor_type") or tensor.HasField("shape") or shape is None:
            continue
        tensor.shape.SetInParent()  # rank 0 when the declaration was a scalar
        for old in shape.dim:
            dim = tensor.shape.dim.add()
            if old.HasField("dim_param") and old.dim_param in sizes:
                dim.dim_value = sizes[old.dim_param]
            elif old.HasField("dim_param"):
                dim.dim_param = old.dim_param
            elif old.HasField("dim_value") and old.dim_value > 0 and keep_static:  # -1: Paddle's "unknown"
                dim.dim_value = old.dim_value


def _check_runs(model: onnx.ModelProto, spec: InputSpec, overridden: Sequence[str],
                filled: Sequence[str] = ()) -> None:
    """Run ``model`` once in ORT (graph optimizations off, seeded inputs) after a static input size was overridden
    or a symbolic one past the batch given a size (``filled``: Silero VAD's 'sequence' at 100 fails in its STFT
    Conv, which optimize-graph's check met as an internal error); an InputError naming the failing node when it
    cannot run at that shape. Skipped while some input is still symbolic (the verb's own checks run it then)."""
    from npukit.runtime.ort import make_session, random_feeds

    if overridden:
        what = (f"input shape {spec.describe()} changes static input size(s) of the model "
                f"({'; '.join(overridden)}) and the model does not run at it")
        hint = ("the model was made for its declared size; pass that shape, or re-export the model with that "
                "dimension symbolic")
    else:
        what = f"the model does not run at input shape {spec.describe()} (sizes given: {'; '.join(filled)})"
        hint = "pass sizes the model takes (its maker's code or documentation says which)"
    try:
        session = make_session(model, optimization="disable")
    except InputError as exc:
        raise InputError(f"{what}: {_ort_failure(exc.message)}", hint=hint) from exc
    try:
        feeds = random_feeds(session, seed=0)
    except InputError:
        return
    import onnxruntime as ort

    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # the failure is reported in the InputError, not logged to the terminal too
    try:
        session.run(None, feeds, quiet)
    except Exception as exc:  # ORT raises its own error types per status code
        raise InputError(f"{what}: {_ort_failure(first_line(exc))}", hint=hint) from exc


def _failing_node(model: onnx.ModelProto, message: str) -> str | None:
    """The first node, in graph order, whose inputs all have shapes after a lenient shape inference but whose
    outputs do not: where a strict inference failed with ``message`` (kept when it names another op type), shown
    with its input shapes; None when no such node is found."""
    try:
        lenient = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - only a better message is at stake
        return None
    shapes: dict[str, str] = {t.name: "x".join(map(str, t.dims)) or "scalar" for t in lenient.graph.initializer}
    for value in (*lenient.graph.input, *lenient.graph.value_info, *lenient.graph.output):
        if value.type.tensor_type.HasField("shape"):
            shapes[value.name] = "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                                          for d in value.type.tensor_type.shape.dim) or "scalar"
    stated = re.search(r"op_type:(\w+)", message)
    for index, node in enumerate(lenient.graph.node):
        inputs = [i for i in node.input if i]
        if node.op_type in ("If", "Loop", "Scan") or not all(i in shapes for i in inputs):
            continue
        if all(o in shapes for o in node.output if o):
            continue
        if stated and stated.group(1) != node.op_type:
            return None
        name = f"{node.name!r} ({node.op_type})" if node.name else f"#{index} ({node.op_type}, unnamed)"
        given = ", ".join(f"{i!r} {shapes[i]}" for i in inputs)
        reason = re.sub(r"^.*\[ShapeInferenceError\]\s*", "", message)
        return f"node {name} fails on inputs {given}: {reason}"
    return None


def _ort_failure(message: str) -> str:
    """ORT's error line cut to the node and reason: "Non-zero status code returned while running Reshape node.
    Name:'r' Status Message: ..." -> "node 'r' (Reshape) fails: ..."."""
    found = re.search(r"running (\w+) node\. Name:'([^']*)' Status Message: (.*)", message)
    if found:
        op, node, reason = found.groups()
        return f"{f'node {node!r} ({op})' if node else f'an unnamed {op} node'} fails: {reason.strip()}"
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message)


def fixed_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """The static shapes of ``model``'s runtime inputs, a symbolic axis 0 taken as 1 (inputs that are not static
    otherwise are left out)."""
    out = {}
    for name, dims in input_dims(model).items():
        if dims is None:
            continue
        shape = tuple(1 if axis == 0 and not isinstance(d, int) else d for axis, d in enumerate(dims))
        if all(isinstance(d, int) for d in shape):
            out[name] = shape  # type: ignore[assignment]
    return out


def load_with_inputs(path: Any, spec: InputSpec | str | Sequence[Any] | Mapping[str, Any] | None, *,
                     needs: str | None = None, allow_batch: bool = True,
                     keep_batch: bool = False, compiled: bool = False) -> onnx.ModelProto:
    """Load the ONNX model at ``path`` with ``spec``'s shapes fixed into it first; with ``needs`` (what needs static
    shapes, for the message) a model left with symbolic dimensions is an InputError naming them and the flag.
    ``keep_batch``: where every input the spec sizes has a symbolic batch (axis 0), it stays symbolic (a server
    batches requests on it); the spec fixes the other dimensions. A compiled HTP context model is refused
    (``onnx_io.refuse_context_model``) unless ``compiled`` (the caller runs it on the HTP)."""
    from npukit.frontend.onnx_io import load_onnx, refuse_context_model

    loaded = load_onnx(path)
    if not compiled:
        refuse_context_model(loaded, path)
    model = fix_inputs(loaded, spec, keep_batch=keep_batch)
    if needs:
        require_static(model, needs=needs, allow_batch=allow_batch)
    return model


def fix_inputs(model: onnx.ModelProto, spec: InputSpec | str | Sequence[Any] | Mapping[str, Any] | None, *,
               keep_batch: bool = False) -> onnx.ModelProto:
    """``model`` with ``spec``'s shapes fixed into it (``load_with_inputs`` for a model in memory; ``keep_batch``
    as there)."""
    parsed = InputSpec.parse(spec)
    symbolic = False
    if keep_batch and parsed is not None:
        declared = input_dims(model)
        given = parsed.resolve(model, override_static=True)
        # a batch the model leaves unknown (Paddle's -1, an unnamed dim) is as symbolic as a named one
        symbolic = bool(given) and all(declared.get(name) and not isinstance(declared[name][0], int) for name in given)
        several = {name: shape[0] for name, shape in given.items() if shape and shape[0] != 1}
        if symbolic and several:  # the sizes are one request's: a batch of 4 was quietly served as 1-row requests
            name, rows = next(iter(several.items()))
            raise InputError(f"--input-shape gives input {name!r} a batch of {rows}, but a request holds one sample: "
                             "requests are stacked along the model's symbolic batch by the runtime",
                             hint="give the sizes of one sample (batch 1); --max-batch (max_batch= in Python) sets "
                                  "how many the runtime stacks")
    return apply_input_spec(model, parsed, dynamic_batch=symbolic)


def fix_input_shape(model: onnx.ModelProto, shape: tuple[int, ...], *, dynamic_batch: bool) -> onnx.ModelProto:
    """A copy of ``model`` whose first input has ``shape`` (dim 0 named "batch" if dynamic_batch), re-inferred: the
    first-input form of ``apply_input_spec``, which may also resize static dimensions."""
    return apply_input_spec(model, InputSpec(((None, tuple(shape)),)), dynamic_batch=dynamic_batch,
                            override_static=True)
