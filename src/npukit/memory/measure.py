"""Measured truth: the peak memory ONNX Runtime CPU really adds while it runs a model once.

Method. Each measurement runs in a fresh Python subprocess, so that nothing allocated before (other sessions,
torch, caches) is in the figures, with ``MALLOC_MMAP_THRESHOLD_=65536``: glibc then serves every block of 64 KiB or
more by mmap and returns it on free, so the resident set falls back after a run and repeats to the kilobyte. The
child builds the input, creates the session (``enable_cpu_mem_arena`` and ``enable_mem_pattern`` as asked, one
intra-op thread, no spinning) and reads ``VmRSS`` from /proc/self/status. It writes "5" to /proc/self/clear_refs
(which resets the high-water mark ``VmHWM`` to the current RSS), runs the model once, reads ``VmHWM``; then does the
same for a second run. Runs go through ``run_with_ort_values``: the outputs stay in ORT's buffers (``run`` would add
a numpy copy of each). The figures:

- ``first_run_bytes`` = VmHWM during run 1 - VmRSS after the session was created;
- ``steady_run_bytes`` = VmHWM during run 2 - VmRSS just before run 2 (what one more run needs);
- ``retained_bytes`` = VmRSS before run 2 - VmRSS after session creation (what run 1 kept: the arena, caches);
- ``peak_bytes`` = ``steady_run_bytes`` + ``retained_bytes`` when the arena is on (the activations live in memory
  it keeps between runs), else ``steady_run_bytes``.

It is an upper bound on the activation memory: the kernels' scratch buffers and the outputs handed back are in it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from npukit.errors import InputError

MMAP_THRESHOLD = 65536
_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class PeakMeasurement:
    """Bytes measured by :func:`measure_ort_peak` (see the module docstring for each figure)."""

    peak_bytes: int
    first_run_bytes: int
    steady_run_bytes: int
    retained_bytes: int
    session_rss_bytes: int
    arena: bool
    mem_pattern: bool
    threads: int
    optimization: str
    input_shape: tuple[int, ...]

    def as_dict(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        data["input_shape"] = list(self.input_shape)
        return data


def measure_ort_peak(
    model_path: str | Path,
    *,
    arena: bool,
    threads: int = 1,
    input_shape: Sequence[int] | None = None,
    mem_pattern: bool | None = None,
    optimization: str = "all",
) -> PeakMeasurement:
    """Peak memory ORT CPU adds while running ``model_path`` once, measured in a fresh subprocess.

    ``mem_pattern`` defaults to ``arena`` (ORT's memory patterns allocate one block per run when on).
    ``input_shape`` sets the first input's shape; symbolic dimensions of other inputs become 1.
    ``optimization``: ORT's graph optimization level, "basic", "extended" or "all" (ORT's default; on x86 it adds
    the NCHWc layout transform, whose reorder buffers and padded channel blocks the "cpu" view does not model).
    """
    path = Path(model_path)
    if not path.is_file():
        raise InputError(f"model file {path} does not exist", hint="give the path of an .onnx file")
    if threads < 1:
        raise InputError(f"threads must be >= 1, not {threads}", hint="use --threads 1 for repeatable figures")
    if optimization not in ORT_LEVELS:
        raise InputError(f"unknown ORT optimization level {optimization!r}",
                         hint=f"choose one of {', '.join(ORT_LEVELS)}")
    pattern = arena if mem_pattern is None else mem_pattern
    request = {"model": str(path), "arena": bool(arena), "mem_pattern": bool(pattern), "threads": int(threads),
               "optimization": optimization,
               "input_shape": None if input_shape is None else [int(d) for d in input_shape]}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD), OMP_NUM_THREADS=str(threads))
    code = "import sys; from npukit.memory.measure import _child; _child(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, json.dumps(request)], env=env, capture_output=True,
                          text=True, timeout=_TIMEOUT_S, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"ORT could not run {path.name} to measure its memory: {last}",
                         hint="check that the model runs on ORT CPU with the given --input-shape")
    data = json.loads(lines[-1])
    data["input_shape"] = tuple(data["input_shape"])
    return PeakMeasurement(**data)


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} is not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _child(request_json: str) -> None:
    """Run in the subprocess: measure as the module docstring says and print one JSON line."""
    import numpy as np
    import onnxruntime as ort

    request = json.loads(request_json)
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = request["arena"]
    options.enable_mem_pattern = request["mem_pattern"]
    options.intra_op_num_threads = request["threads"]
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, ORT_LEVELS[request["optimization"]])
    session = ort.InferenceSession(request["model"], sess_options=options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    shape_used: list[int] = []
    for position, value in enumerate(session.get_inputs()):
        given = request["input_shape"] if position == 0 and request["input_shape"] else None
        shape = given or [d if isinstance(d, int) and d > 0 else 1 for d in value.shape]
        dtype = np.dtype(_NUMPY_TYPES.get(value.type, "float32"))
        feeds[value.name] = (rng.standard_normal(shape) if dtype.kind == "f" else np.zeros(shape)).astype(dtype)
        if position == 0:
            shape_used = list(shape)
    values = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in feeds.items()}
    names = [value.name for value in session.get_outputs()]
    session_rss = _status_bytes("VmRSS")
    _reset_peak()
    outputs = session.run_with_ort_values(names, values)  # ORT's own buffers: no copy into numpy arrays
    first_hwm = _status_bytes("VmHWM")
    del outputs
    before_second = _status_bytes("VmRSS")
    _reset_peak()
    outputs = session.run_with_ort_values(names, values)
    second_hwm = _status_bytes("VmHWM")
    del outputs
    steady = max(second_hwm - before_second, 0)
    retained = max(before_second - session_rss, 0)
    print(json.dumps({
        "peak_bytes": steady + retained if request["arena"] else steady,
        "first_run_bytes": max(first_hwm - session_rss, 0),
        "steady_run_bytes": steady,
        "retained_bytes": retained,
        "session_rss_bytes": session_rss,
        "arena": request["arena"],
        "mem_pattern": request["mem_pattern"],
        "threads": request["threads"],
        "optimization": request["optimization"],
        "input_shape": shape_used,
    }))


ORT_LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
_NUMPY_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
                "tensor(uint8)": "uint8", "tensor(int8)": "int8", "tensor(int32)": "int32", "tensor(int64)": "int64",
                "tensor(bool)": "bool"}
