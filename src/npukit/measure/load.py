"""Load generators that replay requests against a serving function and measure what callers see.

Closed loop: ``clients`` threads each send a request and wait for its answer before sending the next, for
``duration_s``: throughput at that concurrency. Open loop: requests arrive on a Poisson process at ``rate`` per
second regardless of answers (the way independent users arrive), each timed from its scheduled arrival to its answer,
so queueing delay counts; requests the server refuses (``Overloaded``) are counted, not retried; ``behind_s`` says
how late the generator itself fell (submitting is work in this process too: on a tiny model it cannot keep up, and
the late requests leave as a burst). Both stop by themselves and run in-process only.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future

import numpy as np

from npukit._threads import run_threads

Feeds = Mapping[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class LoadResult:
    """One load run: completed requests, refused ones, wall seconds, and latency percentiles in ms."""

    mode: str  # closed | open
    level: float  # clients (closed) or offered requests per second (open)
    completed: int
    refused: int
    failed: int
    seconds: float
    latency_ms: dict[str, float]
    behind_s: float = 0.0  # open loop: how late the generator sent its latest request (it could not offer the rate)
    sent: int = 0  # open loop: the requests the Poisson draw put within the duration (a short one holds few)
    first_error: str = ""  # the first failed request's error, one line ("" where none failed)

    @property
    def throughput(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"throughput_per_s": round(self.throughput, 2)}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _percentiles(latencies: Sequence[float]) -> dict[str, float]:
    if not latencies:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan"), "mean": float("nan")}
    a = np.asarray(latencies) * 1000.0
    return {"p50": round(float(np.percentile(a, 50)), 3), "p90": round(float(np.percentile(a, 90)), 3),
            "p99": round(float(np.percentile(a, 99)), 3), "mean": round(float(a.mean()), 3)}


def closed_loop(call: Callable[[Feeds], object], requests: Sequence[Feeds], *, clients: int,
                duration_s: float) -> LoadResult:
    """``clients`` threads calling ``call`` back to back (request i % len(requests)) for ``duration_s``."""
    if clients < 1 or duration_s <= 0 or not requests:
        raise ValueError("closed_loop needs clients >= 1, a positive duration and at least one request")
    latencies: list[list[float]] = [[] for _ in range(clients)]
    failures = [0] * clients
    errors: list[str] = []
    start = time.perf_counter()
    stop = start + duration_s

    def client(k: int, halt: threading.Event) -> None:
        i = k
        while time.perf_counter() < stop and not halt.is_set():
            t0 = time.perf_counter()
            try:
                call(requests[i % len(requests)])
            except Exception as exc:  # a failed request counts as failed (the first one's error kept); goes on
                failures[k] += 1
                if not errors:
                    errors.append(_one_line(exc))
            else:
                latencies[k].append(time.perf_counter() - t0)
            i += clients

    run_threads(client, clients)
    seconds = time.perf_counter() - start
    flat = [x for lat in latencies for x in lat]
    return LoadResult("closed", clients, len(flat), 0, sum(failures), seconds, _percentiles(flat),
                      first_error=errors[0] if errors else "")


def alternating(calls: Mapping[str, Callable[[Feeds], object]], requests: Sequence[Feeds], *,
                duration_s: float) -> dict[str, LoadResult]:
    """One caller calling each of ``calls`` in turn on the same request (request i % len(requests)), each call
    timed, for ``duration_s`` in all: a drift in the host's speed falls on all of them alike (timed one after the
    other, a bucket's 25 ms model read 1.93x a session's as the host slowed). A failed call raises. Each result's
    seconds are its own calls' time."""
    if not calls or duration_s <= 0 or not requests:
        raise ValueError("alternating needs calls, a positive duration and at least one request")
    latencies: dict[str, list[float]] = {name: [] for name in calls}
    stop, i = time.perf_counter() + duration_s, 0
    while time.perf_counter() < stop or i == 0:
        for name, call in calls.items():
            t0 = time.perf_counter()
            call(requests[i % len(requests)])
            latencies[name].append(time.perf_counter() - t0)
        i += 1
    return {name: LoadResult("closed", 1, len(lat), 0, 0, sum(lat), _percentiles(lat))
            for name, lat in latencies.items()}


def open_loop(submit: Callable[[Feeds], Future], requests: Sequence[Feeds], *, rate: float, duration_s: float,
              seed: int = 0, refused: type[BaseException] = RuntimeError) -> LoadResult:
    """Poisson arrivals at ``rate`` per second for ``duration_s`` into ``submit`` (which returns a future);
    latency runs from each request's scheduled arrival to its answer; ``refused`` exceptions count as refused."""
    if rate <= 0 or duration_s <= 0 or not requests:
        raise ValueError("open_loop needs a positive rate and duration and at least one request")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=int(rate * duration_s * 1.5) + 16)
    arrivals = np.cumsum(gaps)
    arrivals = arrivals[arrivals < duration_s]
    done: list[float] = []
    failed = [0]
    errors: list[str] = []
    lock = threading.Lock()
    refusals = 0
    futures: list[Future] = []
    behind = 0.0
    start = time.perf_counter()
    for i, at in enumerate(arrivals):
        delay = start + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        behind = max(behind, -delay)  # late requests go out back to back: a burst the rate did not ask for
        scheduled = start + at
        try:
            future = submit(requests[i % len(requests)])
        except refused:
            refusals += 1
            continue

        def finished(f: Future, scheduled: float = scheduled) -> None:
            with lock:
                if f.cancelled() or f.exception() is not None:
                    failed[0] += 1
                    if not errors:
                        errors.append("cancelled" if f.cancelled() else _one_line(f.exception()))
                else:
                    done.append(time.perf_counter() - scheduled)

        future.add_done_callback(finished)
        futures.append(future)
    for future in futures:
        try:
            future.result()
        except Exception:  # counted by the callback
            pass
    seconds = time.perf_counter() - start
    return LoadResult("open", rate, len(done), refusals, failed[0], seconds, _percentiles(done),
                      behind_s=round(behind, 4), sent=len(arrivals), first_error=errors[0] if errors else "")
