"""``analyze`` as one stage: analyze a model for several targets, each after the target's fixes when asked, as one
typed ``ModelAnalysis`` (the analyze verb writes the fixed models; ``npukit.report.analyze`` presents it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import onnx

from npukit.errors import InputError
from npukit.targets.fix import FixResult, apply_fixes
from npukit.targets.partition import Analysis, analyze
from npukit.targets.profile import TargetProfile
from npukit.targets.registry import get_target


@dataclasses.dataclass(frozen=True)
class ModelAnalysis:
    """Per target, in the order asked: its profile and its analysis (of the fixed model with ``fix``), and with
    ``fix`` what the target's fixes did (target name -> ``FixResult``, the fixed model in it)."""

    profiles: tuple[TargetProfile, ...]
    analyses: tuple[Analysis, ...]
    fix: bool = False
    fixes: Mapping[str, FixResult] = dataclasses.field(default_factory=dict)
    input_shape: tuple[int, ...] | None = None


def analyze_model(
    model_path: str | Path | onnx.ModelProto,
    targets: list[str],
    *,
    input_shape: tuple[int, ...] | None = None,
    fix: bool = False,
) -> ModelAnalysis:
    """Analyze the model for each target (after the target's fixes when ``fix``, each verified against the model).

    Raises InputError for an unknown target, no targets, or when no target takes any node of the model (the message
    names the ops and what to do).
    """
    from npukit.frontend.onnx_io import load_onnx

    if not targets:
        raise InputError("no target given", hint="pass --target, e.g. --target qnn-htp")
    profiles = tuple(get_target(t) for t in targets)
    model = model_path if isinstance(model_path, onnx.ModelProto) else load_onnx(model_path)
    analyses: list[Analysis] = []
    fixes: dict[str, FixResult] = {}
    for profile in profiles:
        candidate = model
        if fix:
            try:
                fixes[profile.name] = apply_fixes(model, profile, input_shape=input_shape)
            except InputError as exc:  # say that --fix is what needs it (the analysis alone runs without)
                raise InputError(f"--fix for {profile.name} checks the fixed model on seeded inputs: {exc.message}",
                                 hint=exc.hint) from exc
            candidate = fixes[profile.name].model
        shape = input_shape if not fix else None  # a fixed model already carries the input shape
        analyses.append(analyze(candidate, profile, input_shape=shape))
    failed = [a for a in analyses if a.problem()]
    if failed and len(failed) == len(analyses):
        raise InputError("; ".join(f.problem() for f in failed), hint=failed[0].hint())  # type: ignore[misc]
    return ModelAnalysis(profiles=profiles, analyses=tuple(analyses), fix=fix, fixes=fixes, input_shape=input_shape)
