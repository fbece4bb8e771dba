"""The npukit verbs as Python functions (one module each in ``npukit.verbs``); the CLI is a thin shell over these.

Every verb that writes an artifact also writes a JSON report beside it (``model.onnx`` -> ``model.report.json``)
and, with ``html=True``, a self-contained HTML report (``model.report.html``). Each returns a ``CommandResult``.
"""

from __future__ import annotations

from npukit.report.finish import CommandResult, report_path_for
from npukit.verbs.analyze import analyze
from npukit.verbs.bench import bench
from npukit.verbs.common import is_qdq
from npukit.verbs.compile import compile, quantize_for_htp  # noqa: A004 - the verb's name
from npukit.verbs.devices import devices
from npukit.verbs.export import export
from npukit.verbs.inspect import inspect
from npukit.verbs.optimize import optimize
from npukit.verbs.optimize_graph import optimize_graph
from npukit.verbs.plan_memory import plan_memory
from npukit.verbs.prune import prune
from npukit.verbs.qat import qat
from npukit.verbs.quantize import cpu_scheme, quantize
from npukit.verbs.serve_bench import serve_bench
from npukit.verbs.substitute import substitute

from npukit.report.capture import reported  # noqa: E402 - the verbs' library messages and notes into their reports

analyze, bench, compile, devices, export, inspect, optimize, optimize_graph, plan_memory, prune, qat, quantize, \
    serve_bench, substitute = (reported(v) for v in (  # noqa: A001 - compile is the verb's name
        analyze, bench, compile, devices, export, inspect, optimize, optimize_graph, plan_memory, prune, qat,
        quantize, serve_bench, substitute))

__all__ = ["CommandResult", "analyze", "bench", "compile", "cpu_scheme", "devices", "export", "inspect", "is_qdq",
           "optimize", "optimize_graph", "plan_memory", "prune", "qat", "quantize", "quantize_for_htp",
           "report_path_for", "serve_bench", "substitute"]
