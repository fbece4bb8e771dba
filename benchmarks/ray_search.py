"""`npukit optimize` serial against the same search on Ray Tune: one model, the same seed and batch size, run one
after the other through the CLI; wall time of each, the trials each proposed (in order), their task metrics and
sizes, the fronts and the choices; the CPU time of each verb.

    .venv/bin/python benchmarks/ray_search.py --model mobilenet_v2 --trials 8 --workers 2
    .venv/bin/python benchmarks/ray_search.py --trials 10 --workers 2 --batch 4 --stem ray_search_batch4

Both runs propose the same recipes as long as the sampler was told the same figures; the latencies each run measures
differ (a shared host's noise), so once the sampler adapts to them (after the default recipe and the seed recipes)
the two searches may propose different recipes. Writes ``benchmarks/results/<stem>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import default_recipe  # noqa: E402  (the model's inputs, as the recipe benchmark makes them)
import third_party_zoo as zoo  # noqa: E402


def run(args: list[str], cwd: Path) -> tuple[int, float, float, dict]:
    """Exit code, wall seconds, CPU seconds (user + system, of the verb and the processes it waited for: Ray's
    workers too, once it stopped them) and the report of one verb."""
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(zoo._npukit() + args, capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": "160"})
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report = json.loads(Path(args[args.index("-o") + 1]).with_suffix(".report.json").read_text())
    return done.returncode, seconds, cpu, report


def _search_s(row: dict) -> float:
    return row["timings"].get("ray", 0.0) + row["timings"].get("trials", 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None, help="trials proposed together (default: --workers)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--sampler", default="tpe", help="tpe, or nsga2: its first generation (50) is drawn at "
                        "random from the seed, so both runs build the same recipes whatever latencies they measure")
    parser.add_argument("--stem", default="ray_search", help="file name of the results (.md, .json)")
    args = parser.parse_args(argv)
    batch = args.batch or args.workers
    rows = {}
    with tempfile.TemporaryDirectory(prefix="ray-search-") as tmp:
        work = Path(tmp)
        source, shapes, calib, evaluation = default_recipe.inputs(args.model, work)
        common = ["optimize", str(source), "--calib", str(calib), "--data", str(evaluation), "--trials",
                  str(args.trials), "--batch", str(batch), "--seed", "0", "--sampler", args.sampler] + shapes
        for name, extra in (("serial", ["--workers", "1"]), ("ray", ["--workers", str(args.workers)])):
            code, seconds, cpu, report = run(common + ["-o", str(work / name / "best.onnx")] + extra, work)
            search = report["results"]["search"]
            rows[name] = {"exit": code, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
                          "cores_busy": round(cpu / seconds, 2), "verdict": report["verdict"],
                          "timings": report.get("timings_s", {}),
                          "trials": [{k: t.get(k) for k in ("number", "label", "metric", "size_bytes", "latency",
                                                          "feasible", "seconds")} for t in search["trials"]],
                          "front": search["front"], "chosen": search["chosen"]}
    serial, ray = rows["serial"], rows["ray"]
    same = [a["label"] == b["label"] for a, b in zip(serial["trials"], ray["trials"])]
    doc = {"model": args.model, "trials": args.trials, "workers": args.workers, "batch": batch,
           "sampler": args.sampler,
           "cpu": zoo._cpu(), "cores": os.cpu_count(), "npukit": zoo.revision(), "runs": rows,
           "speedup": round(serial["seconds"] / ray["seconds"], 2),
           # the search alone: the trials, and on Ray the start of its instance
           "search_speedup": round(_search_s(serial) / _search_s(ray), 2),
           "same_proposals_until": same.index(False) if False in same else len(same)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# optimize serial vs Ray Tune ({doc['cpu']}, {doc['cores']} cores, npukit {doc['npukit']})", "",
             f"{args.model}, {args.trials} trials, batch {batch}, sampler {args.sampler}, seed 0; serial = "
             f"--workers 1, ray = --workers {args.workers}. Wall time of the whole verb (baseline, search, "
             "confirmation, check).", "",
             "| run | exit | wall s | CPU s (cores busy) | search s (Ray start + trials) | chosen | front |",
             "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['exit']} | {row['seconds']} | {row['cpu_seconds']} ({row['cores_busy']}) | "
                     f"{_search_s(row):.1f} | {row['chosen']} | {row['front']} |")
    lines += ["", "CPU s: user + system time of the verb's process and the processes it waited for; on Ray that leaves "
                  "out the workers (children of Ray's raylet), so it shows the driver alone.",
              "", f"Speed-up: {doc['speedup']}x the whole verb, {doc['search_speedup']}x the search. Same proposals "
                  f"for the first {doc['same_proposals_until']} trials.",
              "", "| trial | serial | metric | size | ray | metric | size |", "|---|---|---|---|---|---|---|"]
    for a, b in zip(serial["trials"], ray["trials"]):
        lines.append(f"| {a['number']} | {a['label']} | {a['metric']} | {a['size_bytes']} | {b['label']} | "
                     f"{b['metric']} | {b['size_bytes']} |")
    (args.out / f"{args.stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
