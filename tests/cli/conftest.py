"""The CLI tests' factories (``tinynet:tiny``, ...) importable by module name, as a user's own module would be."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from npukit.cli import main


@pytest.fixture(autouse=True)
def _factory_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """``tinynet:tiny`` exported (with its HTML report) once per test module."""
    out = tmp_path_factory.mktemp("export") / "tiny.onnx"
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        assert main(["export", "tinynet:tiny", "-o", str(out), "--input-shape", "1,3,32,32", "--html"]) == 0
    finally:
        sys.path.remove(str(Path(__file__).parent))
    return out
