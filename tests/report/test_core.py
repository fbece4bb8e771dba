"""The environment a report records: the versions of what made its artifact."""

from __future__ import annotations

import sys
import types

from npukit.report.core import package_versions


def test_reports_name_the_optional_packages_this_process_used(monkeypatch) -> None:
    """A .pte / .tflite / .mlpackage report listed torch and onnxruntime but not executorch, litert-torch,
    ai-edge-litert or coremltools, which made the artifact; an HTP report not onnxruntime-qnn."""
    monkeypatch.delitem(sys.modules, "coremltools", raising=False)
    assert "coremltools" not in package_versions()  # not imported: not listed
    monkeypatch.setitem(sys.modules, "coremltools", types.ModuleType("coremltools"))
    versions = package_versions()
    assert "coremltools" in versions and versions["npukit"]
    assert "onnxruntime-qnn" in versions or not _installed("onnxruntime-qnn")


def _installed(name: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
