"""npukit's serving runtime (npukit.runtime.engine.Runtime) against a plain one-session loop, on real models.

Models: MobileNetV2 (torchvision's ImageNet weights) exported with a symbolic batch axis, fp32 and INT8 (npukit
quantize with this CPU's default scheme, calibrated on the embedded photos), and YOLOv8n from the third-party zoo
(NudeNet's detector, a fixed batch axis: no batching). Requests are real inputs (the embedded photos' crops, the
zoo's evaluation photos). Per model, in one process, side by side (``npukit.measure.serving``): start-up to first
result, one-caller jitter (p99 / p50), bytes allocated per call, closed-loop throughput against workers, and
open-loop Poisson load at 0.8x, 1.2x and 1.6x the plain loop's capacity. Writes benchmarks/results/runtime.{md,json}
naming the CPU.

    .venv/bin/python benchmarks/runtime.py [--duration 3] [--only mobilenet_v2_fp32 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _mobilenet(tmp: Path) -> dict[str, tuple[Path, list[dict]]]:
    import torch
    import torchvision

    import npukit
    from npukit.data.embedded import calibration_and_evaluation_sets, default_model_weights

    sets = calibration_and_evaluation_sets()
    net = torchvision.models.mobilenet_v2()
    net.load_state_dict(torch.load(default_model_weights()))
    net.eval()
    fp32 = tmp / "mobilenet_v2.onnx"
    torch.onnx.export(net, torch.zeros(1, 3, 224, 224), str(fp32), input_names=["input"],
                      dynamic_axes={"input": {0: "batch"}}, dynamo=False)
    calib = [{"input": c[None].astype(np.float32)} for c in sets.calibration]
    int8 = tmp / "mobilenet_v2.int8.onnx"
    result = npukit.quantize(fp32, int8, calib=calib, runs=3)
    requests = [{"input": e[None].astype(np.float32)} for e in sets.evaluation[:32]]
    print(f"  INT8 model: {result.report.verdict}", flush=True)
    return {"mobilenet_v2_fp32": (fp32, requests), "mobilenet_v2_int8": (int8, requests)}


def _yolo(tmp: Path) -> dict[str, tuple[Path, list[dict]]]:
    """The zoo's YOLOv8n with its symbolic sizes fixed to the zoo's static shape (batch 1: no batching)."""
    import onnx
    from zoo_models import MODELS

    from npukit.frontend.shapes import InputSpec, load_with_inputs

    model = MODELS["nudenet_yolov8n"]
    if not model.installed():
        print("  nudenet_yolov8n is not installed (bash scripts/setup_zoo.sh): skipped", flush=True)
        return {}
    spec = InputSpec.parse([f"{i.name}={','.join(map(str, i.shape))}" for i in model.inputs])
    fixed = tmp / "yolov8n.onnx"
    onnx.save(load_with_inputs(model.model_path(), spec), str(fixed))
    return {"nudenet_yolov8n": (fixed, model.evaluation()[:16])}


BUCKETS = ((1, 3, 160, 160), (1, 3, 224, 224), (1, 3, 288, 288))


def _buckets(tmp: Path, duration: float) -> dict:
    """MobileNetV2 exported with symbolic height and width, served through three size buckets against a session
    fixed to each size."""
    import torch
    import torchvision

    from npukit.data.embedded import default_model_weights
    from npukit.measure.serving import measure_buckets

    net = torchvision.models.mobilenet_v2()
    net.load_state_dict(torch.load(default_model_weights()))
    net.eval()
    path = tmp / "mobilenet_v2_any_size.onnx"
    torch.onnx.export(net, torch.zeros(1, 3, 224, 224), str(path), input_names=["input"],
                      dynamic_axes={"input": {2: "h", 3: "w"}}, dynamo=False)
    print("buckets: serving MobileNetV2 at 160, 224, 288 ...", flush=True)
    return measure_buckets(path, BUCKETS, input_name="input", duration_s=duration).as_dict()


def _bucket_markdown(buckets: dict | None) -> str:
    if not buckets:
        return ""
    lines = ["", "## Shape buckets (MobileNetV2 with symbolic height and width, fp32, one caller)", "",
             "| input | per-size session p50 ms | through buckets p50 ms | ratio | max abs difference |",
             "|---|---|---|---|---|"]
    for shape, r in buckets.items():
        lines.append(f"| {shape} | {r['per_size_session']['latency_ms']['p50']:.2f} | "
                     f"{r['buckets']['latency_ms']['p50']:.2f} | {r['latency_ratio_p50']:.3f} | "
                     f"{r['max_abs_difference']:.3g} |")
    return "\n".join(lines) + "\n"


def _fmt(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


STARTUP = ("plain_session_ms", "cached_session_ms", "runtime_ms")
SERVERS = ("plain", "workers", "batched")


def _markdown(rows: list[dict], cpu: str, duration: float) -> str:
    lines = [f"# Serving runtime vs a plain session loop ({cpu}, {time.strftime('%Y-%m-%d')})", "",
             f"benchmarks/runtime.py, {duration:g} s per load point, one process, side by side. Plain loop: one "
             "session, 1 thread, session.run per request. Runtime: npukit.runtime.engine.Runtime (bound buffers, "
             "worker threads with 1 ORT thread each; dynamic batching up to 4 within 2 ms where the batch axis is "
             "symbolic). Start-up: session creation to first result; the cache keeps ORT's optimized graph on disk.",
             "",
             "x plain: the runtime's best point over the plain loop run just before it (side by side).", "",
             "| model | plain req/s | runtime best req/s (workers) | x plain | jitter p99/p50 plain / runtime | "
             "bytes/call plain / bound / runtime | start-up ms (median of 5): plain session / from cache / runtime |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["serving"]
        plain = s["single"]["plain"]
        best = max(s["curve"].items(), key=lambda kv: kv[1]["throughput_per_s"])
        jit = [x["latency_ms"]["p99"] / x["latency_ms"]["p50"] for x in (plain, s["single"]["pool"])]
        a = s["allocated_bytes_per_call"]
        start = " / ".join(f"{s['startup_ms'][k]:.0f}" for k in STARTUP if k in s["startup_ms"])
        lines.append(f"| {r['model']} | {_fmt(plain['throughput_per_s'])} | {_fmt(best[1]['throughput_per_s'])} "
                     f"({best[0]}) | {s['speedup'][best[0]]:.2f} | "
                     f"{jit[0]:.2f} / {jit[1]:.2f} | {a['plain']:.0f} / {a['bound_buffers']:.0f} / {a['runtime']:.0f} "
                     f"| {start} |")
    lines += ["", "## Open loop (Poisson arrivals at multiples of the plain loop's capacity)", "",
              "Each cell: served requests/s, p50 ms, p99 ms. Workers: the runtime's best worker count without "
              "batching; batched: the same workers with dynamic batching.", "",
              "| model | offered req/s | plain loop | runtime, workers | runtime, workers + batching | batches formed "
              "(size: count) |", "|---|---|---|---|---|---|"]
    for r in rows:
        s = r["serving"]
        formed = s["batching"].get("batches", [])  # none where batching is off (no batched server)
        for i, plain in enumerate(s["open"]["plain"]):
            cells = [s["open"][k][i] if k in s["open"] else None for k in SERVERS]
            lines.append(f"| {r['model']} | {plain['level']:.1f} | "
                         + " | ".join(f"{_fmt(c['throughput_per_s'])}, {c['latency_ms']['p50']:.1f}, "
                                      f"{c['latency_ms']['p99']:.1f}" if c else "-" for c in cells)
                         + f" | {formed[i] if i < len(formed) else '-'} |")
        if s["batching"].get("note"):
            lines.append(f"| {r['model']} | {s['batching']['note']} | | | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from npukit.measure.serving import ServingConfig, measure_serving

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    rows = []
    cpu = "unknown CPU"
    with tempfile.TemporaryDirectory(prefix="npukit-runtime-bench-") as tmp:
        models = {**_mobilenet(Path(tmp)), **_yolo(Path(tmp))}
        for name, (path, requests) in models.items():
            if args.only and name not in args.only:
                continue
            print(f"{name}: serving ...", flush=True)
            result = measure_serving(path, requests, ServingConfig(duration_s=args.duration))
            cpu = result.cpu
            rows.append({"model": name, "serving": result.as_dict()})
            print(f"  plain {result.single['plain'].throughput:.1f}/s, best "
                  f"{max(r.throughput for r in result.curve.values()):.1f}/s", flush=True)
        buckets = _buckets(Path(tmp), args.duration) if not args.only or "buckets" in args.only else None
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runtime.json").write_text(json.dumps({"cpu": cpu, "duration_s": args.duration, "models": rows,
                                                       "buckets": buckets}, indent=1))
    (args.out / "runtime.md").write_text(_markdown(rows, cpu, args.duration) + _bucket_markdown(buckets))
    print((args.out / "runtime.md").read_text())


if __name__ == "__main__":
    main()
