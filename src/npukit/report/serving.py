"""The serve-bench report: the tables and plots of a ``measure.serving.ServingResult``."""

from __future__ import annotations

import math
from typing import Any

from npukit.report.core import Report

GENERATOR_BEHIND = 0.05  # of a run's seconds: the open loop's generator late by more did not offer the rate


def add_serving(report: Report, result: Any) -> None:
    d = result.as_dict()
    report.add("serving", d)
    limit = d["device"].get("device_concurrency")
    at_once = f"; at most {limit} graph(s) at once on it" if limit is not None else ""
    report.add_table(f"Device: {d['device']['device']} ({d['device']['reason']}){at_once}; CPU {d['cpu']}",
                     ["start-up to first result (median)", "ms"],
                     [[{"plain_session_ms": "plain session",
                        "cached_session_ms": "plain session from ORT's optimized graph cached on disk",
                        "runtime_ms": "runtime (session, bound buffers, workers)",
                        "runtime_cached_ms": "runtime from its cache (ORT's optimized graph on the CPU, the "
                                             "compiled graph on the HTP)"}.get(k, k), v]
                      for k, v in d["startup_ms"].items()])
    single = d["single"]
    report.add_table("One caller, back to back (latency ms; jitter = p99 / p50)",
                     ["loop", "requests/s", "p50", "p99", "jitter"],
                     [[name, r["throughput_per_s"], r["latency_ms"]["p50"], r["latency_ms"]["p99"],
                       round(r["latency_ms"]["p99"] / r["latency_ms"]["p50"], 3) if r["latency_ms"]["p50"] else None]
                      for name, r in (("plain session.run", single["plain"]), ("runtime, bound buffers",
                                                                              single["pool"]))])
    report.add_table("Bytes allocated per call (tracemalloc: Python objects and numpy buffers, not ORT's native "
                     "allocations such as the outputs a plain session.run makes on every call)",
                     ["call", "bytes"], [[k, v] for k, v in d["allocated_bytes_per_call"].items()])
    beside = {w: r["throughput_per_s"] for w, r in d["curve_plain"].items()}
    report.add_table("Closed loop: throughput against workers (1 ORT thread each, two clients per worker; the plain "
                     "loop, one caller, run again just before each point: x plain loop is the ratio side by side)",
                     ["workers", "requests/s", "plain loop just before, requests/s", "x plain loop", "failed",
                      "p50 ms", "p99 ms"],
                     [[w, r["throughput_per_s"], beside.get(w), d["speedup"][w], r.get("failed", 0),
                       r["latency_ms"]["p50"], r["latency_ms"]["p99"]] for w, r in d["curve"].items()])
    report.add_figure("Throughput against workers", "line",
                      {"series": {"runtime": {"x": [int(w) for w in d["curve"]],
                                              "y": [r["throughput_per_s"] for r in d["curve"].values()]},
                                  "plain loop (run just before)": {"x": [int(w) for w in beside],
                                                                   "y": list(beside.values())}}},
                      x_label="workers", y_label="requests / s")
    measured = d.get("split", {}).get("measured")
    if measured:
        alone = any(r.get("latency_ms") is not None for r in measured)  # timed for a latency-first split only
        report.add_table(f"Split of the cores a Runtime measures at start ({d['split']['note']})",
                         ["workers", "ORT threads each", "runs/s"] + (["ms per request alone"] if alone else []),
                         [[r["workers"], r["threads"], r["runs_per_s"]] + ([r["latency_ms"]] if alone else [])
                          for r in measured])
    batching = d["batching"]
    rows = []
    for key, label in (("plain", "plain loop (1 session, 1 thread, FIFO)"),
                       ("workers", f"runtime: {batching['workers']} worker(s) (the closed loop's best), no batching"),
                       ("batched", f"runtime: {batching['workers']} worker(s), batches up to {batching['max_batch']} "
                                   f"within {batching['max_wait_ms']} ms")):
        formed = batching.get("batches", []) if key == "batched" else []
        for i, r in enumerate(d["open"].get(key, ())):  # no batched rows where the model's batch axis is fixed
            sizes = ", ".join(f"{k}: {v}" for k, v in formed[i].items()) if i < len(formed) else "-"
            rows.append([label, round(r["level"], 1), r.get("sent", "-"), r["completed"], r["throughput_per_s"],
                         r["refused"], r.get("failed", 0), _ms(r["latency_ms"]["p50"]), _ms(r["latency_ms"]["p99"]),
                         sizes])
    note = f"; {batching['note']}" if batching.get("note") else ""
    late = [r for key in ("plain", "workers", "batched") for r in d["open"].get(key, ())
            if r.get("behind_s", 0.0) > GENERATOR_BEHIND * r["seconds"]]
    if late:
        worst = max(late, key=lambda r: r["behind_s"])
        note += (f"; the load generator fell up to {worst['behind_s']:.2f} s behind its schedule (at "
                 f"{worst['level']:.0f}/s): this process could not offer that rate, and its late requests went out "
                 "in bursts, so refusals there are the client's limit as much as the server's")
    if any(r.get("sent", 1) == 0 for key in ("plain", "workers", "batched") for r in d["open"].get(key, ())):
        note += "; a run the seeded draw sent no request in (a short --duration) has no latency (-)"
    report.add_table(f"Open loop, Poisson arrivals (plain loop's capacity {batching['capacity_per_s']:.1f} "
                     f"requests/s{note}; sent: the requests the seeded draw put within the duration; served/s: "
                     "those answered over the time until the last answer)",
                     ["server", "rate asked/s", "sent", "served", "served/s", "refused", "failed", "p50 ms",
                      "p99 ms", "batches formed (size: count)"], rows)


def _ms(value: float) -> float | str:
    """A latency percentile, or "-" where no request was answered (a run too short to send any: NaN)."""
    return "-" if math.isnan(value) else value


def add_buckets(report: Report, buckets: dict[str, dict]) -> list[dict]:
    """Input-size buckets against a session fixed to each size, exact and padded requests: the table, and the rows
    it shows."""
    report.add("buckets", buckets)
    rows = []
    for shape, r in buckets.items():
        alone = r.get("per_size_session")
        rows.append({"shape": shape, "bucket": r.get("bucket", shape), "padding": r.get("padding", 0.0),
                     "per_size_p50_ms": alone["latency_ms"]["p50"] if alone else None,
                     "buckets_p50_ms": r["buckets"]["latency_ms"]["p50"],
                     "latency_ratio_p50": r.get("latency_ratio_p50"),
                     "max_abs_difference": r.get("max_abs_difference"),
                     "max_difference_of_range": r.get("max_difference_of_range"), "note": r.get("note", "")})
    report.add_table("Input-size buckets against a session fixed to each request's size (one caller, seeded inputs; "
                     "a smaller request zero-padded into its bucket and its maps cropped back)",
                     ["request", "bucket", "padding", "per-size session p50 ms", "through buckets p50 ms", "ratio",
                      "max abs difference", "of the output range", "note"],
                     [[r["shape"], r["bucket"], f"{r['padding']:.0%}", _or_dash(r["per_size_p50_ms"]),
                       r["buckets_p50_ms"], _or_dash(r["latency_ratio_p50"]), _or_dash(r["max_abs_difference"]),
                       "-" if r["max_difference_of_range"] is None else f"{r['max_difference_of_range']:.1%}",
                       r["note"] or "-"] for r in rows])
    return rows


def _or_dash(value: Any) -> Any:
    return "-" if value is None else value
