"""The default pass pipeline, the registry of passes by name, and a numerical check of an optimized model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from npukit.config import OptimizeConfig
from npukit.errors import InputError, NumericCheckError
from npukit.measure.compare import OutputErrors, compare_outputs
from npukit.passes.base import NpukitPass, PassManager, PipelineResult
from npukit.passes.canonicalize_activation import CanonicalizeActivationPass
from npukit.passes.fold_batch_norm import FoldBatchNormPass
from npukit.passes.fold_constants import FoldConstantsPass
from npukit.passes.fuse_matmul_add import FuseMatMulAddPass
from npukit.passes.remove_dead_code import RemoveDeadCodePass
from npukit.passes.remove_identity import RemoveIdentityPass
from npukit.runtime.ort import ModelLike, make_session, random_feeds, run

PASS_REGISTRY: dict[str, type[NpukitPass]] = {
    "fold_constants": FoldConstantsPass,
    "remove_identity": RemoveIdentityPass,
    "fold_batch_norm": FoldBatchNormPass,
    "fuse_matmul_add": FuseMatMulAddPass,
    "canonicalize_activation": CanonicalizeActivationPass,
    "remove_dead_code": RemoveDeadCodePass,
}

# Folding first exposes constant weights and shapes to the fusions; the second folding cleans up what the fusions
# left constant; dead code goes last so every orphan is gone.
DEFAULT_ORDER: tuple[str, ...] = (
    "fold_constants",
    "remove_identity",
    "fold_batch_norm",
    "fuse_matmul_add",
    "canonicalize_activation",
    "fold_constants",
    "remove_dead_code",
)


def default_pipeline(*, skip: Sequence[str] = ()) -> list[NpukitPass]:
    """Fresh pass instances in DEFAULT_ORDER, leaving out the passes named in ``skip`` (every occurrence)."""
    unknown = sorted(set(skip) - set(PASS_REGISTRY))
    if unknown:
        raise InputError(f"unknown pass name(s): {', '.join(unknown)}",
                         hint=f"valid names: {', '.join(PASS_REGISTRY)}")
    factories: list[Callable[[], NpukitPass]] = [PASS_REGISTRY[name] for name in DEFAULT_ORDER if name not in skip]
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
) -> OutputErrors:
    """Run both models on ORT CPU on the same seeded random inputs and return their worst disagreement.

    The reference runs with graph optimizations disabled, the candidate with ORT's default optimizations. Outputs are
    matched by name; errors are max |candidate - reference| / max |reference| over all ``samples`` inputs per
    output. Raises NumericCheckError when an output's relative error exceeds ``rtol``.
    """
    if samples < 1:
        raise InputError("samples must be at least 1")
    ref_session = make_session(reference, optimization="disable")
    cand_session = make_session(candidate)
    names = [o.name for o in ref_session.get_outputs()]
    missing = sorted(set(names) - {o.name for o in cand_session.get_outputs()})
    if missing:
        raise NumericCheckError(f"the optimized model lacks output(s) {', '.join(missing)}",
                                hint="report the model; a pass renamed a graph output")
    ref_runs, cand_runs = [], []
    for i in range(samples):
        feeds = random_feeds(ref_session, seed=seed + i)
        ref_runs.append(run(ref_session, feeds))
        cand_runs.append([np.asarray(o) for o in cand_session.run(names, feeds)])
    errors = compare_outputs(
        [np.stack([r[k] for r in ref_runs]) for k in range(len(names))],
        [np.stack([c[k] for c in cand_runs]) for k in range(len(names))],
    )
    if not errors.within(rtol):
        worst = max(range(len(names)), key=lambda k: errors.per_output[k][1])
        raise NumericCheckError(
            f"optimized model differs from the original: output {names[worst]!r} max relative error "
            f"{errors.max_rel:.3g} > rtol {rtol:g}",
            hint="rerun skipping passes one by one (--skip-pass NAME) to find the one at fault, and report the model",
        )
    return errors
