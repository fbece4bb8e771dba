"""How much of a top-1 agreement difference between two quantization recipes is noise.

``quant_vs_anchors.py`` scores MobileNetV2 columns by top-1 agreement with FP32 on 208 crops of 13 photos. Crops of
one photo share most of their content, so the set holds far fewer than 208 independent trials, and two recipes whose
logits differ by a dB of SQNR can swap places on agreement. This script quantizes MobileNetV2 with two of that
benchmark's columns (the same model, calibration and evaluation crops) and compares them crop by crop:

- top-1 agreement of each, with a photo-level bootstrap 95% interval (resample the 13 evaluation photos with
  replacement, keep each photo's crops together), and the same interval for the difference A - B;
- the discordant crops (only A agrees with FP32, only B does) and McNemar's exact two-sided p-value on them, which
  treats crops as independent and so overstates the evidence;
- logits SQNR of each, and on how many crops A's per-crop SQNR beats B's (median gain);
- the error each makes on FP32's top-1 - top-2 logit margin (mean and standard deviation): a flip needs the margin
  error to exceed the margin, so this is the part of the logits' error that agreement sees.

    python benchmarks/agreement_noise.py                                   # CLI defaults, paired vs not paired
    python benchmarks/agreement_noise.py --a npk-pc-ada-rr --b npk-pc-rs-rr

Writes benchmarks/results/agreement_noise_<A>_vs_<B>.json and .md (see --out-dir).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import quant_vs_anchors as qva  # noqa: E402  (the columns, task and data of the benchmark this one explains)

from npukit._atomic import write_text_atomic  # noqa: E402
from npukit.runtime.ort import make_session  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def photo_bootstrap(values: np.ndarray, groups: np.ndarray, *, rounds: int, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean of per-crop ``values`` when whole groups (photos) are resampled with replacement."""
    labels = np.unique(groups)
    members = [np.flatnonzero(groups == g) for g in labels]
    rng = np.random.default_rng(seed)
    means = np.empty(rounds)
    for k in range(rounds):
        idx = np.concatenate([members[i] for i in rng.integers(0, len(labels), len(labels))])
        means[k] = values[idx].mean()
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: the discordant pairs as a fair coin's flips."""
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return float(min(1.0, 2.0 * tail))


def compare(reference: np.ndarray, a: np.ndarray, b: np.ndarray, groups: np.ndarray, *,
            rounds: int = 2000) -> dict[str, Any]:
    """Crop-by-crop comparison of logits ``a`` and ``b`` (N, classes) against the float ``reference``."""
    order = np.argsort(-reference, axis=1)
    top1, top2 = order[:, 0], order[:, 1]
    rows = np.arange(len(reference))
    right = {k: (v.argmax(axis=1) == top1) for k, v in (("a", a), ("b", b))}
    signal = (reference.astype(np.float64) ** 2).sum(axis=1)
    out: dict[str, Any] = {"crops": int(len(reference)), "photos": int(len(np.unique(groups)))}
    per_crop_db = {}
    for key, logits in (("a", a), ("b", b)):
        err = logits.astype(np.float64) - reference
        noise = (err ** 2).sum(axis=1)
        per_crop_db[key] = 10.0 * np.log10(signal / np.maximum(noise, 1e-30))
        margin = err[rows, top1] - err[rows, top2]
        out[key] = {"top1_agreement": float(right[key].mean()),
                    "agreement_interval": photo_bootstrap(right[key].astype(float), groups, rounds=rounds),
                    "sqnr_db": float(10.0 * np.log10(signal.sum() / max(noise.sum(), 1e-30))),
                    "margin_error_mean": float(margin.mean()), "margin_error_std": float(margin.std())}
    diff = right["a"].astype(float) - right["b"].astype(float)
    only_a, only_b = int((right["a"] & ~right["b"]).sum()), int((right["b"] & ~right["a"]).sum())
    gain = per_crop_db["a"] - per_crop_db["b"]
    out["difference"] = {"top1_agreement": float(diff.mean()),
                         "interval": photo_bootstrap(diff, groups, rounds=rounds),
                         "only_a_agrees": only_a, "only_b_agrees": only_b,
                         "mcnemar_p": mcnemar_exact(only_a, only_b),
                         "crops_a_sqnr_higher": int((gain > 0).sum()), "median_sqnr_gain_db": float(np.median(gain))}
    return out


def logits(model: Any, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    session = make_session(model, threads=1)
    return np.concatenate([np.asarray(session.run(None, f)[0], np.float64).reshape(1, -1) for f in feeds])


def markdown(result: dict[str, Any]) -> str:
    a, b, d = result["a"], result["b"], result["difference"]
    pct = "{:.1f}%".format

    def interval(pair: Sequence[float]) -> str:
        return f"[{pct(100 * pair[0])}, {pct(100 * pair[1])}]"

    lines = [f"# Top-1 agreement: signal or noise ({result['task']})", "",
             f"Generated by `benchmarks/agreement_noise.py`: {result['crops']} evaluation crops of {result['photos']} "
             "photos; intervals: photo-level bootstrap, 95%.", "",
             "| column | top-1 agree | 95% interval | SQNR dB | top-2 margin error mean | std |",
             "|---|---|---|---|---|---|"]
    for side in (a, b):
        lines.append(f"| {side['label']} | {pct(100 * side['top1_agreement'])} | {interval(side['agreement_interval'])}"
                     f" | {side['sqnr_db']:.1f} | {side['margin_error_mean']:+.3f} | {side['margin_error_std']:.3f} |")
    lines += ["", f"- A - B top-1 agreement: {100 * d['top1_agreement']:+.1f} points, 95% interval "
              f"[{100 * d['interval'][0]:+.1f}, {100 * d['interval'][1]:+.1f}]",
              f"- discordant crops: only A agrees {d['only_a_agrees']}, only B {d['only_b_agrees']} "
              f"(McNemar exact p = {d['mcnemar_p']:.3f}, crops taken as independent)",
              f"- A's per-crop SQNR higher on {d['crops_a_sqnr_higher']} of {result['crops']} crops "
              f"(median gain {d['median_sqnr_gain_db']:+.2f} dB)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", default="npk-pc-auto-rr", choices=qva.COLUMN_KEYS)
    parser.add_argument("--b", default="npk-pc-auto-rr-unpaired", choices=qva.COLUMN_KEYS)
    parser.add_argument("--rounds", type=int, default=2000, help="bootstrap rounds (default 2000)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    task = qva.mobilenet_v2_task(quick=False)
    columns = {c.key: c for c in qva.select_columns([args.a, args.b])}
    reference = logits(task.model, task.evaluation)
    per_photo = task.info["evaluation_crops_per_photo"]
    groups = np.arange(len(task.evaluation)) // per_photo
    found = {}
    for side, key in (("a", args.a), ("b", args.b)):
        print(f"quantizing {key} ...", flush=True)
        found[side] = logits(columns[key].make(task.model, task.calibration), task.evaluation)
    result = {"task": task.name, **compare(reference, found["a"], found["b"], groups, rounds=args.rounds)}
    for side, key in (("a", args.a), ("b", args.b)):
        result[side] |= {"key": key, "label": columns[key].label}
    result["seconds"] = time.perf_counter() - start
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"agreement_noise_{args.a}_vs_{args.b}"
    write_text_atomic(args.out_dir / f"{stem}.json", json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    write_text_atomic(args.out_dir / f"{stem}.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
