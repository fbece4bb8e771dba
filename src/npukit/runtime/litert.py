"""LiteRT (TensorFlow Lite's successor): convert a torch program to a .tflite flatbuffer (litert-torch), load it in
LiteRT's interpreter with its default XNNPACK delegate (ai-edge-litert), run it.

LiteRT is an optional extra (``pip install 'npukit[litert]'``, installed by scripts/setup.sh); it is imported only here
and only when the litert target is used (``import litert_torch`` alone takes several seconds: it loads jax).

A PT2E-converted program (q/dq ops from ``convert_pt2e(..., fold_quantize=False)``: the weights' quantize ops kept, as
LiteRT's converter reads them) becomes an integer model whose input and output tensors are int8 or float32 as the
converter leaves each; the runner quantizes int8 inputs and dequantizes int8 outputs on the model's own grids, so
callers feed and read float arrays either way.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib.util
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from npukit._atomic import write_bytes_atomic
from npukit.errors import InputError, ToolError
from npukit.frontend.provenance import Placement, origin, placements
from npukit.frontend.spec import eval_mode
from npukit.quant.emit.pt2e import CarryOptions
from npukit.runtime.litert_float_ops import float_islands
from npukit.runtime.tensors import plain_tensor

# int8 I/O tensors: the caller quantizes inputs and dequantizes outputs with each tensor's scale (npukit's checks do)
INT8_IO = "quantize int8 inputs, dequantize int8 outputs by their tensors' scales; npukit's checks do"
EXTRA_HINT = "install it with: .venv/bin/pip install 'npukit[litert]' (scripts/setup.sh does)"
# how npukit's plan is carried for LiteRT's converter (see CarryOptions): weights' quantize ops kept, averages on
# their input's grid, concatenations on one grid (no requantized edge: a producer that also feeds others widened)
CARRY = CarryOptions(fold_quantize=False, average_grids=False, same_scale_concat=True, requantize_edges=False,
                     transposed_convs=True, float_concat_inputs=True)


def require() -> None:
    """litert-torch and the LiteRT interpreter are installed, or an InputError that says how to install them."""
    # executorch: its XNNPACK quantizer's annotation is what npukit's plan is carried on (npukit.quant.emit.pt2e)
    for module in ("litert_torch", "ai_edge_litert", "executorch"):
        if importlib.util.find_spec(module) is None:
            raise InputError(f"the litert target needs {module.replace('_', '-')}, which is not installed",
                             hint=EXTRA_HINT)
    for name in ("torch.utils._pytree", "absl", "jax._src.xla_bridge"):  # import-time notices, not the user's business
        logging.getLogger(name).setLevel(logging.ERROR)


def cannot_run() -> str | None:
    """Why this machine cannot run the runtime's artifacts: never (it runs on the CPU here)."""
    return None


@dataclasses.dataclass(frozen=True)
class Lowered:
    """A .tflite model's bytes and its operators."""

    buffer: bytes
    ops: dict[str, int]  # the model's builtin operators by name
    delegation: Delegation  # what LiteRT's XNNPACK delegate takes when the model is loaded
    int8_io: bool  # some input or output tensor is int8 (the runner quantizes and dequantizes those)
    float_weighted: int = 0  # convolutions and fully connected ops whose weights are float32 (computed in float)
    # each input's and output's name and dtype as the interpreter has them ("int8" for a quantized one): a face net's
    # probabilities stay float32 beside its int8 box offsets, which one flag for all said were int8
    io_dtypes: tuple[tuple[str, str], ...] = ()
    # the int8 grids the lowering itself wrote, not the plan's: a hardswish's x/6 and gate (``_hardswish_as_int8_ops``)
    inner_grids: frozenset[tuple[float, int]] = frozenset()

    def summary(self) -> dict[str, Any]:
        return {"bytes": len(self.buffer), "ops": dict(self.ops), "int8_io": self.int8_io,
                "io_dtypes": dict(self.io_dtypes), "float_weighted": self.float_weighted} | self.delegation.summary()

    def write(self, output: Path) -> None:
        write_bytes_atomic(output, self.buffer)

    def table(self) -> tuple[str, list[str], list[list[Any]]]:
        left = ", ".join(f"{k} x{v}" for k, v in self.delegation.left.items()) or "none"
        return ("LiteRT model", ["file bytes", "operators", "ops in XNNPACK", "ops left to LiteRT's kernels",
                                 "input/output"],
                [[len(self.buffer), sum(self.ops.values()), self.delegation.delegated, left, self._io()]])

    def _io(self) -> str:
        """The I/O dtypes, and what a caller does with int8 ones."""
        kinds = {dtype for _, dtype in self.io_dtypes}
        if len(kinds) > 1:
            listed = ", ".join(f"{name} {dtype}" for name, dtype in self.io_dtypes)
            return f"{listed} ({INT8_IO})"
        return f"int8 ({INT8_IO})" if self.int8_io else "float32"


@dataclasses.dataclass(frozen=True)
class Delegation:
    """Which of a model's operators LiteRT's XNNPACK delegate took when the interpreter was built."""

    delegated: int
    partitions: int
    left: dict[str, int]  # operators LiteRT runs with its own kernels, by name

    def summary(self) -> dict[str, Any]:
        return {"delegated_ops": self.delegated, "partitions": self.partitions, "left": dict(self.left)}


def lower(program: torch.nn.Module, example: Sequence[torch.Tensor], *,
          names: tuple[Sequence[str], Sequence[str]] | None = None) -> Lowered:
    """``program`` (float, or PT2E-converted with the weights' quantize ops kept) converted to a .tflite model
    (``names`` unused: the converter names the signature's tensors)."""
    with _quiet():  # importing it starts TensorFlow's runtime, which prints absl and oneDNN notices to stderr
        import litert_torch

    args = tuple(plain_tensor(x) for x in example)
    quant = _static_int8_config() if _has_qdq(program) else None
    inner = _hardswish_as_int8_ops(program) if quant is not None else frozenset()
    program = _zero_padded_max_pools(eval_mode(program), args)
    if quant is None:
        program = _prelu_on_4d(program)
    try:
        with _quiet():
            edge = litert_torch.convert(program, args, quant_config=quant)
            buffer = bytes(edge.model_content())
    except Exception as exc:  # noqa: BLE001 - a failure inside LiteRT's converter, said in one line
        cause = _root_cause(exc)
        same_scale = quant is not None and "same scale constraint" in cause
        raise ToolError(f"LiteRT's converter failed on this model: {cause}", hint=(
            "npukit's int8 grids broke LiteRT's rule that a concatenation's inputs share its grid (a gap in npukit: "
            "please report the model); compile the float model (no --calib), or --target executorch-xnnpack"
            if same_scale else "try --target executorch-xnnpack, or npukit quantize on its ONNX export")) from exc
    if quant is not None:
        buffer, _ = float_islands(buffer)
    interpreter = _interpreter(buffer, threads=1)
    taken = delegation(interpreter)
    details = interpreter._get_ops_details()
    ops = collections.Counter(op["op_name"] for op in details if op["op_name"] != "DELEGATE")
    inputs = interpreter.get_input_details()
    dtypes = {d["index"]: d["dtype"] for d in interpreter.get_tensor_details()}
    weighted = [op for op in details if op["op_name"] in WEIGHTED_OPS and len(op["inputs"]) > 1]
    io = (*inputs, *interpreter.get_output_details())
    return Lowered(buffer=buffer, ops=dict(ops), delegation=taken, int8_io=any(_quantized(d) for d in io),
                   io_dtypes=tuple((d["name"], "int8" if _quantized(d) else np.dtype(d["dtype"]).name) for d in io),
                   float_weighted=sum(dtypes.get(int(op["inputs"][1])) == np.float32 for op in weighted),
                   inner_grids=inner)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """litert-torch prints a line per conversion stage unless told not to (an environment variable it reads), and
    its converter logs to the process's stderr: both kept off the terminal, the converter's warnings and errors
    passed to the log (the report's library messages)."""
    from npukit.report.capture import capture_native_output

    before = os.environ.get(_PROGRESS)
    os.environ[_PROGRESS] = "n"
    try:
        with capture_native_output() as native:
            yield
    finally:
        if before is None:
            os.environ.pop(_PROGRESS, None)
        else:
            os.environ[_PROGRESS] = before
        _log_native(native())


def _log_native(text: str) -> None:
    """Native lines worth keeping (warnings and errors; not INFO notices) to the log."""
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("I0000", "INFO:", "WARNING: All log messages before absl")) \
                and "Created TensorFlow Lite XNNPACK delegate" not in line:
            logging.getLogger("litert").warning(line[:300])


_PROGRESS = "LITERT_TORCH_SHOW_PROGRESS"
WEIGHTED_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED")


def unhonoured_floats(lowered: Lowered, qdq: Any) -> str | None:
    """Why the .tflite does not compute what the plan's QDQ model ``qdq`` does, where LiteRT's converter quantized
    layers the plan keeps in float: in static int8 mode it quantizes a float op between quantized tensors itself (its
    own weight grid), which a float conv or linear the plan keeps (a float lift, a fragile depthwise conv) is. None
    where every such layer stayed float."""
    inits = {i.name for i in qdq.graph.initializer}
    planned = sum(n.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul") and len(n.input) > 1 and n.input[1] in inits
                  for n in qdq.graph.node)
    if lowered.float_weighted >= planned:
        return None
    return (f"LiteRT's converter quantized {planned - lowered.float_weighted} of the {planned} conv/linear layer(s) "
            "npukit's plan keeps in float (it quantizes a float op between quantized tensors)")


def _static_int8_config() -> Any:
    """LiteRT's quantization mode flag for a program that already carries its q/dq ops (static int8); the quantizer
    inside is only read for that flag, never run."""
    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from litert_torch.quantize.quant_config import QuantConfig

    return QuantConfig(pt2e_quantizer=PT2EQuantizer().set_global(get_symmetric_quantization_config(
        is_per_channel=True)))


def _has_qdq(program: Any) -> bool:
    graph = getattr(program, "graph", None)
    return graph is not None and any(n.op == "call_function" and "quantized_decomposed" in str(n.target)
                                     for n in graph.nodes)


def _hardswish_as_int8_ops(program: Any) -> frozenset[tuple[float, int]]:
    """Each hardswish of ``program`` (PT2E-converted) that reads an int8 grid written, in place, in int8 ops XNNPACK
    takes: m = x * 1/6 on x's grid scaled by 1/6 (the same integers), h = m + 0.5 on [0, 1] (its grid is the clamp),
    y = x * h. Left as it is, the converter makes it an int8 HARD_SWISH, which LiteRT's XNNPACK delegate refuses
    (float types only): each ran in LiteRT's reference kernel between two delegate partitions, and an INT8 LR-ASPP
    .tflite (128x128, 1 thread) took 4.26 ms to its fp32 .tflite's 3.59 (written so: 1.68 ms, SQNR 15.09 -> 15.08 dB
    on 18 crops; MobileNetV3-Small 0.74 -> 0.29 ms, fp32 0.52). On a grid finer than ``_FINEST_GATED`` (|x| < 0.006,
    where hardswish(x) is x / 2 to 0.1%), y = x * 0.5: XNNPACK's int8 ADD takes an input-to-output scale ratio of
    1/1024 or more, which m's grid has not there. Returns the grids written (x/6's and the gate's: not the plan's)."""
    aten, decomposed = torch.ops.aten, torch.ops.quantized_decomposed
    graph = program.graph

    inner: set[tuple[float, int]] = set()

    def on_grid(value: torch.fx.Node, scale: float, zero: int) -> torch.fx.Node:
        inner.add((float(np.float32(scale)), zero))  # as the .tflite stores it
        return _on_grid(graph, value, (scale, zero, -128, 127, torch.int8))

    changed = False
    for node in list(graph.nodes):
        x = node.args[0] if node.op == "call_function" and node.args else None
        if node.target not in (aten.hardswish.default, aten.hardswish_.default) or not isinstance(x, torch.fx.Node) \
                or x.target != decomposed.dequantize_per_tensor.default or x.args[-1] != torch.int8:
            continue
        scale, zero = float(x.args[1]), int(x.args[2])
        with graph.inserting_before(node):
            if scale < _FINEST_GATED:
                product = graph.call_function(aten.mul.Tensor, (x, 0.5))
            else:
                sixth = on_grid(graph.call_function(aten.mul.Tensor, (x, 1 / 6)), scale / 6, zero)
                gate = on_grid(graph.call_function(aten.add.Tensor, (sixth, 0.5)), 1 / 255, -128)
                product = graph.call_function(aten.mul.Tensor, (x, gate))
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        changed = True
    if changed:
        program.recompile()
    return frozenset(inner)


_FINEST_GATED = 6 / 255 / 1000  # x's finest scale whose m = x / 6 XNNPACK's ADD takes onto h's grid (1/255)


def _on_grid(graph: torch.fx.Graph, value: torch.fx.Node, grid: tuple[Any, ...]) -> torch.fx.Node:
    """``value`` quantized onto ``grid`` (scale, zero point, min, max, dtype) and dequantized, at the graph's insertion
    point: the converter makes the op writing ``value`` an int8 op on that grid."""
    decomposed = torch.ops.quantized_decomposed
    return graph.call_function(decomposed.dequantize_per_tensor.default,
                               (graph.call_function(decomposed.quantize_per_tensor.default, (value, *grid)), *grid))


def _zero_padded_max_pools(program: Any, args: tuple[torch.Tensor, ...]) -> Any:
    """``program`` (exported first where it is not a graph) with each padded max pool whose input is never negative
    (a ReLU's, a clamp's at 0 or above, an int8 grid whose lowest value is 0) computed on its input padded with
    zeros (a PAD, on the input's int8 grid where it has one) and no padding of its own: the same values, as a window's
    maximum is 0 or more either way. Left as it is, the converter pads with the lowest value (-inf, or -128) in a
    PADV2, which LiteRT's XNNPACK delegate has no case for: it ran in LiteRT's kernel between two delegate
    partitions in every model with a ResNet stem (conv, ReLU, 3x3 max pool padded by 1: ResNet-18, ShuffleNetV2),
    fp32 and INT8 alike. A program torch.export cannot take is returned as it is (the converter says why)."""
    aten, decomposed = torch.ops.aten, torch.ops.quantized_decomposed
    if not isinstance(program, torch.fx.GraphModule):
        try:
            program = eval_mode(torch.export.export(program, args).module())  # the converter reads its flag
        except Exception:  # noqa: BLE001 - not exportable here: LiteRT's converter will say why in its own words
            return program
    graph = program.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.max_pool2d.default or len(node.args) < 3:
            continue
        x, padding = node.args[0], node.args[3] if len(node.args) > 3 else 0
        padding = [padding] * 2 if isinstance(padding, int) else list(padding)
        ceil = bool(node.args[5]) if len(node.args) > 5 else bool(node.kwargs.get("ceil_mode", False))
        if not any(padding) or ceil or not _never_negative(x):
            continue
        with graph.inserting_before(node):
            padded = graph.call_function(aten.constant_pad_nd.default,
                                         (x, [padding[1], padding[1], padding[0], padding[0]], 0.0))
            if x.target == decomposed.dequantize_per_tensor.default:  # int8: the PAD on x's grid
                padded = _on_grid(graph, padded, tuple(x.args[1:]))
        node.args = (padded, node.args[1], node.args[2], [0, 0], *node.args[4:])
        changed = True
    if changed:
        program.recompile()
    return program


def _prelu_on_4d(program: Any) -> Any:
    """``program`` (a graph, as ``_zero_padded_max_pools`` returns it) with each PReLU on fewer than 4 dimensions
    computed on a view padded with trailing 1s and viewed back: the same values (the slope is per channel along
    dimension 1). LiteRT's converter lowers a PReLU after a Linear layer as relu(y) - a * relu(-y) and folds the
    negation into a second FULLY_CONNECTED with the weights stored again: MTCNN ONet's fp32 .tflite 2,747,808 bytes
    against its .pte's 1,566,888 (one 1152 x 256 layer with a PReLU: 2,363,304 -> 1,183,112 bytes, one
    FULLY_CONNECTED). On a 4-D view the converter keeps one. fp32 only: an INT8 program's PReLU reads its grids."""
    if not isinstance(program, torch.fx.GraphModule):
        return program
    graph, view = program.graph, torch.ops.aten.view.default
    changed = False
    for node in list(graph.nodes):
        value = node.args[0].meta.get("val") if node.op == "call_function" and node.target == \
            torch.ops.aten.prelu.default and isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dim() >= 4 or value.dim() < 2:
            continue
        shape = list(value.shape)
        with graph.inserting_before(node):
            padded = graph.call_function(view, (node.args[0], shape + [1] * (4 - len(shape))))
        node.args = (padded, *node.args[1:])
        with graph.inserting_after(node):
            back = graph.call_function(view, (node, shape))
        node.replace_all_uses_with(back, delete_user_cb=lambda user: user is not back)
        changed = True
    if changed:
        program.recompile()
    return program


def _never_negative(value: Any) -> bool:
    """``value`` (a graph node) is 0 or more everywhere: a ReLU's output, a clamp's to a lower bound of 0 or more,
    or a dequantization from an int8 grid whose lowest integer is its zero point."""
    aten, decomposed = torch.ops.aten, torch.ops.quantized_decomposed
    if not isinstance(value, torch.fx.Node) or value.op != "call_function":
        return False
    if value.target in (aten.relu.default, aten.relu_.default):
        return True
    if value.target in (aten.hardtanh.default, aten.hardtanh_.default, aten.clamp.default, aten.clamp_.default):
        low = value.args[1] if len(value.args) > 1 else value.kwargs.get("min_val", value.kwargs.get("min"))
        return isinstance(low, (int, float)) and low >= 0
    if value.target == decomposed.dequantize_per_tensor.default:
        return len(value.args) > 3 and int(value.args[2]) == int(value.args[3])
    return False


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip()
    # the converter's MLIR diagnostics: "<file>:<line>:<col>: error: <what>"
    for line in text.splitlines():
        if "error:" in line:
            return line.split("error:", 1)[1].strip()[:300]
    return ((text.splitlines() or [type(exc).__name__])[0])[:300]


def _interpreter(model: bytes | str | Path, *, threads: int) -> Any:
    """LiteRT's interpreter on ``model`` with its tensors allocated (XNNPACK, LiteRT's default delegate, partitions
    the model then); its native warnings go to the log (the report's library messages), its notices nowhere."""
    from ai_edge_litert.interpreter import Interpreter

    from npukit.report.capture import capture_native_output

    source = {"model_content": model} if isinstance(model, bytes) else {"model_path": str(model)}
    with capture_native_output() as native:
        interpreter = Interpreter(**source, num_threads=int(threads))
        interpreter.allocate_tensors()
    _log_native(native())
    return interpreter


def delegation(interpreter: Any) -> Delegation:
    """The operators inside the interpreter's delegate nodes, counted, and those left to LiteRT's own kernels."""
    ops = interpreter._get_ops_details()
    taken = _delegated(ops)
    left = collections.Counter(op["op_name"] for op in ops if op["op_name"] != "DELEGATE" and op["index"] not in taken)
    return Delegation(delegated=len(taken), partitions=sum(op["op_name"] == "DELEGATE" for op in ops), left=dict(left))


def _delegated(ops: list[dict[str, Any]]) -> set[int]:
    """The indices of the operators the delegate nodes among ``ops`` (the interpreter's op details) replaced:
    walking back from each delegate's outputs through the model's operators, stopping at the delegate's inputs,
    reaches exactly them."""
    delegates = [op for op in ops if op["op_name"] == "DELEGATE"]
    model_ops = [op for op in ops if op["op_name"] != "DELEGATE"]
    producer = {int(t): op["index"] for op in model_ops for t in op["outputs"]}
    by_index = {op["index"]: op for op in model_ops}
    taken: set[int] = set()
    for node in delegates:
        boundary = {int(t) for t in node["inputs"]}
        todo = [int(t) for t in node["outputs"]]
        while todo:
            tensor = todo.pop()
            index = producer.get(tensor)
            if tensor in boundary or index is None or index in taken:
                continue
            taken.add(index)
            todo.extend(int(t) for t in by_index[index]["inputs"] if int(t) >= 0)
    return taken


_ORIGIN_TAG = "npk:"  # a tensor name part naming the exported program's node an operator came from


def node_placement(program: torch.nn.Module, example: Sequence[torch.Tensor]) -> dict[str, Placement]:
    """Convert ``program`` to a .tflite (fp32, as ``lower`` does), load it with LiteRT's default XNNPACK delegate and
    say, for each call node of ``torch.export.export(program, example)``, where the operators it became run.

    The converter names each operator's output tensor after the program's node it lowers (its location, built by
    litert-torch's debug info hook, set here to the node's ``from_node`` origin for this conversion only); an
    operator writing a graph output carries the signature's name instead and is left out."""
    with _quiet():  # as in lower: the import's native notices kept off the terminal
        import litert_torch
        from litert_torch.backend import export as backend_export

    args = tuple(plain_tensor(x) for x in example)
    exported = torch.export.export(program, args)
    hook = backend_export.debuginfo
    saved = hook.build_mlir_debuginfo
    hook.build_mlir_debuginfo = lambda node: f"{_ORIGIN_TAG}{origin(node)}|"
    try:
        with _quiet():
            buffer = bytes(litert_torch.convert(_zero_padded_max_pools(eval_mode(exported.module()), args),
                                                args).model_content())
    finally:
        hook.build_mlir_debuginfo = saved
    interpreter = _interpreter(buffer, threads=1)
    ops = interpreter._get_ops_details()
    taken = _delegated(ops)
    names = {d["index"]: d["name"] for d in interpreter.get_tensor_details()}
    delegated: collections.Counter[str] = collections.Counter()
    left: dict[str, list[str]] = collections.defaultdict(list)
    for op in ops:
        if op["op_name"] == "DELEGATE":
            continue
        parts = {part[len(_ORIGIN_TAG):].split("|", 1)[0] for t in op["outputs"]
                 for part in names.get(int(t), "").split(";") if part.startswith(_ORIGIN_TAG)}
        for name in parts:
            if op["index"] in taken:
                delegated[name] += 1
            else:
                left[name].append(op["op_name"])
    return placements(exported, delegated, left)


class Runner:
    """A .tflite model in LiteRT's interpreter with the XNNPACK delegate; ``threads`` sets its threads. Float arrays
    in and out: an int8 model's inputs are quantized and its outputs dequantized on the model's own grids."""

    def __init__(self, path: str | Path, *, threads: int = 1) -> None:
        self.interpreter = _interpreter(path, threads=threads)
        self.inputs = _in_signature_order(self.interpreter, self.interpreter.get_input_details(), "inputs")
        self.outputs = _in_signature_order(self.interpreter, self.interpreter.get_output_details(), "outputs")

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        for detail, value in zip(self.inputs, feeds.values()):
            self.interpreter.set_tensor(detail["index"], _to_tensor(np.asarray(value), detail))
        self.interpreter.invoke()
        return [_from_tensor(self.interpreter.get_tensor(d["index"]), d) for d in self.outputs]


def _in_signature_order(interpreter: Any, details: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """``details`` in the order of the model's signature (the torch program's argument and output order).

    litert-torch names them ``args_<i>`` and ``output_<i>``, and the interpreter lists a signature's names sorted
    as text (output_0, output_1, output_10, output_11, output_2, ...): taken in that order, a model with more than
    ten outputs had its outputs compared with the wrong ones of eager torch (an internal error where their shapes
    differ, a false FAIL where they do not). The position is the name's number where every name ends in one."""
    signatures = interpreter._get_full_signature_list()
    if len(signatures) != 1:
        return details
    named = next(iter(signatures.values()))[kind]
    numbers = {name: re.search(r"(\d+)$", name) for name in named}
    names = (sorted(named, key=lambda n: int(numbers[n].group(1)))  # type: ignore[union-attr]
             if all(numbers.values()) else list(named))
    order = {named[name]: i for i, name in enumerate(names)}
    return sorted(details, key=lambda d: order.get(d["index"], len(order)))


def _quantized(detail: dict[str, Any]) -> bool:
    """Whether a tensor is an int8 model's quantized input or output (a scale to read it by), not a tensor of
    integers in its own right (an argmax's indices, a token id), which has none."""
    return np.dtype(detail["dtype"]).kind in "iu" and bool(detail["quantization"][0])


def _to_tensor(value: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    if not _quantized(detail):
        return np.asarray(value).astype(dtype, copy=False).reshape(detail["shape"])
    scale, zero = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(value / scale) + zero, info.min, info.max).astype(dtype).reshape(detail["shape"])


def _from_tensor(value: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    """An output as eager torch gives it: an int8 model's dequantized on its grid, any other one as it is (integer
    indices stay integers: read as a grid with scale 0 they all became 0)."""
    if not _quantized(detail):
        return value.copy()
    scale, zero = detail["quantization"]
    return (value.astype(np.float32) - zero) * np.float32(scale)
