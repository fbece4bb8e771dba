"""npukit.passes: graph rewrites on onnx-ir models, the default pipeline and its numerical check."""

from npukit.passes.base import NpukitPass, PassManager, PassRecord, PipelineResult
from npukit.passes.pipeline import DEFAULT_ORDER, PASS_REGISTRY, default_pipeline, optimize_model, verify_equivalent

__all__ = [
    "DEFAULT_ORDER",
    "PASS_REGISTRY",
    "NpukitPass",
    "PassManager",
    "PassRecord",
    "PipelineResult",
    "default_pipeline",
    "optimize_model",
    "verify_equivalent",
]
