"""npukit: PyTorch/ONNX -> fast, small, verified artifacts for phones and NPUs, with the numbers to prove it.

Every CLI verb is a function here (``optimize-graph`` as ``optimize_graph``, ...) taking the flags as keyword
arguments, most named as the flags with underscores; many are not, so read each function's signature
(``help(npukit.quantize)``). Among them: ``eval_data`` for ``--eval``, ``timeout_s`` for ``--time-budget``,
``rules`` for ``--rule``, ``targets`` for analyze's ``--target``, ``report_path`` for ``--report`` (and inspect's
``--json``), ``skip_passes`` / ``verify`` for ``--skip-pass`` / ``--no-verify``, ``gate=QualityGate(...)`` for
``--min-task-metric`` / ``--min-sqnr`` / ``--accept-degraded``, ``preprocess=`` for ``--size`` / ``--mean`` /
``--std``, budgets as fractions (``budget=0.01`` for ``--budget 1%``). Each returns a ``CommandResult`` (the
report, the artifact and report paths, and the verb's typed result object). ``result.report.passed`` is False
where the CLI would exit 1, and ``result.report.verdict`` is the report's one-line verdict.
"""

__version__ = "0.1.0"

from npukit.api import (  # noqa: E402
    CommandResult,
    analyze,
    bench,
    compile,
    devices,
    export,
    inspect,
    optimize,
    optimize_graph,
    plan_memory,
    prune,
    qat,
    quantize,
    serve_bench,
    substitute,
)
from npukit.demo_pipeline import demo  # noqa: E402
from npukit.tasks import QualityGate  # noqa: E402

__all__ = ["__version__", "CommandResult", "QualityGate", "analyze", "bench", "compile", "demo", "devices", "export",
           "inspect", "optimize", "optimize_graph", "plan_memory", "prune", "qat", "quantize", "serve_bench",
           "substitute", "Runtime", "RuntimeConfig", "Overloaded"]


def __getattr__(name: str):
    """``npukit.Runtime`` / ``npukit.RuntimeConfig`` (the serving runtime) and ``npukit.Overloaded`` (what its full
    queue raises), imported on first use."""
    if name in ("Runtime", "RuntimeConfig", "Overloaded"):
        from npukit.runtime import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'npukit' has no attribute {name!r}")
