"""Does ``npukit analyze --target qnn-htp`` predict what the real QNN execution provider does?

For each torchvision model of a zoo (random weights, static batch 1), in FP32 and in INT8 (QDQ from ORT's
quantize_static with npukit's QNN config, uint8 activations, calibrated on two seeded random inputs: calibration
quality does not matter for partitioning), compare per node of the model:

- predicted: ``npukit.targets.analyze(model, qnn-htp@SOC)``: delegated to the NPU, left to the CPU, or removed by
  ONNX Runtime's graph optimizations before partitioning;
- actual: ``npukit.runtime.qnn.qnn_node_assignment`` on the HTP backend of onnxruntime-qnn (emulated on x86): the
  execution provider ORT's graph-assignment record gives each node (only session creation, no inference).

Nodes are matched by name on the model as given. Prints a table (predicted vs actual delegated node counts, node
for node match) and every mismatch (node, op, predicted, actual, QNN's reason), and writes
benchmarks/results/qnn_partition.json. Exports and quantized models are cached (``--cache``).

    python benchmarks/qnn_partition.py                       # the whole zoo (about 15 min on 2 cores, cold cache)
    python benchmarks/qnn_partition.py --models resnet18 mobilenet_v3_small --variants int8
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import gc
import json
import multiprocessing
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from npukit._atomic import atomic_path
from npukit.config import ExportConfig
from npukit.frontend.export import export_model
from npukit.frontend.spec import resolve_model
from npukit.runtime.compile import soc_provider_options
from npukit.runtime.qnn import QNN_EP, Assignment, QnnQdqRules, qnn_node_assignment, qnn_quant_config, qnn_versions
from npukit.targets import analyze, get_target

ZOO = ("mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "resnet18", "resnet50", "efficientnet_b0",
       "efficientnet_v2_s", "shufflenet_v2_x1_0", "squeezenet1_1", "googlenet", "inception_v3", "densenet121",
       "mnasnet1_0", "regnet_y_400mf", "convnext_tiny", "swin_t", "vit_b_16", "maxvit_t", "alexnet", "vgg11",
       "lraspp_mobilenet_v3_large")
VARIANTS = ("fp32", "int8")
SOC = "SM8650"  # Snapdragon 8 Gen 3: HTP v75 runs float models in fp16
INT8_RULES = QnnQdqRules(activation_type="uint8")
CALIBRATION_SAMPLES = 2
CHILD_TIMEOUT_S = 600
TARGET_MATCH_RATE = 0.9
RESULTS = Path(__file__).parent / "results"
NPU, CPU, REMOVED = "npu", "cpu", "removed"


@dataclasses.dataclass
class Mismatch:
    node: str
    op: str
    predicted: str
    actual: str
    qnn_reason: str | None
    npukit_reason: str | None


@dataclasses.dataclass
class Row:
    model: str
    variant: str
    ok: bool
    nodes: int | None = None
    predicted_npu: int | None = None
    actual_npu: int | None = None
    predicted_removed: int | None = None
    actual_removed: int | None = None
    predicted_partitions: int | None = None
    actual_partitions: int | None = None
    match: bool | None = None
    mismatches: list[Mismatch] = dataclasses.field(default_factory=list)
    analyze_s: float | None = None
    session_s: float | None = None
    error: str | None = None


class _SeededReader:
    """ORT CalibrationDataReader over a few seeded standard-normal inputs."""

    def __init__(self, model: onnx.ModelProto, *, samples: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        inits = {t.name for t in model.graph.initializer}
        inputs = [i for i in model.graph.input if i.name not in inits]
        self._items = iter([{i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
                             .astype(np.float32) for i in inputs} for _ in range(samples)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._items, None)


def model_file(name: str, variant: str, cache: Path) -> Path:
    """The cached ONNX file of ``name`` in ``variant`` (exported / quantized on first use)."""
    fp32 = cache / f"{name}.fp32.onnx"
    if not fp32.exists():
        export_model(resolve_model(f"torchvision:{name}"), fp32, config=ExportConfig())
    if variant == "fp32":
        return fp32
    int8 = cache / f"{name}.int8.onnx"
    if not int8.exists():
        from onnxruntime.quantization import quantize

        reader = _SeededReader(onnx.load_model(str(fp32), load_external_data=False), samples=CALIBRATION_SAMPLES)
        config = qnn_quant_config(fp32, reader, rules=INT8_RULES)
        with atomic_path(int8) as tmp:
            quantize(str(fp32), str(tmp), config)
    return int8


def _assignment(path: str, options: dict[str, str]) -> Assignment:
    return qnn_node_assignment(onnx.load_model(path), provider_options=options)


def _assignment_in_child(path: Path, options: dict[str, str]) -> Assignment:
    """The QNN EP's assignment, from a fresh process: the HTP backend aborts the process on some models."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(_assignment, str(path), options).result(timeout=CHILD_TIMEOUT_S)
        except concurrent.futures.process.BrokenProcessPool:
            raise RuntimeError("the QNN EP aborted the process while creating the session") from None


def compare(name: str, variant: str, path: Path) -> Row:
    """Predicted vs actual placement of every node of the model at ``path``."""
    model = onnx.load_model(str(path))
    start = time.perf_counter()
    analysis = analyze(model, get_target(f"qnn-htp@{SOC}"))
    analyze_s = time.perf_counter() - start
    options = soc_provider_options(SOC)
    if variant == "fp32":
        options["enable_htp_fp16_precision"] = "1"
    start = time.perf_counter()
    assignment = _assignment_in_child(path, options)
    session_s = time.perf_counter() - start

    verdicts = {v.name: v for v in analysis.nodes}
    removed = set(analysis.removed)
    mismatches = []
    for placement in assignment.nodes:
        verdict = verdicts.get(placement.name)
        if verdict is not None:
            predicted = NPU if verdict.partition is not None else CPU
        else:
            predicted = REMOVED if placement.name in removed else "unknown"
        actual = {QNN_EP: NPU, None: REMOVED}.get(placement.provider, CPU)
        if predicted != actual:
            mismatches.append(Mismatch(
                node=placement.name, op=placement.op_type, predicted=predicted, actual=actual,
                qnn_reason=placement.reason,
                npukit_reason="; ".join(verdict.reasons) if verdict is not None and verdict.reasons else None))
    return Row(
        model=name, variant=variant, ok=True, nodes=len(assignment.nodes),
        predicted_npu=sum(1 for p in assignment.nodes if p.name in verdicts and verdicts[p.name].partition
                          is not None),
        actual_npu=len(assignment.qnn_nodes),
        predicted_removed=sum(1 for p in assignment.nodes if p.name in removed),
        actual_removed=sum(1 for p in assignment.nodes if p.provider is None),
        predicted_partitions=len(analysis.partitions), actual_partitions=assignment.partitions,
        match=not mismatches, mismatches=mismatches, analyze_s=analyze_s, session_s=session_s)


def run_one(name: str, variant: str, cache: Path) -> Row:
    try:
        return compare(name, variant, model_file(name, variant, cache))
    except Exception as exc:  # one broken model must not stop the benchmark
        traceback.print_exc(file=sys.stderr)
        return Row(model=name, variant=variant, ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
    finally:
        gc.collect()


def _print(rows: list[Row], summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"QNN HTP partition: npukit analyze vs the QNN EP (onnxruntime-qnn, HTP emulator, {SOC})")
    for column in ("model", "variant", "nodes", "NPU predicted", "NPU actual", "removed pred/actual",
                   "partitions pred/actual", "node for node", "mismatches"):
        table.add_column(column, justify="left" if column in ("model", "variant") else "right")
    for r in rows:
        if not r.ok:
            table.add_row(r.model, r.variant, "-", "-", "-", "-", "-", "[red]error[/]", (r.error or "")[:60])
            continue
        table.add_row(r.model, r.variant, str(r.nodes), str(r.predicted_npu), str(r.actual_npu),
                      f"{r.predicted_removed}/{r.actual_removed}",
                      f"{r.predicted_partitions}/{r.actual_partitions}",
                      "[green]yes[/]" if r.match else "[red]no[/]", str(len(r.mismatches)))
    console = Console(width=160)
    console.print(table)
    listed = [(r, m) for r in rows for m in r.mismatches]
    if listed:
        detail = Table(title="Every mismatch")
        for column in ("model", "variant", "node", "op", "predicted", "actual", "QNN's reason", "npukit's reason"):
            detail.add_column(column, overflow="fold")
        for r, m in listed:
            detail.add_row(r.model, r.variant, m.node, m.op, m.predicted, m.actual, m.qnn_reason or "-",
                           m.npukit_reason or "-")
        console.print(detail)
    console.print(f"node-for-node match: {summary['matched']}/{summary['compared']} model variants compared "
                  f"({100 * summary['match_rate']:.1f}%; target >= {100 * TARGET_MATCH_RATE:.0f}%); "
                  f"{summary['errors']} not compared (errors above)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(ZOO), help="torchvision model names")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "npukit_qnn_partition",
                        help="where exported and quantized models are kept between runs")
    parser.add_argument("--json", type=Path, default=RESULTS / "qnn_partition.json", help="output JSON")
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)

    rows = []
    for name in args.models:
        for variant in args.variants:
            row = run_one(name, variant, args.cache)
            print(f"{name} {variant}: " + (f"{'match' if row.match else f'{len(row.mismatches)} mismatches'}, "
                                           f"NPU {row.predicted_npu} predicted / {row.actual_npu} actual"
                                           if row.ok else f"error {row.error}"), file=sys.stderr, flush=True)
            rows.append(row)
    compared = [r for r in rows if r.ok]
    matched = sum(1 for r in compared if r.match)
    plugin, sdk = qnn_versions()
    summary = {"compared": len(compared), "matched": matched, "errors": len(rows) - len(compared),
               "match_rate": matched / len(compared) if compared else 0.0,
               "mismatched_nodes": sum(len(r.mismatches) for r in compared), "soc": SOC,
               "onnxruntime_qnn": plugin, "qnn_sdk": sdk, "int8_rules": dataclasses.asdict(INT8_RULES),
               "calibration_samples": CALIBRATION_SAMPLES}
    _print(rows, summary)
    with atomic_path(args.json) as tmp:
        tmp.write_text(json.dumps({"summary": summary, "rows": [dataclasses.asdict(r) for r in rows]}, indent=2))
    return 0 if compared and summary["match_rate"] >= TARGET_MATCH_RATE else 1


if __name__ == "__main__":
    sys.exit(main())
