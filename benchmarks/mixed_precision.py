"""Mixed precision per layer under an accuracy budget, measured: ``npukit quantize --mixed-precision`` against the
all-int8 and the all-16-bit model of the same recipe, each checked on held-out data with the model's task and timed
side by side (ORT CPU, 1 thread, interleaved), in one run.

- ``mobilenet_v2``: official weights; calibrated on 42 crops of the 7 calibration photos, checked on the usual 208
  crops of the 13 others (no labels: against the float model). Budget: logits SQNR >= ``MV2_FLOOR_DB`` (task
  generic: the logits held to the SQNR floor).
- ``retinaface_mnet025`` (third-party zoo, ``zoo_models.py``): RetinaFace MobileNet0.25 at 480x640, calibrated on
  the zoo's calibration photos, checked on its evaluation photos with the detection task (matched faces against
  the float model's: F1 at IoU 0.25 and mAP@0.5, floor 0.9; the SQNR floor 20 dB on the outputs the task does not
  decode).

The all-16-bit model lifts every node's activations to 16 bits (``int16_nodes`` = every node), the usual way to
buy accuracy on a CPU; the per-layer plan is chosen on the calibration samples only.

The compression issue asks: on MobileNetV2 and one non-classifier of the zoo, the chosen plan meets the budget and
is faster (CPU) than the all-int16 plan that meets it.

    .venv/bin/python benchmarks/mixed_precision.py
    .venv/bin/python benchmarks/mixed_precision.py --models retinaface_mnet025

Writes ``benchmarks/results/mixed_precision.{md,json}`` (the CPU named in both).
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import third_party_zoo as zoo  # noqa: E402  (CPU name, revision)
from compression import mobilenet_v2, save_results  # noqa: E402

MODELS = ("mobilenet_v2", "retinaface_mnet025")
MV2_FLOOR_DB = 18.0
RUNS = 60


def _mv2(work: Path) -> dict[str, Any]:
    import numpy as np

    model, train, held, notes = mobilenet_v2(work)
    data = np.load(train)
    name = next(iter(data.keys()))
    calib = work / "mv2_calib.npz"
    np.savez(calib, **{name: data[name][::8][:42]})  # 42 crops over the 7 calibration photos
    from npukit.tasks import QualityGate

    return {"model": model, "calib": calib, "held": held, "task": "generic", "input_shape": None,
            "gate": QualityGate(min_sqnr_db=MV2_FLOOR_DB),
            "notes": {**notes, "calibration": 42, "budget": f"logits SQNR >= {MV2_FLOOR_DB:g} dB"}}


def _zoo(name: str, work: Path) -> dict[str, Any]:
    import zoo_models

    from npukit.tasks import QualityGate

    entry = zoo_models.MODELS[name]
    calib = zoo_models.save_feeds(list(entry.calibration()), work / f"{name}.calib")
    held = zoo_models.save_feeds(list(entry.evaluation()), work / f"{name}.eval")
    shape = [a for a in zoo._shape_args(entry) if a != "--input-shape"] or None
    return {"model": entry.model_path(), "calib": calib, "held": held, "task": None, "input_shape": shape,
            "gate": QualityGate(), "notes": {"note": entry.note, "budget": "the detection task's floors (0.9; "
                                                                           "20 dB on undecoded outputs)"}}


def _every_node(case: dict[str, Any]) -> list[str]:
    """The node names the quantizer sees (pre-processed, named), for the all-16-bit model."""
    from npukit.frontend.onnx_io import named_nodes
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.quant.qdq import preprocess

    proto = load_with_inputs(case["model"], InputSpec.parse(case["input_shape"]))
    return [n.name for n in preprocess(named_nodes(proto)).graph.node]


def _check(doc: dict[str, Any]) -> dict[str, Any]:
    check = doc["results"]["task_check"]
    result = check["result"]
    return {"task": result["task"], "metric": result["metric"], "value": result["value"],
            "worst_sqnr_db": min((o["sqnr_db"] for o in result["outputs"]), default=None),
            "passed": check["verdict"]["passed"], "verdict": doc["verdict"], "samples": result["samples"]}


def run_model(name: str, work: Path) -> dict[str, Any]:
    import dataclasses

    from npukit.api import quantize
    from npukit.config import PreprocessConfig
    from npukit.errors import InputError
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.measure.latency import measure_latency_interleaved
    from npukit.measure.size import model_size
    from npukit.verbs.common import open_data

    case = _mv2(work) if name == "mobilenet_v2" else _zoo(name, work)
    common = {"calib": str(case["calib"]), "data": str(case["held"]), "task": case["task"],
              "input_shape": case["input_shape"], "runs": 10}
    degraded = dataclasses.replace(case["gate"], accept_degraded=True)
    out: dict[str, Any] = {"notes": case["notes"], "variants": {}}
    paths = {}
    for variant in ("int8", "mixed", "all_16bit"):
        path = work / f"{name}.{variant}.onnx"
        start = time.perf_counter()
        try:
            if variant == "mixed":
                result = quantize(case["model"], path, mixed_precision=True, gate=case["gate"], **common)
            else:
                nodes = _every_node(case) if variant == "all_16bit" else ()
                result = quantize(case["model"], path, int16_nodes=nodes, gate=degraded, **common)
        except InputError as exc:
            out["variants"][variant] = {"error": str(exc).splitlines()[0][:300]}
            print(json.dumps({name: out["variants"][variant]}), flush=True)
            continue
        doc = result.report.to_dict()
        row = {"wall_s": round(time.perf_counter() - start, 1), **_check(doc),
               "size_bytes": model_size(path).file_bytes}
        if variant == "mixed":
            plan = doc["results"]["mixed_precision"]
            row["plan"] = {k: plan[k] for k in ("assignment", "met", "tried", "timing_ms", "all_16bit", "base_sqnr_db",
                                                "plan_sqnr_db", "samples", "order")}
            row["search_s"] = round(doc["timings"].get("mixed_precision", 0.0), 1)
        out["variants"][variant] = row
        paths[variant] = str(path)
        print(json.dumps({name: {variant: {k: v for k, v in row.items() if k != "plan"}}}, default=str), flush=True)
    paths = {"float": str(case["model"]), **paths}
    proto = load_with_inputs(case["model"], InputSpec.parse(case["input_shape"]))
    if case["input_shape"]:  # the float model timed with the zoo's static shapes, as the verb times it
        paths["float"] = proto
    feeds = open_data(case["held"], proto, PreprocessConfig()).sample(0)
    latency = measure_latency_interleaved(paths, threads=1, runs=RUNS, feeds=feeds)
    out["latency_ms"] = {k: v.median_ms for k, v in latency.items()}
    return out


def _fmt(value: Any, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(doc: dict[str, Any]) -> str:
    lines = [f"# Mixed precision per layer under a budget ({doc['cpu']}, {doc['cores']} cores)", "",
             f"npukit at {doc['commit']}, {doc['date']}. Held-out checks against the float model; latency: ORT CPU, "
             f"1 thread, medians of {RUNS} runs interleaved (float, int8, mixed, all-16-bit side by side).", "",
             "| model | budget | variant | task metric | value | worst output SQNR dB | meets budget | ms "
             "| vs all-16-bit | size MiB | layers lifted |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in doc["models"].items():
        lat = entry.get("latency_ms", {})
        for variant in ("int8", "mixed", "all_16bit"):
            row = entry["variants"].get(variant, {})
            if "error" in row:
                lines.append(f"| {name} | {entry['notes']['budget']} | {variant} | error: {row['error']} |||||||")
                continue
            lifted = row.get("plan", {}).get("assignment")
            counts = "" if lifted is None else ", ".join(
                f"{sum(1 for p in lifted.values() if p == kind)} {kind}" for kind in ("int16", "float32"))
            ratio = lat.get(variant) / lat["all_16bit"] if lat.get(variant) and lat.get("all_16bit") else None
            lines.append(f"| {name} | {entry['notes']['budget']} | {variant} | {row['metric']} | {_fmt(row['value'])} "
                         f"| {_fmt(row['worst_sqnr_db'], 2)} | {'yes' if row['passed'] else 'no'} "
                         f"| {_fmt(lat.get(variant), 2)} | {_fmt(ratio, 2)} | {row['size_bytes'] / 2**20:.2f} "
                         f"| {counts} |")
        lines.append(f"| {name} | | float | | | | | {_fmt(lat.get('float'), 2)} | | | |")
    lines += ["", "## Targets", ""] + [f"- {t}" for t in doc["targets"]]
    for name, entry in doc["models"].items():
        plan = entry["variants"].get("mixed", {}).get("plan")
        if plan:
            lines += ["", f"## {name}: the search (calibration samples)", "",
                      f"Search {entry['variants']['mixed'].get('search_s')} s; output SQNR on {plan['samples']} "
                      f"calibration samples {plan['base_sqnr_db']:.2f} dB all int8, {plan['plan_sqnr_db']:.2f} dB "
                      f"as planned; lifted: " + (", ".join(f"{n} {p}" for n, p in plan["assignment"].items())
                                                 or "none"), "",
                      "| layers lifted | passed | verdict |", "|---|---|---|"]
            lines += [f"| {t['lifted']} | {t['passed']} | {t['line']} |" for t in plan["tried"]]
    return "\n".join(lines) + "\n"


def targets(doc: dict[str, Any]) -> list[str]:
    out = []
    for name, entry in doc["models"].items():
        variants, lat = entry["variants"], entry.get("latency_ms", {})
        mixed, wide = variants.get("mixed", {}), variants.get("all_16bit", {})
        if "error" in mixed or not mixed:
            out.append(f"{name}: NOT met (no mixed plan: {mixed.get('error', 'not run')})")
            continue
        faster = lat.get("mixed") is not None and lat.get("all_16bit") is not None and lat["mixed"] < lat["all_16bit"]
        met = mixed.get("passed") and wide.get("passed") and faster
        out.append(f"{name}: mixed plan meets the budget on held-out data: {'yes' if mixed.get('passed') else 'no'}; "
                   f"all-16-bit meets it: {'yes' if wide.get('passed') else 'no'}; mixed "
                   f"{_fmt(lat.get('mixed'), 2)} ms vs all-16-bit {_fmt(lat.get('all_16bit'), 2)} ms: "
                   f"{'met' if met else 'NOT met'}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--out", default=str(HERE / "results" / "mixed_precision"))
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"cpu": zoo._cpu(), "cores": os.cpu_count(), "commit": zoo.revision(),
                           "date": time.strftime("%Y-%m-%d"), "models": {}}
    with tempfile.TemporaryDirectory(prefix="npukit-mixed-") as tmp:
        for name in args.models:
            doc["models"][name] = run_model(name, Path(tmp))
    doc["targets"] = targets(doc)
    save_results(doc, Path(args.out), table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
