"""Mixed precision per layer under an accuracy budget, measured: ``npukit quantize --mixed-precision`` against the
all-int8 and the all-16-bit model of the same recipe (the demo's: ``--cle --equalize-activations
--bias-correction``, on this CPU's scheme), each checked on held-out data with the model's task and timed side by
side (ORT CPU, 1 thread, interleaved), in one run.

- ``mobilenet_v2``: official weights; calibrated on 42 crops of the 7 calibration photos, checked on the usual 208
  crops of the 13 others (no labels: against the float model). Budget: logits SQNR >= ``MV2_FLOOR_DB`` (task
  generic: every output held to the SQNR floor).
- ``retinaface_mnet025`` (third-party zoo, ``zoo_models.py``): RetinaFace MobileNet0.25 at 480x640, calibrated on
  the zoo's calibration photos, checked on its evaluation photos with the detection task (faces matched against
  the float model's: mAP@0.5 and F1, floor 0.9) and the landmarks, which the task does not decode, held to
  ``RETINAFACE_FLOOR_DB``.

The all-16-bit model lifts every node's activations to 16 bits (``int16_nodes`` = every node), the usual way to
buy accuracy on a CPU; the per-layer plan is chosen on the calibration samples only. Budgets sit between the
all-int8 and the all-16-bit model's held-out figures (measured before this run: MobileNetV2 19.8 / 25.4 dB,
RetinaFace landmarks 9.8 / 21.9 dB).

The compression issue asks: on MobileNetV2 and one non-classifier of the zoo, the chosen plan meets the budget and
is faster (CPU) than the all-int16 plan that meets it.

    .venv/bin/python benchmarks/mixed_precision.py
    .venv/bin/python benchmarks/mixed_precision.py --models retinaface_mnet025

Writes ``benchmarks/results/mixed_precision.{md,json}`` (the CPU named in both).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import third_party_zoo as zoo  # noqa: E402  (CPU name, revision)
from compression import mobilenet_v2, results_doc, save_results  # noqa: E402

MODELS = ("mobilenet_v2", "retinaface_mnet025")
HTP_SOC = "SM8650"
HTP_FLOOR_DB = 20.0  # MobileNetV2's logits on the HTP
HTP_EVAL_CROPS = 32  # held-out crops run on the HTP emulator (about 0.6 s each)
MV2_FLOOR_DB = 22.0
RETINAFACE_FLOOR_DB = 18.0
RECIPE = {"cle": True, "equalize_activations": True, "bias_correction": True}  # the demo's, for every variant
RUNS = 60


def _mv2(work: Path) -> dict[str, Any]:
    import numpy as np

    model, train, held, notes = mobilenet_v2(work)
    data = np.load(train)
    name = next(iter(data.keys()))
    calib = work / "mv2_calib.npz"
    np.savez(calib, **{name: data[name][::8][:42]})  # 42 crops over the 7 calibration photos
    from npukit.tasks import QualityGate

    return {"model": model, "calib": calib, "held": held, "task": "generic", "input_shape": None,
            "gate": QualityGate(min_sqnr_db=MV2_FLOOR_DB),
            "notes": {**notes, "calibration": 42, "budget": f"logits SQNR >= {MV2_FLOOR_DB:g} dB"}}


def _zoo(name: str, work: Path) -> dict[str, Any]:
    import zoo_models

    from npukit.tasks import QualityGate

    entry = zoo_models.MODELS[name]
    calib = zoo_models.save_feeds(list(entry.calibration()), work / f"{name}.calib")
    held = zoo_models.save_feeds(list(entry.evaluation()), work / f"{name}.eval")
    shape = [a for a in zoo._shape_args(entry) if a != "--input-shape"] or None
    return {"model": entry.model_path(), "calib": calib, "held": held, "task": None, "input_shape": shape,
            "gate": QualityGate(min_sqnr_db=RETINAFACE_FLOOR_DB),
            "notes": {"note": entry.note,
                      "budget": f"detection floors 0.9, landmarks SQNR >= {RETINAFACE_FLOOR_DB:g} dB"}}


def _every_node(case: dict[str, Any]) -> list[str]:
    """The node names the quantizer sees (pre-processed, named), for the all-16-bit model."""
    from npukit.frontend.onnx_io import named_nodes
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.quant.qdq import preprocess

    proto = load_with_inputs(case["model"], InputSpec.parse(case["input_shape"]))
    return [n.name for n in preprocess(named_nodes(proto)).graph.node]


def _check(doc: dict[str, Any]) -> dict[str, Any]:
    check = doc["results"]["task_check"]
    result = check["result"]
    return {"task": result["task"], "metric": result["metric"], "value": result["value"],
            "worst_sqnr_db": min((o["sqnr_db"] for o in result["outputs"]), default=None),
            # the budget: the task's floors; "no integer kernels" (the all-16-bit model's) is a CPU finding, not one
            "passed": not [f for f in check["verdict"]["failures"] if not f.startswith("no integer kernels")],
            "verdict": doc["verdict"], "samples": result["samples"]}


def run_model(name: str, work: Path) -> dict[str, Any]:
    import dataclasses

    from npukit.api import quantize
    from npukit.config import PreprocessConfig
    from npukit.errors import InputError
    from npukit.frontend.shapes import InputSpec, load_with_inputs
    from npukit.measure.latency import measure_latency_interleaved
    from npukit.measure.size import model_size
    from npukit.verbs.common import open_data

    case = _mv2(work) if name == "mobilenet_v2" else _zoo(name, work)
    common = {"calib": str(case["calib"]), "data": str(case["held"]), "task": case["task"],
              "input_shape": case["input_shape"], "runs": 10, **RECIPE}
    degraded = dataclasses.replace(case["gate"], accept_degraded=True)
    out: dict[str, Any] = {"notes": case["notes"], "variants": {}}
    paths = {}
    for variant in ("int8", "mixed", "all_16bit"):
        path = work / f"{name}.{variant}.onnx"
        start = time.perf_counter()
        try:
            if variant == "mixed":
                result = quantize(case["model"], path, mixed_precision=True, gate=case["gate"], **common)
            else:
                nodes = _every_node(case) if variant == "all_16bit" else ()
                result = quantize(case["model"], path, int16_nodes=nodes, gate=degraded, **common)
        except InputError as exc:
            out["variants"][variant] = {"error": str(exc).splitlines()[0][:300]}
            print(json.dumps({name: out["variants"][variant]}), flush=True)
            continue
        doc = result.report.to_dict()
        row = {"wall_s": round(time.perf_counter() - start, 1), **_check(doc),
               "size_bytes": model_size(path).file_bytes}
        if variant == "mixed":
            plan = doc["results"]["mixed_precision"]
            row["plan"] = {k: plan[k] for k in ("assignment", "met", "tried", "timing_ms", "all_16bit", "base_sqnr_db",
                                                "plan_sqnr_db", "samples", "order")}
            row["search_s"] = round(doc["timings_s"].get("mixed_precision", 0.0), 1)
        out["variants"][variant] = row
        paths[variant] = str(path)
        print(json.dumps({name: {variant: {k: v for k, v in row.items() if k != "plan"}}}, default=str), flush=True)
    paths = {"float": str(case["model"]), **paths}
    proto = load_with_inputs(case["model"], InputSpec.parse(case["input_shape"]))
    if case["input_shape"]:  # the float model timed with the zoo's static shapes, as the verb times it
        paths["float"] = proto
    feeds = open_data(case["held"], proto, PreprocessConfig()).sample(0)
    latency = measure_latency_interleaved(paths, threads=1, runs=RUNS, feeds=feeds)
    out["latency_ms"] = {k: v.median_ms for k, v in latency.items()}
    return out


def htp_mobilenet_v2(work: Path, *, floor_db: float, eval_crops: int) -> dict[str, Any]:
    """MobileNetV2 on the HTP emulator as ``HTP_SOC``: the all-int8 model (uint8 activations), ``compile
    --mixed-precision`` under a logits SQNR floor, and the default (uint16 activations everywhere), each run on the
    HTP on ``eval_crops`` held-out crops against the float model on ORT CPU."""
    import dataclasses

    import numpy as np
    import onnx

    from npukit.api import compile as compile_
    from npukit.frontend.opset import ensure_opset
    from npukit.runtime.compile import prepare_graph, soc_provider_options
    from npukit.runtime.htp_precision import W8A8
    from npukit.runtime.htp_quant import quantize_for_htp
    from npukit.runtime.ort import make_session
    from npukit.runtime.qnn import make_qnn_session
    from npukit.tasks import QualityGate

    case = _mv2(work)
    name = onnx.load(str(case["model"]), load_external_data=False).graph.input[0].name
    calib = [{name: x[None]} for x in np.load(case["calib"])[name]]
    held = np.load(case["held"])[name]
    held = [{name: held[i][None]} for i in np.linspace(0, len(held) - 1, eval_crops).astype(int)]
    gate = QualityGate(min_sqnr_db=floor_db)
    start = time.perf_counter()
    mixed = work / "mv2_htp_mixed.onnx"
    doc = compile_(str(case["model"]), str(mixed), soc=HTP_SOC, calib=str(case["calib"]), mixed_precision=True,
                   task="generic", gate=dataclasses.replace(gate, accept_degraded=True)).report.to_dict()
    seconds = round(time.perf_counter() - start, 1)
    plan = doc["results"]["mixed_precision"]
    default = work / "mv2_htp_w8a16.onnx"
    compile_(str(case["model"]), str(default), soc=HTP_SOC, calib=str(case["calib"]), task="generic",
             gate=dataclasses.replace(gate, accept_degraded=True))
    float_model = onnx.load(str(case["model"]))
    prepared, _ = prepare_graph(float_model, feeds=calib[0])
    prepared, _ = ensure_opset(prepared, 21, reason="uint16 Q/DQ", feeds=calib[:1])
    models = {"all-int8 (uint8 activations)": quantize_for_htp(prepared, calib, rules=W8A8).model,
              "mixed (compile --mixed-precision)": str(mixed),
              "uint16 activations everywhere (compile's default)": str(default)}
    ref = make_session(float_model)
    rows = {}
    for label, model in models.items():
        htp = make_qnn_session(model, provider_options=soc_provider_options(HTP_SOC))
        signal = noise = agree = 0.0
        for feeds in held:
            want = np.asarray(ref.run(None, feeds)[0], np.float64)
            got = np.asarray(htp.run(None, feeds)[0], np.float64)
            signal, noise = signal + float((want**2).sum()), noise + float(((want - got) ** 2).sum())
            agree += float(want.argmax() == got.argmax())
        rows[label] = {"sqnr_db": 10 * np.log10(signal / noise), "top1_agreement": agree / len(held)}
        print(json.dumps({label: rows[label]}), flush=True)
    return {"soc": HTP_SOC, "floor_db": floor_db, "eval_crops": eval_crops, "search_and_compile_s": seconds,
            "plan": {k: plan[k] for k in ("assignment", "met", "tried", "energy_added_pj", "cost_unit")},
            "verdict": doc["verdict"], "on_htp": rows}


def _fmt(value: Any, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(doc: dict[str, Any]) -> str:
    lines = [f"# Mixed precision per layer under a budget ({doc['cpu']}, {doc['cores']} cores)", "",
             f"npukit at {doc['commit']}, {doc['date']}. Held-out checks against the float model; latency: ORT CPU, "
             f"1 thread, medians of {RUNS} runs interleaved (float, int8, mixed, all-16-bit side by side).", "",
             "| model | budget | variant | task metric | value | worst output SQNR dB | meets budget | ms "
             "| vs all-16-bit | size MiB | layers lifted |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in doc["models"].items():
        lat = entry.get("latency_ms", {})
        for variant in ("int8", "mixed", "all_16bit"):
            row = entry["variants"].get(variant, {})
            if "error" in row:
                lines.append(f"| {name} | {entry['notes']['budget']} | {variant} | error: {row['error']} |||||||")
                continue
            lifted = row.get("plan", {}).get("assignment")
            counts = "" if lifted is None else ", ".join(
                f"{sum(1 for p in lifted.values() if p == kind)} {kind}" for kind in ("int16", "float32"))
            ratio = lat.get(variant) / lat["all_16bit"] if lat.get(variant) and lat.get("all_16bit") else None
            lines.append(f"| {name} | {entry['notes']['budget']} | {variant} | {row['metric']} | {_fmt(row['value'])} "
                         f"| {_fmt(row['worst_sqnr_db'], 2)} | {'yes' if row['passed'] else 'no'} "
                         f"| {_fmt(lat.get(variant), 2)} | {_fmt(ratio, 2)} | {row['size_bytes'] / 2**20:.2f} "
                         f"| {counts} |")
        lines.append(f"| {name} | | float | | | | | {_fmt(lat.get('float'), 2)} | | | |")
    htp = doc.get("htp")
    if htp:
        lines += ["", f"## MobileNetV2 on the HTP ({htp['soc']} emulator), budget logits SQNR >= "
                      f"{htp['floor_db']:g} dB", ""]
        if "error" in htp:
            lines.append(f"No plan: {htp['error']}" + (f" ({htp['note']})" if htp.get("note") else ""))
        else:
            plan = htp["plan"]
            kinds = ", ".join(f"{sum(1 for p in plan['assignment'].values() if p == k)} {k}"
                              for k in ("int16", "float16"))
            lines += [f"npukit at {htp['commit']}. Plan: {kinds} of the convs lifted from int8 (estimated energy "
                      f"added {plan['energy_added_pj'] / 1e6:.3g} uJ per inference); search and compile "
                      f"{htp['search_and_compile_s']} s; verdict on 8 calibration samples: {htp['verdict']}", "",
                      f"| model | logits SQNR dB ({htp['eval_crops']} held-out crops, on the HTP) | top-1 agreement |",
                      "|---|---|---|"]
            lines += [f"| {label} | {row['sqnr_db']:.2f} | {row['top1_agreement']:.3f} |"
                      for label, row in htp["on_htp"].items()]
    lines += ["", "## Targets", ""] + [f"- {t}" for t in doc["targets"]]
    for name, entry in doc["models"].items():
        plan = entry["variants"].get("mixed", {}).get("plan")
        if plan:
            lines += ["", f"## {name}: the search (calibration samples)", "",
                      f"Search {entry['variants']['mixed'].get('search_s')} s; output SQNR on {plan['samples']} "
                      f"calibration samples {plan['base_sqnr_db']:.2f} dB all int8, {plan['plan_sqnr_db']:.2f} dB "
                      f"as planned; lifted: " + (", ".join(f"{n} {p}" for n, p in plan["assignment"].items())
                                                 or "none"), "",
                      "| layers lifted | passed | verdict |", "|---|---|---|"]
            lines += [f"| {t['lifted']} | {t['passed']} | {t['line']} |" for t in plan["tried"]]
    return "\n".join(lines) + "\n"


def targets(doc: dict[str, Any]) -> list[str]:
    out = []
    htp = doc.get("htp")
    if htp and "on_htp" in htp:
        rows = htp["on_htp"]
        mixed, int8 = rows.get("mixed (compile --mixed-precision)"), rows.get("all-int8 (uint8 activations)")
        better = mixed is not None and int8 is not None and mixed["sqnr_db"] > int8["sqnr_db"]
        floats = sum(1 for p in htp["plan"]["assignment"].values() if p == "float16")
        out.append(f"HTP ({htp['soc']}): the plan ({floats} float16 layers) {'beats' if better else 'does NOT beat'} "
                   f"all-int8 on fidelity: {mixed['sqnr_db'] if mixed else float('nan'):.2f} vs "
                   f"{int8['sqnr_db'] if int8 else float('nan'):.2f} dB held-out: "
                   f"{'met' if better and floats else 'NOT met'}")
    elif htp:
        out.append(f"HTP ({htp['soc']}): NOT met ({htp.get('error')})")
    for name, entry in doc["models"].items():
        variants, lat = entry["variants"], entry.get("latency_ms", {})
        mixed, wide = variants.get("mixed", {}), variants.get("all_16bit", {})
        if "error" in mixed or not mixed:
            out.append(f"{name}: NOT met (no mixed plan: {mixed.get('error', 'not run')})")
            continue
        faster = lat.get("mixed") is not None and lat.get("all_16bit") is not None and lat["mixed"] < lat["all_16bit"]
        met = mixed.get("passed") and wide.get("passed") and faster
        out.append(f"{name}: mixed plan meets the budget on held-out data: {'yes' if mixed.get('passed') else 'no'}; "
                   f"all-16-bit meets it: {'yes' if wide.get('passed') else 'no'}; mixed "
                   f"{_fmt(lat.get('mixed'), 2)} ms vs all-16-bit {_fmt(lat.get('all_16bit'), 2)} ms: "
                   f"{'met' if met else 'NOT met'}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--htp", action="store_true", help=f"also MobileNetV2 on the HTP emulator ({HTP_SOC})")
    parser.add_argument("--htp-only", action="store_true",
                        help="run the HTP part alone and put it into the results already at --out")
    parser.add_argument("--out", default=str(HERE / "results" / "mixed_precision"))
    args = parser.parse_args(argv)
    doc = results_doc(Path(args.out), resume=args.htp_only)
    if args.htp_only:
        args.models, args.htp = [], True
    with tempfile.TemporaryDirectory(prefix="npukit-mixed-") as tmp:
        for name in args.models:
            doc["models"][name] = run_model(name, Path(tmp))
        if args.htp:
            from npukit.errors import InputError

            try:
                doc["htp"] = htp_mobilenet_v2(Path(tmp), floor_db=HTP_FLOOR_DB, eval_crops=HTP_EVAL_CROPS)
            except InputError as exc:
                doc["htp"] = {"soc": HTP_SOC, "floor_db": HTP_FLOOR_DB, "error": str(exc).splitlines()[0][:300]}
            doc["htp"]["commit"] = zoo.revision()
    doc["targets"] = targets(doc)
    save_results(doc, Path(args.out), table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
