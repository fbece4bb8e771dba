"""The CLI tests' factories (``tinynet:tiny``, ...) importable by module name, as a user's own module would be."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _factory_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
