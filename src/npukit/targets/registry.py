"""Target profiles by name: ``get_target("qnn-htp")``, ``get_target("nnapi@30")``, ``get_target("qnn-htp@SM8350")``."""

from __future__ import annotations

from collections.abc import Callable

from npukit.errors import InputError
import npukit.targets.coreml as coreml
import npukit.targets.cpu as cpu
import npukit.targets.executorch_xnnpack as executorch_xnnpack
import npukit.targets.litert as litert
import npukit.targets.litert_xnnpack as litert_xnnpack
import npukit.targets.nnapi as nnapi
import npukit.targets.qnn_htp as qnn_htp
import npukit.targets.xnnpack as xnnpack
from npukit.targets.profile import TargetProfile

TARGETS: list[str] = ["cpu", "qnn-htp", "nnapi", "coreml", "xnnpack", "executorch-xnnpack", "litert", "litert-xnnpack"]


def _nnapi(variant: str | None) -> TargetProfile:
    if variant is None:
        return nnapi.profile()
    if not variant.isdigit() or int(variant) not in nnapi.API_LEVELS:
        raise InputError(f"unknown NNAPI API level {variant!r}",
                         hint=f"use nnapi@LEVEL with LEVEL one of {', '.join(map(str, nnapi.API_LEVELS))}")
    return nnapi.profile(int(variant))


def _qnn(variant: str | None) -> TargetProfile:
    if variant is None:
        return qnn_htp.PROFILE
    part = variant.upper()
    if part not in qnn_htp.SOCS:
        valid = ", ".join(f"{s.part} ({s.name})" for s in qnn_htp.SOCS.values())
        raise InputError(f"unknown Snapdragon SoC {variant!r}", hint=f"use qnn-htp@SOC with SOC one of {valid}")
    return qnn_htp.profile(part)


def _plain(name: str, build: Callable[[], TargetProfile]) -> Callable[[str | None], TargetProfile]:
    def get(variant: str | None) -> TargetProfile:
        if variant is not None:
            raise InputError(f"target {name!r} has no variants (got {name}@{variant})", hint=f"use {name}")
        return build()
    return get


_BUILDERS: dict[str, Callable[[str | None], TargetProfile]] = {
    "cpu": _plain("cpu", cpu.profile),
    "qnn-htp": _qnn,
    "nnapi": _nnapi,
    "coreml": _plain("coreml", lambda: coreml.PROFILE),
    "xnnpack": _plain("xnnpack", lambda: xnnpack.PROFILE),
    "executorch-xnnpack": _plain("executorch-xnnpack", lambda: executorch_xnnpack.PROFILE),
    "litert": _plain("litert", lambda: litert.PROFILE),
    "litert-xnnpack": _plain("litert-xnnpack", lambda: litert_xnnpack.PROFILE),
}


# names users bring for a target (a runtime's former name, its file suffix, its vendor's SDK) -> npukit's name
OTHER_NAMES: dict[str, str] = {
    "tflite": "litert", "tfl": "litert", "tensorflow-lite": "litert", "tensorflowlite": "litert", "lite-rt": "litert",
    "executorch": "executorch-xnnpack", "pte": "executorch-xnnpack", "pytorch-mobile": "executorch-xnnpack",
    "et": "executorch-xnnpack", "qnn": "qnn-htp", "htp": "qnn-htp", "snpe": "qnn-htp", "qualcomm": "qnn-htp",
    "hexagon": "qnn-htp", "mlpackage": "coreml", "core-ml": "coreml", "ane": "coreml", "ort": "cpu",
    "onnxruntime": "cpu", "x86": "cpu", "arm": "cpu",
}


def named(name: str) -> str | None:
    """npukit's name for a target a user named otherwise (``tflite`` -> ``litert``), variant kept; None if none."""
    base, at, variant = name.strip().lower().partition("@")
    ours = OTHER_NAMES.get(base.replace("_", "-").replace(" ", "-"))
    return f"{ours}{at}{variant}" if ours else None


def get_target(name: str) -> TargetProfile:
    """The profile called ``name`` ("TARGET" or "TARGET@VARIANT"); an unknown name raises InputError."""
    base, _, variant = name.strip().lower().partition("@")
    if base not in _BUILDERS:
        ours = named(name)
        raise InputError(f"unknown target {name!r}",
                         hint=f"did you mean --target {ours}?" if ours else
                         f"valid targets: {', '.join(TARGETS)} (variants: nnapi@27..31, qnn-htp@SM8550, ...)")
    return _BUILDERS[base](variant or None)
