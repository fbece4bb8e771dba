"""ExecuTorch with its XNNPACK delegate: lower a torch program to a .pte, load it in ExecuTorch's runtime, run it.

ExecuTorch is an optional extra (``pip install 'npukit[executorch]'``, installed by scripts/setup.sh); it is imported
only here and only when an ExecuTorch target is used. Its Qualcomm backend is never imported (it downloads the QNN
SDK on import of its lowering code); the XNNPACK backend needs nothing at run time.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from npukit._atomic import write_bytes_atomic
from npukit.errors import InputError, ToolError
from npukit.frontend.provenance import Placement, origin, placements
from npukit.quant.emit.pt2e import CarryOptions
from npukit.report.capture import capture_native_output
from npukit.runtime.tensors import plain_tensor

_NOTICES = ("threadpool.cpp", "cpuinfo_utils.cpp")  # its runtime's start-up notices on every load
EXTRA_HINT = "install it with: .venv/bin/pip install 'npukit[executorch]' (scripts/setup.sh does)"
# concatenations on their own grid; transposed convs take the plan's weights (per channel on axis 1, XNNPACK's
# deconvolution) and grids: the .pte loads and computes what the QDQ model does (see CarryOptions)
CARRY = CarryOptions(same_scale_concat=True, transposed_convs=True)


def require() -> None:
    """ExecuTorch is installed, or an InputError that says how to install it."""
    if importlib.util.find_spec("executorch") is None:
        raise InputError("the executorch-xnnpack target needs ExecuTorch, which is not installed", hint=EXTRA_HINT)
    # torchao registers an Enum with torch's pytree on import, which logs a deprecation warning to the terminal
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


def cannot_run() -> str | None:
    """Why this machine cannot run the runtime's artifacts: never (it runs on the CPU here)."""
    return None


def unhonoured_floats(lowered: Any, qdq: Any) -> str | None:
    """Never: ExecuTorch's XNNPACK lowering keeps the float ops of a converted program float (a plan's float convs
    add their fp32 weights to the .pte: MobileNetV2 0.27 -> 0.37x the fp32 size with two of them)."""
    return None


@dataclasses.dataclass(frozen=True)
class Lowered:
    """A .pte program's bytes and what XNNPACK took."""

    buffer: bytes
    delegated_ops: int  # ops of the edge program inside XNNPACK delegate calls
    delegate_calls: int
    portable_ops: dict[str, int]  # ops left to ExecuTorch's portable kernels, by name

    def summary(self) -> dict[str, Any]:
        return {"bytes": len(self.buffer), "delegated_ops": self.delegated_ops, "delegate_calls": self.delegate_calls,
                "portable_ops": dict(self.portable_ops)}

    def write(self, output: Path) -> None:
        write_bytes_atomic(output, self.buffer)

    def table(self) -> tuple[str, list[str], list[list[Any]]]:
        left = ", ".join(f"{k} x{v}" for k, v in self.portable_ops.items()) or "none"
        return ("ExecuTorch program",
                ["file bytes", "ops in XNNPACK", "delegate calls", "ops left to portable kernels"],
                [[len(self.buffer), self.delegated_ops, self.delegate_calls, left]])


def lower(program: torch.nn.Module, example: Sequence[torch.Tensor], *,
          names: tuple[Sequence[str], Sequence[str]] | None = None) -> Lowered:
    """``program`` exported and lowered with ExecuTorch's XNNPACK partitioner (fp32, or the q/dq of a PT2E-converted
    program as XNNPACK's integer kernels; ``names`` unused: a .pte method takes and returns tensors by position)."""
    exported = torch.export.export(program, tuple(plain_tensor(x) for x in example))
    try:
        edge = _to_edge(exported)
    except Exception as exc:  # noqa: BLE001 - any failure inside ExecuTorch's lowering, said in one line
        raise ToolError(f"ExecuTorch's XNNPACK lowering failed on this model: {_root_cause(exc)}",
                         hint="try --target litert or qnn-htp, or the ONNX export (npukit export) on ORT CPU") from exc
    program = edge.exported_program()
    left = collections.Counter(
        getattr(n.target, "__name__", str(n.target)) for n in program.graph.nodes
        if n.op == "call_function" and "getitem" not in str(n.target))
    calls = left.pop("executorch_call_delegate", 0)
    try:
        buffer = edge.to_executorch().buffer
    except Exception as exc:  # noqa: BLE001 - the .pte's serialization refusing the model, said in one line
        raise InputError(f"ExecuTorch cannot write this model as a .pte: {_root_cause(exc)}",
                         hint="try --target litert, or the ONNX export (npukit export) on ORT CPU") from exc
    return Lowered(buffer=bytes(buffer), delegated_ops=_delegated_ops(program), delegate_calls=calls,
                   portable_ops=dict(left))


def _to_edge(exported: torch.export.ExportedProgram) -> Any:
    """``exported`` lowered as every .pte here is: npukit's edge passes (``executorch_passes``: PReLU, mean, split)
    before XNNPACK's partitioner."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from npukit.runtime.executorch_passes import transform_passes

    return to_edge_transform_and_lower(exported, transform_passes=transform_passes(),
                                       partitioner=[XnnpackPartitioner()])


def _delegated_nodes(program: Any) -> Iterator[torch.fx.Node]:
    """The call nodes inside the edge program's XNNPACK delegate calls, in their lowered subgraphs (getitems left
    out)."""
    for node in program.graph.nodes:
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target):
            lowered = getattr(program.graph_module, str(node.args[0].target))
            yield from (n for n in lowered.original_module.graph.nodes
                        if n.op == "call_function" and "getitem" not in str(n.target))


def _on_constants(program: Any) -> set[Any]:
    """The edge program's call nodes that compute on lifted constants only (the dtype copies of a decomposed
    hardsigmoid's scalars): left to the portable kernels, they run before the delegate call on no data and do not
    split the delegated graph, so a placement does not count them as the op's part outside XNNPACK."""
    users = set(program.graph_signature.user_inputs)
    known = {n for n in program.graph.nodes if n.op == "get_attr" or (n.op == "placeholder" and n.name not in users)}
    computed: set[Any] = set()
    for node in program.graph.nodes:
        if node.op == "call_function" and node.all_input_nodes and all(i in known for i in node.all_input_nodes) \
                and "executorch_call_delegate" not in str(node.target):
            known.add(node)
            computed.add(node)
    return computed


def _delegated_ops(program: Any) -> int:
    """The ops inside the edge program's XNNPACK delegate calls, counted in the lowered subgraphs themselves (the
    exported program's count less what is left outside went to 0 where the edge dialect decomposes ops, a GRU's),
    quantize and dequantize ops left out (they are the grids between the ops, not ops of the model)."""
    return sum(1 for n in _delegated_nodes(program) if "quantize_per" not in str(n.target))


def _root_cause(exc: BaseException) -> str:
    """The innermost exception's first line, with the pass it happened in when ExecuTorch names one."""
    passes = ""
    while exc.__cause__ is not None or exc.__context__ is not None:
        text = str(exc)
        if "error occurred when running the" in text and not passes:
            passes = text.split("running the", 1)[1].split("pass", 1)[0].strip(" '") + ": "
        exc = exc.__cause__ or exc.__context__
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{passes}{line}"[:300]


class Runner:
    """A .pte program loaded in ExecuTorch's runtime; ``threads`` sets its thread pool (XNNPACK's threads)."""

    def __init__(self, path: str | Path, *, threads: int = 1) -> None:
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        with capture_native_output() as native:  # its C++ log's notices (threadpool, cpuinfo) off the terminal
            portable_lib._unsafe_reset_threadpool(int(threads))  # before loading: the pool is read at load time
            self.program = Runtime.get().load_program(Path(path))
            self.method = self.program.load_method("forward")
        for line in native().splitlines():
            if line.strip() and not any(k in line for k in _NOTICES):
                logging.getLogger("executorch").warning(line.strip()[:300])

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        inputs = [plain_tensor(v) for v in feeds.values()]
        return [o.numpy() if isinstance(o, torch.Tensor) else np.asarray(o) for o in self.method.execute(inputs)]


def node_placement(program: torch.nn.Module, example: Sequence[torch.Tensor]) -> dict[str, Placement]:
    """Lower ``program`` with ExecuTorch's XNNPACK partitioner (fp32, as ``lower`` does) and say, for each call node
    of ``torch.export.export(program, example)``, where its edge nodes ended up (``Placement``)."""
    exported = torch.export.export(program, tuple(plain_tensor(x) for x in example))
    edge = _to_edge(exported).exported_program()
    delegated = collections.Counter(origin(n) for n in _delegated_nodes(edge))
    portable: dict[str, list[str]] = collections.defaultdict(list)
    constant = _on_constants(edge)
    for node in edge.graph.nodes:
        if node.op == "call_function" and "getitem" not in str(node.target) and node not in constant \
                and "executorch_call_delegate" not in str(node.target):
            portable[origin(node)].append(getattr(node.target, "__name__", str(node.target)))
    return placements(exported, delegated, portable)
