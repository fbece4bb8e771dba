"""npukit optimize on the mobile runtimes: the recipe search measured on ExecuTorch (XNNPACK delegate) and LiteRT.

Per PyTorch model (MobileNetV2 with its official weights and the embedded photos; MTCNN's ONet from facenet-pytorch
with the zoo's face crops, ``benchmarks/zoo_models.py``) and target, one ``npukit optimize --target T`` run through the
CLI: each trial's plan made on the ONNX export, carried onto the torch program, lowered by the runtime and measured on
it (task metric against the float model on held-out inputs; latency as a ratio to the same runtime's fp32 artifact,
timed in the same interleaved rounds, 1 thread; the artifact's bytes against the fp32 artifact's). A model a runtime
cannot lower is recorded with the one-line error the user gets.

    .venv/bin/python benchmarks/optimize_mobile.py                      # every model x target, 8 trials, 1% budget
    .venv/bin/python benchmarks/optimize_mobile.py --only mobilenet_v2 --targets litert --trials 4

Writes ``benchmarks/results/optimize_mobile.{md,json}`` (``--stem`` to name them otherwise; the CPU named in both).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import third_party_zoo as zoo  # noqa: E402
import zoo_models  # noqa: E402

TARGETS = {"executorch-xnnpack": ".pte", "litert": ".tflite"}
MODELS = ("mobilenet_v2", "mtcnn_onet")


def inputs(name: str, work: Path) -> tuple[list[str], Path, Path]:
    """(model arguments, calibration data, evaluation data) for ``name``."""
    if name == "mobilenet_v2":
        from npukit.data.embedded import default_model_weights, split_photos, write_image_folder

        calib_photos, eval_photos = split_photos()
        calib, evaluation = work / "calib", work / "eval"
        write_image_folder(calib, calib_photos, 6)
        write_image_folder(evaluation, eval_photos, 16)
        return ["torchvision:mobilenet_v2", "--weights", str(default_model_weights())], calib, evaluation
    model = zoo_models.MODELS[name]
    calib = zoo_models.save_feeds(model.calibration(), work / f"{name}.calib")
    evaluation = zoo_models.save_feeds(model.evaluation(), work / f"{name}.eval")
    return [model.factory, "--weights", str(model.model_path()), *zoo._shape_args(model)], calib, evaluation


def run(name: str, target: str, *, trials: int, budget: str, timeout: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"npukit-optm-{name}-") as tmp:
        work = Path(tmp)
        model_args, calib, evaluation = inputs(name, work)
        out = work / f"best{TARGETS[target]}"
        args = ["optimize", *model_args, "--target", target, "-o", str(out), "--calib", str(calib), "--data",
                str(evaluation), "--trials", str(trials), "--budget", budget]
        start = time.perf_counter()
        try:
            done = subprocess.run(zoo._npukit() + args, capture_output=True, text=True, timeout=timeout, cwd=work)
            rc, err = done.returncode, done.stderr
        except subprocess.TimeoutExpired:
            rc, err = 124, f"timed out after {timeout} s"
        seconds = time.perf_counter() - start
        report_path = out.with_name(out.name + ".report.json")  # a phone artifact's report keeps its suffix
        row = {"model": name, "target": target, "rc": rc, "seconds": round(seconds, 1),
               "artifact_bytes": out.stat().st_size if out.exists() else None}
        if not report_path.exists():
            lines = [ln for ln in err.splitlines() if ln.startswith(("error:", "Error"))]
            return row | {"verdict": (lines or err.strip().splitlines()[-1:] or ["(no report)"])[0]}
        report = json.loads(report_path.read_text())
        search = report["results"].get("search", {})
        row |= {"verdict": report["verdict"], "fp32_bytes": report["results"].get("fp32_artifact", {}).get("bytes"),
                "chosen": search.get("chosen"), "min_metric": search.get("min_metric"),
                "trials": [{k: t.get(k) for k in ("number", "label", "feasible", "metric_name", "metric",
                                                  "worst_sqnr_db", "latency", "latency_ms", "float_latency_ms",
                                                  "size", "size_bytes", "memory", "energy", "confirmed",
                                                  "seconds", "error")} for t in search.get("trials", [])]}
        return row


def _r(v, digits=3):
    return "" if v is None else round(v, digits) if isinstance(v, float) else v


def write(rows: list[dict], out: Path, stem: str, *, note: str) -> None:
    cpu = f"{zoo._cpu()}, {time.strftime('%Y-%m-%d')}"
    (out / f"{stem}.json").write_text(json.dumps({"cpu": cpu, "note": note, "rows": rows}, indent=1))
    lines = [f"# npukit optimize on the mobile runtimes ({cpu})", "", note, "",
             "| model | target | trial | recipe | within budget | task metric | value | worst SQNR dB | latency x fp32 "
             "artifact | ms | fp32 ms | size x fp32 | bytes | trial s |", "|" + "---|" * 14]
    for row in rows:
        for t in row.get("trials", []):
            mark = " (chosen)" if t["number"] == row.get("chosen") else ""
            lines.append(f"| {row['model']} | {row['target']} | {t['number']}{mark} | {t['label']} | {t['feasible']} "
                         f"| {t['metric_name']} | {_r(t['metric'])} | {_r(t['worst_sqnr_db'], 1)} | "
                         f"{_r(t['latency'], 2)}{' (timed again)' if t['confirmed'] else ''} | {_r(t['latency_ms'], 2)} "
                         f"| {_r(t['float_latency_ms'], 2)} | {_r(t['size'], 2)} | {t['size_bytes']} | "
                         f"{_r(t['seconds'], 0)} |")
    lines += ["", "| model | target | exit | wall s | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['target']} | {r['rc']} | {r['seconds']} | {r['verdict']} |" for r in rows]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    parser.add_argument("--targets", nargs="*", default=list(TARGETS))
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--budget", default="1%")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--stem", default="optimize_mobile")
    parser.add_argument("--note", default="")
    parser.add_argument("--merge", action="store_true", help="keep the rows of the stem's JSON for other models and "
                                                             "targets (a rerun of some of them)")
    args = parser.parse_args()
    rows = []
    previous = HERE / "results" / f"{args.stem}.json"
    if args.merge and previous.exists():
        rows = [r for r in json.loads(previous.read_text())["rows"]
                if not (r["model"] in args.only and r["target"] in args.targets)]
    for name in args.only:
        for target in args.targets:
            print(f"{name} on {target} ...", flush=True)
            rows.append(run(name, target, trials=args.trials, budget=args.budget, timeout=args.timeout))
            print(f"  {rows[-1]['verdict'][:160]}", flush=True)
            write(rows, HERE / "results", args.stem, note=args.note)


if __name__ == "__main__":
    main()
