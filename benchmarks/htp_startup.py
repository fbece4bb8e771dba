"""Start-up on Qualcomm's HTP (the QNN EP's emulator here): time to the first result with the context binary
compiled ahead (`npukit compile`'s EPContext model) against compiling the QDQ model when the session loads.

Models: MobileNetV2 (torchvision's ImageNet weights, the embedded default model) and YOLOv8n from the third-party
zoo (NudeNet's detector, if installed). Each is quantized as the HTP needs (``verbs.compile.quantize_for_htp`` on
calibration samples: int8 weights, uint16 activations) and compiled for the SoC (``compile_qnn_context``: the
binary embedded in the ONNX file). Four ways to the first result: a plain QNN session from the QDQ model (compiled
at load) or from the EPContext model (compiled ahead), and npukit's Runtime on the QDQ model cold or from its
``cache_dir`` (``runtime.context_cache``: the compiled graph its first start kept). Each measurement runs in a fresh
Python process: imports and the QNN EP's registration happen before the clock starts; the clock stops at the first
result, and one more inference gives the steady latency the start-up cost is counted above. Rounds interleave the
ways, and the first results are compared. Writes benchmarks/results/htp_startup.{md,json} naming the CPU.

    .venv/bin/python benchmarks/htp_startup.py [--rounds 5] [--only mobilenet_v2 nudenet_yolov8n]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
SOC = "SM8650"
# a plain QNN session from the QDQ model (QNN compiles at load) or from `npukit compile`'s EPContext model; npukit's
# Runtime on the QDQ model, cold (it compiles, serving from the session it placed the nodes with) or from its
# cache_dir (the compiled graph)
WAYS = ("compile_at_load", "precompiled_context", "runtime_cold", "runtime_cached")
STEADY_RUNS = 2
# inferences up to the first result: the runtime runs the graph once as it binds its buffers (its warm-up)
INFERENCES = {"compile_at_load": 1, "precompiled_context": 1, "runtime_cold": 2, "runtime_cached": 2}


def _mobilenet(tmp: Path) -> tuple[Path, list[dict[str, np.ndarray]]]:
    import torch
    import torchvision

    from npukit.data.embedded import calibration_and_evaluation_sets, default_model_weights

    net = torchvision.models.mobilenet_v2()
    net.load_state_dict(torch.load(default_model_weights()))
    net.eval()
    path = tmp / "mobilenet_v2.onnx"
    torch.onnx.export(net, torch.zeros(1, 3, 224, 224), str(path), input_names=["input"], dynamo=False)
    calib = [{"input": c[None].astype(np.float32)} for c in calibration_and_evaluation_sets().calibration[:16]]
    return path, calib


def _yolo(tmp: Path) -> tuple[Path, list[dict[str, np.ndarray]]] | None:
    from zoo_models import MODELS

    from npukit.verbs.optimize_graph import optimize_graph

    model = MODELS["nudenet_yolov8n"]
    if not model.installed():
        print("  nudenet_yolov8n is not installed (bash scripts/setup_zoo.sh): skipped", flush=True)
        return None
    path = tmp / "yolov8n.onnx"  # its shapes fixed and its graph folded, as the zoo's flow does before compiling
    optimize_graph(model.model_path(), path, input_shape={i.name: tuple(i.shape) for i in model.inputs})
    return path, list(model.calibration())[:8]


MODELS = {"mobilenet_v2": _mobilenet, "nudenet_yolov8n": _yolo}


def prepare(name: str, tmp: Path) -> dict | None:
    """The QDQ model and its EPContext model for ``name``, with one input to run."""
    import onnx

    from npukit.runtime.compile import compile_qnn_context, guard_for_htp
    from npukit.verbs.compile import quantize_for_htp

    made = MODELS[name](tmp)
    if made is None:
        return None
    path, calib = made
    qdq = tmp / f"{name}.qdq.onnx"
    # the patterns the HTP computes wrongly rewritten first, as compile does: every way then loads the same graph
    guarded, rewrites = guard_for_htp(quantize_for_htp(onnx.load(str(path)), calib), soc=SOC, feeds=calib[0])
    onnx.save(guarded, str(qdq))
    ctx = tmp / f"{name}.ctx.onnx"
    t0 = time.perf_counter()
    compiled = compile_qnn_context(qdq, ctx, soc=SOC, feeds=calib[0])
    compile_s = time.perf_counter() - t0
    assert not compiled.hazard_rewrites, "the guarded model needs no more rewrites"
    feeds = tmp / f"{name}.feeds.npz"
    np.savez(feeds, **calib[0])
    cache = tmp / f"{name}.runtime-cache"
    return {"qdq": qdq, "ctx": ctx, "feeds": feeds, "cache": cache, "compile_s": compile_s,
            "hazard_rewrites": len(rewrites), "compiled_identical": compiled.identical,
            "qdq_mb": qdq.stat().st_size / 2**20, "ctx_mb": ctx.stat().st_size / 2**20}


def child(way: str, model: str, feeds: str, out: str, cache: str) -> None:
    """One start-up, in this fresh process: the session (or runtime) on the HTP as ``SOC`` and its first result."""
    import onnx

    from npukit.runtime.compile import context_session, soc_provider_options
    from npukit.runtime.engine import Runtime
    from npukit.runtime.qnn import ensure_registered, make_qnn_session, qnn_available

    ensure_registered()
    qnn_available()  # the runtime's probe of the plugin and backends, once per process: before the clock too
    inputs = dict(np.load(feeds))
    proto = onnx.load(model, load_external_data=False) if way == "precompiled_context" else None
    t0 = time.perf_counter()
    if way == "precompiled_context":
        run = context_session(model, proto, soc=SOC).session.run
    elif way == "compile_at_load":
        run = make_qnn_session(model, provider_options=soc_provider_options(SOC)).run
    else:
        runtime = Runtime(model, device=f"qnn-htp@{SOC}", workers=1,
                          cache_dir=cache if way == "runtime_cached" else None)
        if way == "runtime_cached" and runtime.cache != "hit":
            raise RuntimeError(f"the runtime's cache was {runtime.cache}, not hit")
        run = lambda names, feeds: runtime.run(feeds)  # noqa: E731 - the same call shape as a session's
    t1 = time.perf_counter()
    first = run(None, inputs)
    t2 = time.perf_counter()
    steady = []
    for _ in range(STEADY_RUNS):  # the same input again: what one inference costs once started
        t3 = time.perf_counter()
        run(None, inputs)
        steady.append((time.perf_counter() - t3) * 1000.0)
    np.savez(out, *first)
    print(json.dumps({"ms": (t2 - t0) * 1000.0, "session_ms": (t1 - t0) * 1000.0, "run_ms": (t2 - t1) * 1000.0,
                      "steady_ms": float(np.median(steady))}))
    if way.startswith("runtime"):
        runtime.close()


def _start(way: str, prepared: dict, tmp: Path) -> tuple[dict, list[np.ndarray]]:
    model = prepared["ctx"] if way == "precompiled_context" else prepared["qdq"]
    out = tmp / f"first_{way}.npz"
    done = subprocess.run([sys.executable, __file__, "--child", way, str(model), str(prepared["feeds"]), str(out),
                           str(prepared["cache"])], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{way} failed: {done.stderr.strip().splitlines()[-1:]}")
    with np.load(out) as arrays:
        first = [arrays[k] for k in sorted(arrays.files, key=lambda k: int(k.split("_")[1]))]
    return json.loads(done.stdout.strip().splitlines()[-1]), first


def measure(prepared: dict, rounds: int, tmp: Path) -> dict:
    # the runtime's cache filled once, by a runtime started as a user's first one is
    from npukit.runtime.engine import Runtime

    with Runtime(str(prepared["qdq"]), device=f"qnn-htp@{SOC}", workers=1, cache_dir=str(prepared["cache"])) as rt:
        assert rt.cache == "miss", rt.cache
    parts: dict[str, dict[str, list[float]]] = {w: {"ms": [], "session_ms": [], "run_ms": [], "steady_ms": []}
                                                for w in WAYS}
    firsts: dict[str, list[np.ndarray]] = {}
    for r in range(rounds):
        for way in WAYS if r % 2 == 0 else reversed(WAYS):
            timed, firsts[way] = _start(way, prepared, tmp)
            for part in parts[way]:
                parts[way][part].append(timed[part])
    diffs = {w: max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in
                    zip(firsts[WAYS[0]], firsts[w])) for w in WAYS[1:]}
    median = {w: {p: float(np.median(v)) for p, v in ps.items()} for w, ps in parts.items()}
    steady = float(np.median([t for w in WAYS for t in parts[w]["steady_ms"]]))
    # start-up cost: the time to the first result less the inferences in it, each at the steady latency (the
    # emulator executes the graph in seconds; on a phone's HTP an inference takes milliseconds and the start-up cost
    # is what remains)
    cost = {w: max(median[w]["ms"] - INFERENCES[w] * steady, 0.0) for w in WAYS}

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b > 0 else None

    pairs = {"precompiled_context": "compile_at_load", "runtime_cached": "runtime_cold"}
    return {"ms": {w: [round(t, 1) for t in parts[w]["ms"]] for w in WAYS},
            "median_ms": {w: {p: round(v, 1) for p, v in m.items()} for w, m in median.items()},
            "steady_ms": round(steady, 1), "inferences_to_first_result": INFERENCES,
            "startup_cost_ms": {w: round(v, 1) for w, v in cost.items()},
            "ratio_first_result": {w: ratio(median[w]["ms"], median[b]["ms"]) for w, b in pairs.items()},
            "ratio_startup_cost": {w: ratio(cost[w], cost[b]) for w, b in pairs.items()},
            "ratio_session": {w: ratio(median[w]["session_ms"], median[b]["session_ms"]) for w, b in pairs.items()},
            "first_result_max_abs_diff": diffs, "compile_s": round(prepared["compile_s"], 1),
            "hazard_rewrites": prepared["hazard_rewrites"], "compiled_identical": prepared["compiled_identical"],
            "qdq_mb": round(prepared["qdq_mb"], 2), "ctx_mb": round(prepared["ctx_mb"], 2)}


def _cpu() -> str:
    from npukit.runtime.devices import read_cpu_info

    return read_cpu_info("/proc/cpuinfo").model or "unknown CPU"


def write(doc: dict, out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# HTP start-up: precompiled context vs compile at load ({doc['cpu']}, {doc['date']})", "",
             f"npukit at {doc['commit']}; QNN HTP emulator as {SOC} (onnxruntime-qnn {doc['qnn']}). "
             "Time from creating the session (or npukit's Runtime) to the first result, each in a fresh process "
             "(imports, the EP's registration and the runtime's probe of it before the clock), "
             f"{doc['rounds']} rounds interleaved; medians.", "",
             "Ways: a plain QNN session from the QDQ model (QNN composes and finalizes the graph as the session "
             "loads); from `npukit compile`'s EPContext model (the context binary compiled ahead); npukit's Runtime "
             "on the QDQ model cold (one QNN session, the one it serves with, compiled once; the placement read "
             "from ORT's graph-assignment record of it) and from its `cache_dir` (the compiled graph its first "
             "start kept). "
             "Session: creating it (the runtime's includes its warm-up, one inference as it binds its buffers); "
             "first run: the emulator executing the graph once; steady: one more inference once started. Start-up "
             "cost: the time to the first result less its inferences at the steady latency (the emulator "
             "executes the graph in seconds where a phone's HTP takes milliseconds, so on the emulator the ratio of "
             "first results is bounded by the inference itself). Ratios: precompiled context against compile at "
             "load, the runtime from its cache against the runtime cold; target <= 0.5 on the first result.", "",
             "| model | way | first result ms | session ms | first run ms | steady ms | start-up cost ms "
             "| ratio, first result | ratio, start-up cost | ratio, session | max abs diff of the first result |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(value: float | None, target: bool = False) -> str:
        if value is None:
            return ""
        return f"{value:.3f}" + ((" (met)" if value <= 0.5 else " (not met)") if target else "")

    for name, r in doc["models"].items():
        for way in WAYS:
            m = r["median_ms"][way]
            diff = r["first_result_max_abs_diff"].get(way)
            lines.append(f"| {name} | {way.replace('_', ' ')} | {m['ms']:.0f} | {m['session_ms']:.0f} | "
                         f"{m['run_ms']:.0f} | {m['steady_ms']:.0f} | {r['startup_cost_ms'][way]:.0f} | "
                         f"{cell(r['ratio_first_result'].get(way), True)} | "
                         f"{cell(r['ratio_startup_cost'].get(way))} | {cell(r['ratio_session'].get(way))} | "
                         f"{'' if diff is None else f'{diff:.3g}'} |")
    lines += ["", "Compiling ahead (`npukit compile`): " + "; ".join(
        f"{name} {r['compile_s']:.1f} s, QDQ {r['qdq_mb']:.2f} MB -> context model {r['ctx_mb']:.2f} MB, "
        f"{r['hazard_rewrites']} pattern(s) the HTP computes wrongly rewritten first (every way loads the rewritten "
        f"model), compiled outputs {'identical to' if r['compiled_identical'] else 'not identical to'} the "
        "non-compiled HTP run"
        for name, r in doc["models"].items()) + "."]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--stem", default="htp_startup")
    args = parser.parse_args(argv)
    from importlib.metadata import version

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                            text=True).stdout.strip() or "unknown (run from a copy outside a git checkout)"
    doc = {"cpu": _cpu(), "date": time.strftime("%Y-%m-%d"), "commit": commit, "soc": SOC, "rounds": args.rounds,
           "qnn": version("onnxruntime-qnn"), "models": {}}
    with tempfile.TemporaryDirectory(prefix="npukit-htp-startup-") as work:
        tmp = Path(work)
        for name in args.only:
            print(name, flush=True)
            prepared = prepare(name, tmp)
            if prepared is None:
                continue
            doc["models"][name] = measure(prepared, args.rounds, tmp)
            r = doc["models"][name]
            print(f"  first result ms {({w: m['ms'] for w, m in r['median_ms'].items()})}, ratios "
                  f"{r['ratio_first_result']}, start-up cost {r['ratio_startup_cost']}", flush=True)
            write(doc, args.out, args.stem)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:7])
        sys.exit(0)
    sys.exit(main())
