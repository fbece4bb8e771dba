"""The report: every figure a command measured, the resolved config and the package versions, as one JSON document."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any

from npukit._atomic import write_text_atomic

_PACKAGES = ("npukit", "torch", "torchvision", "onnx", "onnxruntime", "onnxscript", "onnx-ir", "numpy", "rich")


# packages a verb may have used (module -> distribution): listed where this process imported them (the converter
# and runtime of a .pte / .tflite / .mlpackage, the search's), so a report names what made its artifact
_USED = {"executorch": "executorch", "litert_torch": "litert-torch", "ai_edge_litert": "ai-edge-litert",
         "ai_edge_quantizer": "ai-edge-quantizer", "coremltools": "coremltools", "torchao": "torchao",
         "optuna": "optuna", "ray": "ray"}


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str | None]:
    """The versions of npukit's own dependencies, of onnxruntime-qnn where installed (the QNN EP's build), of the
    optional packages this process imported (``_USED``), and of ``extra``."""
    import sys

    used = tuple(dist for module, dist in _USED.items() if module in sys.modules)
    out: dict[str, str | None] = {}
    for name in _PACKAGES + ("onnxruntime-qnn",) + used + extra:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "onnxruntime-qnn":
                out[name] = None
    return out


@dataclasses.dataclass
class Table:
    """A table for the terminal and the HTML report; rows are lists of plain values."""

    title: str
    columns: list[str]
    rows: list[list[Any]]

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "columns": self.columns, "rows": self.rows}


@dataclasses.dataclass
class Figure:
    """A plot for the HTML report. kind: 'bar' (labels, values) or 'line'/'scatter' (series of x, y)."""

    title: str
    kind: str
    data: dict[str, Any]
    x_label: str = ""
    y_label: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Report:
    """Collects what one command did. ``sections`` hold JSON-ready figures; tables and figures feed the renderers."""

    def __init__(self, command: str, *, config: dict[str, Any] | None = None, title: str | None = None) -> None:
        self.command = command
        self.title = title or f"npukit {command}"
        self.config: dict[str, Any] = dict(config or {})
        self.sections: dict[str, Any] = {}
        self.tables: list[Table] = []
        self.figures: list[Figure] = []
        self.artifacts: dict[str, str] = {}
        self.started = _dt.datetime.now(_dt.timezone.utc)
        self.timings: dict[str, float] = {}
        self.verdict: str | None = None  # the one-line verdict that starts the report ("PASS ...", "FAIL ...")
        self.passed: bool = True  # False: the artifact failed its checks (the CLI exits 1)

    def set_verdict(self, line: str, *, passed: bool) -> None:
        """The report's one-line verdict; ``passed=False`` makes the command exit 1."""
        self.verdict = " ".join(line.split())
        self.passed = passed

    @property
    def degraded(self) -> bool:
        """Passed only because the user accepted a result below its floors (--accept-degraded, or a gate with
        ``accept_degraded``): a reader of ``passed`` alone took it for a pass."""
        return bool(self.verdict and self.verdict.startswith("DEGRADED"))

    def add(self, key: str, value: Any) -> None:
        self.sections[key] = value

    def add_table(self, title: str, columns: list[str], rows: list[list[Any]]) -> Table:
        table = Table(title, list(columns), [list(r) for r in rows])
        self.tables.append(table)
        return table

    def add_figure(self, title: str, kind: str, data: dict[str, Any], *, x_label: str = "", y_label: str = "") -> None:
        self.figures.append(Figure(title, kind, data, x_label, y_label))

    def add_artifact(self, role: str, path: str | Path) -> None:
        self.artifacts[role] = str(path)

    def to_dict(self) -> dict[str, Any]:
        return {
            "npukit_report": 1,
            "verdict": self.verdict,
            "passed": self.passed,
            "degraded": self.degraded,
            "command": self.command,
            "title": self.title,
            "created": self.started.isoformat(timespec="seconds"),
            "config": self.config,
            "artifacts": self.artifacts,
            "timings_s": self.timings,
            "results": self.sections,
            "tables": [t.as_dict() for t in self.tables],
            "figures": [f.as_dict() for f in self.figures],
            "environment": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "machine": platform.machine(),
                "packages": package_versions(),
            },
        }

    def to_json(self) -> str:
        return json.dumps(_finite(self.to_dict()), indent=2, default=_json_default, allow_nan=False)

    def write_json(self, path: str | Path) -> Path:
        return write_text_atomic(path, self.to_json() + "\n")


def _finite(value: Any) -> Any:
    """Strict JSON has no NaN/Infinity: write them as the strings "nan", "inf", "-inf"."""
    import math

    import numpy as np

    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")
