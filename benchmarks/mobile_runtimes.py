"""ExecuTorch (.pte, XNNPACK delegate) and LiteRT (.tflite, XNNPACK delegate) from npukit against the runtimes' own
quantizers, on real-weight PyTorch models.

For each model and runtime: the fp32 artifact (npukit compile --target executorch-xnnpack / litert, no --calib) and
its error against eager torch; the INT8 artifact from npukit's plan (compile with --calib); the runtimes' own INT8
routes as anchors, calibrated on the same samples: ExecuTorch's XNNPACKQuantizer (symmetric per-channel, PT2E,
lowered the same way), LiteRT's PT2E quantizer (symmetric per-channel, converted by litert-torch) and
ai-edge-quantizer's static int8 recipe on the fp32 .tflite (its default calibration); and npukit's own ORT INT8
model (quantize with this CPU's default scheme). Each INT8 model is compared with eager float torch on held-out
inputs (output SQNR, and top-1 agreement where the model classifies). Latency: each artifact, eager torch and ORT,
1 thread, interleaved in one run. Writes benchmarks/results/mobile_runtimes.{md,json}, naming the CPU.

    .venv/bin/python benchmarks/mobile_runtimes.py [--only mobilenet_v2 mtcnn_onet mtcnn_rnet] [--eval 64]
"""

from __future__ import annotations

import argparse
import os
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import third_party_zoo as zoo  # noqa: E402


def _mobilenet() -> dict:
    from npukit.data.embedded import calibration_and_evaluation_sets, default_model_weights

    sets = calibration_and_evaluation_sets()
    return {"spec": "torchvision:mobilenet_v2", "weights": str(default_model_weights()), "shape": (1, 3, 224, 224),
            "calib": [c[None] for c in sets.calibration], "eval": [e[None] for e in sets.evaluation],
            "classify": True, "what": "MobileNetV2, torchvision's ImageNet weights; 42 crops of 7 photos to "
                                      "calibrate, crops of 13 other photos to evaluate"}


def _onet() -> dict:
    from zoo_models import MODELS

    model = MODELS["mtcnn_onet"]
    if not model.installed():
        raise SystemExit("mtcnn_onet needs facenet-pytorch: bash scripts/setup_zoo.sh")
    name = model.inputs[0].name
    return {"spec": model.factory, "weights": str(model.model_path()), "shape": model.inputs[0].shape,
            "calib": [f[name] for f in model.calibration()], "eval": [f[name] for f in model.evaluation()],
            "classify": False, "what": "MTCNN ONet (facenet-pytorch's weights): box regression, landmarks, face "
                                       "probability; face crops from the zoo's photos"}


def _pnet() -> dict:
    """MTCNN's proposal net, fully convolutional: a face/no-face map and box offsets per 12x12 window; fed the
    zoo's 48x48 face crops (one scale of the image pyramid it runs on)."""
    onet = _onet()
    from zoo_models import MODELS as ZOO

    weights = ZOO["mtcnn_onet"].model_path().with_name("pnet.pt")
    return onet | {"spec": "facenet_pytorch.models.mtcnn:PNet", "weights": str(weights),
                   "what": "MTCNN PNet (facenet-pytorch's weights), fully convolutional: box offsets and face "
                           "probability maps; 48x48 face crops from the zoo's photos"}


def _rnet() -> dict:
    """MTCNN's refinement net, 24x24 crops: the zoo's 48x48 face crops (and non-face squares) averaged 2x2, as the
    cascade resizes its windows for RNet. Its box output is small beside its face probability: the output the check
    holds to the SQNR floor, where the plan's float head had to stretch past its MAC share."""
    onet = _onet()
    from zoo_models import MODELS as ZOO

    def half(crops: list[np.ndarray]) -> list[np.ndarray]:
        return [c.reshape(c.shape[0], c.shape[1], c.shape[2] // 2, 2, c.shape[3] // 2, 2).mean(axis=(3, 5))
                .astype(np.float32) for c in crops]

    weights = ZOO["mtcnn_onet"].model_path().with_name("rnet.pt")
    return onet | {"spec": "facenet_pytorch.models.mtcnn:RNet", "weights": str(weights), "shape": (1, 3, 24, 24),
                   "calib": half(onet["calib"]), "eval": half(onet["eval"]),
                   "what": "MTCNN RNet (facenet-pytorch's weights): box regression and face probability; the zoo's "
                           "48x48 face crops and non-face squares averaged to 24x24"}


MODELS = {"mobilenet_v2": _mobilenet, "mtcnn_pnet": _pnet, "mtcnn_onet": _onet, "mtcnn_rnet": _rnet}


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((ref - got) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(ref ** 2)) / noise)


def _anchor_pte(module: torch.nn.Module, calib: list[np.ndarray], path: Path) -> float:
    """ExecuTorch's own INT8 route: XNNPACKQuantizer (symmetric, per channel), PT2E, XNNPACK lowering."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                         get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    from npukit.runtime import executorch

    start = time.perf_counter()
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared, example = _calibrated(module, calib, quantizer)
    path.write_bytes(executorch.lower(convert_pt2e(prepared), example).buffer)
    return time.perf_counter() - start


def _calibrated(module: torch.nn.Module, calib: list[np.ndarray], quantizer: object) -> tuple:
    """``module`` exported, prepared for PT2E with ``quantizer`` and run on every calibration input."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    example = (torch.from_numpy(np.array(calib[0], copy=True)),)
    prepared = prepare_pt2e(torch.export.export(module, example).module(), quantizer)
    with torch.no_grad():
        for x in calib:
            prepared(torch.from_numpy(np.array(x, copy=True)))
    return prepared, example


def _anchor_litert_pt2e(module: torch.nn.Module, calib: list[np.ndarray], path: Path) -> float:
    """LiteRT's PT2E route: its PT2EQuantizer (symmetric, per channel), convert_pt2e keeping the weights' quantize
    ops, litert-torch's converter."""
    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    from npukit.runtime import litert

    start = time.perf_counter()
    quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared, example = _calibrated(module, calib, quantizer)
    path.write_bytes(litert.lower(convert_pt2e(prepared, fold_quantize=False), example).buffer)
    return time.perf_counter() - start


def _anchor_ai_edge_quantizer(float_tflite: Path, calib: list[np.ndarray], path: Path) -> float:
    """ai-edge-quantizer's static int8 recipe (int8 weights and activations) on the fp32 .tflite, its default
    calibration on the same samples."""
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import quantizer, recipe

    start = time.perf_counter()
    signature = Interpreter(model_path=str(float_tflite)).get_signature_list()
    key, names = next(iter(signature.items()))
    work = quantizer.Quantizer(str(float_tflite))
    work.load_quantization_recipe(recipe.static_wi8_ai8())
    data = {key: [{names["inputs"][0]: np.array(x, dtype=np.float32)} for x in calib]}
    path.write_bytes(work.quantize(work.calibrate(data)).quantized_model)
    return time.perf_counter() - start


def run_model(name: str, work: Path, eval_count: int) -> dict:
    from npukit.errors import InputError
    from npukit.frontend.spec import resolve_model
    from npukit.frontend.verify import flatten_outputs
    from npukit.measure.latency import time_calls_interleaved
    from npukit.runtime import executorch, litert
    from npukit.runtime.ort import make_session
    from npukit.verbs.compile_mobile import compile_mobile
    from npukit.verbs.quantize import quantize

    spec = MODELS[name]()
    module = resolve_model(spec["spec"], weights=spec["weights"]).module.eval()
    shape = ",".join(map(str, spec["shape"]))
    calib_file = work / f"{name}_calib.npy"
    np.save(calib_file, np.concatenate(spec["calib"]).astype(np.float32))
    evaluation = spec["eval"][:eval_count]
    seconds = {}
    paths = {"npukit fp32 .pte": work / f"{name}_fp32.pte", "npukit INT8 .pte": work / f"{name}_int8.pte",
             "ExecuTorch XNNPACKQuantizer .pte": work / f"{name}_anchor.pte",
             "npukit fp32 .tflite": work / f"{name}_fp32.tflite", "npukit INT8 .tflite": work / f"{name}_int8.tflite",
             "LiteRT PT2E quantizer .tflite": work / f"{name}_pt2e.tflite",
             "ai-edge-quantizer .tflite": work / f"{name}_aeq.tflite"}
    fp32_errors, verdicts, carried, refused = {}, {}, {}, {}
    for target, suffix in (("executorch-xnnpack", ".pte"), ("litert", ".tflite")):
        start = time.perf_counter()
        try:
            fp32 = compile_mobile(spec["spec"], paths[f"npukit fp32 {suffix}"], target=target, input_shape=shape,
                                  weights=spec["weights"])
        except InputError as exc:  # a model the runtime cannot lower: npukit's one-line refusal is the result
            refused[target] = f"{exc} {exc.hint}".strip()
            for label in [k for k in paths if k.endswith(suffix)]:
                del paths[label]
            continue
        seconds[f"npukit fp32 {suffix}"] = time.perf_counter() - start
        fp32_errors[target] = fp32.report.sections["fp32_error"]["max_abs_over_range"]
        start = time.perf_counter()
        int8 = compile_mobile(spec["spec"], paths[f"npukit INT8 {suffix}"], target=target, input_shape=shape,
                              weights=spec["weights"], calib=calib_file)
        seconds[f"npukit INT8 {suffix}"] = time.perf_counter() - start
        verdicts[target], carried[target] = int8.report.verdict, int8.report.sections["carried_plan"]
    if "executorch-xnnpack" not in refused:
        label = "ExecuTorch XNNPACKQuantizer .pte"
        seconds[label] = _anchor_pte(module, spec["calib"], paths[label])
    if "litert" not in refused:
        label = "LiteRT PT2E quantizer .tflite"
        seconds[label] = _anchor_litert_pt2e(module, spec["calib"], paths[label])
        label = "ai-edge-quantizer .tflite"
        seconds[label] = _anchor_ai_edge_quantizer(paths["npukit fp32 .tflite"], spec["calib"], paths[label])
    float_onnx = work / f"{name}.onnx"
    from npukit.verbs.export import export

    export(spec["spec"], float_onnx, weights=spec["weights"], input_shape=shape)
    ort_int8 = work / f"{name}_int8.onnx"
    start = time.perf_counter()
    quantize(float_onnx, ort_int8, calib=calib_file, runs=5)
    seconds["npukit INT8 ONNX (ORT CPU)"] = time.perf_counter() - start
    runners = {label: (executorch if label.endswith(".pte") else litert).Runner(path) for label, path in paths.items()}
    session = make_session(str(ort_int8), threads=1)
    runners["npukit INT8 ONNX (ORT CPU)"] = lambda feeds: session.run(None, feeds)
    input_name = session.get_inputs()[0].name

    def eager(x: np.ndarray) -> list[np.ndarray]:
        with torch.no_grad():
            return [o.numpy() for o in flatten_outputs(module(torch.from_numpy(np.array(x, copy=True))))]

    rows = {}
    for label, runner in runners.items():
        sqnrs, agree = [], []
        for x in evaluation:
            ref = eager(x)
            got = runner({input_name: np.array(x, dtype=np.float32)})
            sqnrs.append(min(_sqnr(r, np.asarray(g).reshape(r.shape)) for r, g in zip(ref, got)))
            if spec["classify"]:
                agree.append(int(np.argmax(ref[0]) == np.argmax(got[0])))
        size = (paths[label] if label in paths else ort_int8).stat().st_size
        rows[label] = {"sqnr_db": float(np.mean(sqnrs)), "worst_sqnr_db": float(np.min(sqnrs)),
                       "top1_agreement": float(np.mean(agree)) if agree else None, "bytes": size,
                       "build_seconds": seconds[label]}
    feeds = {input_name: np.array(evaluation[0], dtype=np.float32)}
    float_session = make_session(str(float_onnx), threads=1)
    calls = {label: (lambda r=runner: r(feeds)) for label, runner in runners.items()}
    calls["eager torch fp32"] = lambda: eager(evaluation[0])
    calls["ORT CPU fp32"] = lambda: float_session.run(None, feeds)
    torch.set_num_threads(1)
    latency = time_calls_interleaved(calls, threads=1, warmup=3, runs=60, rounds=4)
    eager_ms = latency["eager torch fp32"].median_ms
    for label, result in latency.items():
        rows.setdefault(label, {})["median_ms"] = result.median_ms
        rows[label]["speedup_vs_eager"] = eager_ms / result.median_ms
    return {"model": name, "what": spec["what"], "eval_samples": len(evaluation), "calib_samples": len(spec["calib"]),
            "fp32_error_over_range": fp32_errors, "npukit_int8_verdict": verdicts, "carried_plan": carried,
            "refused": refused, "rows": rows}


def _markdown(results: list[dict], cpu: str) -> str:
    lines = ["# Mobile runtimes: ExecuTorch .pte and LiteRT .tflite (XNNPACK) from npukit's plan vs the runtimes' own "
             "quantizers", "",
             f"CPU: {cpu}; 1 thread; latency interleaved in one run (median of 60). SQNR: mean over the held-out "
             "inputs of the worst output's SQNR against eager float torch. Written by benchmarks/mobile_runtimes.py.",
             ""]
    for result in results:
        errors = "; ".join(f"fp32 {t} max error / output range {e:.1e}"
                           for t, e in result["fp32_error_over_range"].items())
        lines += [f"## {result['model']}", "", result["what"] + f"; {result['calib_samples']} calibration, "
                  f"{result['eval_samples']} evaluation inputs. {errors}.", ""]
        for target, why in result["refused"].items():
            lines += [f"npukit compile --target {target} refused it (exit 2, nothing written): {why}", ""]
        lines += [
                  "| artifact | top-1 agreement | SQNR dB (worst) | size | median ms | vs eager torch | build s |",
                  "|---|---|---|---|---|---|---|"]
        for label, row in result["rows"].items():
            agree = f"{row['top1_agreement']:.3f}" if row.get("top1_agreement") is not None else "-"
            sqnr = f"{row['sqnr_db']:.1f} ({row['worst_sqnr_db']:.1f})" if "sqnr_db" in row else "-"
            size = f"{row['bytes'] / 1e6:.2f} MB" if "bytes" in row else "-"
            build = f"{row['build_seconds']:.0f}" if "build_seconds" in row else "-"
            lines.append(f"| {label} | {agree} | {sqnr} | {size} | {row['median_ms']:.2f} | "
                         f"{row['speedup_vs_eager']:.2f}x | {build} |")
        lines.append("")
        for target, verdict in result["npukit_int8_verdict"].items():
            lines += [f"npukit INT8 {target} verdict (compile's check on calibration inputs): {verdict}", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--eval", type=int, default=64, help="held-out inputs per model (default 64)")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--stem", default="mobile_runtimes")
    args = parser.parse_args()
    cpu = f"{zoo._cpu()}, {os.cpu_count()} cores"
    results = []
    with tempfile.TemporaryDirectory(prefix="npukit-mobile-") as work:
        for name in args.only:
            results.append(run_model(name, Path(work), args.eval))
            print(json.dumps({k: v for k, v in results[-1].items() if k == "rows"}, indent=1), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.stem}.json").write_text(json.dumps({"cpu": cpu, "results": results}, indent=1, default=str))
    (out / f"{args.stem}.md").write_text(_markdown(results, cpu))
    print(_markdown(results, cpu))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
