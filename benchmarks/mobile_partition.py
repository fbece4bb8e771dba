"""Does ``npukit analyze`` predict what the mobile runtimes' real XNNPACK partitioners do?

Two backends (``--backend``): ExecuTorch's XnnpackPartitioner (profile executorch-xnnpack) and LiteRT's default
XNNPACK delegate (profile litert-xnnpack). For each torchvision model of a zoo (random weights: partitioning does not
look at values; static batch 1), the same ``torch.export`` program is

- exported to ONNX by torch's dynamo exporter as ``npukit export`` writes it (opset 18, optimized: constants and
  BatchNorms folded) and analyzed with the backend's profile: each ONNX node delegated or not;
- lowered by the runtime as ``npukit compile --target executorch-xnnpack | litert`` does (fp32): ExecuTorch's
  ``to_edge_transform_and_lower`` (each edge node inside an XNNPACK delegate call or left to the portable kernels),
  or litert-torch's converter and LiteRT's interpreter (each .tflite operator inside the XNNPACK delegate node or
  left to LiteRT's kernels).

Both sides are traced back to the node of the exported program they came from (torch's ``from_node`` provenance; the
ONNX exporter's per-node record; the .tflite tensor names litert-torch writes from it), and compared node for node
over the program's nodes that exist on both sides: predicted delegated (every ONNX node it became is) against
actually delegated (every lowered node it became is; "split", some inside and some not, counts as not delegated and
is listed). Nodes one side removed (dropout; a conv whose BatchNorm the ONNX optimizer folded into it; on LiteRT the
operator writing a graph output, which carries the signature's name) are counted, not compared. Prints a table and
every mismatch, writes benchmarks/results/mobile_partition_<backend>.json.

    python benchmarks/mobile_partition.py --backend executorch --jobs 2   # the whole zoo (about 20 min on 2 cores)
    python benchmarks/mobile_partition.py --backend litert --models resnet18 vit_b_16
    python benchmarks/mobile_partition.py --backend executorch --models "facenet_pytorch.models.mtcnn:PNet()@1,3,48,48"
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ZOO = ("mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "resnet18", "resnet50", "efficientnet_b0",
       "efficientnet_v2_s", "shufflenet_v2_x1_0", "squeezenet1_1", "googlenet", "inception_v3", "densenet121",
       "mnasnet1_0", "regnet_y_400mf", "convnext_tiny", "swin_t", "vit_b_16", "maxvit_t", "alexnet", "vgg11",
       "lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "fcn_resnet50", "swin_v2_t", "r3d_18")
BACKENDS = {"executorch": "executorch-xnnpack", "litert": "litert-xnnpack"}  # backend -> npukit's profile
TARGET_MATCH_RATE = 0.9
CHILD_TIMEOUT_S = 900
RESULTS = Path(__file__).parent / "results"


@dataclasses.dataclass
class Mismatch:
    node: str
    op: str
    onnx_ops: str
    predicted: str
    actual: str
    npukit_reason: str | None
    left_ops: str | None  # the ops of its lowered nodes the runtime left to its own kernels


@dataclasses.dataclass
class Row:
    model: str
    ok: bool
    program_nodes: int | None = None
    compared: int | None = None
    matched: int | None = None
    predicted_delegated: int | None = None
    actual_delegated: int | None = None
    split: int | None = None
    removed_onnx: int | None = None
    removed_edge: int | None = None
    mismatches: list[Mismatch] = dataclasses.field(default_factory=list)
    seconds: float | None = None
    error: str | None = None

    @property
    def rate(self) -> float | None:
        return self.matched / self.compared if self.ok and self.compared else None


def _example(name: str) -> tuple[Any, tuple[Any, ...]]:
    """The module and an input for ``name``: a torchvision model, or any model spec npukit takes with its input
    shape after an @ (``facenet_pytorch.models.mtcnn:PNet()@1,3,48,48``)."""
    import torch

    from npukit.frontend.spec import resolve_model

    spec, _, given = name.partition("@")
    source = resolve_model(spec if ":" in spec else f"torchvision:{spec}")
    shape = tuple(int(d) for d in given.split(",")) if given else source.default_input_shape or (1, 3, 224, 224)
    if spec == "r3d_18":
        shape = (1, 3, 8, 112, 112)
    torch.manual_seed(0)
    return source.module.eval(), (torch.randn(*shape),)


def compare(name: str, backend: str) -> Row:
    """Predicted vs actual placement of every node of ``name``'s exported program."""
    import logging
    import warnings

    import torch

    from npukit.frontend.provenance import onnx_nodes_by_origin
    from npukit.targets import analyze, get_target

    if backend == "executorch":
        from npukit.runtime.executorch import node_placement, require
    else:
        from npukit.runtime.litert import node_placement, require
    require()
    warnings.simplefilter("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)
    start = time.perf_counter()
    module, example = _example(name)
    placement = node_placement(module, example)
    exported = torch.export.export(module, example)
    program = torch.onnx.export(exported, dynamo=True, optimize=True, opset_version=18, verbose=False)
    analysis = analyze(program.model_proto, get_target(BACKENDS[backend]))
    verdicts = {v.name: v for v in analysis.nodes}
    onnx_nodes = {o: [verdicts[n] for n in names] for o, names in onnx_nodes_by_origin(program).items()}
    row = Row(model=name, ok=True, program_nodes=len(placement), compared=0, matched=0,
              predicted_delegated=0, actual_delegated=0, split=0, removed_onnx=0, removed_edge=0)
    for origin, place in placement.items():
        nodes = onnx_nodes.get(origin)
        if place.where == "removed":
            row.removed_edge += 1  # type: ignore[operator]
            continue
        if not nodes:
            row.removed_onnx += 1  # type: ignore[operator]
            continue
        predicted = all(v.partition is not None for v in nodes)
        actual = place.where == "delegated"
        row.compared += 1  # type: ignore[operator]
        row.predicted_delegated += predicted  # type: ignore[operator]
        row.actual_delegated += actual  # type: ignore[operator]
        row.split += place.where == "split"  # type: ignore[operator]
        if predicted == actual:
            row.matched += 1  # type: ignore[operator]
            continue
        reasons = "; ".join(r for v in nodes for r in v.reasons) or None
        row.mismatches.append(Mismatch(
            node=origin, op=place.target, onnx_ops=" ".join(v.op_type for v in nodes),
            predicted="delegated" if predicted else "cpu", actual=place.where, npukit_reason=reasons,
            left_ops=", ".join(sorted(set(place.left))) or None))
    row.seconds = round(time.perf_counter() - start, 1)
    return row


def _run(name: str, backend: str) -> Row:
    try:
        return compare(name, backend)
    except Exception as exc:  # one broken model must not stop the benchmark
        traceback.print_exc(file=sys.stderr)
        return Row(model=name, ok=False, error=f"{type(exc).__name__}: {exc}"[:400])


def _print(rows: list[Row], summary: dict[str, Any], backend: str) -> None:
    from rich.console import Console
    from rich.table import Table

    title = {"executorch": f"XnnpackPartitioner (executorch {summary['runtime']})",
             "litert": f"LiteRT's XNNPACK delegate (ai-edge-litert {summary['runtime']})"}[backend]
    table = Table(title=f"{BACKENDS[backend]} partition: npukit analyze vs {title}, fp32")
    for column in ("model", "program nodes", "compared", "delegated pred/actual", "split", "removed onnx/edge",
                   "node for node", "mismatches"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in rows:
        if not r.ok:
            table.add_row(r.model, "-", "-", "-", "-", "-", "[red]error[/]", (r.error or "")[:60])
            continue
        table.add_row(r.model, str(r.program_nodes), str(r.compared), f"{r.predicted_delegated}/{r.actual_delegated}",
                      str(r.split), f"{r.removed_onnx}/{r.removed_edge}", f"{100 * (r.rate or 0):.1f}%",
                      str(len(r.mismatches)))
    console = Console(width=160)
    console.print(table)
    for r in rows:
        for m in r.mismatches:
            console.print(f"  {r.model}: {m.node} ({m.op.split('.')[-2] if '.' in m.op else m.op} -> {m.onnx_ops}) "
                          f"predicted {m.predicted}, actual {m.actual}"
                          f"{f' [{m.left_ops}]' if m.left_ops else ''}"
                          f"{f' -- npukit: {m.npukit_reason}' if m.npukit_reason else ''}", highlight=False)
    console.print(f"node for node: {summary['matched']}/{summary['compared']} = {100 * summary['rate']:.1f}% over "
                  f"{summary['models_ok']} models, {summary['models_at_or_above_target']} of them at >= "
                  f"{100 * TARGET_MATCH_RATE:.0f}% (target >= {100 * TARGET_MATCH_RATE:.0f}% over >= 15 models): "
                  f"{'PASS' if summary['passed'] else 'FAIL'}")


def _markdown(rows: list[Row], summary: dict[str, Any]) -> str:
    lines = [f"# {summary['profile']}: npukit analyze vs the real partitioner ({summary['backend']} "
             f"{summary['runtime']}, torch {summary['torch']}, {summary['cpu']}, fp32)", "",
             f"Node for node: {summary['matched']}/{summary['compared']} = {100 * summary['rate']:.1f}% over "
             f"{summary['models_ok']} models; {summary['models_at_or_above_target']} models at >= "
             f"{100 * TARGET_MATCH_RATE:.0f}%. Target >= {100 * TARGET_MATCH_RATE:.0f}% over >= 15 models: "
             f"{'PASS' if summary['passed'] else 'FAIL'}.", "",
             "| model | program nodes | compared | delegated pred/actual | split | removed onnx/runtime | match |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if not r.ok:
            lines.append(f"| {r.model} | error: {(r.error or '').splitlines()[0][:100]} | | | | | |")
            continue
        lines.append(f"| {r.model} | {r.program_nodes} | {r.compared} | {r.predicted_delegated}/"
                     f"{r.actual_delegated} | {r.split} | {r.removed_onnx}/{r.removed_edge} | "
                     f"{100 * (r.rate or 0):.1f}% |")
    groups: dict[tuple[str, ...], list[str]] = {}
    for r in rows:
        for m in r.mismatches:
            key = (m.op.split(".")[-2] if "." in m.op else m.op, m.onnx_ops, m.predicted, m.actual, m.left_ops or "")
            groups.setdefault(key, []).append(r.model)
    if groups:
        lines += ["", "Mismatches, by torch op:", "", "| torch op | ONNX ops | predicted | actual | left ops | count "
                  "| models |", "|---|---|---|---|---|---:|---|"]
        for key, models in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"| {' | '.join(key)} | {len(models)} | {', '.join(sorted(set(models)))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=list(BACKENDS), required=True)
    parser.add_argument("--models", nargs="*", default=list(ZOO))
    parser.add_argument("--jobs", type=int, default=1, help="models compared at once (one process each)")
    parser.add_argument("--stem", default=None, help="results file stem (mobile_partition_<backend>)")
    args = parser.parse_args(argv)

    import importlib.metadata

    import torch

    from npukit.runtime.devices import read_cpu_info

    rows: list[Row] = []
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context, max_tasks_per_child=1) as pool:
        futures = {name: pool.submit(_run, name, args.backend) for name in args.models}
        for name, future in futures.items():
            try:
                rows.append(future.result(timeout=CHILD_TIMEOUT_S))
            except Exception as exc:  # noqa: BLE001 - a crashed or hung child is that model's error
                rows.append(Row(model=name, ok=False, error=f"{type(exc).__name__}: {exc}"[:400]))
            print(f"{name}: {'ok' if rows[-1].ok else rows[-1].error}", file=sys.stderr, flush=True)
    ok = [r for r in rows if r.ok]
    compared = sum(r.compared or 0 for r in ok)
    matched = sum(r.matched or 0 for r in ok)
    rate = matched / compared if compared else 0.0
    summary = {
        "cpu": read_cpu_info("/proc/cpuinfo").model or platform.machine(), "torch": torch.__version__,
        "backend": args.backend, "profile": BACKENDS[args.backend],
        "runtime": importlib.metadata.version({"executorch": "executorch", "litert": "ai-edge-litert"}[args.backend]),
        "models_ok": len(ok), "compared": compared,
        "matched": matched, "rate": rate, "target_rate": TARGET_MATCH_RATE,
        "passed": len(ok) >= 15 and rate >= TARGET_MATCH_RATE,
        "models_at_or_above_target": sum(1 for r in ok if (r.rate or 0) >= TARGET_MATCH_RATE),
    }
    _print(rows, summary, args.backend)
    RESULTS.mkdir(exist_ok=True)
    stem = args.stem or f"mobile_partition_{args.backend}"
    payload = {"summary": summary, "rows": [dataclasses.asdict(r) | {"rate": r.rate} for r in rows]}
    (RESULTS / f"{stem}.json").write_text(json.dumps(payload, indent=1) + "\n")
    (RESULTS / f"{stem}.md").write_text(_markdown(rows, summary))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
