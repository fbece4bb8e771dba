"""Qualcomm QNN execution provider (onnxruntime-qnn plugin): availability, HTP sessions, node assignment.

The plugin registers once per process. On x86 the HTP backend (libQnnHtp.so) runs as an emulator of the NPU's
integer pipeline. The QNN EP reports why a backend fails to load or a node is rejected only in ORT's log, so the
functions here capture ORT's stderr around session creation and read those lines back; which execution provider
took which node comes from ORT's structured graph-assignment record (``session.record_ep_graph_assignment_info``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tempfile
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from npukit.errors import InputError
from npukit.report.capture import capture_native_output
from npukit.frontend.onnx_io import named_nodes
from npukit.runtime.ort import ModelLike, model_path_or_bytes

QNN_EP = "QNNExecutionProvider"
CPU_EP = "CPUExecutionProvider"
BACKENDS = ("htp", "cpu", "gpu")
_PIP_HINT = "install it with `pip install onnxruntime-qnn` (it brings the QNN EP plugin and the HTP backend)"

_register_lock = threading.Lock()


# ----------------------------------------------------------------------------------------------------------------
# Availability


@dataclasses.dataclass(frozen=True)
class QnnStatus:
    """Whether the QNN EP can be used here; ``backends`` maps backend name -> None (loads) or the reason it does not."""

    importable: bool
    registered: bool
    plugin_version: str | None
    qnn_sdk_version: str | None
    library_path: str | None
    backends: dict[str, str | None]
    reason: str | None  # why the plugin as a whole is unusable; None when it registered

    @property
    def available(self) -> bool:
        return self.registered and self.backends.get("htp") is None

    def backend_ok(self, backend: str) -> bool:
        return self.registered and backend in self.backends and self.backends[backend] is None

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "available": self.available}


def _qnn_module() -> Any:
    import onnxruntime_qnn

    return onnxruntime_qnn


def ensure_registered() -> list[Any]:
    """Register the QNN EP plugin library once per process; return its OrtEpDevice list. InputError if impossible."""
    try:
        qnn = _qnn_module()
    except ImportError as exc:
        raise InputError(f"the QNN execution provider is not installed (onnxruntime_qnn: {exc})",
                         hint=_PIP_HINT) from exc
    with _register_lock:
        devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]
        if not devices:
            try:
                ort.register_execution_provider_library(qnn.get_ep_name(), qnn.get_library_path())
            except Exception as exc:  # ORT raises its own Fail type here
                raise InputError(f"ONNX Runtime {ort.__version__} cannot register the QNN EP plugin "
                                 f"{qnn.get_library_path()}: {_first_line(exc)}",
                                 hint="install an onnxruntime-qnn build that matches this onnxruntime") from exc
            devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]
    if not devices:
        raise InputError("the QNN EP plugin registered but offers no device", hint=_PIP_HINT)
    return devices


def qnn_versions() -> tuple[str | None, str | None]:
    """(onnxruntime-qnn version, QNN SDK version it was built with), None where not discoverable."""
    try:
        qnn = _qnn_module()
    except ImportError:
        return None, None
    info = getattr(qnn, "build_and_package_info", None)
    return getattr(qnn, "__version__", None), getattr(info, "qnn_version", None)


@functools.cache
def qnn_available() -> QnnStatus:
    """Probe the plugin and its HTP and CPU backends (each with a one-node QDQ model); cached per process."""
    plugin_version, sdk_version = qnn_versions()
    try:
        qnn = _qnn_module()
    except ImportError as exc:
        return QnnStatus(False, False, None, None, None, {}, f"onnxruntime_qnn is not importable: {exc}")
    try:
        ensure_registered()
    except InputError as exc:
        return QnnStatus(True, False, plugin_version, sdk_version, qnn.get_library_path(), {}, exc.message)
    probe = _probe_model()
    backends: dict[str, str | None] = {}
    for backend in ("htp", "cpu"):
        try:
            make_qnn_session(probe, backend=backend)
            backends[backend] = None
        except InputError as exc:
            backends[backend] = exc.message
    return QnnStatus(True, True, plugin_version, sdk_version, qnn.get_library_path(), backends, None)


def _probe_model() -> onnx.ModelProto:
    """x -> DQ(Q(x)) -> Relu -> DQ(Q(.)) with static shapes: one node unit any working QNN backend takes."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("Relu", ["xd"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "qnn_probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


# ----------------------------------------------------------------------------------------------------------------
# Sessions


def make_qnn_session(
    model: ModelLike,
    *,
    backend: str = "htp",
    allow_cpu_fallback: bool = False,
    provider_options: Mapping[str, str] | None = None,
    profiling: bool = False,
    session_config: Mapping[str, str] | None = None,
) -> ort.InferenceSession:
    """An InferenceSession on the QNN EP with ``backend`` (htp | cpu | gpu).

    Every input must have a static shape. Unless ``allow_cpu_fallback``, nodes the QNN EP does not take make the
    session fail (InputError naming them when the log says); a backend that does not load is an InputError with the
    reason. With ``allow_cpu_fallback`` such a session runs on the CPU EP and a warning says why. A float model
    (no Q/DQ nodes) on the htp backend runs in fp16 for FLOAT_HTP_SOC unless ``provider_options`` say otherwise
    (``float_htp_options``).
    """
    session, log = create_session_with_log(model, backend=backend, allow_cpu_fallback=allow_cpu_fallback,
                                   provider_options=provider_options, profiling=profiling,
                                   session_config=session_config)
    failure = _backend_failure(log)
    if failure:
        warnings.warn(f"QNN {backend} backend did not load ({failure}); the session runs on the CPU EP",
                      RuntimeWarning, stacklevel=2)
    return session


def create_session_with_log(
    model: ModelLike,
    *,
    backend: str,
    allow_cpu_fallback: bool,
    provider_options: Mapping[str, str] | None,
    profiling: bool,
    session_config: Mapping[str, str] | None = None,
    verbose: bool = False,
    optimization: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
) -> tuple[ort.InferenceSession, str]:
    """Create the session with ORT's stderr captured; return it and the captured log."""
    if backend not in BACKENDS:
        raise InputError(f"unknown QNN backend {backend!r}", hint=f"choose one of {', '.join(BACKENDS)}")
    proto = as_proto(model)
    require_static_shapes(proto)
    devices = ensure_registered()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = optimization
    so.log_severity_level = 0 if verbose else 2
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if allow_cpu_fallback else "1")
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    for key, value in (session_config or {}).items():
        so.add_session_config_entry(key, str(value))
    if profiling:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "npukit_qnn_profile")
    options = float_htp_options(proto, provider_options, backend=backend)
    if "backend_path" not in options:  # the EP takes one of the two
        options["backend_type"] = backend
    so.add_provider_for_devices(devices, options)
    with capture_native_output() as log:
        try:
            session = ort.InferenceSession(model_path_or_bytes(model if not isinstance(model, onnx.ModelProto)
                                                               else proto), sess_options=so)
        except Exception as exc:  # ORT raises several unrelated types here
            error = exc
        else:
            error = None
    text = log()
    if error is not None:
        if not verbose and _FALLBACK_DISABLED in str(error):
            # The reasons for rejected nodes are logged only at verbose level: create it again to read them.
            return create_session_with_log(model, backend=backend, allow_cpu_fallback=allow_cpu_fallback,
                                   provider_options=provider_options, profiling=profiling,
                                   session_config=session_config, verbose=True, optimization=optimization)
        raise _session_error(error, text, backend=backend, shifted=shifted_weights(proto)) from error
    return session, text


_WEIGHTED = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def shifted_weights(proto: onnx.ModelProto) -> list[str]:
    """The layers (names) whose int8 weights are dequantized per channel with a non-zero zero point
    (``GraphIndex.shifted_dequantized``): the likely cause of a QNN session that fails to add a node."""
    from npukit.frontend.graph_index import GraphIndex

    index = GraphIndex.of(proto)
    shifted = index.shifted_dequantized
    return [node.name or node.op_type for node in index.nodes
            if node.op_type in _WEIGHTED and len(node.input) > 1 and node.input[1] in shifted]


FLOAT_HTP_SOC = "SM8650"  # the SoC a float model's HTP session targets when the caller names none
_QUANT_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def float_htp_options(
    model: onnx.ModelProto,
    provider_options: Mapping[str, str] | None,
    *,
    backend: str = "htp",
) -> dict[str, str]:
    """``provider_options`` as strings, with the HTP's float-model defaults added for a model without Q/DQ nodes
    or a QDQ model with float layers (``float_layers``: a mixed-precision plan's float16 layers).

    The HTP has no fp32 datapath: it runs float graphs in fp16 (HTP v69 and newer). With default options the QNN EP
    builds a float32 graph, which the HTP backend may fail to finalize (QNN_COMMON_ERROR_MEM_ALLOC); its fp16 mode
    (``enable_htp_fp16_precision=1``) is what a device runs, and the EP accepts it only together with a
    ``soc_model``. So for a float model on the htp backend, unless the caller set them: fp16 precision on, and
    ``soc_model``/``htp_arch`` of FLOAT_HTP_SOC (Snapdragon 8 Gen 3), or the soc_model of the first SoC with the
    ``htp_arch`` the caller gave. QDQ models without float layers are left as given.
    """
    options = {k: str(v) for k, v in (provider_options or {}).items()}
    quantized = any(n.op_type in _QUANT_OPS for n in model.graph.node)
    floats = float_layers(model) if quantized else []
    if backend != "htp" or "backend_path" in options or (quantized and not floats):
        return options
    if not any(n.op_type == "EPContext" for n in model.graph.node):  # a compiled graph has no float ops to run
        _refuse_float_without_a_float_unit(options.get("htp_arch"), floats, quantized=quantized)
    options.setdefault("enable_htp_fp16_precision", "1")
    if options["enable_htp_fp16_precision"] == "1" and "soc_model" not in options:
        from npukit.targets.qnn_htp import SOCS

        same_arch = [s for s in SOCS.values() if str(s.htp_arch) == options.get("htp_arch")]
        chip = same_arch[0] if same_arch else SOCS[FLOAT_HTP_SOC]
        options["soc_model"] = str(chip.soc_model)
        options.setdefault("htp_arch", str(chip.htp_arch))
    return options


def _refuse_float_without_a_float_unit(htp_arch: str | None, floats: Sequence[str], *, quantized: bool) -> None:
    """An HTP without a float unit (v68, Snapdragon 888) asked to run float layers: the backend failed to finalize
    the graph ("QNN_COMMON_ERROR_MEM_ALLOC") and the hint pointed at analyze, which says so only for a float model
    (a CPU scheme from ``npukit quantize`` keeps its stem float)."""
    from npukit.targets.qnn_htp import SOCS

    chip = next((c for c in SOCS.values() if str(c.htp_arch) == htp_arch and not c.fp16), None)
    if chip is None:
        return
    what = (f"{len(floats)} layer(s) of this QDQ model run in float ({', '.join(floats[:3])}"
            f"{', ...' if len(floats) > 3 else ''})" if quantized else "a float model cannot run on it")
    raise InputError(f"HTP v{chip.htp_arch} ({chip.name}) has no float unit: {what}",
                     hint=f"compile the float model for it, quantized whole: npukit compile FLOAT.onnx --target "
                          f"qnn-htp --soc {chip.part} --calib DATA")


def float_layers(model: onnx.ModelProto) -> list[str]:
    """The Conv / ConvTranspose / Gemm / MatMul nodes of a QDQ model whose weight is a float initializer (not the
    output of a DequantizeLinear): layers left in float, which the HTP runs in fp16."""
    inits = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type in _WEIGHTED and len(n.input) > 1 and n.input[1] in inits]


def require_static_shapes(model: onnx.ModelProto) -> None:
    """InputError naming the first model input with a symbolic or unknown dimension."""
    initializers = {t.name for t in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        dims = inp.type.tensor_type.shape.dim
        if not inp.type.tensor_type.HasField("shape"):
            raise InputError(f"input {inp.name!r} has no shape; the QNN EP needs static shapes",
                             hint=f"give the sizes it runs at: --input-shape {inp.name}=N,C,H,W (input_shape= in "
                                  "Python)")
        for axis, dim in enumerate(dims):
            if not (dim.HasField("dim_value") and dim.dim_value > 0):
                shown = "x".join(d.dim_param or (str(d.dim_value) if d.dim_value else "?") for d in dims)
                raise InputError(f"input {inp.name!r} has a symbolic dimension at axis {axis} ({shown}); "
                                 "the QNN EP needs static shapes",
                                 hint=f"give the sizes it runs at: --input-shape {_example_shape(inp.name, dims)} "
                                      "(input_shape= in Python)")


def _example_shape(name: str, dims: Any) -> str:
    """An --input-shape value for an input of ``dims``: its static sizes, 1 for a symbolic first (batch) axis, and
    the symbol's name (or ?) for any other the user must choose."""
    sizes = [str(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else
             "1" if axis == 0 else (d.dim_param or "?") for axis, d in enumerate(dims)]
    return f"{name}={','.join(sizes)}"


def as_proto(model: ModelLike) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        return onnx.load_model_from_string(model)
    path = Path(model)
    if not path.is_file():
        raise InputError(f"{path} does not exist", hint="pass an .onnx file")
    return onnx.load_model(str(path), load_external_data=False)


_BACKEND_FAIL = re.compile(r"QNN SetupBackend failed (.*?)(?:\x1b\[m)?$", re.MULTILINE)
_FALLBACK_DISABLED = "fallback to CPU EP has been explicitly disabled"


def _backend_failure(log: str) -> str | None:
    match = _BACKEND_FAIL.search(log)
    return " ".join(match.group(1).split()) if match else None


def _session_error(error: Exception, log: str, *, backend: str, shifted: Sequence[str] = ()) -> InputError:
    failure = _backend_failure(log)
    if failure:
        return InputError(f"the QNN {backend} backend does not load: {failure}",
                          hint="use --target cpu, or allow the CPU fallback explicitly")
    message = _first_line(error)
    if _FALLBACK_DISABLED in message:
        rejected = _rejected_ops(log)
        shown = "; ".join(f"{name}: {reason}" for name, reason in list(rejected.items())[:3])
        more = f" and {len(rejected) - 3} more" if len(rejected) > 3 else ""
        detail = f" ({shown}{more})" if rejected else ""
        return InputError(f"the QNN {backend} backend does not take every node of the model{detail}",
                          hint="see `npukit analyze --target qnn-htp`, quantize to QDQ first, or allow the CPU "
                               "fallback")
    rejected = _rejected_ops(log)
    errors = [e for e in qnn_errors(log) if not (rejected and e.startswith("Unsupported nodes"))]
    details = [*errors[:3]]
    if rejected:
        details.append("nodes the QNN EP rejected: " + "; ".join(
            f"{name}: {reason}" for name, reason in list(rejected.items())[:3])
            + (f" and {len(rejected) - 3} more" if len(rejected) > 3 else ""))
    detail = f" (QNN log: {' | '.join(details)})" if details else ""
    if shifted:  # the likely cause, named first: weights a CPU kernel choice moved off zero
        return InputError(f"ONNX Runtime cannot create the QNN {backend} session: {len(shifted)} layer(s) ("
                          f"{', '.join(shifted[:3])}{', ...' if len(shifted) > 3 else ''}) have int8 per-channel "
                          "weights with a non-zero zero point, which the HTP does not take (ORT CPU kernel choices "
                          f"of `npukit quantize`): {message}{detail}",
                          hint="compile the float model for the HTP (npukit compile FLOAT.onnx --target qnn-htp "
                               "--soc SOC --calib DATA), or quantize it again with --gemm-convs off")
    return InputError(f"ONNX Runtime cannot create the QNN {backend} session: {message}{detail}",
                      hint="check the model with `npukit analyze --target qnn-htp`")


_ERROR_LINE = re.compile(r"\[E:onnxruntime:[^\]]*\] (.*?)(?:\x1b\[m)?$", re.MULTILINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def qnn_errors(log: str) -> list[str]:
    """The error-level lines of ORT's log (what the QNN EP says when composing or finalizing a graph fails, e.g.
    "Failed to create tensor for node: X tensor_name: Y error code: 7004"), without the source locations, once each."""
    lines = []
    for match in _ERROR_LINE.finditer(log):
        text = " ".join(_ANSI.sub("", match.group(1)).split())
        text = re.sub(r"^\S+\.(?:cc|h|cpp):\d+ \S+\] ?", "", text)
        if len(text) > 300:
            text = text[:297] + "..."
        if text and text not in lines:
            lines.append(text)
    # what failed (a tensor, a node, the graph) before the list of nodes the EP left out, which rejections give
    return sorted(lines, key=lambda line: line.startswith("Unsupported nodes"))


def _first_line(exc: BaseException) -> str:
    """The innermost ORT message of ``exc`` on one line (ORT nests "[ONNXRuntimeError] : 1 : FAIL : <source>"
    prefixes)."""
    text = re.split(r"\[ONNXRuntimeError\] : \d+ : \w+ : ", str(exc).strip())[-1].strip()
    return " ".join(text.splitlines()[0].split()) if text else type(exc).__name__


# ----------------------------------------------------------------------------------------------------------------
# Node assignment


@dataclasses.dataclass(frozen=True)
class NodePlacement:
    name: str
    op_type: str
    provider: str | None  # QNNExecutionProvider | CPUExecutionProvider | None: removed by ORT's graph optimizations
    reason: str | None  # why the QNN EP rejected the node (from its validation log), None when taken
    evidence: str  # "assignment": ORT's assignment record; "node-unit": placed with the QDQ unit it belongs to


@dataclasses.dataclass(frozen=True)
class Assignment:
    """Which execution provider runs each node of the original model on the QNN EP (CPU fallback allowed)."""

    backend: str
    nodes: tuple[NodePlacement, ...]
    partitions: int  # QNN subgraphs (fused nodes) ORT created
    backend_failure: str | None

    @property
    def qnn_nodes(self) -> list[str]:
        return [n.name for n in self.nodes if n.provider == QNN_EP]

    @property
    def cpu_nodes(self) -> list[str]:
        return [n.name for n in self.nodes if n.provider == CPU_EP]

    @property
    def rejected(self) -> dict[str, str]:
        return {n.name: n.reason or "not taken" for n in self.nodes if n.provider == CPU_EP}

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "partitions": self.partitions, "backend_failure": self.backend_failure,
                "qnn_nodes": len(self.qnn_nodes), "cpu_nodes": len(self.cpu_nodes),
                "nodes": [dataclasses.asdict(n) for n in self.nodes]}


_UNIT_BLOCK = re.compile(r"Validation (PASSED|FAILED) for \d+ nodes in OrtNodeUnit \([^)]*\) :\n((?:\t[^\n]*\n?)+)")
_UNIT_NODE = re.compile(r"\tOperator type: (\S+) Node name: (.*?) Node index: \d+")
_UNIT_REASON = re.compile(r"\tREASON : (.*)")
_TOKEN_SUFFIX = re.compile(r"_token_\d+$")


def qnn_node_assignment(
    model: ModelLike,
    *,
    backend: str = "htp",
    provider_options: Mapping[str, str] | None = None,
) -> Assignment:
    """Create a QNN session with CPU fallback allowed and report, per node of ``model``, the provider that runs it.

    Providers come from ORT's graph-assignment record. The layout transformer renames nodes it rewrites
    (``conv`` -> ``conv_token_1``) or replaces a DequantizeLinear with a new one; such nodes take the provider of
    the QDQ node unit they were validated in. Reasons for rejected nodes come from the QNN EP's validation log.
    A float model gets the same fp16 defaults as ``make_qnn_session`` (``float_htp_options``).
    """
    proto = named_nodes(as_proto(model))
    session, log = create_session_with_log(proto, backend=backend, allow_cpu_fallback=True,
                                   provider_options=provider_options, profiling=False, verbose=True)
    return session_assignment(proto, session, log=log, backend=backend)


def session_assignment(proto: onnx.ModelProto, session: ort.InferenceSession, *, log: str | None = None,
                       backend: str = "htp") -> Assignment:
    """Per node of ``proto``, the provider ``session`` (made from ``proto`` on the QNN EP with CPU fallback allowed;
    every session npukit makes there keeps ORT's graph-assignment record) runs it on. With the session's verbose
    ``log`` (``qnn_node_assignment``), a node the layout transformer replaced takes the provider of its QDQ node unit
    and a rejected node its reason; without it (a session made to serve, whose log is quiet) such a
    DequantizeLinear takes the provider of the nodes reading it where they agree, and a rejected node has no
    reason."""
    assigned: dict[str, str] = {}
    partitions = 0
    for subgraph in session.get_provider_graph_assignment_info():
        if subgraph.ep_name == QNN_EP:
            partitions += 1
        for node in subgraph.get_nodes():
            assigned.setdefault(node.name, subgraph.ep_name)
            assigned.setdefault(_TOKEN_SUFFIX.sub("", node.name), subgraph.ep_name)
    reasons = node_rejections(log or "")
    units = [[m.group(2) for m in _UNIT_NODE.finditer(body)] for _verdict, body in _UNIT_BLOCK.findall(log or "")]
    placements = []
    readers: dict[str, list[str]] = {}
    for node in proto.graph.node:
        for tensor in node.input:
            readers.setdefault(tensor, []).append(node.name)
    for node in proto.graph.node:
        name = node.name
        provider, evidence = assigned.get(name), "assignment"
        if provider is None and log is not None:
            provider, evidence = _unit_provider(name, units, assigned), "node-unit"
        elif provider is None and node.op_type == "DequantizeLinear":
            # no log: a DequantizeLinear the layout transformer replaced belongs to the unit of the nodes reading it
            found = {assigned.get(reader) for reader in readers.get(node.output[0], [])}
            provider, evidence = (found.pop(), "readers") if len(found) == 1 else (None, "readers")
        placements.append(NodePlacement(name=name, op_type=node.op_type, provider=provider,
                                        reason=reasons.get(name) if provider == CPU_EP else None,
                                        evidence=evidence if provider else "removed"))
    return Assignment(backend=backend, nodes=tuple(placements), partitions=partitions,
                      backend_failure=_backend_failure(log or ""))


def node_rejections(log: str) -> dict[str, str]:
    """Node name -> reason, for every node unit the QNN EP's verbose validation log marks FAILED (last pass wins)."""
    rejected: dict[str, str] = {}
    for verdict, body in _UNIT_BLOCK.findall(log):
        reason = _UNIT_REASON.search(body)
        for match in _UNIT_NODE.finditer(body):
            if verdict == "FAILED":
                rejected[match.group(2)] = " ".join(reason.group(1).split()) if reason else "failed validation"
            else:
                rejected.pop(match.group(2), None)
    return rejected


def _rejected_ops(log: str) -> dict[str, str]:
    """Like ``node_rejections``, for the operator of each failed node unit only (not its Q/DQ nodes)."""
    rejected = node_rejections(log)
    ops = {m.group(2): m.group(1) for _verdict, body in _UNIT_BLOCK.findall(log) for m in _UNIT_NODE.finditer(body)}
    main = {k: v for k, v in rejected.items() if ops.get(k) not in ("QuantizeLinear", "DequantizeLinear")}
    return main or rejected


def _unit_provider(name: str, units: list[list[str]], assigned: dict[str, str]) -> str | None:
    for names in units:
        if name in names:
            for other in names:
                if other != name and other in assigned:
                    return assigned[other]
    return None


# ----------------------------------------------------------------------------------------------------------------
# QDQ rules for the HTP


@dataclasses.dataclass(frozen=True)
class QnnQdqRules:
    """How npukit quantizes for the QNN HTP, and why (MobileNetV2, official weights, 40 real-photo crops, HTP
    emulator of onnxruntime-qnn 2.7.0 / QNN 2.51):

    - The HTP's requantization rounds differently from ORT's float-simulated QDQ by one step on a few percent of
      the elements of each layer (3% of the first Conv's outputs, all within 1 LSB). With uint8 activations these
      steps compound through MobileNetV2's 52 convolutions into 5-100 LSB differences at the classifier (logits
      SQNR 14 dB between HTP and the exact QDQ graph; top-1 agreement with FP32: HTP 75%, QDQ graph 62.5%).
      uint16 activations shrink each step 256x: HTP and QDQ graph then both agree with FP32 on 95% of the crops
      (100% of the confident ones) and with each other on 100% (SQNR 30 dB) (``activation_type``).
      benchmarks/htp_fidelity.py (npukit's exporter, 52 crops): HTP 88.5% with FP32, QDQ graph 94.2%, HTP vs QDQ
      graph 94.2% (SQNR 29.9 dB); the same rules with uint8 activations: 69.2%, 71.2%, 80.8% (14.0 dB). On a real
      HTP 16-bit activations cost speed; ``qnn_quant_config(uint16_tensors=...)`` keeps uint8 elsewhere.
    - Weights stay int8, symmetric, per output channel (axis 0), zero point 0: the layout the HTP's int8 Conv
      kernels take; bias is int32 with scale input_scale * weight_scale.
    - With uint16 activations the int8 weights' nearest rounding is nearly the whole error, mostly a per-channel
      offset (a kernel's rounded sum times a mostly positive input); compounded over 50-60 layers it left third-party
      models 15-18 dB from the float model. ``gptq`` re-rounds each Conv / Gemm weight on ORT's own grid (GPTQ, the
      layer input's Hessian from the calibration data) and ``bias_correction`` removes the per-channel mean of what
      is left through the int32 bias: scales, zero points and layout do not change. ``activation_headroom`` widens
      each calibrated 16-bit grid so inputs unlike the calibration samples are not clipped (moderately: the HTP's
      uint16 arithmetic loses 6 dB per doubling from a ~60 dB floor per layer). RetinaFace-MobileNet0.25 loc, QDQ
      graph vs float on 20 calibration / 16 other photos: 14.4 / 14.6 dB -> 29.3 / 28.8 dB. BatchNormalizations
      the float passes leave are folded into a preceding ConvTranspose or become Mul + Add: QNN's BatchNorm puts its
      folded scale on one int8 grid (4.7-22 dB from the QDQ graph on the HTP).
      See ``npukit.runtime.htp_quant``.
    - The CPU reference for an HTP run is the QDQ graph with ORT graph optimizations disabled
      (``qdq_reference_session``): on x86 CPUs without VNNI, ORT's fused u8s8 kernels saturate 16-bit
      intermediate sums, so ORT's fused CPU run of the very same uint8 model is not the model's semantics
      (45% top-1 agreement with the unfused graph; 85% once weights use 7 bits with reduce_range).
    """

    activation_type: str = "uint16"
    weight_type: str = "int8"  # or "int4" (W4A16; the emulator compiles it for every SoC, devices unchecked)
    per_channel: bool = True
    weight_symmetric: bool = True
    bias_type: str = "int32"
    calibrate_method: str = "MinMax"
    gptq: bool = True
    bias_correction: bool = True
    activation_headroom: float = 1.5


HTP_QDQ_RULES = QnnQdqRules()


def qnn_quant_config(
    model: onnx.ModelProto | str | os.PathLike[str],
    calibration_reader: Any,
    *,
    rules: QnnQdqRules = HTP_QDQ_RULES,
    uint16_tensors: tuple[str, ...] = (),
) -> Any:
    """An ORT ``StaticQuantConfig`` for ``onnxruntime.quantization.quantize`` that follows ``rules``.

    With uint8 activations, ``uint16_tensors`` names activations kept at 16 bits (ORT inserts the conversions).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantType
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    types = {"uint8": QuantType.QUInt8, "uint16": QuantType.QUInt16, "int8": QuantType.QInt8,
             "int4": QuantType.QInt4}
    if rules.activation_type not in ("uint8", "uint16") or rules.weight_type not in ("int8", "uint8", "int4"):
        raise InputError(f"the HTP takes uint8/uint16 activations and int8/uint8/int4 weights, not "
                         f"{rules.activation_type}/{rules.weight_type}", hint="use the default QnnQdqRules()")
    from npukit.quant.emit.ort_qdq import grouped_transposed_weights

    overrides = {name: [{"quant_type": QuantType.QUInt16}] for name in uint16_tensors}
    source = os.fspath(model) if not isinstance(model, onnx.ModelProto) else model
    if rules.per_channel:  # per tensor, where ORT's per-channel bias quantization would crash
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(source, load_external_data=False)
        overrides |= {w: [{"symmetric": rules.weight_symmetric}] for w in grouped_transposed_weights(proto)}
    return get_qnn_qdq_config(
        source, calibration_reader,
        calibrate_method=getattr(CalibrationMethod, rules.calibrate_method),
        activation_type=types[rules.activation_type],
        weight_type=types[rules.weight_type],
        per_channel=rules.per_channel,
        weight_symmetric=rules.weight_symmetric,
        init_overrides=overrides or None,
    )


def qdq_reference_session(model: ModelLike) -> ort.InferenceSession:
    """The CPU run that defines a QDQ model's numerics: Q/DQ in float, no fused integer kernels (see QnnQdqRules)."""
    from npukit.runtime.ort import make_session

    return make_session(model, optimization="disable")
