"""Read ONNX files with one-line errors for every way they can be wrong, write them atomically, fix input shapes."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from npukit._atomic import atomic_path
from npukit.errors import InputError
from npukit.frontend._messages import first_line

# Protobuf cannot serialize a message of 2 GiB or more; leave room for the graph itself.
SINGLE_FILE_LIMIT_BYTES = 2**31 - 2**27

_NOT_ONNX_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"GIF8", "a GIF image"),
    (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "a zip archive (a PyTorch checkpoint or .pt2 file?)"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"\x80\x02", "a Python pickle (a PyTorch checkpoint?)"),
)
_ONNX_HINT = "pass an .onnx file saved by torch.onnx.export or onnx.save"
# flatbuffer file identifiers (bytes 4-8): a phone runtime's artifact, which compile checked on its runtime
_MOBILE_IDENTIFIERS = {b"ET12": "an ExecuTorch program (.pte)", b"TFL3": "a LiteRT (TFLite) model"}
_MOBILE_HINT = ("npukit reads ONNX here; compile ran and checked it on its runtime (see its report); give the ONNX "
                "model (npukit export) to this verb")


# metadata_props key an export of an untrained architecture (torchvision:NAME without --weights) carries, so the
# verbs that read the ONNX model later can say so in their verdict (``UntrainedWeights``)
UNTRAINED_KEY = "npukit.untrained"


class UntrainedWeights(UserWarning):
    """The model read was exported from an untrained architecture (random weights): whatever a check holds its
    artifact to says nothing of the trained model. ``report.finish`` lists it and adds it to the verdict."""


def mark_untrained(model: onnx.ModelProto | ir.Model, spec: str) -> None:
    """Record in ``model``'s metadata that it is ``spec``'s architecture with random weights."""
    value = f"{spec} without --weights (random weights)"
    if isinstance(model, ir.Model):
        model.metadata_props[UNTRAINED_KEY] = value
        return
    for i in reversed([i for i, p in enumerate(model.metadata_props) if p.key == UNTRAINED_KEY]):
        del model.metadata_props[i]
    model.metadata_props.add(key=UNTRAINED_KEY, value=value)


def untrained_note(model: onnx.ModelProto) -> str | None:
    """What ``mark_untrained`` recorded, or None."""
    return next((p.value for p in model.metadata_props if p.key == UNTRAINED_KEY), None)


def is_context_model(model: onnx.ModelProto) -> bool:
    """Whether ``model`` holds a compiled EPContext node (it runs only on the execution provider that wrote it)."""
    return any(n.op_type == "EPContext" for n in model.graph.node)


def refuse_context_model(model: onnx.ModelProto, path: str | Path) -> None:
    """An InputError for a compiled context model (``npukit compile``'s EPContext output): its graph is one opaque
    node holding a binary for Qualcomm's HTP, which no step reading the ONNX graph can read."""
    if is_context_model(model):
        raise InputError(f"{Path(str(path)).name} is a compiled HTP context model (EPContext): its graph is one "
                         "node holding a context binary for Qualcomm's HTP, which this command cannot read",
                         hint="give the ONNX model `npukit compile` was given (the QDQ or the float model); "
                              "`npukit bench MODEL --target qnn-htp` times the compiled one")


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Load and check an ONNX model (with any external data beside it); bad files raise a one-line InputError."""
    if not isinstance(path, (str, Path)):  # a ModelProto or a torch module given in Python
        raise InputError(f"this command reads an ONNX model file, not a {type(path).__name__} given in Python",
                         hint="save an onnx.ModelProto with onnx.save(model, 'model.onnx') and pass the path; export "
                              "a torch module first with npukit.export(module, 'model.onnx', input_shape=...)")
    given, path = str(path), Path(path)
    if not path.exists():
        if re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*(\(.*\))?", given):  # torchvision:NAME, module:factory
            raise InputError(f"{given} is a PyTorch model; this command takes an ONNX model",
                             hint=f"export it first: npukit export {given} -o model.onnx (with --input-shape if "
                                  "it has no default), then pass model.onnx")
        raise InputError(f"{path} does not exist", hint=_ONNX_HINT)
    if path.is_dir():
        raise InputError(f"{path} is a directory, not an ONNX file", hint=_ONNX_HINT)
    with path.open("rb") as f:
        head = f.read(4096)
    if not head:
        raise InputError(f"{path} is empty", hint=_ONNX_HINT)
    kind = _sniff_not_onnx(head)
    if kind:
        raise InputError(f"{path} is {kind}, not an ONNX model",
                         hint=_MOBILE_HINT if kind in _MOBILE_IDENTIFIERS.values() else _ONNX_HINT)
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InputError(f"{path} is not a readable ONNX model (truncated or corrupt?): {first_line(exc)}",
                         hint="export or download it again") from exc
    if model.ir_version == 0 or not model.graph.node or not model.graph.input:
        raise InputError(f"{path} is not a complete ONNX model (truncated or corrupt?): its graph has "
                         f"{len(model.graph.node)} nodes and {len(model.graph.input)} inputs",
                         hint="export or download it again")
    external = any(external_data_helper.uses_external_data(t) for t in model.graph.initializer)
    if external:
        _load_external_data(model, path)
    try:
        # The checker cannot take an in-memory model of 2 GB or more; from the path it reads the data itself.
        onnx.checker.check_model(str(path) if external else model)
    except onnx.checker.ValidationError as exc:
        raise InputError(f"{path} fails the ONNX checker: {first_line(exc)}",
                         hint="re-export the model, or fix it with onnx tools") from exc
    untrained = untrained_note(model)
    if untrained:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("always", UntrainedWeights)
            warnings.warn(f"{path.name} comes from {untrained}: the checks say nothing of the trained "
                          "model; export it again with --weights", UntrainedWeights, stacklevel=2)
    return model


def _sniff_not_onnx(head: bytes) -> str | None:
    if head[4:8] in _MOBILE_IDENTIFIERS:
        return _MOBILE_IDENTIFIERS[head[4:8]]
    for signature, kind in _NOT_ONNX_SIGNATURES:
        if head.startswith(signature):
            return kind
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if all(c.isprintable() or c in "\r\n\t" for c in text):
        return "a text file"
    return None


def _load_external_data(model: onnx.ModelProto, path: Path) -> None:
    for tensor in model.graph.initializer:
        if not external_data_helper.uses_external_data(tensor):
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if not (path.parent / location).is_file():
            raise InputError(f"external data file {location!r} of {path} is missing",
                             hint="keep the model's .data file beside the .onnx file")
    try:
        external_data_helper.load_external_data_for_model(model, str(path.parent))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the external data of {path}: {first_line(exc)}",
                         hint="export the model again") from exc


def initializer_bytes(model: ir.Model) -> int:
    """Bytes of every initializer of ``model``, subgraphs included: what decides one file or external data."""
    return sum(v.const_value.nbytes for g in (model.graph, *model.graph.subgraphs())
               for v in g.initializers.values() if v.const_value is not None)


def onnx_bytes(model: onnx.ModelProto) -> bytes:
    """The bytes ``save_onnx`` writes for ``model`` (under 2 GB of weights): what a size in a report must count. The
    serializer adds every value's shape it knows; optimize counted the model's own bytes, 8.5% fewer than its file
    (PP-OCR cls: 307,241 reported, 333,427 written)."""
    from onnx_ir.passes.common import RemoveUnusedOpsetsPass

    ir_model = ir.serde.deserialize_model(model)
    RemoveUnusedOpsetsPass()(ir_model)
    return ir.serde.serialize_model(ir_model).SerializeToString()


def save_onnx(model: onnx.ModelProto | ir.Model, path: str | Path) -> Path:
    """Write ``model`` atomically: one file under 2 GB of weights, else ``<name>.data`` beside it, without the opset
    imports no node uses (an export through torch declares org.pytorch.aten, ai.onnx.preview.training and others,
    which stricter converters refuse; removed from an ``ir.Model`` given too). Returns ``path``."""
    from onnx_ir.passes.common import RemoveUnusedOpsetsPass

    path = Path(path)
    ir_model = model if isinstance(model, ir.Model) else ir.serde.deserialize_model(model)
    RemoveUnusedOpsetsPass()(ir_model)
    if initializer_bytes(ir_model) < SINGLE_FILE_LIMIT_BYTES:
        with atomic_path(path) as tmp:
            ir.save(ir_model, tmp)
        return path
    data_path = path.with_name(path.name + ".data")
    existed = data_path.exists()
    try:
        with atomic_path(path) as tmp:
            ir.save(ir_model, tmp, external_data=data_path.name)
    except BaseException:
        if not existed:
            with contextlib.suppress(FileNotFoundError):
                data_path.unlink()
        raise
    return path


def shapeless_outputs(model: onnx.ModelProto) -> list[str]:
    """The main graph's outputs whose tensor type has no shape: the ONNX checker requires one there (a value_info
    or a subgraph's output may lack it)."""
    return [o.name for o in model.graph.output
            if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape")]


def complete_output_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when every main-graph output has a shape, else a copy where each that lacks one takes it
    from a value_info of the same name or from a lenient shape inference (what is known of its dims; its rank at
    least). Outputs of unknown rank stay as they are (``shapeless_outputs`` names them). Value_info entries without
    a shape are kept: the checker takes them, and their element type may be all that is known of a value."""
    missing = set(shapeless_outputs(model))
    if not missing:
        return model
    known = {v.name: v.type.tensor_type.shape for v in model.graph.value_info
             if v.name in missing and v.type.tensor_type.HasField("shape")}
    if len(known) < len(missing):
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception:  # noqa: BLE001 - nothing more to learn then
            inferred = None
        if inferred is not None:
            for value in (*inferred.graph.value_info, *inferred.graph.output):
                if value.name in missing and value.name not in known and value.type.tensor_type.HasField("shape"):
                    known[value.name] = value.type.tensor_type.shape
    if not known:
        return model
    repaired = onnx.ModelProto()
    repaired.CopyFrom(model)
    for output in repaired.graph.output:
        if output.name in known:
            output.type.tensor_type.shape.CopyFrom(known[output.name])
    return repaired


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are fed at run time (older models also list their initializers as inputs)."""
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def static_input_shape(model: onnx.ModelProto) -> tuple[int, ...] | None:
    """The first input's shape with a symbolic batch taken as 1; None when another dim is symbolic or unknown."""
    inputs = graph_inputs(model)
    if not inputs or not inputs[0].type.tensor_type.HasField("shape"):
        return None
    shape = []
    for axis, dim in enumerate(inputs[0].type.tensor_type.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            shape.append(dim.dim_value)
        elif axis == 0:
            shape.append(1)
        else:
            return None
    return tuple(shape)


# Ops of a model that is quantized already: Q/DQ pairs (the QDQ format), or the operator format's integer kernels.
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
INTEGER_OPS = frozenset({"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "QGemm", "QAttention",
                         "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM", "MatMulNBits",
                         "QEmbedLayerNormalization", "QuantizeBFP", "DequantizeBFP"})


def quantized_ops(model: onnx.ModelProto) -> dict[str, int]:
    """{op type: count} of the quantization ops in ``model`` (subgraphs included): Q/DQ nodes, QLinear* kernels,
    ConvInteger / MatMulInteger / DynamicQuantizeLinear and ONNX Runtime's contrib integer ops; {} for a float model."""
    found: dict[str, int] = {}

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            if node.op_type in QDQ_OPS or node.op_type in INTEGER_OPS or node.op_type.startswith("QLinear"):
                found[node.op_type] = found.get(node.op_type, 0) + 1
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    walk(sub)

    walk(model.graph)
    return dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))


def named_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when every node has a unique name, else a copy naming the others ``<op_type>_<index>``
    (with a suffix where that is taken). Node names are how exclusions, 16-bit layers, the float head and the
    reports refer to nodes, so an unnamed node must not share the name "" with every other."""
    names = [n.name for n in model.graph.node]
    if all(names) and len(set(names)) == len(names):
        return model
    named = onnx.ModelProto()
    named.CopyFrom(model)
    taken = set(names)
    seen: set[str] = set()
    for index, node in enumerate(named.graph.node):
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = name = f"{node.op_type}_{index}"
        suffix = 0
        while name in taken:
            suffix += 1
            name = f"{base}_{suffix}"
        node.name = name
        taken.add(name)
        seen.add(name)
    return named
