"""npukit analyze --target nnapi / coreml against ONNX Runtime's own mobile usability checker, on the zoo.

ORT ships ``onnxruntime.tools.mobile_helpers.usability_checker`` (``python -m
onnxruntime.tools.check_onnx_model_mobile_usability``): it optimizes a model at ORT's basic level, then counts the
nodes the NNAPI EP and the CoreML EP (ML Program) would take and the partitions they form, from the op lists ORT
ships. npukit's analyze does the same job with its own target profiles (constraints per op, QDQ units, fixes). Per
third-party zoo model (``benchmarks/zoo_models.py``, ONNX files, the zoo's static input shapes fixed in), both are run
on the same file and their node, delegated-node and partition counts compared.

    .venv/bin/python benchmarks/mobile_ep_checker.py            # every ONNX model of the zoo that is installed

Writes ``benchmarks/results/mobile_ep_checker.{md,json}``. Differences are listed with npukit's reasons for the nodes
the two count differently: ORT's checker reads op names (and a few caveats it does not check); npukit checks
constraints too (ranks, constant inputs, dtypes), so where it takes fewer nodes its reasons say which constraint.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import third_party_zoo as zoo  # noqa: E402
import zoo_models  # noqa: E402

TARGETS = {"nnapi": "NNAPI", "coreml": "CoreML MLProgram"}


def _ort_checker(path: Path, target: str, work: Path) -> dict:
    """ORT's checker's counts for ``target`` on ``path``, after ORT's basic optimizations as its command line does."""
    from onnxruntime.tools.mobile_helpers import usability_checker as checker
    from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, optimize_model

    optimized = work / f"{path.stem}.basic.onnx"
    optimize_model(path, optimized)  # what the checker's command line does first
    model = ModelProtoWithShapeInfo(optimized).model_with_shape_info
    if target == "nnapi":
        info = checker.check_nnapi_partitions(model, True)
    else:
        info = checker.check_coreml_partitions(model, True, "coreml_supported_mlprogram_ops.md")
    empty = {t.name for t in model.graph.initializer if 0 in t.dims}
    omitted = {n.name for n in model.graph.node if any(x == "" or x in empty for x in n.input)}
    return {"nodes": info.num_nodes, "delegated": info.num_supported_nodes, "partitions": info.num_partitions,
            "unsupported_ops": sorted(info.unsupported_ops),
            "taken": sorted(n.name for group in info.supported_groups for n in group),
            "all": {n.name: (n.op_type, n.name in omitted) for n in model.graph.node},
            "ops": sorted({n.op_type for n in model.graph.node})}


def _npukit(path: Path, target: str) -> dict:
    import onnx

    from npukit.targets import analyze, get_target

    a = analyze(onnx.load(str(path)), get_target(target))
    return {"nodes": len(a.nodes), "delegated": a.delegated_nodes, "partitions": len(a.partitions),
            "taken": sorted(v.name for v in a.nodes if v.supported),
            "refused": {v.name: (v.op_type, v.reasons[0] if v.reasons else "") for v in a.nodes if not v.supported}}


def _differences(ort_side: dict, npk: dict) -> dict[str, int]:
    """Why the two count differently, node by node, grouped: the nodes only npukit takes (by op, and whether ORT's
    checker left them out for an omitted optional input), those only ORT's checker takes (by npukit's reason), and
    the nodes one graph has and the other does not."""
    out: dict[str, int] = {}

    def count(key: str) -> None:
        out[key] = out.get(key, 0) + 1

    ort_taken, npk_taken, ort_all = set(ort_side["taken"]), set(npk["taken"]), ort_side["all"]
    if all(ort_side[k] == npk[k] for k in ("nodes", "delegated", "partitions")):
        return {}
    whole = collections.Counter(op for op, reason in npk["refused"].values() if op not in ort_side["ops"])
    for op, n in whole.items():  # a function op ORT inlines, which npukit names with the fix that replaces it
        out[f"{op} kept whole by npukit, where ORT inlines its body (npukit names the fix for it)"] = n
    if "" in ort_all:  # unnamed nodes: npukit names them op@index, which ORT's graph cannot be matched on
        out["other nodes not compared one by one: the graph has unnamed nodes"] = 1
        return out
    for name in npk_taken - ort_taken:
        if name not in ort_all:
            count("npukit takes a node of its own graph")
            continue
        op, omitted = ort_all[name]
        count(f"{op} with an omitted or empty optional input, which ORT's checker reads as a value of unknown "
              "shape ('' has no value_info; a 0-sized one is not 'fixed' to is_fixed_size_tensor)" if omitted
              else f"{op}: npukit takes it, ORT's checker does not")
    for name in ort_taken - npk_taken:
        if name in npk["refused"]:
            count(f"{npk['refused'][name][1]} (npukit)")
        elif ort_all.get(name, ("",))[0] not in whole:
            count(f"{ort_all.get(name, ('?',))[0]} of ORT's inlined body (not in npukit's graph)")
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))  # ties in one order from run to run


def _static(model: zoo_models.ZooModel, work: Path) -> Path:
    """The zoo's ONNX model with the zoo's input shapes fixed in."""
    import onnx

    from npukit.frontend.shapes import fix_inputs

    proto = onnx.load(str(model.model_path()))
    spec = {s.name: s.shape for s in model.inputs if s.shape}
    out = work / f"{model.name}.onnx"
    onnx.save(fix_inputs(proto, spec) if spec else proto, str(out))
    return out


def run(models: list[zoo_models.ZooModel]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="npukit-ep-checker-") as tmp:
        work = Path(tmp)
        for model in models:
            row: dict = {"model": model.name, "task": model.task}
            try:
                path = _static(model, work)
                for target in TARGETS:
                    row[target] = {"ort": _ort_checker(path, target, work), "npukit": _npukit(path, target)}
                    counts = [(row[target][k]["nodes"], row[target][k]["delegated"], row[target][k]["partitions"])
                              for k in ("ort", "npukit")]
                    row[target]["same"] = counts[0] == counts[1]
                    row[target]["differences"] = _differences(row[target]["ort"], row[target]["npukit"])
                    for side in ("ort", "npukit"):  # the node lists served the comparison; the counts stay
                        for key in ("taken", "all", "refused"):
                            row[target][side].pop(key, None)
            except Exception as exc:  # one model that cannot be read does not stop the table
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            print(json.dumps(row)[:300], flush=True)
            rows.append(row)
    return rows


def write(rows: list[dict], out: Path, stem: str, *, note: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"cpu": zoo._cpu(), "cores": os.cpu_count(), "commit": zoo.revision(), "date": time.strftime("%Y-%m-%d"),
           "note": note, "rows": rows}
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# npukit analyze vs ONNX Runtime's mobile usability checker ({doc['date']}, npukit {doc['commit']})",
             "", "Nodes after ORT's basic optimizations / nodes the EP takes / partitions. ORT: "
             "onnxruntime.tools.mobile_helpers.usability_checker (op lists; its caveats unchecked); npukit: "
             "`npukit analyze --target` (op rules with constraints). Same file, the zoo's static input shapes. " + note,
             "",
             "| model | task | NNAPI: ORT | NNAPI: npukit | same | CoreML: ORT | CoreML: npukit | same | "
             "nodes counted differently, and why |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['task']} | | | | | | | not read: {r['error']} |")
            continue
        cells, notes = [], []
        for target in TARGETS:
            t = r[target]
            cells += ["/".join(str(t['ort'][k]) for k in ("nodes", "delegated", "partitions")),
                      "/".join(str(t['npukit'][k]) for k in ("nodes", "delegated", "partitions")),
                      "yes" if t["same"] else "**no**"]
            if t["differences"]:
                notes.append(f"{target}: " + "; ".join(f"{n}x {k}" for k, n in t["differences"].items())
                             .replace("|", "/"))
        lines.append(f"| {r['model']} | {r['task']} | " + " | ".join(cells) + f" | {' <br> '.join(notes)} |")
    same = sum(1 for r in rows for t in TARGETS if "error" not in r and r[t]["same"])
    total = sum(1 for r in rows for _ in TARGETS if "error" not in r)
    lines += ["", f"Same counts in {same} of {total} model-target pairs.", "", "## Reading", "",
              "- Where ORT's checker leaves out a Resize whose omitted ('') or empty (0-sized) roi/scales input it "
              "reads as a value of unknown shape (its `_is_fixed_shape_value` / `is_fixed_size_tensor`), npukit "
              "counts the Resize as taken: the input carries no data.",
              "- Where npukit takes fewer nodes, its reasons are constraints ORT's checker lists as caveats it does "
              "not check (NNAPI: 2D Conv only, rank <= 4, constant Pad only) or shapes it could not infer past a "
              "contrib op (com.microsoft DynamicQuantizeLSTM).",
              "- A function op the target lacks (HardSwish on NNAPI) is inlined by ORT (HardSigmoid + Mul); npukit "
              "keeps it whole where the target would not take the body either, to name the fix that serves it "
              "(hardswish_to_clip). Where the target takes the body (Core ML), npukit inlines it as ORT does."]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--stem", default="mobile_ep_checker")
    parser.add_argument("--note", default="", help="a line for the results' header (what changed, the run)")
    args = parser.parse_args()
    models = [m for m in zoo_models.MODELS.values() if m.kind not in ("torchscript", "state_dict+factory")
              and (not args.only or m.name in args.only) and m.installed()]
    write(run(models), args.out, args.stem, note=args.note)
    print((args.out / f"{args.stem}.md").read_text())


if __name__ == "__main__":
    main()
