"""Fixtures for the frontend tests: the tiny-model factories on sys.path and a small hand-built ONNX model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).parent


@pytest.fixture
def factories(monkeypatch: pytest.MonkeyPatch) -> str:
    """Put tiny_models.py on sys.path; returns the module name to use in ``module:factory`` specs."""
    monkeypatch.syspath_prepend(str(HERE))
    return "tiny_models"


def make_matmul_model(batch: int | str = "batch", *, width: int = 3) -> onnx.ModelProto:
    """y = relu(x @ W + b) with x: [batch, 4] -> y: [batch, width]."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, width)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])],
        initializer=[w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


@pytest.fixture
def matmul_onnx(tmp_path: Path) -> Path:
    path = tmp_path / "matmul.onnx"
    onnx.save(make_matmul_model(), path)
    return path
