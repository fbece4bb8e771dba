"""Core ML: a torch program converted to an ML Program package (``.mlpackage``) with coremltools.

coremltools is an optional extra (``pip install 'npukit[coreml]'``; scripts/setup.sh installs it with ExecuTorch); it
is imported only here and only when the Core ML target is used. Core ML runs models on Apple platforms only. Off
macOS a package is converted, saved, reloaded and inspected, never run: its inputs and outputs against the torch
program's, its operators, and for INT8 the integer grids it holds against npukit's plan (``package_grids``). On macOS
``Runner`` runs it on Core ML's CPU compute unit, and the compile verb checks it like the other runtimes' artifacts.

The package computes in float32 (``compute_precision=FLOAT32``; coremltools' default for ML programs is float16,
which would not be the model npukit checked). INT8 uses iOS 17's ops: weights as ``constexpr_affine_dequantize``
(int8 per channel), activations as ``quantize`` / ``dequantize`` pairs on the plan's grids.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import logging
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from npukit.errors import InputError
from npukit.quant.emit.pt2e import CarryOptions
from npukit.runtime.tensors import plain_tensor

EXTRA_HINT = "install it with: .venv/bin/pip install 'npukit[coreml]' (scripts/setup.sh does)"
CARRY = CarryOptions()  # coremltools converts PT2E's q/dq ops as carried for ExecuTorch (fixed grids, folded weights)
NOT_HERE = "Core ML runs models on macOS (and iOS) only"


def require() -> None:
    """coremltools (and ExecuTorch, whose PT2E annotation npukit's plan is carried on) are installed, or an
    InputError that says how to install them."""
    for module in ("coremltools", "executorch"):
        if importlib.util.find_spec(module) is None:
            raise InputError(f"the coreml target needs {module}, which is not installed", hint=EXTRA_HINT)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's Enum registration notice


def cannot_run() -> str | None:
    """Why this machine cannot run a Core ML package (None on macOS)."""
    return None if sys.platform == "darwin" else NOT_HERE


def unhonoured_floats(lowered: Any, qdq: Any) -> str | None:
    """None: not found out for Core ML (whether its converter keeps a plan's float layers float is not measured; off
    macOS the package's grids are compared with the plan's by ``compile``, on macOS its run is checked with the
    task)."""
    return None


@dataclasses.dataclass(frozen=True)
class Lowered:
    """A converted ML Program: the coremltools model, its operators by type."""

    model: Any  # coremltools.models.MLModel, in memory (its MIL program readable)
    ops: dict[str, int]

    def summary(self) -> dict[str, Any]:
        return {"ops": dict(self.ops), "format": "mlprogram", "minimum_deployment_target": "iOS17",
                "compute_precision": "float32"}

    def table(self) -> tuple[str, list[str], list[list[Any]]]:
        compute = sum(n for op, n in self.ops.items() if not op.startswith(("const", "constexpr_")))
        quantized = self.ops.get("constexpr_affine_dequantize", 0)
        return ("Core ML ML Program (iOS 17, float32 compute)",
                ["operators (constants aside)", "int8 weights (constexpr_affine_dequantize)", "operator types"],
                [[compute, quantized, ", ".join(f"{k} x{v}" for k, v in sorted(self.ops.items())
                                                 if not k.startswith("const"))]])

    def write(self, output: Path) -> None:
        """Saved as a package directory, atomically: written beside ``output`` and moved into place whole (a
        package already there is replaced only once the new one is complete)."""
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
        new, old = staging / output.name, staging / "replaced"
        try:
            self.model.save(str(new))
            if output.exists():
                output.rename(old)
            try:
                new.rename(output)
            except BaseException:
                if old.exists() and not output.exists():  # put the previous package back
                    old.rename(output)
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def lower(program: torch.nn.Module, example: Sequence[torch.Tensor], *,
          names: tuple[Sequence[str], Sequence[str]] | None = None) -> Lowered:
    """``program`` (eager or PT2E-converted) exported, decomposed to ATen and converted by coremltools to an ML
    Program with float32 compute (its progress bars kept off the terminal). ``names``: the model's input and output
    names, given to the package's features (without them an INT8 package's output is named after its last
    dequantize op)."""
    import coremltools as ct

    example = tuple(plain_tensor(x) for x in example)
    exported = torch.export.export(program, example).run_decompositions({})
    features = {}
    if names is not None:
        features = {"inputs": [ct.TensorType(name=n, shape=tuple(x.shape)) for n, x in zip(names[0], example)],
                    "outputs": [ct.TensorType(name=n) for n in names[1]]}
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            model = ct.convert(exported, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
                               compute_precision=ct.precision.FLOAT32, **features)
    except Exception as exc:  # noqa: BLE001 - any failure inside coremltools is the model's, said in one line
        line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise InputError(f"coremltools could not convert this model to Core ML: {line}",
                         hint="try --target executorch-xnnpack or litert, or npukit quantize on its ONNX export") \
            from exc
    ops: dict[str, int] = {}
    for function in model._mil_program.functions.values():
        for op in function.operations:
            ops[op.op_type] = ops.get(op.op_type, 0) + 1
    return Lowered(model=model, ops=ops)


def package_interface(path: str | Path) -> dict[str, dict[str, list[int]]]:
    """The saved package reloaded (not compiled: that needs macOS): its inputs and outputs with their shapes."""
    import coremltools as ct

    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    return {"inputs": {i.name: list(i.type.multiArrayType.shape) for i in spec.description.input},
            "outputs": {o.name: list(o.type.multiArrayType.shape) for o in spec.description.output}}


def package_grids(lowered: Lowered) -> tuple[set[tuple[float, int]], list[tuple[np.ndarray, np.ndarray]]]:
    """The integer grids the ML Program holds: activation grids (scale, zero point as int8: a uint8 one less 128)
    of its ``quantize`` ops, and each int8 weight's integers with its per-channel scales."""
    grids: set[tuple[float, int]] = set()
    weights: list[tuple[np.ndarray, np.ndarray]] = []
    for function in lowered.model._mil_program.functions.values():
        for op in function.operations:
            if op.op_type == "quantize":
                # coremltools writes an int8 grid with zero point -128 as uint8 with no zero point (0): the same
                # grid, compared here as int8
                zero = 0 if op.zero_point is None else int(np.asarray(op.zero_point.val).reshape(-1)[0])
                zero -= 128 if str(op.output_dtype.val) == "uint8" else 0
                scale = float(np.asarray(op.scale.val).reshape(-1)[0]) * _normalized_by(op)
                grids.add((round(scale, 9), zero))
            elif op.op_type == "constexpr_affine_dequantize":
                weights.append((np.asarray(op.quantized_data.val), np.asarray(op.scale.val).reshape(-1)))
    return grids, weights


def _normalized_by(quantize: Any) -> float:
    """coremltools' ``distributive_quantized_binary_op_scale_normalization`` rewrites q(dq(x; s_x) + dq(y; s_y); s_z)
    as q(dq(x; s_x / s_y) + dq(y; 1); s_z / s_y), the same grid of z in units of s_y, so that its backend fuses one
    scale (add or sub, a relu between allowed): the s_y to multiply ``quantize``'s scale by to read the grid planned
    for z (1 where nothing was rewritten). s_y is the real scale of the quantize that wrote y: where that quantize was
    itself rewritten (ResNet's identity shortcuts: one block's add reads the previous block's), its own s_y too."""
    tail = quantize.input.op
    if tail is not None and tail.op_type == "relu":
        tail = tail.x.op
    if tail is None or tail.op_type not in ("add", "sub"):
        return 1.0
    for side in (tail.x, tail.y):
        dq = side.op
        if dq is not None and dq.op_type == "dequantize" and np.asarray(dq.scale.val).size == 1 \
                and float(np.asarray(dq.scale.val).reshape(-1)[0]) == 1.0 and dq.input.op is not None \
                and dq.input.op.op_type == "quantize":
            return float(np.asarray(dq.input.op.scale.val).reshape(-1)[0]) * _normalized_by(dq.input.op)
    return 1.0


class Runner:
    """A package loaded by Core ML on its CPU compute unit (macOS only). Float arrays in and out, in the program's
    input and output order."""

    def __init__(self, path: str | Path, *, threads: int = 1) -> None:
        import coremltools as ct

        if cannot_run():
            raise InputError(f"cannot run {path}: {NOT_HERE}", hint="run it on a Mac, or use another --target")
        self.model = ct.models.MLModel(str(path), compute_units=ct.ComputeUnit.CPU_ONLY)
        spec = self.model.get_spec()
        self.inputs = [i.name for i in spec.description.input]
        self.outputs = [o.name for o in spec.description.output]

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        result = self.model.predict(dict(zip(self.inputs, feeds.values())))
        return [np.asarray(result[name]) for name in self.outputs]
