"""The demo's report: each verb's part of its own report (sections, tables and timings under the verb's name), the
models side by side (size, latency beside eager PyTorch, agreement with FP32) and what the INT8 model predicts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from npukit.report.core import Report, Table


def add_stage(report: Report, prefix: str, stage: Report, keys: Sequence[str], *,
              tables: Callable[[Table], bool] = lambda table: True, sections_prefixed: bool = True) -> None:
    """A verb's report into the demo's: its timings and the ``keys`` sections under ``prefix``, the tables
    ``tables`` keeps."""
    report.timings.update({f"{prefix}.{k}": v for k, v in stage.timings.items()})
    for key in keys:
        report.add(f"{prefix}.{key}" if sections_prefixed else key, stage.sections[key])
    report.tables.extend(t for t in stage.tables if tables(t))


def add_models(report: Report, models: Mapping[str, Path], latency: Mapping[str, Any], agreements: Mapping[str, Any],
               sizes: Mapping[str, Any], *, eager: Any, eager_label: str, model_spec: str, samples: int,
               threads: int) -> dict[str, Any]:
    """Each model's file size, latency (``LatencyResult``; ratio to fp32) and agreement with fp32 (``Agreement``),
    with eager PyTorch timed in the same rounds; the per-model summary."""
    base = latency["fp32"].median_ms
    report.add("eager_torch", {"latency": eager.as_dict(),
                               "speedup": {k: eager.median_ms / latency[k].median_ms for k in models}})
    rows, summary = [], {}
    for k, path in models.items():
        agreement = agreements[k]
        summary[k] = {"file": str(path), "file_bytes": sizes[k].file_bytes, "latency": latency[k].as_dict(),
                      "agreement_with_fp32": agreement.as_dict()}
        rows.append([k, path.name, sizes[k].file_bytes, latency[k].median_ms, latency[k].median_ms / base,
                     agreement.top1_agreement, agreement.top5_overlap, agreement.sqnr_db])
    report.add("models", summary)
    rows.append([eager_label, model_spec, "-", eager.median_ms, eager.median_ms / base, "-", "-", "-"])
    from npukit.report.qat import noisy_timing

    # the optimized model (the same graph, give or take a pooling op) read 1.23x fp32's time on a busy host
    noisy = next((n for n in (noisy_timing(latency["fp32"], latency[k]) for k in models if k != "fp32") if n), "")
    report.add_table(f"Models on {samples} real-photo crops (ORT CPU, {threads} thread(s), "
                     f"interleaved medians; eager PyTorch timed in the same rounds{noisy})",
                     ["model", "file", "size_bytes", "median ms", "latency vs fp32", "top-1 agreement",
                      "top-5 overlap", "logits SQNR dB"], rows)
    report.add_figure("Latency, median ms", "bar",
                      {"labels": [*models, eager_label], "values": [latency[k].median_ms for k in models]
                       + [eager.median_ms]}, x_label="ms")
    return summary


def add_predictions(report: Report, top: Sequence[tuple[str, str, float]]) -> None:
    """(photo, top-1 class, probability) of the INT8 model on each evaluation photo's centre crop."""
    report.add("predictions", [{"photo": p, "top1": c, "probability": pr} for p, c, pr in top])
    report.add_table("What the INT8 model sees (center crop of each evaluation photo)",
                     ["photo", "top-1 class", "probability"], [list(t) for t in top])
