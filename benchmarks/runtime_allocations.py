"""Native allocation calls per inference: a plain session.run loop, npukit's bound buffers (ORT IOBinding on
pre-allocated OrtValues, ``runtime.pool``) and the serving runtime (``Runtime.run`` into the caller's arrays).

tracemalloc (what ``npukit.measure.serving`` and serve-bench report) sees Python objects and numpy buffers only, not
ONNX Runtime's own C++ allocations. This counts every malloc / calloc / realloc / posix_memalign / aligned_alloc /
memalign call of the process, from every thread, with a small C library loaded by LD_PRELOAD
(``benchmarks/native/malloc_count.c``, compiled here with the system's C compiler; without one the benchmark says so
and stops). Each variant runs in a child process under the counter: 200 warm-up calls, then the mean count over
``--calls`` calls. Models: a tiny conv net, MobileNetV2 fp32 and INT8 (torchvision's ImageNet weights, npukit
quantize with this CPU's scheme). Writes benchmarks/results/runtime_allocations.{md,json} naming the CPU.

    .venv/bin/python benchmarks/runtime_allocations.py [--calls 10000] [--only tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "native" / "malloc_count.c"
WARMUP = 200


def build_counter(work: Path) -> Path | None:
    """The counting library compiled into ``work``, or None (and why, printed) where no C compiler is found."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        print("no C compiler (cc, gcc or clang) on PATH: native allocations cannot be counted here", flush=True)
        return None
    library = work / "malloc_count.so"
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(SOURCE), "-ldl"], check=True)
    return library


def count_calls(library: Path, model: Path, feeds: Path, calls: int) -> dict[str, float]:
    """Mean native allocation calls per inference of each variant, measured in a child process under ``library``."""
    env = dict(os.environ, LD_PRELOAD=str(library))
    out = subprocess.run([sys.executable, __file__, "--child", str(model), str(feeds), str(calls)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(model: str, feeds_path: str, calls: int) -> None:
    """Runs under the counter: the three variants on one model and input, one after the other."""
    import ctypes

    from npukit.runtime.engine import Runtime
    from npukit.runtime.ort import make_session
    from npukit.runtime.pool import BoundBuffers

    counter = ctypes.CDLL(None).npukit_allocation_calls
    counter.restype = ctypes.c_long
    feeds = dict(np.load(feeds_path))
    session = make_session(model, threads=1)

    def per_call(call, n: int = calls) -> float:
        for _ in range(WARMUP):
            call()
        before = counter()
        for _ in range(n):
            call()
        return (counter() - before) / n

    result = {"plain_session_run": per_call(lambda: session.run(None, feeds))}
    bound = BoundBuffers(session, {k: v.shape for k, v in feeds.items()})
    result["bound_buffers"] = per_call(lambda: bound.run(feeds))
    with Runtime(model, device="cpu", workers=1, threads=1) as runtime:
        out = [np.empty(o.shape, np.float32) for o in session.run(None, feeds)]
        result["runtime_run_into_callers_arrays"] = per_call(lambda: runtime.run(feeds, out=out))
        # the counter also sees the calling thread's own future and queue record, and the worker's wake-up
    print(json.dumps({k: round(v, 2) for k, v in result.items()}))


def _tiny(tmp: Path) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp / "tiny.onnx"
    onnx.save(model, str(path))
    return {"tiny_conv": (path, {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)})}


def _mobilenet(tmp: Path) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    sys.path.insert(0, str(HERE))
    from runtime import _mobilenet as models  # the runtime benchmark's MobileNetV2 fp32 / INT8, batch axis symbolic

    import onnx

    from npukit.frontend.shapes import InputSpec, load_with_inputs

    out = {}
    for name, (path, requests) in models(tmp).items():
        static = tmp / f"{name}.static.onnx"  # batch 1: what one request is
        onnx.save(load_with_inputs(path, InputSpec.parse("1,3,224,224")), str(static))
        out[name] = (static, requests[0])
    return out


def _cpu() -> str:
    from npukit.runtime.devices import read_cpu_info

    return read_cpu_info("/proc/cpuinfo").model or platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--only", nargs="*", default=None, help="tiny_conv, mobilenet_v2_fp32, mobilenet_v2_int8")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="npukit-alloc-") as tmp:
        work = Path(tmp)
        library = build_counter(work)
        if library is None:
            return 2
        models = _tiny(work)
        if args.only is None or any(n.startswith("mobilenet") for n in args.only):
            models |= _mobilenet(work)
        for name, (path, feeds) in models.items():
            if args.only and name not in args.only:
                continue
            feeds_path = work / f"{name}.npz"
            np.savez(feeds_path, **feeds)
            counts = count_calls(library, path, feeds_path, args.calls)
            print(f"  {name}: {counts}", flush=True)
            rows.append({"model": name, **counts})
    result = {"cpu": _cpu(), "calls": args.calls, "warmup": WARMUP, "rows": rows,
              "note": "native allocation calls per inference, mean over the calls after the warm-up, every thread"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runtime_allocations.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Native allocation calls per inference ({result['cpu']})", "",
             f"malloc / calloc / realloc / posix_memalign / aligned_alloc / memalign calls of the whole process (every "
             f"thread), counted by an LD_PRELOAD library; mean over {args.calls} calls after {WARMUP} warm-up calls, "
             "ORT CPU, 1 thread.", "",
             "| model | plain session.run | bound buffers (IOBinding) | Runtime.run into the caller's arrays |",
             "|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['plain_session_run']} | {r['bound_buffers']} | "
              f"{r['runtime_run_into_callers_arrays']} |" for r in rows]
    (out / "runtime_allocations.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'runtime_allocations.json'} and {out / 'runtime_allocations.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
