"""Every npukit verb on real third-party models (``benchmarks/zoo_models.py``), run as a new user runs them.

For each installed zoo model: its real calibration and evaluation inputs are saved (disjoint sources), then the CLI
runs in a fresh, empty working directory with every output written to a separate folder:

    export (TorchScript and state-dict models) -> inspect -> optimize-graph -> quantize (default recipe, --data)
    -> analyze --target qnn-htp -> compile --soc SM8650 -> bench (INT8 vs float on ORT CPU)
    -> bench --target qnn-htp (the compiled model on the HTP emulator vs float)
    -> compile --target litert / executorch-xnnpack --calib (the ONNX model, run as a torch program, to an INT8
       .tflite / .pte on npukit's plan, run on LiteRT / ExecuTorch and checked there; verbs compile-litert and
       compile-executorch)

Recorded per model and verb: exit code, wall time, the verdict or the one-line error, the task and its metric for
the artifact against the float model, and any file left in the working directory (there must be none). The table
and the JSON go to ``benchmarks/results/third_party_zoo.{md,json}``; the CPU is named in both.

    .venv/bin/python benchmarks/third_party_zoo.py                 # every installed zoo model
    .venv/bin/python benchmarks/third_party_zoo.py --only nudenet_yolov8n ppocrv4_det --verbs quantize bench

Install the zoo first: ``bash scripts/setup_zoo.sh``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import zoo_models  # noqa: E402

VERBS = ("export", "inspect", "optimize-graph", "quantize", "analyze", "compile", "bench", "bench-htp",
         "compile-litert", "compile-executorch")
MOBILE = {"compile-litert": ("litert", ".tflite"), "compile-executorch": ("executorch-xnnpack", ".pte")}
SOC = "SM8650"
# The real-models issue's targets: INT8 vs float with npukit's default recipe
TARGETS = {"detect": 0.90, "segment": 0.90, "text-detect": 0.90, "classify": 0.90, "text-recognize": 0.90}
MIN_SQNR_DB = 20.0
VERDICTS = ("PASS", "FAIL", "DEGRADED", "MEASURED", "INFO", "UNVERIFIED")  # how a report's first line starts


@dataclasses.dataclass
class Step:
    verb: str
    exit_code: int | None
    seconds: float
    line: str  # the verdict, or the one-line error
    task: str | None = None
    metric: str | None = None
    value: float | None = None
    worst_sqnr_db: float | None = None
    stray_files: list[str] = dataclasses.field(default_factory=list)
    skipped: str = ""
    latency_ratio: float | None = None  # INT8 / float median latency on ORT CPU (quantize's report)
    float_fragile: list[str] | None = None  # quantize's depthwise convs (and writers) kept float for their input


def _npukit() -> list[str]:
    exe = Path(sys.executable).with_name("npukit")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "npukit.cli"]


def _shape_args(model: zoo_models.ZooModel) -> list[str]:
    args = []
    for spec in model.inputs:
        if spec.shape:
            args += ["--input-shape", f"{spec.name}=" + ",".join(map(str, spec.shape))]
    return args


def _run(verb: str, args: Sequence[str], *, cwd: Path, report: Path | None, timeout: int) -> Step:
    for leftover in cwd.iterdir():  # each verb starts in an empty folder
        if leftover.is_file():
            leftover.unlink()
    start = time.perf_counter()
    try:
        done = subprocess.run(_npukit() + list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "COLUMNS": "160"})
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        code, out, err = None, "", f"timed out after {timeout} s"
    seconds = time.perf_counter() - start
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    first = out.splitlines()[0] if out.strip() else ""
    line = errors[-1] if errors else (first if first.startswith(VERDICTS) else
                                      (err.strip().splitlines() or [""])[-1])
    step = Step(verb, code, round(seconds, 1), line[:400], stray_files=sorted(p.name for p in cwd.iterdir()))
    if report is not None and report.is_file():
        doc = json.loads(report.read_text())
        check = doc.get("results", {}).get("task_check")
        if check:
            result = check["result"]
            step.task, step.metric, step.value = result["task"], result["metric"], result["value"]
            sqnrs = [o["sqnr_db"] for o in result["outputs"] if isinstance(o["sqnr_db"], (int, float))]
            step.worst_sqnr_db = min(sqnrs) if sqnrs else None
        latency = doc.get("results", {}).get("latency")
        if isinstance(latency, dict) and "float" in latency and "int8" in latency:
            step.latency_ratio = round(latency["int8"]["median_ms"] / latency["float"]["median_ms"], 3)
        elif isinstance(latency, dict):  # a mobile artifact beside its fp32 twin on the same runtime
            twin = next((k for k in latency if f"{k} fp32" in latency), None)
            if twin is not None:
                step.latency_ratio = round(latency[twin]["median_ms"] / latency[f"{twin} fp32"]["median_ms"], 3)
        fragile = doc.get("results", {}).get("steps", {}).get("float_fragile")
        if fragile is not None:
            step.float_fragile = fragile["nodes"]
    return step


def run_model(model: zoo_models.ZooModel, verbs: Sequence[str], *, timeout: int, log=print) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"zoo-{model.name}-") as tmp:
        root = Path(tmp)
        user, out, feeds = root / "user", root / "out", root / "feeds"
        for d in (user, out, feeds):
            d.mkdir()
        calib = zoo_models.save_feeds(model.calibration(), feeds / "calib")
        evaluation = zoo_models.save_feeds(model.evaluation(), feeds / "eval")
        source = model.model_path()
        shapes = _shape_args(model)
        steps: list[Step] = []

        def step(verb: str, args: list[str], report: Path | None = None) -> Step:
            s = _run(verb, args, cwd=user, report=report, timeout=timeout)
            steps.append(s)
            log(f"  {model.name} {verb}: exit {s.exit_code} in {s.seconds} s: {s.line[:160]}")
            return s

        float_model = source
        if model.kind in ("torchscript", "state_dict+factory"):
            exported = out / "model.onnx"
            args = ["export", str(source), "-o", str(exported)] + shapes
            if model.kind == "state_dict+factory":
                args = ["export", model.factory, "--weights", str(source), "-o", str(exported)] + shapes
            if "export" in verbs:
                s = step("export", args)
                float_model = exported if s.exit_code == 0 else None
        if float_model is None:
            return {"name": model.name, "steps": [dataclasses.asdict(s) for s in steps]}
        if "inspect" in verbs:
            step("inspect", ["inspect", str(float_model)] + shapes)
        optimized = out / "model.opt.onnx"
        if "optimize-graph" in verbs:
            s = step("optimize-graph", ["optimize-graph", str(float_model), "-o", str(optimized)] + shapes)
            if s.exit_code != 0:
                optimized = Path(float_model)
        else:
            optimized = Path(float_model)
        int8 = out / "model.int8.onnx"
        if "quantize" in verbs:
            step("quantize", ["quantize", str(optimized), "--calib", str(calib), "--data", str(evaluation), "-o",
                              str(int8), "--runs", "10"] + shapes, report=out / "model.int8.report.json")
        if "analyze" in verbs:
            step("analyze", ["analyze", str(optimized), "--target", "qnn-htp"] + shapes)
        ctx = out / "model.ctx.onnx"
        if "compile" in verbs:
            step("compile", ["compile", str(optimized), "--soc", SOC, "--calib", str(calib), "-o", str(ctx)] + shapes,
                 report=out / "model.ctx.report.json")
        if "bench" in verbs and int8.is_file():
            step("bench", ["bench", str(int8), "--reference", str(optimized), "--data", str(evaluation), "--runs",
                           "10", "--report", str(out / "bench.json")] + shapes, report=out / "bench.json")
        if "bench-htp" in verbs and ctx.is_file():
            step("bench-htp", ["bench", str(ctx), "--target", "qnn-htp", "--soc", SOC, "--reference", str(optimized),
                               "--data", str(evaluation), "--runs", "3", "--max-samples", "8", "--report",
                               str(out / "bench_htp.json")] + shapes, report=out / "bench_htp.json")
        # the mobile targets convert torch programs: a PyTorch model is given as it is (a factory and its weights,
        # a TorchScript file), an ONNX model as its file (run as a torch program)
        given = [model.factory, "--weights", str(source)] if model.kind == "state_dict+factory" else \
            [str(source)] if model.kind == "torchscript" else [str(float_model)]
        for verb, (target, suffix) in MOBILE.items():
            if verb in verbs:
                mobile = out / f"model{suffix}"
                step(verb, ["compile", *given, "--target", target, "--calib", str(calib), "-o",
                            str(mobile)] + shapes, report=mobile.with_name(mobile.name + ".report.json"))
    return {"name": model.name, "task": model.task, "package": f"{model.dist}=={model.version()}",
            "kind": model.kind, "inputs": {i.name: list(i.shape) for i in model.inputs},
            "steps": [dataclasses.asdict(s) for s in steps]}


def revision() -> str:
    """The git revision of the checkout these benchmarks run from, or a note when they run from a copy."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                            text=True).stdout.strip()
    if not commit:
        return "unknown (run from a copy outside a git checkout)"
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "benchmarks/*.py"], cwd=HERE.parent,
                           capture_output=True, text=True).stdout.strip()
    return f"{commit} plus uncommitted changes to src/ or benchmarks/" if dirty else commit


def _cpu() -> str:
    """The CPU's model name and its int8 dot-product features: machines of one name ("AMD EPYC") differ in what
    decides int8 speed and exactness (AVX2 only, or AVX-512 VNNI; AMX on the Xeons)."""
    name, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not name:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    name = name or platform.processor() or platform.machine()
    if not flags:
        return name
    features = ("AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-VNNI" if "avx_vnni" in flags
                else "AVX2, no VNNI" if "avx2" in flags else "no AVX2")
    return f"{name} ({features}{', AMX' if 'amx_int8' in flags else ''})"


def summarize(rows: list[dict]) -> dict:
    steps = [s for r in rows for s in r["steps"]]
    silent = [f"{r['name']} {s['verb']}" for r in rows for s in r["steps"]
              if s["exit_code"] == 0 and s["value"] is not None and s["task"] in TARGETS
              and s["value"] < TARGETS[s["task"]] and not s["line"].startswith("DEGRADED")]
    return {"models": len(rows), "verb_runs": len(steps),
            "exit_0": sum(s["exit_code"] == 0 for s in steps), "exit_1": sum(s["exit_code"] == 1 for s in steps),
            "exit_2": sum(s["exit_code"] == 2 for s in steps),
            "other_exit": [f"{s['verb']}: {s['exit_code']}" for s in steps if s["exit_code"] not in (0, 1, 2)],
            "exit_0_below_target": silent,
            "stray_files": sorted({f for s in steps for f in s["stray_files"]}),
            "compile_ok": sum(1 for s in steps if s["verb"] == "compile" and s["exit_code"] == 0),
            "compile_runs": sum(1 for s in steps if s["verb"] == "compile")}


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def write_results(doc: dict, out_dir: Path, stem: str = "third_party_zoo") -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Third-party zoo: every verb on real models ({doc['cpu']}, {doc['date']})", "",
             f"npukit at {doc['commit']}; SoC {SOC} on the QNN HTP emulator. Exit codes: 0 passed its checks, "
             "1 a check failed (artifact written, verdict says why), 2 bad input / unsupported (one-line error).",
             "Latency: the INT8 artifact's median over the float model's (ORT CPU) or its fp32 twin's (the same mobile "
             "runtime), 1 thread, interleaved.",
             "", "| model | task | verb | exit | s | task metric | value | worst output SQNR dB | x float latency "
             "| verdict or error |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in doc["rows"]:
        for s in row["steps"]:
            line = s["line"].replace("|", "/")
            lines.append(f"| {row['name']} | {row.get('task', '')} | {s['verb']} | {s['exit_code']} | {s['seconds']} "
                         f"| {s['metric'] or ''} | {_fmt(s['value'])} | {_fmt(s['worst_sqnr_db'])} "
                         f"| {_fmt(s.get('latency_ratio'))} | {line} |")
    summary = doc["summary"]
    lines += ["", "## Summary", "", "```", json.dumps(summary, indent=2), "```", ""]
    md_path.write_text("\n".join(lines))
    return json_path, md_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="zoo model names")
    parser.add_argument("--verbs", nargs="*", choices=VERBS, default=list(VERBS))
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per verb")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--stem", default="third_party_zoo")
    args = parser.parse_args(argv)
    names = args.only or list(zoo_models.MODELS)
    unknown = [n for n in names if n not in zoo_models.MODELS]
    if unknown:
        parser.error(f"unknown zoo models {unknown}; known: {', '.join(zoo_models.MODELS)}")
    rows = []
    commit = revision()
    for name in names:
        model = zoo_models.MODELS[name]
        if not model.installed():
            print(f"{name}: not installed (bash scripts/setup_zoo.sh)")
            continue
        print(f"{name} ({model.task}, {model.dist})")
        rows.append(run_model(model, args.verbs, timeout=args.timeout))
        doc = {"cpu": _cpu(), "date": time.strftime("%Y-%m-%d"), "commit": commit, "soc": SOC, "rows": rows,
               "summary": summarize(rows)}
        json_path, md_path = write_results(doc, args.out, args.stem)  # after every model: a long run keeps its part
    print(json.dumps(doc["summary"], indent=2))
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
