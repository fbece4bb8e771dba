"""The serve-bench verb: a plain session loop against npukit's runtime under closed- and open-loop load."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
    prefer: str = "throughput",
    device_concurrency: int | None = None,
    samples: int = 16,
    report_path: str | Path | None = None,
    html: bool = False,
    buckets: Sequence[Sequence[int]] = (),
    input_shape: str | Sequence[Any] | None = None,
    preprocess: PreprocessConfig | None = None,
) -> CommandResult:
    """Serve ``model`` with ``npukit.runtime.engine.Runtime`` and with a plain one-session loop under the same loads
    (``measure.serving``): start-up, jitter, allocations per call, throughput against workers, and open-loop Poisson
    load at ``loads`` x the plain loop's capacity with dynamic batching (models with a symbolic batch axis).
    Requests are ``samples`` inputs from ``data`` (image folder, .npy, .npz) or seeded random inputs. ``prefer``:
    what the split of the cores a runtime measures for itself optimizes ("throughput" or "latency");
    ``device_concurrency``: graphs run at once on the device (None: one on an NPU, no limit on the CPU).

    With ``buckets`` (input shapes; a model with one input whose sizes are symbolic): the model served through
    ``runtime.buckets.BucketedRuntime`` at those sizes against a session fixed to each size, one caller, on seeded
    inputs of each size (``measure.serving.measure_buckets``): outputs compared, latency side by side.

    ``input_shape`` (``InputSpec`` forms) is fixed into a copy of the model first, which is served; on the HTP a
    symbolic batch is fixed too (the QNN EP takes static shapes: one request at a time)."""
    from npukit.frontend.shapes import InputSpec, fix_inputs, fixed_shapes, symbolic_inputs
    from npukit.measure.serving import ServingConfig
    from npukit.report.serving import add_serving
    from npukit.verbs.common import check_report_path

    report_path = check_report_path(report_path)
    path = _served_file(model)
    spec = InputSpec.parse(input_shape)
    _refuse_buckets_with(buckets, spec, data)
    if buckets:
        return _serve_buckets(path, buckets, duration_s=duration_s, report_path=report_path, html=html)
    config = ServingConfig(device=device, duration_s=duration_s, max_workers=max_workers, loads=tuple(loads),
                           max_batch=max_batch, max_wait_ms=max_wait_ms, prefer=prefer,
                           device_concurrency=device_concurrency)
    npu = device.strip().lower().partition("@")[0] == "qnn-htp"  # static shapes: one request at a time, no batching
    proto, requests, spec, from_data = _served_model(path, spec, data, samples, preprocess or PreprocessConfig(),
                                                     keep_batch=not npu)
    if npu and symbolic_inputs(proto, allow_batch=False) and not symbolic_inputs(proto):  # a symbolic batch alone
        spec = InputSpec(tuple(fixed_shapes(proto).items()))  # taken as 1, as compile and bench take it
        proto = fix_inputs(proto, spec)
    report = Report("serve-bench", config={"model": str(model), "data": str(data) if data else "seeded random inputs",
                                           "serving": {**config.__dict__, "loads": list(config.loads)},
                                           "requests": len(requests),
                                           "input_shape": spec.as_dict() if spec else None,
                                           "input_shape_from": "the data's first request" if from_data else
                                           "--input-shape" if spec else "the model"})
    result = _measure(path, proto, requests, config, fixed=bool(spec))
    add_serving(report, result)
    _set_verdict(report, result, _caveat(result, requests, seeded=data is None))
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=html, json_path=json_path, result=result, source=model)


def _refuse_buckets_with(buckets: Sequence[Sequence[int]], spec: Any, data: Any) -> None:
    """--bucket gives the served sizes and its own inputs: refused beside --input-shape or --data."""
    from npukit.errors import InputError

    if buckets and spec:
        raise InputError("--bucket and --input-shape both give the served shape",
                         hint="give the sizes to serve with --bucket alone")
    if buckets and data is not None:
        raise InputError("--bucket compares each bucket with a session at its size on seeded inputs of that size; "
                         "--data is not read there", hint="leave --data out with --bucket, or serve the data without "
                                                          "--bucket")


def _served_model(path: Path, spec: Any, data: Any, samples: int, preprocess: PreprocessConfig, *,
                  keep_batch: bool = True) -> tuple[Any, list, Any, dict]:
    """The model with ``spec`` fixed in (a symbolic batch kept symbolic with ``keep_batch``, for batching), the
    requests, the spec served and the sizes taken from the data's first request (where ``spec`` is None and the
    model leaves sizes open; {} otherwise)."""
    from npukit.frontend.shapes import InputSpec, fix_inputs, load_with_inputs

    # a truncated or foreign file is a one-line error, not a decoder's traceback; sizes only the requests' data
    # gives may stay symbolic
    proto = load_with_inputs(path, spec, needs=None if data is not None else "serving on seeded random requests",
                             keep_batch=keep_batch)
    requests = _requests(proto, data, samples, preprocess)
    from_data = spec is None and _sized_by(proto, requests)
    if from_data:  # sizes the model leaves open, as the data's requests have them (bench takes them so too)
        spec = InputSpec.parse(from_data)
        proto = fix_inputs(proto, spec, keep_batch=keep_batch)
    return proto, requests, spec, from_data or {}


def _measure(path: Path, proto: Any, requests: list, config: Any, *, fixed: bool) -> Any:
    """``measure_serving`` on the file given, or (``fixed``: shapes fixed in) on the model saved aside, since the
    runtimes measured open a file."""
    from npukit.frontend.onnx_io import save_onnx
    from npukit.measure.serving import measure_serving

    with tempfile.TemporaryDirectory(prefix="npukit-serve-") as tmp:
        served = path
        if fixed:
            served = Path(tmp) / path.name
            save_onnx(proto, served)
        return measure_serving(served, requests, config)


def _caveat(result: Any, requests: list, *, seeded: bool) -> str:
    """What the figures may not show: seeded integer inputs (a branch real data never takes), the HTP emulator."""
    from npukit.runtime.engine import EMULATOR_NOTE, htp_emulated

    integers = [name for name, value in requests[0].items() if np.asarray(value).dtype.kind in "biu"] \
        if seeded and requests else []
    caveat = (f"; the seeded requests give integer input(s) {', '.join(map(repr, integers))} small random values, "
              "so a model that branches on one (a sample rate, a mode flag) may be timed on a path real data never "
              "takes: pass --data" if integers else "")
    if str(result.device.get("device", "")).startswith("qnn-htp") and htp_emulated():
        caveat += f"; {EMULATOR_NOTE}"
    return caveat


def _set_verdict(report: Report, result: Any, caveat: str) -> None:
    """FAIL where requests failed; else the best point's throughput against the plain loop beside it."""
    failed = _failed(result)
    if failed:
        report.set_verdict(f"FAIL serve-bench: {failed}", passed=False)
        return
    curve = result.curve
    best = max(curve, key=lambda w: curve[w].throughput)
    report.set_verdict(f"INFO serve-bench: runtime {curve[best].throughput:.1f} requests/s with {best} worker(s), "
                       f"{result.speedup(best):.2f}x the plain loop run just before it "
                       f"({_plain_runs(result, best)}); a measurement, nothing was checked{caveat}", passed=True)


def _plain_runs(result: Any, workers: int) -> str:
    """The plain loop's throughput in the run just before the runtime's with ``workers`` (the ratio's denominator),
    and how far its runs drifted where the host's speed moved."""
    before = result.curve[workers].throughput / result.speedup(workers)
    low, high = result.plain_range()
    if high <= low * 1.05:
        return f"plain loop {before:.1f} requests/s"
    return (f"plain loop {before:.1f} requests/s; {low:.1f}-{high:.1f} over its {len(result.curve_plain) + 1} "
            "runs: the host's speed moved during the run, so compare figures measured side by side")


def _sized_by(proto: Any, requests: Sequence[dict]) -> dict[str, tuple[int, ...]]:
    """One request's shape for each input whose sizes past the batch the model leaves symbolic, from the first of
    ``requests`` (the data's); {} where none is open."""
    from npukit.frontend.shapes import input_dims

    if not requests:
        return {}
    dims = input_dims(proto)
    return {name: tuple(int(d) for d in np.shape(requests[0][name])) for name, shape in dims.items()
            if shape and any(not isinstance(d, int) for d in shape[1:]) and name in requests[0]}


def _failed(result: Any) -> str:
    """Which loads had requests that failed (the served figures then leave them out, and look faster), with the
    first error; "" where every request was answered."""
    runs = [(f"one caller, {name}", r) for name, r in result.single.items()]
    runs += [(f"closed loop, {w} worker(s)", r) for w, r in result.curve.items()]
    runs += [(f"open loop, {name} at {r.level:.1f}/s", r) for name, rs in result.open.items() for r in rs]
    bad = [(where, r) for where, r in runs if r.failed]
    if not bad:
        return ""
    where, first = bad[0]
    return (f"{sum(r.failed for _, r in bad)} requests failed in {len(bad)} of {len(runs)} loads (first: {where}, "
            f"{first.failed} of {first.failed + first.completed}: {first.first_error or 'no error text'}); the "
            "throughput and latency of those loads count only the requests answered")


def _served_file(model: str | Path) -> Path:
    """The path of an ONNX model serve-bench can serve: one-line errors for a missing or foreign file and for a
    compiled context model (its plain-loop baseline and seeded inputs need the ONNX model it was compiled from)."""
    import onnx

    from npukit.errors import InputError
    from npukit.frontend.onnx_io import is_context_model

    path = Path(model)
    if not path.exists():
        raise InputError(f"{model} does not exist", hint="check the path; serve an ONNX model (npukit export "
                                                         "makes one)")
    if path.is_dir():  # as every other verb says it
        raise InputError(f"{model} is a directory, not an ONNX file", hint="serve an ONNX model (npukit export "
                                                                           "makes one)")
    if not path.is_file() or path.suffix.lower() != ".onnx":
        raise InputError(f"{model} is not an .onnx file", hint="serve an ONNX model (npukit export makes one)")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not a model: load_onnx says what the file is, in one line, later
        return path
    if is_context_model(proto):  # which the ONNX checker does not pass
        raise InputError(f"{path.name} is a compiled HTP context model (EPContext); serve-bench compares the runtime "
                         "with a plain loop of the ONNX model and compiles it for the HTP itself",
                         hint="serve the model given to `npukit compile` with --device qnn-htp@SOC (the compiled "
                              "graph is cached across starts); `npukit bench --target qnn-htp` times this one")
    return path


def _requests(proto: Any, data: str | Path | None, samples: int, preprocess: PreprocessConfig) -> list[dict]:
    """``samples`` requests: samples of ``data`` (image folder, .npy, .npz; images by ``preprocess``), or seeded
    random inputs."""
    from npukit.data.subsets import spread
    from npukit.runtime.ort import make_session, random_feeds
    from npukit.verbs.common import open_data

    if data is not None:
        dataset = spread(open_data(data, proto, preprocess), samples)  # over the data, not its first: it may be sorted
        return [dict(dataset.sample(i)) for i in range(len(dataset))]
    session = make_session(proto)
    return [random_feeds(session, seed=i) for i in range(samples)]


def _serve_buckets(path: Path, buckets: Sequence[Sequence[int]], *, duration_s: float,
                   report_path: str | Path | None, html: bool) -> CommandResult:
    """serve-bench with ``--bucket``: the buckets against per-size sessions (see ``serve_bench``)."""
    from npukit.errors import InputError
    from npukit.frontend.onnx_io import graph_inputs, load_onnx
    from npukit.measure.serving import measure_buckets
    from npukit.report.serving import add_buckets

    proto = load_onnx(path)
    inputs = graph_inputs(proto)
    if len(inputs) != 1:
        raise InputError(f"--bucket serves a model with one input; {path.name} has {len(inputs)}",
                         hint="serve it without --bucket at one fixed shape")
    dims = inputs[0].type.tensor_type.shape.dim
    rank = len(dims)
    if all(d.HasField("dim_value") for d in dims[1:]):
        raise InputError(f"--bucket serves a model at several sizes; input {inputs[0].name!r} of {path.name} has "
                         f"fixed sizes {[d.dim_param or d.dim_value for d in dims]}",
                         hint="serve it without --bucket (its one size)")
    wrong = [list(b) for b in buckets if len(b) != rank]
    if wrong:
        raise InputError(f"bucket {wrong[0]} has {len(wrong[0])} dimensions; input {inputs[0].name!r} has {rank}",
                         hint="give each --bucket as the input's full shape, e.g. 1,3,224,224")
    report = Report("serve-bench", config={"model": str(path), "buckets": [list(b) for b in buckets],
                                           "duration_s": duration_s, "inputs": "seeded random inputs of each size"})
    result = measure_buckets(path, buckets, input_name=inputs[0].name, duration_s=duration_s)
    rows = add_buckets(report, result.as_dict())
    exact = [r for r in rows if not r["padding"]]
    worst = max(exact, key=lambda r: r["latency_ratio_p50"])
    padded = [r for r in rows if r["padding"]]
    compared = [r for r in padded if r["max_abs_difference"] is not None]
    where = ", ".join(f"{r['shape']} in {r['bucket']}" for r in padded)
    pads = (f"; requests padded into a bucket ({where}, {max(r['padding'] for r in padded):.0%} padding at most): " + (
                f"cropped outputs up to {max(r['max_abs_difference'] for r in compared):.3g} from a session at "
                f"their own size ({max(r['max_difference_of_range'] for r in compared):.1%} of the output range)"
                if compared else "not comparable with a session at their own size (see the table)")
            if padded else "")
    report.set_verdict(f"INFO serve-bench: {len(exact)} bucket(s), outputs at each bucket's size equal to per-size "
                       f"sessions up to {max(r['max_abs_difference'] for r in exact):.3g}, p50 latency up to "
                       f"{worst['latency_ratio_p50']:.2f}x theirs ({worst['shape']}){pads}; a measurement, nothing "
                       "was checked", passed=True)
    json_path = Path(report_path) if report_path else None
    return finish(report, None, html=html, json_path=json_path, result=result, source=path)
