"""The serve-bench verb: a plain session loop against npukit's runtime under closed- and open-loop load."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from npukit.config import PreprocessConfig
from npukit.report.core import Report
from npukit.report.finish import CommandResult, finish


def serve_bench(
    model: str | Path,
    *,
    data: str | Path | None = None,
    device: str = "cpu",
    duration_s: float = 3.0,
    max_workers: int | None = None,
    loads: Sequence[float] = (0.8, 1.2, 1.6),
    max_batch: int = 4,
    max_wait_ms: float = 2.0,
    samples: int = 16,
    report_path: str | Path | None = None,
    html: bool = False,
) -> CommandResult:
    """Serve ``model`` with ``npukit.runtime.engine.Runtime`` and with a plain one-session loop under the same loads
    (``measure.serving``): start-up, jitter, allocations per call, throughput against workers, and open-loop Poisson
    load at ``loads`` x the plain loop's capacity with dynamic batching (models with a symbolic batch axis).
    Requests are ``samples`` inputs from ``data`` (image folder, .npy, .npz) or seeded random inputs."""
    import onnx

    from npukit.errors import InputError
    from npukit.measure.serving import ServingConfig, measure_serving
    from npukit.report.serving import add_serving
    from npukit.runtime.ort import make_session, random_feeds
    from npukit.verbs.common import open_data

    path = Path(model)
    if not path.is_file() or path.suffix.lower() != ".onnx":
        raise InputError(f"{model} is not an .onnx file", hint="serve an ONNX model (npukit export makes one)")
    config = ServingConfig(device=device, duration_s=duration_s, max_workers=max_workers, loads=tuple(loads),
                           max_batch=max_batch, max_wait_ms=max_wait_ms)
    proto = onnx.load(str(path), load_external_data=False)
    if data is not None:
        dataset = open_data(data, proto, PreprocessConfig())
        requests = [dict(dataset.sample(i)) for i in range(min(samples, len(dataset)))]
    else:
        session = make_session(path)
        requests = [random_feeds(session, seed=i) for i in range(samples)]
    report = Report("serve-bench", config={"model": str(model), "data": str(data) if data else "seeded random inputs",
                                           "serving": {**config.__dict__, "loads": list(config.loads)},
                                           "requests": len(requests)})
    result = measure_serving(path, requests, config)
    add_serving(report, result)
    curve = result.curve
    best = max(curve, key=lambda w: curve[w].throughput)
    plain = result.single["plain"].throughput
    report.set_verdict(f"INFO serve-bench: plain loop {plain:.1f} requests/s; runtime {curve[best].throughput:.1f} "
                       f"requests/s with {best} workers ({curve[best].throughput / plain:.2f}x); a measurement, "
                       "nothing was checked", passed=True)
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=html, json_path=json_path, result=result, source=model)
