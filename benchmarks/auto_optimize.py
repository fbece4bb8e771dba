"""npukit optimize against Intel Neural Compressor's accuracy-driven tuning, in one run on one machine.

Per model (MobileNetV2 with the embedded photos, and third-party zoo models, ``benchmarks/zoo_models.py``):
the same float model (optimize-graph'd), the same calibration inputs and the same held-out inputs for both; the same
budget (the task metric may fall 1% below the float model's: npukit's ``--budget``, INC's ``tolerable_loss``) and the
same metric (npukit's task metric against the float model; INC's eval_fn calls it). Then, side by side in this
process: both artifacts' task metric on the held-out inputs, latency timed in the same interleaved rounds with the
float model (1 thread), file size, and each tool's tuning wall time.

The auto-optimize issue asks: npukit's chosen point dominates INC's (at least as accurate, and faster or smaller)
with less tuning wall time; its Pareto front holds a point within 1% of float at <= 0.55x float latency.

    bash benchmarks/setup_inc.sh                                   # INC's ONNX line in .venv-inc (numpy < 2)
    .venv/bin/python benchmarks/auto_optimize.py                   # MobileNetV2, YOLOv8n (NudeNet), PP-OCR cls
    .venv/bin/python benchmarks/auto_optimize.py --only mobilenet_v2 --trials 8

Writes ``benchmarks/results/auto_optimize.{md,json}`` (the CPU named in both).
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

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import default_recipe  # noqa: E402  (the models' float, calibration and held-out inputs)
import third_party_zoo as zoo  # noqa: E402

MODELS = ("mobilenet_v2", "nudenet_yolov8n", "ppocr_cls")
INC_PYTHON = ROOT / ".venv-inc" / "bin" / "python"


def _as_arrays(path: Path, model: Path, folder: Path) -> Path:
    """``path`` as NAME.npy / NAME.npz (an image folder read the way npukit reads it), for INC's script."""
    if path.suffix in (".npy", ".npz"):
        return path
    import onnx

    from npukit.config import PreprocessConfig
    from npukit.verbs.common import open_data

    data = open_data(path, onnx.load(str(model)), PreprocessConfig())
    name = data.input_names[0]
    out = folder / f"{path.name}.npy"
    np.save(out, np.concatenate([data.sample(i)[name] for i in range(len(data))]))
    return out


def _compare(model: Path, candidates: dict[str, Path], held: Path, *, runs: int) -> dict[str, dict]:
    """Task metric on the held-out inputs and latency (interleaved with the float model, 1 thread) of each."""
    import onnx

    from npukit.config import PreprocessConfig
    from npukit.measure.latency import measure_latency_interleaved
    from npukit.measure.task_fidelity import check_samples, compare_task, session_runner
    from npukit.runtime.ort import make_session
    from npukit.verbs.common import open_data

    proto = onnx.load(str(model))
    data = open_data(held, proto, PreprocessConfig())
    samples = check_samples(data, len(data))
    reference = make_session(proto)
    names = [o.name for o in reference.get_outputs()]
    out: dict[str, dict] = {}
    for name, path in candidates.items():
        _, result = compare_task(session_runner(reference), session_runner(make_session(path)), samples,
                                 output_names=names)
        sqnrs = [o.sqnr_db for o in result.outputs]
        out[name] = {"metric": result.metric, "value": result.value, "worst_sqnr_db": round(min(sqnrs), 2),
                     "samples": result.samples, "bytes": path.stat().st_size}
    timed = measure_latency_interleaved({"float": model, **candidates}, threads=1, runs=runs, rounds=10,
                                        feeds=data.sample(0))
    for name in candidates:
        out[name] |= {"ms": round(timed[name].median_ms, 3),
                      "latency_x_float": round(timed[name].median_ms / timed["float"].median_ms, 3)}
    out["float"] = {"ms": round(timed["float"].median_ms, 3), "bytes": model.stat().st_size}
    return out


def run(name: str, *, trials: int, budget: float, runs: int, timeout: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"autoopt-{name}-") as tmp:
        work = Path(tmp)
        source, shapes, calib, held = default_recipe.inputs(name, work)
        model = work / "opt.onnx"
        subprocess.run(zoo._npukit() + ["optimize-graph", str(source), "-o", str(model)] + shapes, check=True,
                       capture_output=True, cwd=work)
        npk = work / "npukit" / "best.onnx"
        npk.parent.mkdir()
        start = time.perf_counter()
        done = subprocess.run(zoo._npukit() + ["optimize", str(model), "-o", str(npk), "--calib", str(calib),
                                               "--data", str(held), "--budget", f"{budget}", "--trials", str(trials)]
                              + shapes, capture_output=True, text=True, timeout=timeout, cwd=work,
                              env={**os.environ, "COLUMNS": "160"})
        npk_s = time.perf_counter() - start
        report = json.loads(npk.with_name("best.report.json").read_text())
        search = report["results"]["search"]
        row = {"model": name, "npukit": {"exit": done.returncode, "seconds": round(npk_s, 1),
                                         "verdict": report["verdict"], "trials": len(search["trials"]),
                                         "chosen": search["chosen"], "front": search["front"],
                                         "trial_log": search["trials"]}}
        inc_json, inc_model = work / "inc.json", work / "inc.onnx"
        start = time.perf_counter()
        inc = subprocess.run([str(INC_PYTHON), str(HERE / "anchors" / "inc_autotune.py"), "--model", str(model),
                              "--calib", str(_as_arrays(calib, model, work)), "--eval",
                              str(_as_arrays(held, model, work)), "--budget", f"{budget}", "--out", str(inc_model),
                              "--json", str(inc_json)], capture_output=True, text=True, timeout=timeout, cwd=work)
        inc_s = time.perf_counter() - start
        inc_doc = json.loads(inc_json.read_text()) if inc_json.is_file() else {"found": False}
        row["inc"] = {"exit": inc.returncode, "seconds": round(inc_s, 1), "found": inc_doc.get("found", False),
                      "trials": inc_doc.get("trials"), "evaluations": inc_doc.get("evaluations", []),
                      "error": inc.stderr.strip().splitlines()[-1] if inc.returncode else ""}
        candidates = {k: p for k, p in (("npukit", npk), ("inc", inc_model)) if p.is_file()}
        row["side_by_side"] = _compare(model, candidates, held, runs=runs) if candidates else {}
        row["checks"] = _checks(row, budget)
        print(json.dumps({k: row[k] for k in ("model", "side_by_side", "checks")}), flush=True)
        return row


def _checks(row: dict, budget: float) -> dict:
    side = row["side_by_side"]
    npk, inc = side.get("npukit"), side.get("inc")
    out: dict = {}
    if npk and inc:
        accurate = (npk["value"] or 0) >= (inc["value"] or 0)
        out["dominates_inc"] = bool(accurate and (npk["latency_x_float"] < inc["latency_x_float"]
                                                  or npk["bytes"] < inc["bytes"]))
    out["less_tuning_time"] = row["npukit"]["seconds"] < row["inc"]["seconds"]
    fast = [t for t in row["npukit"]["trial_log"] if t["feasible"] and t["latency"] is not None
            and t["latency"] <= 0.55]
    out["front_point_within_budget_at_0.55x"] = bool(fast)
    out["fastest_within_budget_x_float"] = min((t["latency"] for t in row["npukit"]["trial_log"] if t["feasible"]),
                                               default=None)
    return out


def write(rows: list[dict], out: Path, stem: str, *, note: str, trials: int, budget: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"cpu": zoo._cpu(), "cores": os.cpu_count(), "commit": zoo.revision(), "date": time.strftime("%Y-%m-%d"),
           "trials": trials, "budget": budget, "note": note, "rows": rows}
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# npukit optimize vs Neural Compressor's accuracy-driven tuning ({doc['cpu']}, {doc['cores']} cores, "
             f"{doc['date']})", "",
             f"npukit at {doc['commit']}; budget {budget:.1%} on the task metric against the float model (INC: "
             f"tolerable_loss {budget}); npukit {trials} trials (space quick, TPE, seed 0, prefer latency); INC "
             "onnx-neural-compressor 1.0, StaticQuantConfig's tuning set (QDQ), sequential sampler. Metric, latency "
             "(1 thread, interleaved with the float model) and size measured side by side after both finished. "
             + note, "",
             "| model | tool | tuning s | trials | task metric | value | worst SQNR dB | ms | x float | MB | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        side = r["side_by_side"]
        for tool in ("npukit", "inc"):
            s = side.get(tool, {})
            info = r[tool]
            verdict = info.get("verdict", "") if tool == "npukit" else \
                ("found" if info.get("found") else f"none found {info.get('error', '')}")
            value = f"{s['value']:.3f}" if isinstance(s.get("value"), float) else ""
            lines.append(f"| {r['model']} | {tool} | {info['seconds']} | {info.get('trials')} | {s.get('metric', '')} "
                         f"| {value} | {s.get('worst_sqnr_db', '')} | {s.get('ms', '')} | "
                         f"{s.get('latency_x_float', '')} | {round(s['bytes'] / 1e6, 2) if s.get('bytes') else ''} | "
                         f"{verdict.replace('|', '/')[:160]} |")
        lines.append(f"| {r['model']} | float | | | | | | {side.get('float', {}).get('ms', '')} | 1.0 | "
                     f"{round(side.get('float', {}).get('bytes', 0) / 1e6, 2)} | |")
    lines += ["", "| model | npukit dominates INC | less tuning time | front point within budget at <= 0.55x | "
                  "fastest within budget (x float) |", "|---|---|---|---|---|"]
    for r in rows:
        c = r["checks"]
        fastest = c["fastest_within_budget_x_float"]
        lines.append(f"| {r['model']} | {c.get('dominates_inc')} | {c['less_tuning_time']} | "
                     f"{c['front_point_within_budget_at_0.55x']} | {'' if fastest is None else round(fastest, 3)} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--budget", type=float, default=0.01)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--timeout", type=int, default=3600)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--stem", default="auto_optimize")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    if not INC_PYTHON.exists():
        sys.exit("Neural Compressor's environment is missing: bash benchmarks/setup_inc.sh")
    rows: list[dict] = []
    for name in args.only:
        if name != "mobilenet_v2" and not default_recipe.zoo_models.MODELS[name].installed():
            print(f"{name}: not installed (bash scripts/setup_zoo.sh)")
            continue
        rows.append(run(name, trials=args.trials, budget=args.budget, runs=args.runs, timeout=args.timeout))
        write(rows, args.out, args.stem, note=args.note, trials=args.trials, budget=args.budget)


if __name__ == "__main__":
    main()
