"""Serving measurements: a plain one-session loop against ``runtime.engine.Runtime`` under the same loads, both on the
same device (the CPU, or the HTP through the QNN EP).

Measured side by side in one process on the same requests: start-up (session creation to first result; on the CPU
also with ORT's optimized graph cached on disk, ``runtime.session_cache``; the runtime cold and from its cache, which
on the HTP holds the compiled graph, ``runtime.context_cache``), the
single-caller latency distribution (p99 / p50 as jitter) of a plain ``session.run`` loop and of the runtime on bound
buffers, the bytes allocated per call (tracemalloc: Python objects and numpy buffers; ORT's native allocations, such as
the output tensors a plain ``session.run`` makes on every call, are not visible to it) of a plain ``session.run``, of
bound buffers alone and of the runtime (which adds a future and a queue hand-off per request), closed-loop
throughput against the number of workers (1 thread each; the plain loop is run again just before each point, and
the speedup is the ratio of the two: a shared host's speed moves more between the start of the run and its end than
between two runs side by side), and, for open-loop Poisson load at multiples of the plain loop's capacity on three
servers: the plain loop, the runtime's workers without batching, and the same workers with dynamic batching (which
takes effect where the model's batch axis is symbolic), so the gain of each is seen apart.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from npukit.measure.load import LoadResult, alternating, closed_loop, open_loop
from npukit.runtime.engine import Overloaded, Runtime, RuntimeConfig, batching_off, choose_device
from npukit.runtime.ort import SERVING_LOG_LEVEL, make_session
from npukit.runtime.pool import BoundBuffers, signatures

Feeds = Mapping[str, np.ndarray]


MIN_DURATION_S = 0.1  # a load point's shortest duration
MAX_LOAD = 20.0  # the highest open-loop load, a multiple of the plain loop's capacity


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    """``duration_s`` per load point; ``max_workers`` for the throughput curve (None: the machine's cores);
    ``loads``: open-loop rates as multiples of the plain loop's measured capacity; ``max_batch`` / ``max_wait_ms``
    for the batching runtime; ``alloc_calls`` calls measured for allocations; ``startup_rounds`` start-ups of each
    kind (medians); ``prefer``: what the split of the cores that a Runtime measures for itself optimizes
    ("throughput" or "latency"); ``device_concurrency``: graphs run at once on the device by every runtime measured
    (None: the runtime's default, one on an NPU, no limit on the CPU)."""

    device: str = "cpu"
    duration_s: float = 3.0
    max_workers: int | None = None
    loads: tuple[float, ...] = (0.8, 1.2, 1.6)
    max_batch: int = 4
    max_wait_ms: float = 2.0
    alloc_calls: int = 200
    startup_rounds: int = 5
    prefer: str = "throughput"
    device_concurrency: int | None = None

    def __post_init__(self) -> None:
        from npukit.errors import InputError

        self.runtime()  # the device, prefer and device_concurrency checked as every runtime measured will check them
        if not MIN_DURATION_S <= self.duration_s < math.inf:
            raise InputError(f"duration {self.duration_s} s must be at least {MIN_DURATION_S} s (a load point "
                             "shorter than that measures too few requests to say anything)", hint="e.g. --duration 3")
        if self.max_workers is not None and self.max_workers < 1:
            raise InputError(f"max_workers {self.max_workers} must be at least 1", hint="or leave it to the cores")
        if not self.loads or not all(0 < x <= MAX_LOAD for x in self.loads):
            raise InputError(f"open-loop loads {list(self.loads)} must be multiples of the plain loop's capacity in "
                             f"(0, {MAX_LOAD:g}] (an in-process generator cannot offer more)", hint="e.g. --loads 0.8")
        if not 0 <= self.max_wait_ms < math.inf:
            raise InputError(f"max_wait_ms {self.max_wait_ms} must be a finite number of ms, 0 or more",
                             hint="e.g. --max-wait-ms 2")
        if self.max_batch < 1:
            raise InputError(f"max_batch {self.max_batch} must be at least 1 (1: no batching)",
                             hint="e.g. --max-batch 4")

    def runtime(self, **fields: object) -> RuntimeConfig:
        """The config of a runtime measured here: this device, its concurrency and the split's preference, and
        ``fields``."""
        return RuntimeConfig(**{"device": self.device, "device_concurrency": self.device_concurrency,
                                "prefer": self.prefer, **fields})


@dataclasses.dataclass(frozen=True)
class ServingResult:
    device: dict
    startup_ms: dict[str, float]
    single: dict[str, LoadResult]  # plain / pool, one caller
    allocated_bytes_per_call: dict[str, float]
    curve: dict[int, LoadResult]  # workers (1 thread each) -> closed loop with two clients per worker
    open: dict[str, list[LoadResult]]  # plain / batched, one per load
    batching: dict
    cpu: str
    split: dict = dataclasses.field(default_factory=dict)
    curve_plain: dict[int, LoadResult] = dataclasses.field(default_factory=dict)  # plain loop just before each

    def speedup(self, workers: int) -> float:
        """The runtime's throughput with ``workers`` over the plain loop's run just before it (the host's speed
        moves between runs on a shared machine; the ratio of two runs side by side moves less)."""
        plain = self.curve_plain.get(workers, self.single["plain"]).throughput
        return self.curve[workers].throughput / plain if plain else math.inf

    def plain_range(self) -> tuple[float, float]:
        """The lowest and highest throughput of the plain loop's runs (one caller): how far the host drifted."""
        runs = [self.single["plain"].throughput, *(r.throughput for r in self.curve_plain.values())]
        return min(runs), max(runs)

    def as_dict(self) -> dict:
        return {"device": self.device, "startup_ms": self.startup_ms, "cpu": self.cpu,
                "single": {k: v.as_dict() for k, v in self.single.items()},
                "allocated_bytes_per_call": self.allocated_bytes_per_call,
                "curve": {str(w): r.as_dict() for w, r in self.curve.items()},
                "curve_plain": {str(w): r.as_dict() for w, r in self.curve_plain.items()},
                "speedup": {str(w): round(self.speedup(w), 3) for w in self.curve},
                "open": {k: [r.as_dict() for r in v] for k, v in self.open.items()},
                "batching": self.batching, "split": self.split}


def allocated_per_call(call: Callable[[], object], calls: int, budget_s: float | None = None) -> float:
    """Mean bytes allocated above the running baseline during one call (tracemalloc: Python objects and numpy
    buffers), over ``calls`` calls after a warm-up of 5; with ``budget_s``, fewer calls (5 at least) where they
    take longer than that in all (a slow device: a call on the HTP emulator takes seconds)."""
    started = time.perf_counter()
    for _ in range(5):
        call()
    warm_s = (time.perf_counter() - started) / 5
    if budget_s is not None:
        calls = max(5, min(calls, int(budget_s / max(warm_s, 1e-9))))
    tracemalloc.start()
    try:
        total = 0
        for _ in range(calls):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            call()
            total += tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return total / calls


def plain_session(path: str, device: str) -> Any:
    """The plain loop's session, on the device the runtime serves on (``engine.choose_device``): ORT's CPU EP, or
    the QNN EP's HTP for the SoC asked (nodes it does not take on the CPU, as the runtime opens it). Both loops run on
    the same hardware, so the open-loop rates, multiples of the plain loop's capacity, suit the runtime measured (a
    CPU loop's capacity queued minutes of work on the HTP emulator)."""
    chosen = choose_device(device).device
    if chosen == "cpu":
        return make_session(path, threads=1, log_level=SERVING_LOG_LEVEL)
    from npukit.runtime.compile import soc_provider_options
    from npukit.runtime.qnn import make_qnn_session

    soc = chosen.partition("@")[2]
    return make_qnn_session(path, allow_cpu_fallback=True, provider_options=soc_provider_options(soc) if soc else None)


def _cpu_name() -> str:
    from npukit.runtime.devices import read_cpu_info

    return read_cpu_info("/proc/cpuinfo").model or "unknown CPU"  # read_cpu_info copes with a missing file


def _startup(path: str, sample: Feeds, config: ServingConfig) -> dict[str, float]:
    """Median ms from nothing to the first result, ``rounds`` times interleaved (fewer once they have taken
    ``duration_s``, one at least): a plain session, a plain session
    from ORT's optimized graph cached on disk (CPU; the cache filled once first), the runtime, and the runtime
    starting from its cache (ORT's optimized graph on the CPU, the compiled graph on the HTP; filled once first)."""
    from npukit.runtime.session_cache import cached_session

    device, rounds = config.device, config.startup_rounds
    times: dict[str, list[float]] = {"plain_session_ms": [], "runtime_ms": [], "runtime_cached_ms": []}
    with tempfile.TemporaryDirectory(prefix="npukit-serving-cache-") as cache, \
            tempfile.TemporaryDirectory(prefix="npukit-serving-runtime-cache-") as runtime_cache:
        if device == "cpu":  # from the file, as a user starts it (keyed by its path and time: nothing hashed)
            times["cached_session_ms"] = []
            cached_session(path, threads=1, cache_dir=cache)
        with Runtime(path, config.runtime(workers=1, threads=1, cache_dir=runtime_cache)) as rt:
            rt.run(sample)  # fills the runtime's cache
        started = time.perf_counter()
        for done in range(rounds):
            if done and time.perf_counter() - started > config.duration_s:
                break  # start-ups that take long (a compile for the HTP) measured fewer times, once at least
            t0 = time.perf_counter()
            plain_session(path, device).run(None, dict(sample))
            times["plain_session_ms"].append(time.perf_counter() - t0)
            if device == "cpu":
                t0 = time.perf_counter()
                cached_session(path, threads=1, cache_dir=cache)[0].run(None, dict(sample))
                times["cached_session_ms"].append(time.perf_counter() - t0)
            for key, folder in (("runtime_ms", None), ("runtime_cached_ms", runtime_cache)):
                t0 = time.perf_counter()
                with Runtime(path, config.runtime(workers=1, threads=1, cache_dir=folder)) as rt:
                    rt.run(sample)
                    times[key].append(time.perf_counter() - t0)
    return {k: round(float(np.median(v)) * 1000.0, 1) for k, v in times.items()}


def measure_serving(model: str | os.PathLike[str], requests: Sequence[Feeds], config: ServingConfig
                    ) -> ServingResult:
    """Every figure of the module docstring for ``model`` on ``requests`` (one sample each); each phase shows a
    spinner on a terminal (a device such as the HTP emulator makes a phase take minutes)."""
    from npukit.report.progress import step

    path = os.fspath(model)
    sample = dict(requests[0])
    with step("serve-bench: start-up times"):
        startup = _startup(path, sample, config)
    plain = plain_session(path, config.device)
    names = [o.name for o in plain.get_outputs()]

    def plain_loop() -> LoadResult:  # one caller on the plain session: the baseline, run again beside each point
        return closed_loop(lambda f: plain.run(names, dict(f)), requests, clients=1, duration_s=config.duration_s)

    with Runtime(path, config.runtime(workers=1, threads=1)) as single:
        device = single.device.as_dict() | {"device_concurrency": single.gate.limit}  # None: no limit
        out = [np.empty_like(o) for o in single.run(sample)]
        with step("serve-bench: one caller"):
            singles = {"plain": plain_loop(),
                       "pool": closed_loop(lambda f: single.run(f, out=out), requests, clients=1,
                                           duration_s=config.duration_s)}
        bound = BoundBuffers(single.session, {k: v.shape for k, v in sample.items()})
        calls = {"plain": lambda: plain.run(names, sample), "bound_buffers": lambda: bound.run(sample),
                 "runtime": lambda: single.run(sample, out=out)}
        with step("serve-bench: allocations per call"):
            allocations = {k: allocated_per_call(call, config.alloc_calls, config.duration_s)
                           for k, call in calls.items()}
    split: dict = {}
    if config.device == "cpu":  # the split a Runtime with no workers/threads given measures for itself
        with step("serve-bench: the runtime's own split of the cores"), Runtime(path, config.runtime()) as auto:
            split = auto.describe()["split"]
    curve: dict[int, LoadResult] = {}
    beside: dict[int, LoadResult] = {}  # the plain loop run again just before each point: ratios side by side
    for workers in range(1, (config.max_workers or os.cpu_count() or 1) + 1):
        with step(f"serve-bench: closed loop, {workers} worker(s)"), \
                Runtime(path, config.runtime(workers=workers, threads=1)) as rt:
            beside[workers] = plain_loop()
            curve[workers] = closed_loop(rt.run, requests, clients=workers * 2, duration_s=config.duration_s)
    capacity = singles["plain"].throughput
    batching: dict = {"max_batch": config.max_batch, "max_wait_ms": config.max_wait_ms, "capacity_per_s": capacity}
    best_workers = max(curve, key=lambda w: curve[w].throughput)
    plain_cfg = config.runtime(workers=1, threads=1, pool=False, max_batch=1)
    workers_cfg = config.runtime(workers=best_workers, threads=1, max_batch=1)
    batched_cfg = dataclasses.replace(workers_cfg, max_batch=config.max_batch, max_wait_ms=config.max_wait_ms)
    batching["note"] = batching_off(signatures(plain), config.max_batch)  # a fixed batch axis is served unbatched
    if config.max_batch <= 1:  # asked for no batching: no batched server (its row would repeat the workers' one)
        batching["note"] = "batching off: max_batch 1"
    servers = {"plain": plain_cfg, "workers": workers_cfg} | ({} if batching["note"] else {"batched": batched_cfg})
    opened: dict[str, list[LoadResult]] = {key: [] for key in servers}
    for factor in config.loads:
        rate = capacity * factor
        for key, cfg in servers.items():
            with step(f"serve-bench: open loop at {factor:g}x capacity, {key}"), Runtime(path, cfg) as rt:
                opened[key].append(open_loop(rt.submit, requests, rate=rate, duration_s=config.duration_s,
                                             refused=Overloaded))
                if key == "batched":
                    batching.setdefault("batches", []).append(rt.describe()["batches"])
                    if rt.batching_note:  # the runtime turned batching off at start (its checks): say why
                        batching["note"] = rt.batching_note
    batching["workers"] = best_workers
    return ServingResult(device=device, startup_ms=startup, single=singles,
                         allocated_bytes_per_call={k: round(v, 1) for k, v in allocations.items()}, curve=curve,
                         open=opened, batching=batching, cpu=_cpu_name(), split=split, curve_plain=beside)


@dataclasses.dataclass(frozen=True)
class BucketResult:
    """Per bucket shape: requests/s of a session fixed to that shape and of ``BucketedRuntime`` (one caller each),
    the latency ratio, and the largest difference between their outputs on the same requests."""

    rows: dict[str, dict]

    def as_dict(self) -> dict:
        return dict(self.rows)


PADDED_SHARE = 0.85  # a padded request's spatial sizes, as a share of its bucket's


def measure_buckets(model: str | os.PathLike[str], shapes: Sequence[Sequence[int]], *, input_name: str,
                    duration_s: float, seed: int = 0) -> BucketResult:
    """``model`` (symbolic sizes) served through buckets at ``shapes`` against one session per shape, each given
    seeded inputs of exactly that shape, one caller calling the two in turn (``measure.load.alternating``); then,
    per bucket of rank 3 or more, requests of ``PADDED_SHARE`` of its last two sizes (where no smaller bucket takes
    them), padded into it and cropped back (``runtime.buckets``), against a session fixed to the request's own
    size, called in turn the same way: the padding share and
    how far the cropped outputs are from that session's (or why they cannot be compared)."""
    from npukit.frontend.onnx_io import load_onnx
    from npukit.frontend.shapes import fix_input_shape
    from npukit.runtime.buckets import BucketedRuntime

    proto = load_onnx(model)
    rng = np.random.default_rng(seed)
    rows: dict[str, dict] = {}
    with BucketedRuntime(proto, shapes, device="cpu", workers=1, threads=1) as bucketed:
        for shape in shapes:
            session = make_session(fix_input_shape(proto, tuple(shape), dynamic_batch=False), threads=1)
            requests = [{input_name: rng.standard_normal(tuple(shape)).astype(np.float32)} for _ in range(4)]
            diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                       for r in requests for a, b in zip(session.run(None, r), bucketed.run(r)))
            timed = alternating({"session": lambda f: session.run(None, dict(f)), "buckets": bucketed.run}, requests,
                                duration_s=2 * duration_s)
            per_size, through = timed["session"], timed["buckets"]
            rows["x".join(map(str, shape))] = {
                "per_size_session": per_size.as_dict(), "buckets": through.as_dict(), "max_abs_difference": diff,
                "latency_ratio_p50": round(through.latency_ms["p50"] / per_size.latency_ms["p50"], 3),
                "padding": 0.0, "bucket": "x".join(map(str, shape))}
        for shape in shapes:
            sizes = [max(1, int(d * PADDED_SHARE)) for d in shape[-2:]]  # then multiples a strided model may need
            candidates = [(*shape[:-2], *(max(m, n // m * m) for n in sizes)) for m in (1, 32, 16, 8)]
            candidates = [c for c in dict.fromkeys(candidates)
                          if len(shape) >= 3 and c != tuple(shape) and bucketed.bucket_for(c) == tuple(shape)]
            if candidates:
                row = _padded_row(proto, bucketed, input_name, tuple(shape), candidates, rng, duration_s)
                rows[row.pop("request")] = row
    return BucketResult(rows)


def _padded_row(proto: Any, bucketed: Any, input_name: str, bucket: tuple[int, ...],
                candidates: Sequence[tuple[int, ...]], rng: np.random.Generator, duration_s: float) -> dict:
    """One padded request size against a session fixed to it (``measure_buckets``): the first of ``candidates``
    the model runs at on its own (a strided model may need a multiple of 32), else the first, uncompared."""
    from npukit.frontend.shapes import fix_input_shape

    session, failure = None, ""
    for request in candidates:
        requests = [{input_name: rng.standard_normal(request).astype(np.float32)} for _ in range(4)]
        try:
            session = make_session(fix_input_shape(proto, request, dynamic_batch=False), threads=1)
            expected = [session.run(None, r) for r in requests]
            break
        except Exception as exc:  # noqa: BLE001 - a model that does not run at this size (strides that must divide
            session, failure = None, failure or type(exc).__name__  # it): the next candidate
    if session is None:
        request = candidates[0]
        requests = [{input_name: rng.standard_normal(request).astype(np.float32)} for _ in range(4)]
        through = closed_loop(bucketed.run, requests, clients=1, duration_s=duration_s)
    else:  # side by side, call by call
        timed = alternating({"session": lambda f: session.run(None, dict(f)), "buckets": bucketed.run}, requests,
                            duration_s=2 * duration_s)
        through, per_size = timed["buckets"], timed["session"]
    row = {"request": "x".join(map(str, request)), "buckets": through.as_dict(), "bucket": "x".join(map(str, bucket)),
           "padding": round(1.0 - math.prod(request) / math.prod(bucket), 4)}
    if session is None:
        tried = ", ".join("x".join(map(str, c[-2:])) for c in candidates)
        return row | {"note": f"the model runs at none of {tried} itself ({failure}), so the cropped outputs have "
                              "nothing to be compared with"}
    got = [bucketed.run(r) for r in requests]
    pairs = [(np.asarray(a), np.asarray(b)) for e, g in zip(expected, got) for a, b in zip(e, g)]
    if any(a.shape != b.shape for a, b in pairs):
        shown = next(f"{list(a.shape)} alone, {list(b.shape)} through the bucket" for a, b in pairs
                     if a.shape != b.shape)
        return row | {"note": f"an output's shape differs ({shown}): it is not a map over the input's sizes, so it "
                              "comes back as the bucket gives it"}
    diff = max(float(np.max(np.abs(a - b))) for a, b in pairs)
    scale = max(float(np.max(np.abs(a))) for a, _ in pairs) or 1.0
    return row | {"per_size_session": per_size.as_dict(), "max_abs_difference": diff,
                  "max_difference_of_range": round(diff / scale, 4),
                  "latency_ratio_p50": round(through.latency_ms["p50"] / per_size.latency_ms["p50"], 3)}
