"""How to split this machine's cores between concurrent runs and ORT's intra-op threads: measured, not assumed.

For ``cores`` cores the candidates are every (workers, threads) with workers x threads = cores (2 cores: 2 x 1 and
1 x 2; 8 cores: 8 x 1, 4 x 2, 2 x 4, 1 x 8). Each is timed on the model itself: a session with ``threads`` intra-op
threads, ``workers`` Python threads calling it back to back on one seeded input for about ``seconds`` (ORT releases
the GIL while it runs), after one warm-up call each. The split with the most runs per second wins
(``prefer="throughput"``). With ``prefer="latency"`` each thread count is also timed for its one-request latency,
the median of back-to-back calls of one caller on that session (what a request waits on an idle runtime; workers do
not change it), and the split whose single request is fastest wins (a tie within 5% goes to the higher
throughput). The table of all of them goes into the runtime's description. Many small models run best as one worker per core; a large model on few requests may run best
as one worker with all threads.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping

import numpy as np

from npukit._threads import run_threads
from npukit.runtime.ort import make_session


@dataclasses.dataclass(frozen=True)
class Split:
    workers: int
    threads: int
    runs_per_s: float
    latency_ms: float | None = None  # one request on an idle runtime (timed for prefer="latency" only)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def candidates(cores: int) -> list[tuple[int, int]]:
    """(workers, threads) pairs whose product is ``cores``, most workers first."""
    return [(cores // t, t) for t in range(1, cores + 1) if cores % t == 0]


def _throughput(model: bytes, feeds: Mapping[str, np.ndarray], workers: int, threads: int, seconds: float) -> float:
    session = make_session(model, threads=threads)
    names = [o.name for o in session.get_outputs()]
    counts = [0] * workers
    for _ in range(workers):
        session.run(names, dict(feeds))
    start = time.perf_counter()
    stop = start + seconds

    def loop(k: int, halt: threading.Event) -> None:
        while time.perf_counter() < stop and not halt.is_set():
            session.run(names, dict(feeds))
            counts[k] += 1

    run_threads(loop, workers)
    return sum(counts) / (time.perf_counter() - start)


def _latency_ms(model: bytes, feeds: Mapping[str, np.ndarray], threads: int, seconds: float) -> float:
    session = make_session(model, threads=threads)
    names = [o.name for o in session.get_outputs()]
    session.run(names, dict(feeds))
    times: list[float] = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop or len(times) < 3:
        start = time.perf_counter()
        session.run(names, dict(feeds))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1000.0


PREFERS = ("throughput", "latency")
LATENCY_TIE = 0.05  # latency-first: splits within 5% of the fastest request count as tied, the higher throughput wins


def measure_split(model: bytes, feeds: Mapping[str, np.ndarray], *, cores: int, seconds: float = 0.4,
                  prefer: str = "throughput") -> tuple[Split, list[Split]]:
    """The best (workers, threads) split of ``cores`` for ``model`` (serialized ONNX) on ``feeds`` by ``prefer``
    (see the module docstring), and every candidate measured."""
    if prefer not in PREFERS:
        raise ValueError(f"prefer must be one of {PREFERS}, not {prefer!r}")
    pairs = candidates(max(1, cores))
    latency: dict[int, float | None] = dict.fromkeys((t for _, t in pairs), None)
    if prefer == "latency":  # not on every runtime's start: only where the choice reads it
        latency = {t: round(_latency_ms(model, feeds, t, seconds / 2), 3) for t in latency}
    table = [Split(w, t, round(_throughput(model, feeds, w, t, seconds), 2), latency[t]) for w, t in pairs]
    return choose(table, prefer), table


def choose(table: list[Split], prefer: str) -> Split:
    """The split ``prefer`` picks from ``table`` (see the module docstring)."""
    if prefer == "latency":
        assert all(s.latency_ms is not None for s in table), "latency-first needs each split's latency"
        fastest = min(s.latency_ms for s in table)
        table = [s for s in table if s.latency_ms <= fastest * (1 + LATENCY_TIE)]
    return max(table, key=lambda s: s.runs_per_s)
