"""Intel Neural Compressor's accuracy-driven tuning on an ONNX model (the auto-optimize issue's anchor).

Runs in its own virtual environment (``bash benchmarks/setup_inc.sh`` -> ``.venv-inc``: onnx-neural-compressor 1.0,
INC's ONNX Runtime line, pins numpy < 2). It walks INC's own static-quantization config set
(``StaticQuantConfig.get_config_set_for_tuning``: op types, per-channel or not, last MatMul or not) with its sequential
sampler until one meets ``--budget`` relative loss against the float model's score, as INC's ``autotune`` does. The
score is the same task metric npukit's optimize verb uses (``npukit.measure.task_fidelity.compare_task`` against the
float model on the held-out samples; npukit's numpy-only task code is imported without its package's heavy imports).

    .venv-inc/bin/python benchmarks/anchors/inc_autotune.py --model m.onnx --calib c.npy --eval e.npy \
        --budget 0.01 --out inc.onnx --json inc.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

SRC = Path(__file__).resolve().parents[2] / "src"


def _npukit_tasks():
    """npukit's task comparison without ``npukit/__init__`` (which imports torch)."""
    package = types.ModuleType("npukit")
    package.__path__ = [str(SRC / "npukit")]
    sys.modules.setdefault("npukit", package)
    from npukit.measure.task_fidelity import compare_task, session_runner

    return compare_task, session_runner


def _feeds(path: Path, names: list[str]) -> list[dict[str, np.ndarray]]:
    """One feed dict per sample from NAME.npy (one input) or NAME.npz (keyed by input name), batch axis kept."""
    if path.suffix == ".npy":
        arrays = {names[0]: np.load(path)}
    else:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
    count = len(next(iter(arrays.values())))
    return [{k: v[i:i + 1] for k, v in arrays.items()} for i in range(count)]


def _session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _vnni() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--calib", required=True, type=Path)
    parser.add_argument("--eval", required=True, type=Path)
    parser.add_argument("--budget", type=float, default=0.01)
    parser.add_argument("--task", default=None)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--json", required=True, type=Path)
    args = parser.parse_args()

    from onnx_neural_compressor import data_reader
    from onnx_neural_compressor.quantization import config, tuning

    compare_task, session_runner = _npukit_tasks()
    reference = _session(args.model)
    names = [i.name for i in reference.get_inputs()]
    outputs = [o.name for o in reference.get_outputs()]
    calib = _feeds(args.calib, names)
    held = _feeds(args.eval, names)
    ref_runner = session_runner(reference)
    evals: list[dict] = []

    class Reader(data_reader.CalibrationDataReader):
        def __init__(self) -> None:
            self.rewind()

        def get_next(self):
            return next(self._it, None)

        def rewind(self) -> None:
            self._it = iter(calib)

    def eval_fn(model) -> float:
        start = time.perf_counter()
        candidate = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        try:
            _, result = compare_task(ref_runner, session_runner(_session(candidate)), held, output_names=outputs,
                                     task=args.task)
        except Exception as exc:  # a candidate ORT cannot run scores 0, and the tuning goes on
            evals.append({"metric": "error", "value": 0.0, "error": str(exc).splitlines()[0][:200],
                          "seconds": time.perf_counter() - start})
            return 0.0
        value = float(result.value) if result.value is not None else 0.0
        evals.append({"metric": result.metric, "value": value, "seconds": time.perf_counter() - start})
        return value

    reduce_range = not _vnni()  # INC's own advice on CPUs without VNNI
    # QDQ: INC's default QOperator format writes a QGemm whose bias type ORT 1.32 refuses on MobileNetV2 ("Type
    # parameter (TB) of Optype (QGemm) bound to different types"), so no candidate would run
    from onnxruntime.quantization import QuantFormat

    config_set = config.StaticQuantConfig.get_config_set_for_tuning(quant_format=QuantFormat.QDQ,
                                                                    reduce_range=reduce_range)
    tune = tuning.TuningConfig(config_set=config_set, tolerable_loss=args.budget)
    start = time.perf_counter()
    best = tuning.autotune(model_input=str(args.model), tune_config=tune, eval_fn=eval_fn,
                           calibration_data_reader=Reader())
    seconds = time.perf_counter() - start
    if best is not None:
        onnx.save(best, str(args.out))
    args.json.write_text(json.dumps({
        "found": best is not None, "seconds": seconds, "reduce_range": reduce_range, "evaluations": evals,
        "trials": max(0, len(evals) - 1), "budget": args.budget, "out": str(args.out) if best is not None else None,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
