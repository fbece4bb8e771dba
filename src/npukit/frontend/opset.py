"""Raise a model's ONNX opset to what a step needs (per-channel Q/DQ: 13; 16-bit Q/DQ: 21), verified.

``onnx.version_converter`` rewrites the ops whose signature changed between opsets; the converted model is run beside
the original in ONNX Runtime on the same inputs (calibration samples where the verb has them, else seeded random
ones) and must match within a tolerance scaled to each output's range, or nothing goes further.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from npukit.errors import InputError
from npukit.frontend._messages import first_line
from npukit.frontend.onnx_io import complete_output_shapes, shapeless_outputs
from npukit.measure.compare import compare_outputs
from npukit.runtime.ort import make_session, random_feeds, run

PER_CHANNEL_QDQ_OPSET = 13  # the axis attribute of QuantizeLinear / DequantizeLinear
SIXTEEN_BIT_QDQ_OPSET = 21  # int16 / uint16 QuantizeLinear / DequantizeLinear in the ONNX domain


@dataclasses.dataclass(frozen=True)
class OpsetUpgrade:
    """An opset conversion and how its outputs compared with the original's."""

    from_opset: int
    to_opset: int
    reason: str
    inputs: str  # what the two models were run on
    samples: int
    max_abs_error: float
    max_rel_error: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def onnx_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def ensure_opset(
    model: onnx.ModelProto,
    minimum: int,
    *,
    reason: str,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    rtol: float = 1e-4,
    alternative: str = "",
) -> tuple[onnx.ModelProto, OpsetUpgrade | None]:
    """``model`` itself when its opset is ``minimum`` or more; else the model converted to ``minimum`` and verified
    (``reason`` says what needs it, ``alternative`` what the user can do instead, both shown in errors).

    The check runs both models with ORT's graph optimizations off on ``feeds`` (at most 4 of them) or two seeded
    random inputs, and fails when an output's max abs error exceeds rtol * max |original| + ``ABS_FLOOR``. A
    conversion that fails or changes the outputs is an InputError (exit 2): it is the converter's limit, not a fault
    of the model, and the message says so, with what the user can do (``alternative``, or bring a copy of the model
    at that opset: a third-party file cannot be re-exported by its user). A graph output left without a shape is
    given one from shape inference first (``complete_output_shapes``); a model that fails the checker before any
    conversion is named as such, not blamed on the converter."""
    current = onnx_opset(model)
    if current >= minimum:
        return model, None
    what = f"converting the model from opset {current} to {minimum} (which {reason} needs)"
    # What a user can do with a third-party file: the alternative the verb offers first, else bring an opset-N file.
    todo = ((f"{alternative}; or " if alternative else "")
            + f"pass a copy of the model at opset {minimum} or later (exported from its source with that opset, "
              "or converted by another tool)")
    model = complete_output_shapes(model)  # ONNX requires a shape on each graph output; the checker below too
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:  # the model as npukit prepared it, before any conversion
        raise InputError(f"{what}: the model fails the ONNX checker before conversion ({first_line(exc)}; graph "
                         f"outputs without a shape: {', '.join(map(repr, shapeless_outputs(model))) or 'none'})",
                         hint="report the model: npukit's preparation left it invalid") from exc
    except Exception:  # noqa: BLE001 - not a verdict on the model (over protobuf's 2 GB): the conversion tells
        pass
    try:
        converted = onnx.version_converter.convert_version(model, minimum)
        onnx.checker.check_model(converted)
    except Exception as exc:  # the converter raises RuntimeError, ValidationError, ...
        raise InputError(f"{what} failed in onnx.version_converter: {first_line(exc)}", hint=todo) from exc
    try:
        reference = make_session(model, optimization="disable")
        candidate = make_session(converted, optimization="disable")
    except InputError as exc:
        raise InputError(f"{what}: ONNX Runtime cannot load the converted model ({exc.message})", hint=todo) from exc
    inputs = [dict(f) for f in feeds][:4] if feeds else [random_feeds(reference, seed=i) for i in range(2)]
    names = [o.name for o in reference.get_outputs()]
    refs = [run(reference, f) for f in inputs]
    gots = [[np.asarray(o) for o in candidate.run(names, f)] for f in inputs]
    errors = compare_outputs([np.concatenate([r[k].reshape(-1) for r in refs]) for k in range(len(names))],
                             [np.concatenate([g[k].reshape(-1) for g in gots]) for k in range(len(names))])
    failing = errors.failing(rtol)
    if failing:
        k = failing[0]
        raise InputError(f"{what} changed output {names[k]!r}: max abs error {errors.per_output[k][0]:.3g} > "
                         f"{errors.allowed(k, rtol):.3g} allowed (onnx.version_converter's rewrite, not the model, "
                         "is at fault)", hint=todo)
    return converted, OpsetUpgrade(
        from_opset=current, to_opset=minimum, reason=reason,
        inputs="calibration samples" if feeds else "seeded random inputs", samples=len(inputs),
        max_abs_error=errors.max_abs, max_rel_error=errors.max_rel)

