"""Helpers for pass tests: build tiny ONNX models with onnx.helper, apply a pass, compare numerically on ORT CPU."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from npukit.measure.compare import OutputErrors, compare_outputs
from npukit.passes.base import NpukitPass
from npukit.runtime.ort import make_session, random_feeds, run

FLOAT = TensorProto.FLOAT


def info(name: str, shape: Sequence[int | str] | None, dtype: int = FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name: str, array: np.ndarray | float | Sequence[float], dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=dtype), name)


def constant_node(output: str, array: np.ndarray | float, dtype: type = np.float32) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [output], value=const(output + "_value", array, dtype))


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    *,
    opset: int = 17,
    extra_opsets: Sequence[tuple[str, int]] = (),
    functions: Sequence[onnx.FunctionProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "tiny", list(inputs), list(outputs), list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def apply(pass_: NpukitPass, model: onnx.ModelProto) -> onnx.ModelProto:
    """Run ``pass_`` on a copy of ``model``; return the result after a full onnx.checker check."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    result = pass_(ir.serde.deserialize_model(copy))
    out = ir.serde.serialize_model(result.model)
    onnx.checker.check_model(out, full_check=True)
    return out


def op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def errors(reference: onnx.ModelProto, candidate: onnx.ModelProto, *, seed: int = 0, samples: int = 2,
           scale: float = 1.0) -> OutputErrors:
    """Worst disagreement over ``samples`` seeded inputs (times ``scale``), both run without ORT graph optimizations."""
    ref = make_session(reference, optimization="disable")
    cand = make_session(candidate, optimization="disable")
    names = [o.name for o in ref.get_outputs()]
    assert names == [o.name for o in cand.get_outputs()], "graph output names changed"
    ref_out: list[np.ndarray] = []
    cand_out: list[np.ndarray] = []
    for i in range(samples):
        feeds = {k: v * scale if v.dtype.kind == "f" else v for k, v in random_feeds(ref, seed=seed + i).items()}
        ref_out.extend(run(ref, feeds))
        cand_out.extend(run(cand, feeds))
    return compare_outputs(ref_out, cand_out)


def assert_equivalent(reference: onnx.ModelProto, candidate: onnx.ModelProto, *, rtol: float = 1e-5,
                      scale: float = 1.0) -> None:
    err = errors(reference, candidate, scale=scale)
    assert err.max_rel <= rtol, f"max relative error {err.max_rel:.3g} > {rtol:g} ({err.as_dict()})"
