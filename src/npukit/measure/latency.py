"""Latency of ONNX Runtime CPU sessions: time.perf_counter around session.run, alone or interleaved across models."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from npukit.errors import InputError
from npukit.runtime.ort import ModelLike, make_session, random_feeds


@dataclasses.dataclass(frozen=True)
class LatencyResult:
    """Wall-clock times of ``runs`` timed calls of session.run (after warm-up), in milliseconds."""

    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    runs: int
    threads: int
    times_ms: tuple[float, ...]

    @classmethod
    def from_times(cls, times_ms: list[float], *, threads: int) -> LatencyResult:
        arr = np.asarray(times_ms, dtype=np.float64)
        return cls(
            median_ms=float(np.median(arr)),
            p90_ms=float(np.percentile(arr, 90)),
            mean_ms=float(arr.mean()),
            min_ms=float(arr.min()),
            runs=len(times_ms),
            threads=threads,
            times_ms=tuple(float(t) for t in times_ms),
        )

    def as_dict(self) -> dict[str, Any]:
        return {"median_ms": self.median_ms, "p90_ms": self.p90_ms, "mean_ms": self.mean_ms, "min_ms": self.min_ms,
                "runs": self.runs, "threads": self.threads, "times_ms": list(self.times_ms)}


def measure_latency(
    model: ModelLike,
    *,
    threads: int = 1,
    warmup: int = 10,
    runs: int = 50,
    feeds: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
) -> LatencyResult:
    """Time one model: ``warmup`` untimed runs, then ``runs`` timed ones on ``feeds`` (seeded random when None)."""
    _check_counts(threads=threads, warmup=warmup, runs=runs)
    session = make_session(model, threads=threads)
    inputs = dict(feeds) if feeds is not None else random_feeds(session, seed=seed)
    for _ in range(warmup):
        session.run(None, inputs)
    return LatencyResult.from_times(_timed_calls(lambda: session.run(None, inputs), runs), threads=threads)


def measure_latency_interleaved(
    models: Mapping[str, ModelLike],
    *,
    threads: int = 1,
    warmup: int = 10,
    runs: int = 50,
    rounds: int = 10,
    feeds: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
) -> dict[str, LatencyResult]:
    """Time several models fairly on a noisy machine: all sessions are made (without spinning) and warmed first,
    then ``rounds`` rounds each run every model for its share of ``runs`` in turn (A,B,A,B,...; the order rotates
    each round), so a slow spell hits every model alike. Each model gets ``runs`` timed runs in all; ``rounds`` is
    capped at ``runs``. ``feeds`` go to every model; when None, each gets seeded random inputs for its own inputs.
    """
    _check_counts(threads=threads, warmup=warmup, runs=runs)
    if not models:
        raise InputError("no models to time", hint="give at least one model")
    if rounds < 1:
        raise InputError("rounds must be at least 1")
    sessions = {name: make_session(model, threads=threads) for name, model in models.items()}
    return time_sessions_interleaved(sessions, threads=threads, warmup=warmup, runs=runs, rounds=rounds, feeds=feeds,
                                     seed=seed)


def time_sessions_interleaved(
    sessions: Mapping[str, ort.InferenceSession],
    *,
    threads: int,
    warmup: int,
    runs: int,
    rounds: int,
    feeds: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
) -> dict[str, LatencyResult]:
    """The timing loop of ``measure_latency_interleaved`` on sessions already made (``threads`` is recorded only):
    ``warmup`` runs of each, then ``rounds`` rounds of ``runs`` timed runs in all, the order rotating each round;
    ``feeds`` go to every session, or each gets seeded random inputs for its own inputs."""
    inputs = {name: dict(feeds) if feeds is not None else random_feeds(sessions[name], seed=seed) for name in sessions}
    calls = {name: (lambda s=session, f=inputs[name]: s.run(None, f)) for name, session in sessions.items()}
    return time_calls_interleaved(calls, threads=threads, warmup=warmup, runs=runs, rounds=rounds)


def time_calls_interleaved(calls: Mapping[str, Callable[[], Any]], *, threads: int, warmup: int, runs: int,
                           rounds: int) -> dict[str, LatencyResult]:
    """``warmup`` calls of each function, then ``rounds`` rounds of ``runs`` timed calls in all, the order rotating
    each round (``threads`` is recorded only): any runtime's inference as a function of nothing (ORT, ExecuTorch,
    eager torch), timed side by side."""
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    blocks = _blocks(runs, rounds)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r, block in enumerate(blocks):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            times[name].extend(_timed_calls(calls[name], block))
    return {name: LatencyResult.from_times(times[name], threads=threads) for name in names}


def _blocks(runs: int, rounds: int) -> list[int]:
    """Timed runs per round of ``time_sessions_interleaved``."""
    return [len(b) for b in np.array_split(np.arange(runs), min(rounds, runs))]


def paired_ratio(base: LatencyResult, other: LatencyResult, *, rounds: int) -> float:
    """``other``'s latency over ``base``'s, both timed by one ``time_sessions_interleaved`` call with ``rounds``:
    the median over rounds of the ratio of their medians within the round (``round_ratios``). Robust to a machine
    that changes speed between rounds (shared hosts here move by 30% for seconds at a time), which the ratio of
    whole-run medians is not."""
    return float(np.median(round_ratios(base, other, rounds=rounds)))


def round_ratios(base: LatencyResult, other: LatencyResult, *, rounds: int) -> list[float]:
    """Round by round, the median of ``other``'s times over the median of ``base``'s (both timed by one
    ``time_sessions_interleaved`` call with ``rounds``)."""
    if base.runs != other.runs:
        raise ValueError("both results must come from one interleaved timing")
    ratios, start = [], 0
    for block in _blocks(base.runs, rounds):
        ratios.append(float(np.median(other.times_ms[start:start + block])
                            / np.median(base.times_ms[start:start + block])))
        start += block
    return ratios


def _timed_calls(call: Callable[[], Any], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def _check_counts(*, threads: int, warmup: int, runs: int) -> None:
    if threads < 1:
        raise InputError(f"--threads {threads}: threads must be at least 1",
                         hint="pass --threads 1 (one core, the phone-like figure) or the cores to use")
    if warmup < 0 or runs < 1:
        raise InputError(f"--runs {runs} / --warmup {warmup}: runs must be at least 1 and warmup non-negative",
                         hint="e.g. --runs 50 --warmup 5")
