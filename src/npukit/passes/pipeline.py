"""The default pass pipeline, the registry of passes by name, and a numerical check of an optimized model."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from npukit.config import OptimizeConfig
from npukit.errors import InputError, NumericCheckError
from npukit.measure.compare import ABS_FLOOR, OutputErrors, compare_outputs, stacked_runs
from npukit.passes.base import NpukitPass, PassManager, PipelineResult
from npukit.passes.canonicalize_activation import CanonicalizeActivationPass
from npukit.passes.fold_batch_norm import FoldBatchNormPass
from npukit.passes.fold_constants import FoldConstantsPass
from npukit.passes.fold_conv_affine import FoldConvAffinePass
from npukit.passes.fuse_matmul_add import FuseMatMulAddPass
from npukit.passes.initializers_as_constants import InitializersAsConstantsPass
from npukit.passes.remove_dead_code import RemoveDeadCodePass
from npukit.passes.remove_identity import RemoveIdentityPass
from npukit.passes.share_initializers import ShareInitializersPass
from npukit.runtime.ort import ModelLike, make_session, random_feeds, run

PASS_REGISTRY: dict[str, type[NpukitPass]] = {
    "initializers_as_constants": InitializersAsConstantsPass,
    "fold_constants": FoldConstantsPass,
    "remove_identity": RemoveIdentityPass,
    "fold_batch_norm": FoldBatchNormPass,
    "fold_conv_affine": FoldConvAffinePass,
    "fuse_matmul_add": FuseMatMulAddPass,
    "canonicalize_activation": CanonicalizeActivationPass,
    "remove_dead_code": RemoveDeadCodePass,
    "share_initializers": ShareInitializersPass,
}

# Initializers that are also graph inputs become constants first (else nothing folds them); folding then exposes
# constant weights and shapes to the fusions; the second folding cleans up what the fusions left constant; dead code
# goes last so every orphan is gone.
DEFAULT_ORDER: tuple[str, ...] = (
    "initializers_as_constants",
    "fold_constants",
    "remove_identity",
    "fold_batch_norm",
    "fold_conv_affine",
    "fuse_matmul_add",
    "canonicalize_activation",
    "fold_constants",
    "remove_dead_code",
    "share_initializers",
)


def _name_key(name: str) -> str:
    """"FoldBatchNormPass", "fold_batch_norm", "foldbatchnorm", "Fold-Batch-Norm" -> "foldbatchnorm"."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return key[: -len("pass")] if key.endswith("pass") and len(key) > len("pass") else key


def resolve_pass_names(names: Sequence[str]) -> tuple[str, ...]:
    """Registry names for ``names``, each given as the registry name (fold_batch_norm) or the class name the pass
    table prints (FoldBatchNormPass), case-insensitively; an unknown name is an InputError listing the valid ones."""
    by_key: dict[str, str] = {}
    for registry_name, cls in PASS_REGISTRY.items():
        by_key[_name_key(registry_name)] = registry_name
        by_key[_name_key(cls.__name__)] = registry_name
    unknown = [n for n in names if _name_key(n) not in by_key]
    if unknown:
        valid = ", ".join(f"{name} ({cls.__name__})" for name, cls in PASS_REGISTRY.items())
        raise InputError(f"unknown pass name(s): {', '.join(unknown)}", hint=f"valid names: {valid}")
    return tuple(dict.fromkeys(by_key[_name_key(n)] for n in names))


def default_pipeline(*, skip: Sequence[str] = ()) -> list[NpukitPass]:
    """Fresh pass instances in DEFAULT_ORDER, leaving out the passes named in ``skip`` (every occurrence; names as
    ``resolve_pass_names`` takes them)."""
    skipped = set(resolve_pass_names(skip))
    factories: list[Callable[[], NpukitPass]] = [PASS_REGISTRY[name] for name in DEFAULT_ORDER if name not in skipped]
    return [factory() for factory in factories]


def optimize_model(model: ir.Model, *, config: OptimizeConfig) -> PipelineResult:
    """Run the default pipeline (minus ``config.skip_passes``) on ``model`` in place, checking the graph after each pass.

    Numerical verification is the caller's job (see ``verify_equivalent``).
    """
    return PassManager(default_pipeline(skip=config.skip_passes))(model)


def verify_equivalent(
    reference: ModelLike,
    candidate: ModelLike,
    *,
    rtol: float,
    seed: int = 0,
    samples: int = 2,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    atol: float = ABS_FLOOR,
    what: str = "optimized model",
    hint: str = "rerun skipping passes one by one (--skip-pass NAME) to find the one at fault, and report the model",
) -> OutputErrors:
    """Run both models on ORT CPU on the same inputs and return their worst disagreement.

    The inputs are ``feeds`` (real data, e.g. calibration samples) when given, else ``samples`` seeded random ones.
    The reference runs with graph optimizations disabled, the candidate with ORT's default optimizations. Outputs are
    matched by name; an output fails when its max |candidate - reference| over all inputs exceeds
    ``rtol * max |reference| + atol``: scaled to that output's range, with a floor (``ABS_FLOOR``) for float32
    rounding, so a tiny-range output is no false alarm while a real error still fails. Raises NumericCheckError
    naming the worst failing output; ``what`` names the candidate and ``hint`` says what to try.

    ORT's own optimizations can move a model's outputs by more than that on their own: on a deep TF-converted
    U-Net its NCHWc layout transform reorders the convolutions' float32 sums and the softmax output of the
    *unmodified* model moves by 4.5e-3. So when an output fails, a control is run: the reference under the
    candidate's optimizations. Where that moves the outputs, the candidate passes only if (a) run without ORT's
    optimizations, exactly like the reference, it is within the tolerance above (what the rewrites themselves
    changed), and (b) as deployed, each output is within its tolerance plus twice the control's deviation there
    (ORT reorders the candidate's sums differently, by as much but not the same way);
    ``OutputErrors.runtime_allowance`` holds that allowance. A model ORT runs identically either way gets none.
    """
    if feeds is None and samples < 1:
        raise InputError("samples must be at least 1")
    if feeds is not None and not feeds:
        raise InputError("no inputs to verify on", hint="give at least one feed dict")
    ref_session = make_session(reference, optimization="disable")
    cand_session = make_session(candidate)
    names = [o.name for o in ref_session.get_outputs()]
    missing = sorted(set(names) - {o.name for o in cand_session.get_outputs()})
    if missing:
        raise NumericCheckError(f"the {what} lacks output(s) {', '.join(missing)}",
                                hint="report the model; a pass renamed a graph output")
    inputs = list(feeds) if feeds is not None else [random_feeds(ref_session, seed=seed + i) for i in range(samples)]
    ref_runs, cand_runs = [], []
    for sample in inputs:
        ref_runs.append(run(ref_session, sample))
        cand_runs.append([np.asarray(o) for o in cand_session.run(names, dict(sample))])
    errors = compare_outputs(stacked_runs(ref_runs), stacked_runs(cand_runs))
    failing = errors.failing(rtol, atol)
    if failing:
        errors = _with_runtime_allowance(reference, candidate, inputs, ref_runs, errors, names=names, rtol=rtol,
                                         atol=atol)
        failing = errors.failing(rtol, atol)
    if failing:
        worst = failing[0]
        abs_err, rel_err = errors.per_output[worst]
        raise NumericCheckError(
            f"{what} differs from the original: output {names[worst]!r} max abs error {abs_err:.3g} > "
            f"{errors.allowed(worst, rtol, atol):.3g} allowed (rtol {rtol:g} x max |reference| "
            f"{errors.scales[worst]:.3g} + {atol:g}; relative error {rel_err:.3g})",
            hint=hint,
        )
    return errors


def optimization_allowance(reference: ModelLike, inputs: Sequence[Mapping[str, np.ndarray]],
                           ref_runs: Sequence[Sequence[np.ndarray]]) -> tuple[float, ...]:
    """Per output, twice what ORT's default graph optimizations move the unmodified ``reference``'s outputs by on
    ``inputs`` (``ref_runs``: its outputs there with no optimizations): all 0 where ORT runs it the same either way.
    A float32 sum taken in another order moves a deep U-Net's outputs by 4.3e-3 of their range; a rewrite, or
    another runtime, reorders them differently, by as much but not the same way."""
    as_deployed = make_session(reference)
    names = [o.name for o in as_deployed.get_outputs()]
    control = compare_outputs(stacked_runs(ref_runs),
                              stacked_runs([as_deployed.run(names, dict(f)) for f in inputs]))
    return tuple(2 * err for err, _ in control.per_output)


def _with_runtime_allowance(reference: ModelLike, candidate: ModelLike, inputs: Sequence[Mapping[str, np.ndarray]],
                            ref_runs: Sequence[Sequence[np.ndarray]], errors: OutputErrors, *, names: Sequence[str],
                            rtol: float, atol: float) -> OutputErrors:
    """``errors`` with ``runtime_allowance`` set when ORT's optimizations move the unmodified reference's outputs and
    the candidate, run without them, is within tolerance (see ``verify_equivalent``); else ``errors`` unchanged."""
    allowance = optimization_allowance(reference, inputs, ref_runs)  # the reference as the candidate is run
    if not any(allowance):
        return errors
    plain = make_session(candidate, optimization="disable")
    rewrites = compare_outputs(stacked_runs(ref_runs), stacked_runs([plain.run(names, dict(f)) for f in inputs]))
    if rewrites.failing(rtol, atol):
        return errors
    return dataclasses.replace(errors, runtime_allowance=allowance)
