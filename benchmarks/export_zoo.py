"""Model zoo: export every torchvision classification builder (random weights), run npukit's graph passes, and
measure what each step costs and buys.

Weights are random but drawn so that every output depends on the input (see ``informative_init``).
Per model: the exporter used (and why it fell back), nodes before/after the passes, max relative error against
torch of the export and of the optimized model, and ORT CPU latency after/before the passes (1 thread, interleaved
runs, medians). Prints a table and writes JSON under benchmarks/results/.

    python benchmarks/export_zoo.py                    # every classification model (long: about an hour)
    python benchmarks/export_zoo.py --subset ci        # the representative subset CI runs
    python benchmarks/export_zoo.py --models resnet18 mobilenet_v2
    python benchmarks/export_zoo.py --resume --redo alexnet   # keep what passed, run the rest and alexnet again
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import onnx
import onnx_ir as ir
import torchvision

from npukit.config import ExportConfig, OptimizeConfig
from npukit.frontend.export import export_model
from npukit.frontend.onnx_io import save_onnx
from npukit.frontend.spec import resolve_model
from npukit.frontend.verify import verify_against_torch
from npukit.measure.latency import measure_latency, measure_latency_interleaved
from npukit.passes.pipeline import optimize_model, verify_equivalent

CI_SUBSET = ("mobilenet_v2", "mobilenet_v3_large", "resnet18", "efficientnet_b0", "shufflenet_v2_x1_0",
             "convnext_tiny", "googlenet")
RTOL = 1e-4
TIME_BUDGET_S = 30.0  # timed runs per model are capped so both variants together take about this long
MIN_RUNS = 6
RESULTS = Path(__file__).parent / "results"


@dataclasses.dataclass
class ZooRow:
    model: str
    ok: bool
    exporter: str | None = None
    fallback_reason: str | None = None
    input_shape: list[int] | None = None
    nodes_before: int | None = None
    nodes_after: int | None = None
    export_max_rel: float | None = None
    optimized_max_rel_vs_torch: float | None = None
    optimized_max_rel_vs_export: float | None = None
    latency_before_ms: float | None = None
    latency_after_ms: float | None = None
    latency_ratio: float | None = None
    noise_ratio: float | None = None  # A/A control: the unmodified model timed twice in the same interleaving
    graph_changed: bool | None = None  # False when the passes left every node's op type and attributes as they were
    latency_runs: int | None = None
    export_s: float | None = None
    error: str | None = None


RESIDUAL_BRANCH_GAIN = 0.7


def informative_init(module, *, seed: int = 0) -> None:
    """Re-draw every weight so that outputs depend on the input (torchvision's own init zeroes some heads, and
    GoogLeNet's random features vanish): He-normal matrices/kernels, weights of norms near 1, small biases, BatchNorm
    statistics of plausible spread. Still random weights, but a numeric error in an export now shows."""
    import math

    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) * math.sqrt(2.0 / max(1, fan_in)))
            elif name.endswith("weight"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            else:
                p.copy_((torch.rand(p.shape, generator=gen) - 0.5) * 0.2)
    # BatchNorm statistics measured on random inputs, as training would leave them: every normalized layer then has
    # unit gain, so deep nets stay well conditioned (with arbitrary statistics the activations of EfficientNet-B4
    # reach 1e5 and fp32 rounding differences between torch and ONNX Runtime grow layer by layer to 30%).
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batches
        module.train()
        shape = getattr(module, "_npukit_input_shape", None) or (2, 3, 224, 224)
        with torch.no_grad():
            for _ in range(2):
                module(torch.randn(shape, generator=gen))
        module.eval()
    # Then the last BatchNorm of each ResNet/ResNeXt residual branch at 0.7 of the gain its successors' statistics
    # were measured at. As drawn, a random ResNet is chaotic: a perturbation grows about 10% per block, so float32
    # rounding alone (torch's own run against its float64 run) grows from 1e-6 after the first block of resnet152 to
    # 1.7e-3 after the last and 2.6e-4 on the logits - the model, not the export, would decide the check. At 0.7 it
    # grows to 2e-5 after the last block (2.6e-6 on the logits): no longer amplified block by block, while the logits
    # still move with the input (their spread over inputs is 7% of their spread over classes for resnet152, 11% for
    # resnet18; 14% and 16% at full gain).
    with torch.no_grad():
        for block in module.modules():
            if isinstance(block, (torchvision.models.resnet.BasicBlock, torchvision.models.resnet.Bottleneck)):
                last_norm = block.bn3 if isinstance(block, torchvision.models.resnet.Bottleneck) else block.bn2
                last_norm.weight.mul_(RESIDUAL_BRANCH_GAIN)
                last_norm.bias.mul_(RESIDUAL_BRANCH_GAIN)


def classification_models() -> list[str]:
    return sorted(torchvision.models.list_models(module=torchvision.models))


def run_model(name: str, work: Path, *, runs: int, time_it: bool = True) -> ZooRow:
    row = ZooRow(model=name, ok=False)
    try:
        source = resolve_model(f"torchvision:{name}")
        shape = source.default_input_shape or (1, 3, 224, 224)
        source.module._npukit_input_shape = (2, *shape[1:])
        informative_init(source.module)
        exported_path = work / f"{name}.onnx"
        result = export_model(source, exported_path, config=ExportConfig(rtol=RTOL))
        row.exporter, row.fallback_reason = result.exporter, result.fallback_reason
        row.input_shape = list(result.input_shape or ())
        row.export_max_rel, row.export_s = result.max_rel_error, round(result.seconds, 1)
        original = onnx.load(str(exported_path))
        pipeline = optimize_model(ir.serde.deserialize_model(original), config=OptimizeConfig())
        optimized = ir.serde.serialize_model(pipeline.model)
        row.nodes_before, row.nodes_after = len(original.graph.node), len(optimized.graph.node)
        # by path, not bytes: the largest models (vit_h_14, regnet_y_128gf) exceed protobuf's 2 GB and keep their
        # weights in a .data file beside the .onnx
        optimized_path = save_onnx(pipeline.model, work / f"{name}.opt.onnx")
        row.optimized_max_rel_vs_export = verify_equivalent(str(exported_path), str(optimized_path),
                                                            rtol=RTOL).max_rel
        row.optimized_max_rel_vs_torch = verify_against_torch(source.module, str(optimized_path),
                                                              shape=result.input_shape, samples=1, seed=1).max_rel
        if time_it:
            probe = measure_latency(str(optimized_path), threads=1, warmup=1, runs=1)
            runs = max(MIN_RUNS, min(runs, int(TIME_BUDGET_S * 1000 / (2 * probe.median_ms))))
            runs = max(MIN_RUNS, runs * 2 // 3)  # three variants share the budget
            latency = measure_latency_interleaved(
                {"before": str(exported_path), "after": str(optimized_path), "before (again)": str(exported_path)},
                threads=1, warmup=2, runs=runs, rounds=min(10, runs))
            row.latency_runs = runs
            row.latency_before_ms = latency["before"].median_ms
            row.latency_after_ms = latency["after"].median_ms
            row.latency_ratio = row.latency_after_ms / row.latency_before_ms
            row.noise_ratio = latency["before (again)"].median_ms / row.latency_before_ms
        row.graph_changed = _graph_signature(original) != _graph_signature(optimized)
        row.ok = (row.export_max_rel is not None and row.export_max_rel <= RTOL
                  and row.optimized_max_rel_vs_torch <= RTOL)
    except Exception as exc:  # a zoo run records every failure and goes on
        row.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        traceback.print_exc(file=sys.stderr)
    finally:
        for path in work.glob(f"{name}.*"):
            path.unlink()
        gc.collect()
    return row


def _graph_signature(model: onnx.ModelProto) -> list[tuple]:
    return [(n.op_type, n.domain, tuple(a.SerializeToString() for a in n.attribute)) for n in model.graph.node]


def print_table(rows: list[ZooRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="npukit export zoo (torchvision, random weights; latency: ORT CPU 1 thread, medians)")
    for col in ("model", "exporter", "nodes before", "nodes after", "export rel err", "optimized rel err",
                "latency before ms", "after ms", "after/before", "A/A noise", "status"):
        table.add_column(col, justify="left" if col in ("model", "exporter", "status") else "right")

    def f(v, fmt):
        return "—" if v is None else format(v, fmt)

    for r in rows:
        table.add_row(r.model, (r.exporter or "—") + (" (fallback)" if r.fallback_reason else ""),
                      f(r.nodes_before, "d"), f(r.nodes_after, "d"), f(r.export_max_rel, ".2e"),
                      f(r.optimized_max_rel_vs_torch, ".2e"), f(r.latency_before_ms, ".2f"),
                      f(r.latency_after_ms, ".2f"), f(r.latency_ratio, ".3f"), f(r.noise_ratio, ".3f"),
                      "ok" if r.ok else (r.error or "over tolerance"))
    Console(width=200).print(table)


def summarize(rows: list[ZooRow]) -> dict:
    ratios = sorted(r.latency_ratio for r in rows if r.latency_ratio is not None)
    return {
        "models": len(rows),
        "exported_and_matching": sum(r.ok for r in rows),
        "fell_back_to_torchscript": [r.model for r in rows if r.fallback_reason],
        "failed": {r.model: r.error or "over tolerance" for r in rows if not r.ok},
        "median_latency_ratio": ratios[len(ratios) // 2] if ratios else None,
        # slower: over 3% and beyond what the A/A control of the same run shows the machine's noise to be
        "slower_after_passes_over_3pct": [r.model for r in rows if r.latency_ratio and r.latency_ratio > 1.03
                                          and r.latency_ratio - 1 > abs((r.noise_ratio or 1.0) - 1)],
        "over_3pct_within_noise": [r.model for r in rows if r.latency_ratio and r.latency_ratio > 1.03
                                   and r.latency_ratio - 1 <= abs((r.noise_ratio or 1.0) - 1)],
        "graph_unchanged_by_passes": sum(r.graph_changed is False for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subset", choices=("all", "ci"), default="all")
    parser.add_argument("--models", nargs="*", help="explicit model names (overrides --subset)")
    parser.add_argument("--runs", type=int, default=30, help="timed runs per model and variant")
    parser.add_argument("--no-latency", action="store_true", help="skip timing (correctness only)")
    parser.add_argument("--json", type=Path, help="output JSON (default benchmarks/results/export_zoo.json; "
                                                  "export_zoo_ci.json with --subset ci; export_zoo_selected.json "
                                                  "with --models)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the models that passed in the JSON, run the rest (failed ones again)")
    parser.add_argument("--redo", nargs="*", metavar="MODEL",
                        help="with --resume: run these again too (e.g. to re-time models flagged slower)")
    args = parser.parse_args(argv)
    names = args.models or (list(CI_SUBSET) if args.subset == "ci" else classification_models())
    # a run of named models never overwrites the full zoo's results
    default = "export_zoo_selected.json" if args.models else \
        "export_zoo_ci.json" if args.subset == "ci" else "export_zoo.json"
    out = args.json or RESULTS / default
    rows: list[ZooRow] = []
    if args.resume and out.is_file():
        rows = [ZooRow(**r) for r in json.loads(out.read_text())["rows"]
                if r["model"] in names and r["ok"] and r["model"] not in (args.redo or ())]
    done = {r.model for r in rows}
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="npukit-zoo-") as tmp:
        for i, name in enumerate(names, 1):
            if name in done:
                continue
            row = run_model(name, Path(tmp), runs=args.runs, time_it=not args.no_latency)
            rows.append(row)
            print(f"[{i}/{len(names)}] {name}: {'ok' if row.ok else row.error or 'over tolerance'} "
                  f"(rel err {row.export_max_rel}, ratio {row.latency_ratio})", file=sys.stderr, flush=True)
            _write(out, rows, names, started=start)  # after every model: a long run keeps what it measured
    print_table(rows)
    print(json.dumps(summarize(rows), indent=2))
    _write(out, rows, names, started=start)
    print(f"wrote {out}")
    return 0 if all(r.ok for r in rows) and len(rows) == len(names) else 1


def _write(out: Path, rows: list[ZooRow], names: list[str], *, started: float) -> None:
    from npukit.report.core import package_versions

    out.parent.mkdir(parents=True, exist_ok=True)
    order = {n: i for i, n in enumerate(names)}
    rows.sort(key=lambda r: order.get(r.model, len(order)))
    payload = {"summary": summarize(rows), "complete": len(rows) == len(names), "planned_models": names,
               "rows": [dataclasses.asdict(r) for r in rows], "seconds_this_run": round(time.time() - started, 1),
               "rtol": RTOL, "packages": package_versions()}
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(out)


if __name__ == "__main__":
    sys.exit(main())
