"""Skip QNN tests cleanly when the onnxruntime-qnn plugin is not installed."""

from __future__ import annotations

import importlib.util

import pytest

HAVE_QNN = importlib.util.find_spec("onnxruntime_qnn") is not None

requires_qnn = pytest.mark.skipif(not HAVE_QNN, reason="onnxruntime_qnn is not importable (pip install onnxruntime-qnn)")
