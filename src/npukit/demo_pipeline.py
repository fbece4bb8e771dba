"""The main job on the embedded default: MobileNetV2 (official ImageNet weights) through every stage npukit has,
measured on real photos, ending in one report.

Stages: export (verified against torch) -> graph passes (verified against the export) -> INT8 quantization
(calibrated on crops of 7 photos) -> latency side by side
(interleaved, medians) -> agreement with the float model on crops of 13 other photos -> report (JSON, HTML,
terminal).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npukit.errors import InputError
from npukit.report.core import Report
from npukit.report.demo import add_models, add_predictions, add_stage
from npukit.report.finish import finish
from npukit.report.progress import progress, step

MODEL_SPEC = "torchvision:mobilenet_v2"
# The best recipe measured on this model (benchmarks/quant_vs_anchors.py): per-channel int8 weights, ranges chosen
# automatically (one calibration pass, every observer scored on held-out crops), cross-layer equalization, activation
# equalization of the residual streams and bias correction; 7-bit weights on CPUs without int8 dot products.
QUANT_RECIPE = {"method": "auto", "cle": True, "equalize_activations": True, "bias_correction": True}
INPUT_SHAPE = (1, 3, 224, 224)
EAGER = "eager PyTorch fp32"  # the model as the user trains it, timed beside the artifacts


def demo(output_dir: str | Path = "npukit_out", *, threads: int = 1, runs: int = 50, html: bool = True):
    """The main job on the embedded default: MobileNetV2 with official ImageNet weights, real photos, every stage
    (the verbs of ``npukit.api`` in a row); returns a ``CommandResult``."""
    return run_demo(Path(output_dir), threads=threads, runs=runs, html=html)


def run_demo(output_dir: Path, *, threads: int = 1, runs: int = 50, html: bool = True):
    import npukit.api as api
    from npukit.data.embedded import calibration_and_evaluation_sets, default_model_weights
    from npukit.measure.size import model_size

    from npukit._atomic import check_writes

    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise InputError(f"{output_dir} is a file: the demo writes its models and report into a folder",
                         hint="name a folder with -o (a new one is made)")
    check_writes([output_dir / "demo.report.json"], [])  # a folder this process can create files in
    output_dir.mkdir(parents=True, exist_ok=True)
    weights = default_model_weights()
    report = Report("demo", title="npukit demo: MobileNetV2 (official ImageNet weights) on real photos",
                    config={"model": MODEL_SPEC, "weights": str(weights), "input_shape": list(INPUT_SHAPE),
                            "threads": threads, "runs": runs})

    fp32_path = output_dir / "mobilenet_v2.onnx"
    exported = api.export(MODEL_SPEC, fp32_path, weights=weights, input_shape=INPUT_SHAPE, html=False)
    add_stage(report, "export", exported.report, ["export"], sections_prefixed=False)

    opt_path = output_dir / "mobilenet_v2.opt.onnx"
    optimized = api.optimize_graph(fp32_path, opt_path, input_shape=INPUT_SHAPE, html=False)
    add_stage(report, "optimize", optimized.report, ["passes", "before", "after", "verification"])

    with step("cutting real photos into crops", timings=report.timings, key="data"):
        photos = calibration_and_evaluation_sets()
    report.add("data", photos.describe())

    int8_path = output_dir / "mobilenet_v2.int8.onnx"
    name = _input_name(opt_path)
    calib = [{name: photos.calibration[i:i + 1]} for i in range(len(photos.calibration))]
    quantized = api.quantize(opt_path, int8_path, calib=calib, **QUANT_RECIPE, threads=threads, runs=runs,
                             html=False)
    add_stage(report, "quantize", quantized.report, ["steps", "integer_kernels", "kernel_profile"],
              tables=lambda t: t.title.startswith(("Layers", "What ORT", "Where the time goes")))
    models = {"fp32": fp32_path, "optimized": opt_path, "int8": int8_path}

    with step(f"timing {len(models)} models and eager PyTorch side by side", timings=report.timings,
              key="latency"):
        latency = _time_with_eager(models, weights, photos.evaluation[:1], threads=threads, runs=runs)
    eager = latency.pop(EAGER)
    stacked = _logits(models, photos.evaluation, threads=threads)
    summary = add_models(report, models, latency, {k: _agreement(stacked["fp32"], stacked[k]) for k in models},
               {k: model_size(path) for k, path in models.items()}, eager=eager, eager_label=EAGER,
               model_spec=MODEL_SPEC, samples=len(photos.evaluation), threads=threads)
    add_predictions(report, _predictions(stacked["int8"], photos))

    _task_verdict(report, stacked, quantized.report)
    report.add_artifact("fp32", fp32_path)
    report.add_artifact("optimized", opt_path)
    report.add_artifact("int8", int8_path)
    return finish(report, None, html=html, json_path=output_dir / "demo.report.json", result=summary)


def _logits(models: dict[str, Path], images: np.ndarray, *, threads: int) -> dict[str, np.ndarray]:
    """Each model's logits on every evaluation crop, one crop per run (model name -> crops x classes)."""
    from npukit.runtime.ort import make_session

    sessions = {k: make_session(v, threads=threads) for k, v in models.items()}
    names = {k: s.get_inputs()[0].name for k, s in sessions.items()}
    logits: dict[str, list[np.ndarray]] = {k: [] for k in models}
    for i in progress(range(len(images)), description="evaluating on real photos"):
        x = images[i:i + 1]
        for k, s in sessions.items():
            logits[k].append(np.asarray(s.run(None, {names[k]: x})[0], dtype=np.float32).reshape(1, -1))
    return {k: np.concatenate(v) for k, v in logits.items()}


def _agreement(reference: np.ndarray, candidate: np.ndarray):
    from npukit.measure.fidelity import AgreementMeter

    meter = AgreementMeter()
    meter.update(reference, candidate)
    return meter.result()


def _predictions(logits: np.ndarray, photos) -> list[tuple[str, str, float]]:
    """(photo, top-1 ImageNet class, its probability) on the first crop of each evaluation photo."""
    from npukit.data.embedded import imagenet_categories

    categories = imagenet_categories()
    per_photo = len(photos.evaluation) // max(1, len(photos.evaluation_photos))
    top = []
    for j, name in enumerate(photos.evaluation_photos):
        row = logits[j * per_photo]
        prob = np.exp(row - row.max())
        prob /= prob.sum()
        c = int(np.argmax(row))
        top.append((name, categories[c], float(prob[c])))
    return top


def _time_with_eager(models: dict[str, Path], weights: Path, x: np.ndarray, *, threads: int, runs: int) -> dict:
    """Each ONNX model on ORT and the PyTorch model in eager mode (the starting point a user deploys from), timed in
    the same interleaved rounds on the same input, ``threads`` each."""
    import torch

    from npukit._threads import torch_threads
    from npukit.frontend.spec import resolve_model
    from npukit.measure.latency import time_calls_interleaved
    from npukit.runtime.ort import make_session

    module = resolve_model(MODEL_SPEC, weights=str(weights)).module.eval()
    sessions = {k: make_session(v, threads=threads) for k, v in models.items()}
    calls = {k: (lambda s=s: s.run(None, {s.get_inputs()[0].name: x})) for k, s in sessions.items()}
    tensor = torch.from_numpy(np.array(x, dtype=np.float32, copy=True))

    def eager() -> None:
        with torch.no_grad():
            module(tensor)
    calls[EAGER] = eager
    with torch_threads(threads):
        return time_calls_interleaved(calls, threads=threads, warmup=10, runs=runs, rounds=min(10, runs))


def _task_verdict(report: Report, logits: dict[str, np.ndarray], quantize_report: Report) -> None:
    """The demo's verdict: the INT8 model's classification check against FP32 on the held-out photo crops
    (``npukit.tasks``, default floors), after quantize's own check on its calibration crops."""
    from npukit.report.task import add_task_check
    from npukit.tasks import QualityGate, choose_task, judge

    reference, candidate = logits["fp32"], logits["int8"]
    choice = choose_task([reference[:1].shape], [(1, *INPUT_SHAPE[1:])], task="classify")
    meter = choice.meter(["logits"])
    for i in range(len(reference)):
        meter.update([reference[i:i + 1]], [candidate[i:i + 1]])
    gate = QualityGate()
    earlier = [] if quantize_report.passed else [f"quantize's own check failed ({quantize_report.verdict})"]
    verdict = judge(meter.result(), gate, what="demo (INT8 vs FP32 on held-out photo crops)",
                    extra_failures=earlier)
    add_task_check(report, choice, meter.result(), gate, verdict, where=f"{len(reference)} held-out photo crops")


def _input_name(path: Path) -> str:
    import onnx

    return onnx.load(str(path), load_external_data=False).graph.input[0].name
