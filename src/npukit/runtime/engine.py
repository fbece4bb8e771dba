"""A serving runtime over ONNX Runtime: the device chosen from the probe, buffers bound once per worker and batch
size (``runtime.pool``), a pool of worker threads, dynamic batching, and requests that fail alone.

``Runtime(model)`` loads one session (ORT's Run is thread-safe; the weights are held once) and starts ``workers``
threads. Each worker takes the oldest request from one bounded queue and, when the model's batch axis is symbolic and
``max_batch`` > 1, adds the requests that arrive within ``max_wait_ms`` up to ``max_batch`` rows, runs them as one
batch on buffers bound for that batch size, and hands each caller its rows. ``submit`` returns a future; ``run`` waits
for it; ``map`` keeps a bounded number in flight and yields results in order. A request whose names, dtypes or shapes
do not match the model fails on its own future with an ``InputError``; a full queue raises ``Overloaded`` at
``submit`` (back-pressure, never unbounded growth); ``close`` drains or cancels what is queued and joins the workers.

Devices: ``cpu``; ``qnn-htp`` / ``qnn-htp@SOC`` (Qualcomm's HTP through the QNN EP, nodes it does not take on the CPU
EP, and the split recorded); ``auto`` takes the HTP where the QNN HTP backend loads on an Arm machine (a phone or a
Snapdragon laptop) and the CPU otherwise, saying why (on x86 the QNN HTP backend is Qualcomm's emulator, which
simulates the NPU far slower than the CPU runs the model). On the HTP most of a start is QNN compiling the graph;
with ``cache_dir`` the first start keeps what it compiled (an EPContext model) and later starts load it.

A device is shared by every runtime of the process: at most ``device_concurrency`` graphs run on it at once, across
runtimes (``open_gate``). The NPU defaults to one (two models served from one process take turns on it rather
than both submitting to it at once); the CPU to no limit. The first runtime opened on a
device sets its limit while any is open; one asking another limit meanwhile is refused.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import onnx

from npukit.errors import InputError
from npukit.runtime.ort import SERVING_LOG_LEVEL, ModelLike, make_session
from npukit.runtime.pool import BoundBuffers, InputSignature, signatures
from npukit.runtime.split import PREFERS

DEVICES = ("auto", "cpu", "qnn-htp")
WAITS_KEPT = 10_000  # queue waits kept for describe()'s percentiles: the last ones; 200,000 requests grew RSS 29 MB


def ordered_map(submit: Callable[[Mapping[str, np.ndarray]], Future], requests: Iterable[Mapping[str, np.ndarray]],
                in_flight: int) -> Iterator[list[np.ndarray]]:
    """The results of ``submit`` over ``requests`` in order, with at most ``in_flight`` submitted and not yet
    returned."""
    pending: list[Future] = []
    for feeds in requests:
        pending.append(submit(feeds))
        if len(pending) >= in_flight:
            yield pending.pop(0).result()
    for future in pending:
        yield future.result()


class Overloaded(RuntimeError):
    """The request queue is full: the caller should slow down or retry (the runtime keeps serving)."""


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """``workers``: threads that run requests and ``threads``: ORT intra-op threads per run (both None: the split
    of the cores timed fastest on the model, ``runtime.split``; one None: the cores divided by the other; on the NPU
    one worker); ``max_batch`` rows run together at most (1: no batching), waiting at
    most ``max_wait_ms`` for more; ``queue_limit`` requests queued at most; ``pool``: run on bound buffers;
    ``cache_dir``: keep ORT's optimized graph (CPU; ``runtime.session_cache``) or the compiled graph (HTP, a QDQ
    model; ``runtime.context_cache``) there and start from it next time;
    ``device_concurrency``: graphs run at once on the device across all runtimes of the process (None: one on an
    NPU, no limit on the CPU); ``prefer``: what the measured split of the cores optimizes when neither ``workers``
    nor ``threads`` is given, "throughput" (requests per second) or "latency" (one request on an idle runtime)."""

    device: str = "auto"
    workers: int | None = None
    threads: int | None = None
    max_batch: int = 1
    max_wait_ms: float = 2.0
    queue_limit: int = 256
    pool: bool = True
    cache_dir: str | None = None
    device_concurrency: int | None = None
    prefer: str = "throughput"

    def __post_init__(self) -> None:
        base = self.device.split("@", 1)[0]
        if base not in DEVICES or (self.device.count("@") and base != "qnn-htp"):
            raise InputError(f"unknown device {self.device!r}", hint="use auto, cpu, qnn-htp or qnn-htp@SM8650")
        for name in ("workers", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"{name} must be at least 1, not {value}", hint="or leave it to the runtime")
        if self.max_batch < 1:
            raise InputError(f"max_batch must be at least 1, not {self.max_batch}", hint="1 turns batching off")
        if self.max_wait_ms < 0:
            raise InputError(f"max_wait_ms must not be negative, not {self.max_wait_ms}", hint="e.g. 2")
        if self.queue_limit < 1:
            raise InputError(f"queue_limit must be at least 1, not {self.queue_limit}", hint="e.g. 256")
        if self.prefer not in PREFERS:
            raise InputError(f"prefer must be throughput or latency, not {self.prefer!r}",
                             hint="latency: the split of the cores whose single request is fastest")
        if self.device_concurrency is not None and self.device_concurrency < 1:
            raise InputError(f"device_concurrency must be at least 1, not {self.device_concurrency}",
                             hint="or leave it to the runtime (one graph at a time on an NPU)")


class DeviceGate:
    """The graphs that may run at once on one device, shared by every open runtime of the process that uses it."""

    def __init__(self, device: str, limit: int | None) -> None:
        self.device, self.limit = device, limit  # limit None: no limit
        self.slots = threading.BoundedSemaphore(limit) if limit is not None else None
        self.users = 0  # open runtimes on the device

    def __enter__(self) -> None:
        if self.slots is not None:
            self.slots.acquire()

    def __exit__(self, *exc: object) -> None:
        if self.slots is not None:
            self.slots.release()


_GATES: dict[str, DeviceGate] = {}
_GATES_LOCK = threading.Lock()


def open_gate(device: str, limit: int | None) -> DeviceGate:
    """The process's gate for ``device`` (its base: one NPU whatever SoC option a runtime names), made with
    ``limit`` by the first runtime that opens the device while none is open (None: one graph at a time on an NPU,
    none on the CPU); a runtime that asks another limit while the gate is in use is refused."""
    base = device.split("@", 1)[0]
    wanted = limit if limit is not None else (None if base == "cpu" else 1)
    with _GATES_LOCK:
        gate = _GATES.get(base)
        if gate is None:
            gate = _GATES[base] = DeviceGate(base, wanted)
        elif limit is not None and gate.limit != limit:
            raise InputError(f"device {base} already runs at most {gate.limit or 'any number of'} graph(s) at once "
                             f"for {gate.users} open runtime(s) in this process; device_concurrency={limit} asks "
                             "otherwise", hint="give every runtime on one device the same device_concurrency, or none")
        gate.users += 1
        return gate


def close_gate(gate: DeviceGate) -> None:
    """One runtime less on the gate's device; the last one to close lets the next runtime set a new limit."""
    with _GATES_LOCK:
        gate.users -= 1
        if gate.users <= 0 and _GATES.get(gate.device) is gate:
            del _GATES[gate.device]


@dataclasses.dataclass(frozen=True)
class DeviceChoice:
    """Where the runtime runs: ``device`` (cpu | qnn-htp@SOC), why, and for the HTP the nodes left to the CPU."""

    device: str
    reason: str
    cpu_nodes: tuple[str, ...] = ()
    npu_nodes: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def choose_device(requested: str) -> DeviceChoice:
    """The device for ``requested`` (see the module docstring)."""
    base, _, soc = requested.partition("@")
    if base == "cpu":
        return DeviceChoice("cpu", "asked for")
    from npukit.runtime.qnn import qnn_available

    status = qnn_available()
    htp_ok = status.available and status.backend_ok("htp")
    if base == "auto":
        if not htp_ok:
            why = status.error or (status.backends or {}).get("htp") or "the QNN HTP backend did not load"
            return DeviceChoice("cpu", f"no NPU: {why}")
        if htp_emulated():
            return DeviceChoice("cpu", f"the QNN HTP backend here is Qualcomm's emulator on {platform.machine()} "
                                       "(it simulates the NPU, far slower than the CPU runs the model)")
        soc = soc or ""
    elif not htp_ok:
        why = status.error or (status.backends or {}).get("htp") or "the QNN HTP backend did not load"
        raise InputError(f"device {requested} is not available here: {why}", hint="use --device cpu or auto")
    return DeviceChoice(f"qnn-htp@{soc}" if soc else "qnn-htp", "placed when its session is made")


def htp_emulated() -> bool:
    """Whether the QNN HTP backend here is Qualcomm's x86 emulator (the NPU's numerics, not its speed)."""
    return platform.machine().lower() not in ("aarch64", "arm64")


EMULATOR_NOTE = ("on this x86 host the HTP is Qualcomm's emulator: its latency and throughput are the emulator's, "
                 "not an NPU's")


def placed(device: DeviceChoice, model: onnx.ModelProto, session: Any) -> DeviceChoice:
    """``device`` (on the HTP) with the nodes ``session`` (made from ``model``, CPU fallback allowed) runs on the HTP
    and on the CPU EP, read from ORT's graph-assignment record of that session: the one the runtime serves with, so
    QNN compiles the graph once (``runtime.qnn.session_assignment``)."""
    from npukit.runtime.qnn import session_assignment

    assignment = session_assignment(model, session)
    cpu = tuple(assignment.cpu_nodes)
    npu = len(assignment.qnn_nodes)
    emulated = f"; {EMULATOR_NOTE}" if htp_emulated() else ""
    return DeviceChoice(device.device, f"{npu} nodes on the HTP, {len(cpu)} on the CPU EP (fallback){emulated}", cpu,
                        npu)


def _soc_options(soc: str) -> dict[str, str] | None:
    from npukit.runtime.compile import soc_provider_options

    return soc_provider_options(soc) if soc else None


@dataclasses.dataclass
class _Request:
    feeds: Mapping[str, np.ndarray]
    future: Future
    out: Sequence[np.ndarray] | None
    submitted: float
    started: float = 0.0


_STOP = object()


def batching_off(inputs: Sequence[InputSignature], max_batch: int) -> str:
    """Why requests for a model with these ``inputs`` are not batched up to ``max_batch``, or "" where they are: every
    input needs a symbolic batch axis to stack requests along."""
    fixed = [s for s in inputs if not s.batched]
    if max_batch <= 1 or not fixed:
        return ""
    why = ", ".join(f"{s.name!r} ({'a scalar' if not s.shape else f'axis 0 is {s.shape[0]}'})" for s in fixed[:4])
    more = f" and {len(fixed) - 4} more" if len(fixed) > 4 else ""
    return (f"batching off: requests stack along axis 0 of every input, which is not a symbolic batch in {why}{more} "
            "(a PyTorch model exported with npukit export --dynamic-batch has one on every input)")


def batch_mismatch(session: Any, inputs: Sequence[InputSignature], rtol: float = 1e-4) -> str:
    """Why requests stacked along the batch axis would not get their own results (``runtime.ort.batch_problem``:
    the runtime handed one request both results of such a model and the other an empty array), or ""."""
    from npukit.runtime.ort import batch_problem

    try:
        problem = batch_problem(session, {s.name: (1, *s.shape[1:]) for s in inputs}, rtol=rtol)
    except InputError:
        return ""  # not fed seeded inputs here (a symbolic size): the shapes are checked on every request
    return f"batching off: {problem}" if problem else ""


def bound_problem(buffers: Mapping[int, BoundBuffers]) -> str:
    """Why the bound buffers of more than one request (rows -> ``BoundBuffers``) cannot run, or "": each run once on
    its zeros. A run at batch 1 that fails is left to the requests (their own futures say why)."""
    for rows, bound in sorted(buffers.items()):
        if rows < 2:
            continue
        try:
            bound.run()
        except InputError as exc:
            return (f"the model bound to {rows} requests at once does not run ({exc.message}; an output declared "
                    "with batch 1 in the graph is the usual cause)")
    return ""


class Runtime:
    """See the module docstring. Use as a context manager, or call ``close``."""

    def __init__(self, model: ModelLike | str | os.PathLike[str], config: RuntimeConfig | None = None, *,
                 input_shape: str | Sequence[Any] | Mapping[str, Any] | None = None, **overrides: Any) -> None:
        """``input_shape`` (the CLI's ``--input-shape`` forms: "1,3,320,320", "x=1,3,320,320" or {name: shape})
        fixes a model's symbolic sizes to one request's; a symbolic batch axis stays symbolic for batching."""
        from npukit.frontend.onnx_io import load_onnx
        from npukit.frontend.shapes import fix_inputs

        config = dataclasses.replace(config or RuntimeConfig(), **overrides)
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load_from_string(model) \
            if isinstance(model, bytes) else load_onnx(model)  # a bad path or file: a one-line InputError
        if input_shape is not None:
            proto = fix_inputs(proto, input_shape, keep_batch=True)
        cached = self._cached_context(proto, config)  # a previous start's compiled HTP graph: nothing to compile
        self.device = cached[1] if cached else choose_device(config.device)
        cores = os.cpu_count() or 1
        self.split_table: list[dict] = []
        self.split_note = "given" if config.workers or config.threads else ""
        if self.device.device != "cpu":  # the NPU as one queue: one worker feeds it
            workers, threads = config.workers or 1, config.threads or cores
            self.split_note = self.split_note or "one worker: the NPU runs one graph at a time"
        elif config.workers is None and config.threads is None:
            workers, threads = self._measured_split(proto, cores, config.prefer)
        else:
            workers = config.workers or max(1, cores // (config.threads or 1))
            threads = config.threads or max(1, cores // workers)
        file = os.fspath(model) if isinstance(model, (str, os.PathLike)) and input_shape is None else None
        self.session, self.cache = (cached[0], "hit") if cached else self._open(proto, threads, config.cache_dir, file)
        self.signatures = signatures(self.session)
        fixed = [s for s in self.signatures if any(d is None for d in s.shape[1:])]
        if fixed:
            example = f"{fixed[0].name}=" + ",".join("1" if d is None and axis == 0 else "N" if d is None else str(d)
                                                     for axis, d in enumerate(fixed[0].shape))
            from npukit.frontend.shapes import input_dims, show_dims

            declared = show_dims(input_dims(proto).get(fixed[0].name))
            raise InputError(f"input {fixed[0].name!r} ({declared}) has symbolic dimensions past axis 0 (the axis a "
                             "runtime batches on)",
                             hint=f"give the sizes of one request, each N a number: --input-shape {example} on the "
                                  f"command line, Runtime(model, input_shape={example!r}) from Python")
        self.batching_note = batching_off(self.signatures, config.max_batch) or (
            batch_mismatch(self.session, self.signatures) if config.max_batch > 1 else "")
        max_batch = 1 if self.batching_note else config.max_batch
        self.config = dataclasses.replace(config, workers=workers, threads=threads, max_batch=max_batch)
        self._request_shapes = self._shapes(1)  # what one request holds, checked on every submit
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._queue: queue.Queue = queue.Queue(maxsize=config.queue_limit)
        self._closed = False
        self._lock = threading.Lock()  # the statistics
        self._accepting = threading.Lock()  # submit against close
        self.batch_sizes: Counter = Counter()
        self.queue_waits_ms: deque[float] = deque(maxlen=WAITS_KEPT)  # bounded: a server runs for days
        self._workers = [threading.Thread(target=self._work, name=f"npukit-runtime-{i}", daemon=True)
                         for i in range(workers)]
        self._buffers: list[dict[int, BoundBuffers]] = [{} for _ in range(workers)]
        if config.pool:  # bound up front: the first requests pay no allocation
            for slot in self._buffers:
                for rows in range(1, max_batch + 1):
                    slot[rows] = BoundBuffers(self.session, self._shapes(rows))
            problem = bound_problem(self._buffers[0])
            if problem:  # every batched request would fail on its own future: batches off, said in the note
                self.batching_note = f"batching off: {problem}"
                self.config = dataclasses.replace(self.config, max_batch=1)
                self._buffers = [{1: slot[1]} for slot in self._buffers]
        self.gate = open_gate(self.device.device, config.device_concurrency)  # last: nothing after it can fail
        for worker in self._workers:
            worker.start()

    @staticmethod
    def _cached_context(proto: onnx.ModelProto, config: RuntimeConfig) -> tuple[Any, DeviceChoice] | None:
        """The HTP session from the compiled graph a previous start left in ``cache_dir`` and the placement chosen
        then (``runtime.context_cache``), for a model not yet compiled asked for on the HTP; None otherwise."""
        from npukit.frontend.onnx_io import is_context_model
        from npukit.runtime.context_cache import load_context

        base, _, soc = config.device.partition("@")
        on_htp = base == "qnn-htp" or (base == "auto" and platform.machine().lower() in ("aarch64", "arm64"))
        if not config.cache_dir or not on_htp or is_context_model(proto):
            return None
        loaded = load_context(config.cache_dir, proto.SerializeToString(), soc)
        if loaded is None:
            return None
        session, placed = loaded
        return session, DeviceChoice(placed["device"], placed["reason"], tuple(placed["cpu_nodes"]),
                                     placed["npu_nodes"])

    def _open(self, proto: onnx.ModelProto, threads: int, cache_dir: str | None, file: str | None = None
              ) -> tuple[Any, str]:
        """The session on the chosen device, and whether ORT's optimized graph (CPU) or the compiled graph (HTP)
        came from the cache: "miss" when it was made and stored now. ``file``: the ONNX file ``proto`` was read from
        as it is (the CPU cache keys it by its path and time, ``runtime.session_cache``; else by ``proto``'s bytes)."""
        if self.device.device == "cpu" and cache_dir:
            from npukit.runtime.session_cache import cached_session

            key = file if file is not None else proto.SerializeToString()
            session, cache, _ = cached_session(key, threads=threads, cache_dir=cache_dir, log_level=SERVING_LOG_LEVEL)
            return session, cache
        if self.device.device == "cpu":
            return make_session(proto, threads=threads, log_level=SERVING_LOG_LEVEL), "off"
        from npukit.frontend.onnx_io import is_context_model, named_nodes
        from npukit.runtime.qnn import make_qnn_session

        soc = self.device.device.partition("@")[2]
        named = named_nodes(proto)  # the placement names every node; the same graph otherwise

        def place(session: Any) -> dict:
            self.device = placed(self.device, named, session)
            return self.device.as_dict()

        if cache_dir and not is_context_model(proto):
            from npukit.runtime.context_cache import compile_into_cache

            return compile_into_cache(cache_dir, proto.SerializeToString(), soc, place, served=named), "miss"
        session = make_qnn_session(named, allow_cpu_fallback=True, provider_options=_soc_options(soc))
        place(session)
        return session, "off"

    def _measured_split(self, proto: onnx.ModelProto, cores: int, prefer: str) -> tuple[int, int]:
        """Workers x threads measured on this model and machine for ``prefer`` (``runtime.split``); cores x 1 where
        the model cannot be fed seeded inputs (symbolic sizes besides the batch)."""
        from npukit.runtime.ort import random_feeds
        from npukit.runtime.split import measure_split

        model = proto.SerializeToString()
        try:
            feeds = random_feeds(make_session(model), seed=0)
        except InputError as exc:
            self.split_note = f"{cores} x 1 thread, not measured: {exc.message}"
            return cores, 1
        best, table = measure_split(model, feeds, cores=cores, prefer=prefer)
        self.split_table = [s.as_dict() for s in table]
        alone = f", {best.latency_ms} ms per request alone" if best.latency_ms is not None else ""
        self.split_note = (f"measured for {prefer}: {best.workers} worker(s) x {best.threads} thread(s), "
                           f"{best.runs_per_s} runs/s{alone}")
        return best.workers, best.threads

    # -- requests ----------------------------------------------------------------------------------------------
    def _shapes(self, rows: int) -> dict[str, tuple[int, ...]]:
        return {s.name: (rows, *s.shape[1:]) if s.batched else tuple(s.shape) for s in self.signatures}

    def _check(self, feeds: Mapping[str, np.ndarray]) -> tuple[str, str] | None:
        """(what is wrong with a request, what to do) or None; the hint fits the problem (a misspelt input name was
        told to send one sample per request)."""
        names = {s.name for s in self.signatures}
        keyed = f"key each request's arrays by the model's input names: {', '.join(sorted(names))}"
        if not isinstance(feeds, Mapping):
            return (f"a request is a dict of input name -> numpy array (or one array for a one-input model), not a "
                    f"{type(feeds).__name__}; the model takes {sorted(names)}", keyed)
        if set(feeds) != names:
            return f"the request names inputs {sorted(feeds)}, the model takes {sorted(names)}", keyed
        for sig in self.signatures:
            array = feeds[sig.name]
            if not isinstance(array, np.ndarray):
                return (f"input {sig.name!r} is a {type(array).__name__}, not a numpy array",
                        "give numpy arrays (np.asarray(x))")
            if array.dtype != sig.dtype:
                return (f"input {sig.name!r} is {array.dtype}, the model takes {sig.dtype}",
                        f"give it as {sig.dtype} (np.asarray(x, dtype=np.{sig.dtype}))")
            want = self._request_shapes[sig.name]
            if array.shape != want:
                return (f"input {sig.name!r} has shape {list(array.shape)}, the model takes {list(want)} per request",
                        "send one sample per request, as the model's inputs say")
        return None

    def submit(self, feeds: Mapping[str, np.ndarray] | np.ndarray, *,
               out: Sequence[np.ndarray] | None = None) -> Future:
        """Queue one request (batch 1: {input name: array}, or the array alone for a one-input model); its future
        gets the outputs (written into ``out`` when given), or the request's own error. Raises ``Overloaded`` when the
        queue is full, RuntimeError after ``close``. The arrays are read when the request runs, not copied here:
        a caller that reuses a frame buffer fills it again once the future is done."""
        if self._closed:  # said before the request's own errors: no request is taken after close
            raise RuntimeError("the runtime is closed")
        future: Future = Future()
        if isinstance(feeds, np.ndarray) and len(self.signatures) == 1:  # a one-input model's array alone
            feeds = {self.signatures[0].name: feeds}
        if isinstance(feeds, Mapping):  # a numpy scalar (a sample rate read from an .npz) is a rank-0 array
            feeds = {k: np.asarray(v) if isinstance(v, (np.generic, int)) else v for k, v in feeds.items()}
        problem = self._check(feeds)
        if problem:
            future.set_exception(InputError(problem[0], hint=problem[1]))
            return future
        if out is not None and (not isinstance(out, Sequence) or len(out) != len(self.output_names)
                                or not all(isinstance(a, np.ndarray) for a in out)):
            future.set_exception(InputError(f"out= must be a list of {len(self.output_names)} numpy arrays, one per "
                                            f"output ({', '.join(map(repr, self.output_names))})",
                                            hint="leave out= out to get new arrays"))
            return future
        if out is not None and not all(a.flags.writeable for a in out):  # a read-only one killed the worker
            k = next(i for i, a in enumerate(out) if not a.flags.writeable)
            future.set_exception(InputError(f"out[{k}] is read-only", hint="give writable arrays, or leave out= out"))
            return future
        with self._accepting:  # close() cannot slip its stop markers in between the check and the put
            if self._closed:
                raise RuntimeError("the runtime is closed")
            try:
                self._queue.put_nowait(_Request(feeds, future, out, time.perf_counter()))
            except queue.Full:
                raise Overloaded(f"{self.config.queue_limit} requests already queued; slow down or raise "
                                 "queue_limit") from None
        return future

    def run(self, feeds: Mapping[str, np.ndarray] | np.ndarray, *,
            out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        return self.submit(feeds, out=out).result()

    def map(self, requests: Iterable[Mapping[str, np.ndarray]], *, in_flight: int | None = None
            ) -> Iterator[list[np.ndarray]]:
        """Results of ``requests`` in order, at most ``in_flight`` (default: workers x max_batch x 2) queued, and no
        more than ``queue_limit``, so that map never overloads its own queue."""
        wanted = in_flight or self.config.workers * self.config.max_batch * 2
        return ordered_map(self.submit, requests, min(wanted, self.config.queue_limit))

    # -- workers -----------------------------------------------------------------------------------------------
    def _take(self) -> list[_Request] | None:
        first = self._queue.get()
        if first is _STOP:
            return None
        batch = [first]
        if self.config.max_batch > 1:
            deadline = time.perf_counter() + self.config.max_wait_ms / 1000.0
            while len(batch) < self.config.max_batch:
                wait = deadline - time.perf_counter()
                try:
                    nxt = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._queue.put(_STOP)  # for the next worker; this one stops after this batch
                    break
                batch.append(nxt)
        return batch

    def _work(self) -> None:
        slot = self._buffers[self._workers.index(threading.current_thread())]
        while True:
            batch = self._take()
            if batch is None:
                return
            live = [r for r in batch if r.future.set_running_or_notify_cancel()]
            if not live:
                continue
            start = time.perf_counter()
            for r in live:
                r.started = start
            try:
                outputs = self._run(slot, live)
                each = None
                if len(live) > 1 and any(np.shape(o)[:1] != (len(live),) for o in outputs):
                    # outputs that do not follow the batch (a count that depends on the data): one at a time
                    each = [[np.array(o) for o in self._run(slot, [r])] for r in live]
            except Exception as exc:  # the batch fails together; the runtime keeps serving
                for r in live:
                    r.future.set_exception(exc)
                continue
            with self._lock:
                self.batch_sizes[len(live)] += 1
                self.queue_waits_ms.extend((start - r.submitted) * 1000.0 for r in live)
            for i, r in enumerate(live):
                # a request of its own takes whole outputs (a fixed batch axis may hold more than one row)
                mine = outputs if len(live) == 1 else each[i] if each else [o[i:i + 1] for o in outputs]
                if r.out is None:
                    r.future.set_result([np.array(o) for o in mine])
                    continue
                wrong = next(((k, dst, src) for k, (dst, src) in enumerate(zip(r.out, mine))
                              if dst.shape != np.shape(src) or not np.can_cast(np.asarray(src).dtype, dst.dtype)), None)
                if wrong is not None:  # this request's own error: the worker goes on serving
                    k, dst, src = wrong
                    r.future.set_exception(InputError(
                        f"out[{k}] is {dst.dtype} {list(dst.shape)}, output {self.output_names[k]!r} is "
                        f"{np.asarray(src).dtype} {list(np.shape(src))}", hint="give out= arrays of the outputs' "
                        "shapes and dtypes for one request, or leave out= out"))
                    continue
                try:
                    for dst, src in zip(r.out, mine):
                        np.copyto(dst, src)
                except Exception as exc:  # noqa: BLE001 - whatever the arrays refuse fails this request alone
                    r.future.set_exception(exc)
                    continue
                r.future.set_result(list(r.out))

    def _run(self, slot: dict[int, BoundBuffers], batch: list[_Request]) -> list[np.ndarray]:
        with self.gate:  # the device's limit, shared with the process's other runtimes on it
            return self._run_batch(slot, batch)

    def _run_batch(self, slot: dict[int, BoundBuffers], batch: list[_Request]) -> list[np.ndarray]:
        rows = len(batch)
        if not self.config.pool:
            feeds = {s.name: (batch[0].feeds[s.name] if rows == 1 else
                              np.concatenate([r.feeds[s.name] for r in batch])) for s in self.signatures}
            return [np.asarray(o) for o in self.session.run(self.output_names, feeds)]
        buffers = slot[rows]
        if rows == 1:
            return buffers.run(batch[0].feeds)
        for sig in self.signatures:
            target = buffers.inputs[sig.name]
            for i, r in enumerate(batch):
                target[i:i + 1] = r.feeds[sig.name]
        return buffers.run()

    # -- life cycle --------------------------------------------------------------------------------------------
    def close(self, *, drain: bool = True) -> None:
        """Stop taking requests; run what is queued (``drain``) or cancel it; join the workers."""
        with self._accepting:
            if self._closed:
                return
            self._closed = True
        if not drain:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Request):
                    item.future.cancel()
        for _ in self._workers:
            self._queue.put(_STOP)
        for worker in self._workers:
            worker.join()
        close_gate(self.gate)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(drain=exc[0] is None)  # left by an exception (a Ctrl-C): what is queued is cancelled, not run

    def describe(self) -> dict:
        """The resolved configuration, the device and why, and what the workers did so far."""
        with self._lock:
            waits = np.asarray(self.queue_waits_ms or [0.0])
        return {"config": dataclasses.asdict(self.config), "device": self.device.as_dict(), "cache": self.cache,
                "device_concurrency": self.gate.limit,
                "split": {"note": self.split_note, "measured": self.split_table},
                "batching_note": self.batching_note,
                "inputs": [{"name": s.name, "dtype": str(s.dtype), "shape": list(s.shape)} for s in self.signatures],
                "batches": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "queue_wait_ms": {"p50": float(np.percentile(waits, 50)), "p99": float(np.percentile(waits, 99)),
                                  "of_last": len(self.queue_waits_ms)}}

