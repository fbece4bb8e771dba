"""ONNX Runtime sessions made the same way everywhere (threads, no idle spinning) and seeded random inputs."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from npukit.errors import InputError

# ONNX Runtime's CPU kernels that compute on integers (what its QDQ fusions turn Q/DQ-wrapped float ops into)
INTEGER_KERNELS = frozenset({"QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger", "QGemm", "QLinearAdd",
                             "QLinearMul", "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearConcat",
                             "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "MatMulIntegerToFloat",
                             "DynamicQuantizeMatMul"})
# the integer kernels of the compute (convolutions and matrix products), where a quantized model's speed is
INTEGER_COMPUTE_KERNELS = frozenset({"QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger", "QGemm",
                                     "MatMulIntegerToFloat", "DynamicQuantizeMatMul"})

_ORT_TO_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}

ModelLike = str | os.PathLike[str] | bytes | onnx.ModelProto

# The log level of a serving session: ORT logs nothing of a failed run, whose error is raised and counted by the
# caller (a load with 1 request in 16 failing printed 3,969 lines of ORT's "Non-zero status code" to stderr). Set
# on the session, not per run: RunOptions with a log level of their own cost ~19 native allocations a Run (a run
# logger made each time; the bound buffers' 20 became 39, more than a plain session.run's 34).
SERVING_LOG_LEVEL = 4


def make_session(
    model: ModelLike,
    *,
    threads: int = 1,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    optimization: str = "all",
    optimized_model_path: str | None = None,
    session_config: Mapping[str, str] | None = None,
    profile_prefix: str | None = None,
    log_level: int = 3,
) -> ort.InferenceSession:
    """An InferenceSession with ``threads`` intra-op threads, sequential execution and no spinning between runs;
    ``session_config``: more ``add_session_config_entry`` pairs; ``profile_prefix``: turn on ORT's profiler, writing
    its JSON trace to ``<profile_prefix>_<time>.json`` (``session.end_profiling()`` returns the path)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = log_level
    if optimized_model_path:
        so.optimized_model_filepath = optimized_model_path
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    for key, value in (session_config or {}).items():
        so.add_session_config_entry(key, value)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = os.fspath(model)
    try:
        return ort.InferenceSession(model, sess_options=so, providers=list(providers))
    except Exception as exc:  # ORT raises several unrelated types here
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"ONNX Runtime cannot load the model: {first}",
                         hint="check the model with `npukit inspect`, or re-export it") from exc


def input_dtype(ort_type: str) -> np.dtype:
    try:
        return np.dtype(_ORT_TO_NUMPY[ort_type])
    except KeyError:
        raise InputError(f"model input type {ort_type} is not supported for generated inputs",
                         hint="give real inputs with --data") from None


def random_feeds(
    session: ort.InferenceSession,
    *,
    seed: int = 0,
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int = 1,
) -> dict[str, np.ndarray]:
    """Seeded inputs for every model input: standard normal floats, small non-negative integers.

    Symbolic dimensions take ``shapes[name]`` when given; otherwise a leading symbolic dim becomes ``batch`` and
    any other symbolic dim is an error that asks for an explicit shape.
    """
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for inp in session.get_inputs():
        if shapes and inp.name in shapes:
            shape = tuple(int(d) for d in shapes[inp.name])
        else:
            shape_list = []
            for i, dim in enumerate(inp.shape):
                if isinstance(dim, int) and dim > 0:
                    shape_list.append(dim)
                elif i == 0:
                    shape_list.append(batch)
                else:
                    raise InputError(f"input {inp.name!r} has a symbolic dimension {dim!r} at axis {i}",
                                     hint="pass the full shape with --input-shape")
            shape = tuple(shape_list)
        dtype = input_dtype(inp.type)
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[inp.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[inp.name] = rng.integers(0, 8, shape).astype(dtype)
    return feeds


def run(session: ort.InferenceSession, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(o) for o in session.run(None, dict(feeds))]


def batch_problem(session: ort.InferenceSession, one: Mapping[str, Sequence[int]], *, seed: int = 0,
                  rtol: float = 1e-4) -> str:
    """Why two samples stacked along the batch axis do not each get what they get alone, or "": two seeded samples
    (``one``: each input's shape for one sample) run together and one at a time. A graph that keeps a batch of 1
    inside (a Reshape to a constant [1, -1, C], as YOLOX and PicoDet exports have) runs at batch 2 but folds the
    second sample into another axis. A size ``one`` leaves open is an InputError (``random_feeds``'s)."""
    from npukit.frontend._messages import first_line
    from npukit.measure.compare import compare_outputs

    singles = [random_feeds(session, seed=seed + i, shapes=one) for i in range(2)]
    alone = [run(session, feeds) for feeds in singles]
    try:
        together = run(session, {k: np.concatenate([f[k] for f in singles]) for k in singles[0]})
    except Exception as exc:  # noqa: BLE001 - ORT's refusal is the model's, said in one line
        return f"the model fails on two samples at once ({first_line(exc)})"
    for out, pair, got in zip(session.get_outputs(), zip(*alone), together):
        want = np.concatenate(pair)
        if got.shape != want.shape:
            return (f"the model run on 2 samples at once gives output {out.name!r} of shape {list(got.shape)}, not "
                    f"one row per sample ({list(want.shape)}): the graph keeps a batch of 1 inside")
    errors = compare_outputs([np.concatenate([a[k].reshape(-1) for a in alone]) for k in range(len(together))],
                             [t.reshape(-1) for t in together])
    if not errors.within(rtol):
        return f"two samples run at once do not get what each gets alone (max abs error {errors.max_abs:.3g})"
    return ""


def every_output(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *,
                 save_to: Path | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of every node output, and of each feed, as ONNX Runtime computes them on ``feeds``, with no
    graph optimization (so every tensor of the graph as written exists): what shape inference cannot tell
    (Shape -> Reshape chains, sizes computed in the graph). ``save_to``: where the probe model is written first (next
    to the external data its initializers point to); else it is passed in memory. ``model`` is not changed."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    listed = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in listed:
                probe.graph.output.append(onnx.ValueInfoProto(name=name))
                listed.add(name)
    if save_to is not None:
        onnx.save(probe, str(save_to))
    session = make_session(save_to if save_to is not None else probe, optimization="disable")
    names = [o.name for o in session.get_outputs()]
    values = session.run(names, dict(feeds))
    found = {name: (tuple(int(d) for d in np.shape(v)), np.asarray(v).dtype)
             for name, v in zip(names, values, strict=True)}
    return found | {name: (tuple(np.shape(v)), np.asarray(v).dtype) for name, v in feeds.items()}


def model_path_or_bytes(model: ModelLike) -> str | bytes:
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, bytes):
        return model
    return os.fspath(Path(model))
