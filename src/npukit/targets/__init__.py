"""Target profiles (one module per backend, as data), operator-support analysis and partitioning, and fixes."""

from npukit.targets.api import analyze_model
from npukit.targets.fix import FIXES, FixResult, apply_fixes
from npukit.targets.partition import Analysis, analyze
from npukit.targets.profile import OpRule, TargetProfile
from npukit.targets.registry import TARGETS, get_target

__all__ = ["FIXES", "TARGETS", "Analysis", "FixResult", "OpRule", "TargetProfile", "analyze", "analyze_model",
           "apply_fixes", "get_target"]
