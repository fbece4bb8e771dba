"""Memory planning against ONNX Runtime's real peak: for each model (random weights, batch 1, TorchScript export,
opset 17) the naive arena and the lower bound of the exported graph, every planner's arena on it, the planned peak on
the graph ORT CPU really runs (read back from ORT: NCHWc layout, fused kernels; npukit.memory.ort_cpu), the
rule-based "cpu" view's plan, the plans with 8-bit activations (ORT int8, QNN HTP), and ORT CPU's measured peak
activation memory with its arena off and on (fresh subprocess, VmHWM; see npukit.memory.measure), and with the arena
off at ORT's "extended" optimization level (no NCHWc layout transform).

The prediction compared with the measurement ("pred. run") is ORT's own allocation planner replayed on the graph ORT
runs (same-shape buffer reuse), without the graph input: the measurement starts after the input exists. "plan run"
is npukit's best offset plan on that same graph, without the input: what ORT would need with npukit's placement.
Target: the prediction within 10% of the arena-off measurement (and, as a check, the "extended" prediction of the
extended measurement).

    python benchmarks/memory.py                                  # all models (several minutes)
    python benchmarks/memory.py --models mobilenet_v2 resnet18
    python benchmarks/memory.py --work-dir /tmp/memexports       # keep (and reuse) the exported models
    python benchmarks/memory.py --models mobilenet_v2 lraspp_mobilenet_v3_large --tiling-only

Models: seven classifiers and segmenters at batch 1 and SSDlite-MobileNetV3 at 512x512 without its pre- and
post-processing (image in, raw box regressions and class logits of every anchor out).

Restructuring for memory (npukit.memory.tiling.optimize_for_memory, what `optimize-graph --memory-budget` runs) for
the models in TILING_MODELS among those run: the budget is half ORT's predicted peak of the original (when no
restructuring reaches it, the smallest reachable peak is used instead and the row says so); upsamples whose
NCHWc form raises the peak are kept in the plain layout (npukit.memory.layout), then the early stage is tiled
(patch-based inference) if the budget is still not met; the table gives ORT CPU's measured peak (arena off, default
optimization level) before and after, the outputs' max relative error and the latency ratio restructured / original
(1 thread, interleaved runs, medians). A budget nothing reaches is reported with the smallest reachable peak.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import onnx
import torch

from npukit._atomic import write_text_atomic
from npukit.memory.graph import load_tensor_graph
from npukit.memory.lifetimes import lifetimes_of
from npukit.memory.measure import measure_ort_peak
from npukit.memory.ort_cpu import ort_allocation, ort_executed_graph, without_graph_inputs
from npukit.memory.plan import plan_memory
from npukit.memory.planners import all_plans, best_plan
from npukit.memory.runtime_view import VIEWS, apply_view

MODELS = {  # name -> input side
    "mobilenet_v2": 224, "resnet18": 224, "googlenet": 224, "inception_v3": 299, "densenet121": 224,
    "shufflenet_v2_x1_0": 224, "lraspp_mobilenet_v3_large": 512, "ssdlite320_mobilenet_v3_large": 512,
}
TILING_MODELS = ("mobilenet_v2", "lraspp_mobilenet_v3_large", "ssdlite320_mobilenet_v3_large")
RESULTS = Path(__file__).parent / "results"


@dataclasses.dataclass
class Row:
    model: str
    input_shape: list[int]
    nodes: int
    naive: int
    lower_bound_unfused: int
    greedy_by_size_unfused: int
    greedy_by_breadth_unfused: int
    lower_bound_cpu: int
    planned_cpu: int
    planned_cpu_rules: int
    planned_cpu_int8: int
    planned_qnn_htp: int
    predicted_run_cpu: int
    planned_run_cpu: int
    predicted_run_cpu_extended: int
    measured_arena_off: int
    measured_arena_on: int
    measured_arena_off_extended: int
    error_vs_arena_off: float
    error_plan_vs_arena_off: float
    error_vs_arena_off_extended: float
    order_improved_bytes: int
    plan_seconds: float


def export(name: str, side: int, path: Path) -> None:
    import torchvision

    if path.exists():
        return
    if name.startswith("lraspp") or name.startswith("deeplab"):
        module = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None)
    elif name.startswith("ssdlite"):
        module = RawDetector(getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None))
    else:
        extra = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
        module = getattr(torchvision.models, name)(weights=None, **extra)
    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.randn(1, 3, side, side),), str(path), dynamo=False, opset_version=17,
                          input_names=["input"])


class RawDetector(torch.nn.Module):
    """An SSD detector without its pre- and post-processing: image tensor in, the raw box regressions and class
    logits of every anchor out (what runs on the accelerator; resizing and NMS stay on the CPU)."""

    def __init__(self, detector: torch.nn.Module) -> None:
        super().__init__()
        self.backbone, self.head = detector.backbone, detector.head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.head(list(self.backbone(x).values()))
        return out["bbox_regression"], out["cls_logits"]


def measure_model(name: str, side: int, work: Path) -> Row:
    path = work / f"{name}.onnx"
    export(name, side, path)
    model = onnx.load(str(path))
    exported = load_tensor_graph(model)
    unfused = lifetimes_of(exported)
    plans = all_plans(unfused)
    start = time.perf_counter()
    cpu = plan_memory(path, target="cpu")
    plan_seconds = time.perf_counter() - start
    planned = {view: best_plan(lifetimes_of(apply_view(exported, VIEWS[view]))).arena_bytes
               for view in ("cpu", "cpu-int8", "qnn-htp")}
    predicted = cpu.runtime_peak
    planned_run = best_plan(without_graph_inputs(cpu.lifetimes)).arena_bytes
    predicted_extended = ort_allocation(ort_executed_graph(path, optimization="extended")).peak_bytes
    off = measure_ort_peak(path, arena=False)
    on = measure_ort_peak(path, arena=True)
    extended = measure_ort_peak(path, arena=False, optimization="extended")
    return Row(
        model=name, input_shape=[1, 3, side, side], nodes=len(model.graph.node),
        naive=plans["naive"].arena_bytes, lower_bound_unfused=unfused.peak_bytes,
        greedy_by_size_unfused=plans["greedy_by_size"].arena_bytes,
        greedy_by_breadth_unfused=plans["greedy_by_breadth"].arena_bytes,
        lower_bound_cpu=cpu.lower_bound, planned_cpu=cpu.best.arena_bytes, planned_cpu_rules=planned["cpu"],
        planned_cpu_int8=planned["cpu-int8"], planned_qnn_htp=planned["qnn-htp"],
        predicted_run_cpu=predicted, planned_run_cpu=planned_run, predicted_run_cpu_extended=predicted_extended,
        measured_arena_off=off.peak_bytes, measured_arena_on=on.peak_bytes,
        measured_arena_off_extended=extended.peak_bytes,
        error_vs_arena_off=_error(predicted, off.peak_bytes),
        error_plan_vs_arena_off=_error(planned_run, off.peak_bytes),
        error_vs_arena_off_extended=_error(predicted_extended, extended.peak_bytes),
        order_improved_bytes=cpu.order.original_peak_bytes - cpu.order.peak_bytes if cpu.order else 0,
        plan_seconds=plan_seconds,
    )


def _error(predicted: int, measured: int) -> float:
    return (predicted - measured) / measured if measured else float("nan")


@dataclasses.dataclass
class TilingRow:
    model: str
    budget: int
    predicted_before: int
    predicted_after: int | None = None
    planar_resizes: str = ""
    tiles: str = ""
    cut: str = ""
    mac_overhead: float | None = None
    measured_before: int | None = None
    measured_after: int | None = None
    measured_ratio: float | None = None
    max_rel_error: float | None = None
    latency_original_ms: float | None = None
    latency_tiled_ms: float | None = None
    latency_ratio: float | None = None
    choose_seconds: float | None = None
    unreachable: str = ""


def measure_tiling(name: str, side: int, work: Path) -> TilingRow:
    from npukit.errors import InputError
    from npukit.measure.latency import measure_latency_interleaved
    from npukit.memory.layout import ort_predicted_peak
    from npukit.memory.tiling import BudgetUnreachable, max_rel_error, optimize_for_memory

    path = work / f"{name}.onnx"
    export(name, side, path)
    before = ort_predicted_peak(path)
    row = TilingRow(model=name, budget=before // 2, predicted_before=before)
    tiled_path = work / f"{name}_tiled.onnx"
    start = time.perf_counter()
    try:
        done = optimize_for_memory(path, tiled_path, budget_bytes=row.budget)
    except BudgetUnreachable as exc:  # measure the smallest peak that is reachable instead
        row.unreachable = exc.one_line()
        if exc.smallest_peak is None or exc.smallest_peak >= before:
            return row
        done = optimize_for_memory(path, tiled_path, budget_bytes=exc.smallest_peak)
    except InputError as exc:
        row.unreachable = exc.one_line()
        return row
    row.choose_seconds = time.perf_counter() - start
    row.predicted_after = done.peak_after
    if done.layout is not None:
        row.planar_resizes = ",".join(done.layout.planar)
    if done.tiling is not None:
        row.mac_overhead = done.tiling.mac_overhead
        row.tiles, row.cut = f"{done.tiling.tiles[0]}x{done.tiling.tiles[1]}", done.tiling.cut
    else:
        row.mac_overhead = 0.0
    row.max_rel_error = max_rel_error(onnx.load(str(path)), done.model)
    row.measured_before = measure_ort_peak(path, arena=False).peak_bytes
    row.measured_after = measure_ort_peak(tiled_path, arena=False).peak_bytes
    row.measured_ratio = row.measured_before / row.measured_after
    times = measure_latency_interleaved({"original": path, "tiled": tiled_path}, threads=1, warmup=5, runs=60,
                                        rounds=12)
    row.latency_original_ms, row.latency_tiled_ms = times["original"].median_ms, times["tiled"].median_ms
    row.latency_ratio = row.latency_tiled_ms / row.latency_original_ms
    return row


def chain_plan_seconds(work: Path, length: int = 1000) -> float:
    from onnx import TensorProto, helper

    names = ["x"] + [f"t{i}" for i in range(length)]
    nodes = [helper.make_node("Relu" if i % 2 else "Sigmoid", [names[i]], [names[i + 1]]) for i in range(length)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, [1, 8, 16, 16])])
    path = work / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    start = time.perf_counter()
    plan_memory(path, target="unfused")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--work-dir", type=Path, help="where exported models are kept (default: a temp dir)")
    parser.add_argument("--output", type=Path, default=RESULTS / "memory.json")
    parser.add_argument("--tiling-only", action="store_true", help="only the tiling table (own JSON file)")
    args = parser.parse_args(argv)
    if args.tiling_only:
        return tiling_main(args)
    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows, failures = [], {}
        for name in args.models:
            start = time.perf_counter()
            try:
                rows.append(measure_model(name, MODELS[name], work))
            except Exception as exc:  # one model's failure must not hide the others' figures
                failures[name] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
        chain_s = chain_plan_seconds(work)
        tiling_rows, tiling_failures = run_tiling(args.models, work)

    mb = 1e6
    table = Table(title="Activation memory (MB = 1e6 bytes; planned = best planner, 64-byte aligned)")
    for column in ("model", "naive", "LB unfused", "by size", "by breadth", "LB cpu", "plan cpu", "plan rules",
                   "plan int8", "plan HTP", "plan run", "pred. run", "ORT off", "err off", "err plan", "pred. ext",
                   "ORT off ext", "err ext", "ORT on", "plan s"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in rows:
        table.add_row(r.model, *(f"{v / mb:.2f}" for v in (
            r.naive, r.lower_bound_unfused, r.greedy_by_size_unfused, r.greedy_by_breadth_unfused, r.lower_bound_cpu,
            r.planned_cpu, r.planned_cpu_rules, r.planned_cpu_int8, r.planned_qnn_htp, r.planned_run_cpu,
            r.predicted_run_cpu, r.measured_arena_off)), f"{r.error_vs_arena_off:+.1%}",
            f"{r.error_plan_vs_arena_off:+.1%}", f"{r.predicted_run_cpu_extended / mb:.2f}",
            f"{r.measured_arena_off_extended / mb:.2f}", f"{r.error_vs_arena_off_extended:+.1%}",
            f"{r.measured_arena_on / mb:.2f}", f"{r.plan_seconds:.2f}")
    console = Console(width=210)
    console.print(table)
    console.print(f"1,000-node chain: planned in {chain_s:.3f} s")
    for name, error in failures.items():
        console.print(f"[red]{name} failed:[/red] {error}")
    print_tiling(console, tiling_rows, tiling_failures)
    payload = {"rows": [dataclasses.asdict(r) for r in rows], "failures": failures,
               "chain_1000_plan_seconds": chain_s,
               "within_10_percent": {r.model: abs(r.error_vs_arena_off) <= 0.10 for r in rows},
               "within_10_percent_extended": {r.model: abs(r.error_vs_arena_off_extended) <= 0.10 for r in rows},
               **tiling_payload(tiling_rows, tiling_failures)}
    write_text_atomic(args.output, json.dumps(payload, indent=2) + "\n")
    return 1 if failures or tiling_failures else 0


def run_tiling(models: list[str], work: Path) -> tuple[list[TilingRow], dict[str, str]]:
    rows, failures = [], {}
    for name in (m for m in models if m in TILING_MODELS):
        start = time.perf_counter()
        try:
            rows.append(measure_tiling(name, MODELS[name], work))
        except Exception as exc:  # one model's failure must not hide the others' figures
            failures[name] = f"{type(exc).__name__}: {exc}"
        print(f"{name} tiling: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return rows, failures


def print_tiling(console, rows: list[TilingRow], failures: dict[str, str]) -> None:
    from rich.table import Table

    mb = 1e6
    table = Table(title="Restructuring for memory (budget = half ORT's predicted peak; ORT CPU, arena off; "
                        "MB = 1e6 bytes)")
    for column in ("model", "budget", "pred. before", "pred. after", "plain resizes", "tiles", "MAC +", "ORT before",
                   "ORT after", "ORT ratio", "max rel err", "latency ratio"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in rows:
        if r.predicted_after is None:
            table.add_row(r.model, f"{r.budget / mb:.2f}", f"{r.predicted_before / mb:.2f}", *("—",) * 9)
            continue
        table.add_row(r.model, f"{r.budget / mb:.2f}", f"{r.predicted_before / mb:.2f}",
                      f"{r.predicted_after / mb:.2f}", r.planar_resizes or "—", r.tiles or "—",
                      f"{r.mac_overhead:.1%}", f"{r.measured_before / mb:.2f}", f"{r.measured_after / mb:.2f}",
                      f"{r.measured_ratio:.2f}x", f"{r.max_rel_error:.1e}", f"{r.latency_ratio:.3f}")
    console.print(table)
    for r in rows:
        if r.unreachable:
            console.print(f"{r.model}: {r.unreachable}" + ("; measured at the smallest reachable peak instead"
                                                           if r.predicted_after is not None else ""))
        if r.predicted_after is not None:
            console.print(f"{r.model}: cut {r.cut or '—'}; plain-layout resizes {r.planar_resizes or '—'}; latency "
                          f"{r.latency_original_ms:.2f} -> {r.latency_tiled_ms:.2f} ms")
    for name, error in failures.items():
        console.print(f"[red]{name} tiling failed:[/red] {error}")


def tiling_payload(rows: list[TilingRow], failures: dict[str, str]) -> dict[str, object]:
    return {"tiling": [dataclasses.asdict(r) for r in rows], "tiling_failures": failures,
            "tiling_targets_met": {r.model: (r.measured_ratio is not None and r.measured_ratio >= 2
                                             and r.max_rel_error <= 1e-5 and r.latency_ratio <= 1.2)
                                   for r in rows}}


def tiling_main(args: argparse.Namespace) -> int:
    from rich.console import Console

    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows, failures = run_tiling(args.models, work)
    print_tiling(Console(width=170), rows, failures)
    write_text_atomic(args.output.with_name("memory_tiling.json"),
                      json.dumps(tiling_payload(rows, failures), indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
