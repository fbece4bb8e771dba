"""Tiny ONNX CNNs built with onnx.helper for the quantization tests."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.runtime.ort import make_session, run


def tiny_cnn(*, seed: int = 0, activation: str = "Relu", spread: float = 1.0, opset: int = 17) -> onnx.ModelProto:
    """x[1,4,8,8] -> Conv 3x3 (4->8) -> act -> depthwise 3x3 -> act -> Conv 1x1 (8->6) -> GAP -> Flatten -> Gemm.

    ``spread`` scales output channels of the first two convs by 10**U(-spread, spread): unequal ranges for CLE.
    """
    rng = np.random.default_rng(seed)

    def chan(n: int) -> np.ndarray:
        return 10.0 ** rng.uniform(-spread, spread, n)

    w1 = rng.standard_normal((8, 4, 3, 3)) * 0.3 * chan(8)[:, None, None, None]
    b1 = rng.standard_normal(8) * 0.5 + 0.5
    w2 = rng.standard_normal((8, 1, 3, 3)) * 0.4 * chan(8)[:, None, None, None]
    b2 = rng.standard_normal(8) * 0.3 + 1.0
    w3 = rng.standard_normal((6, 8, 1, 1)) * 0.4
    b3 = rng.standard_normal(6) * 0.1
    w4 = rng.standard_normal((5, 6)) * 0.5
    b4 = rng.standard_normal(5) * 0.1
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in
             [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2), ("w3", w3), ("b3", b3), ("w4", w4), ("b4", b4)]]

    def act(name: str, src: str, dst: str) -> list[onnx.NodeProto]:
        if activation == "Relu":
            return [helper.make_node("Relu", [src], [dst], name=name)]
        if activation == "LeakyRelu":
            return [helper.make_node("LeakyRelu", [src], [dst], name=name, alpha=0.1)]
        if activation == "PRelu":  # a slope per channel
            inits.append(numpy_helper.from_array(rng.uniform(0.05, 0.3, (8, 1, 1)).astype(np.float32),
                                                 f"{name}_slope"))
            return [helper.make_node("PRelu", [src, f"{name}_slope"], [dst], name=name)]
        inits.extend([numpy_helper.from_array(np.float32(0.0), f"{name}_lo"),
                      numpy_helper.from_array(np.float32(6.0), f"{name}_hi")])
        return [helper.make_node("Clip", [src, f"{name}_lo", f"{name}_hi"], [dst], name=name)]

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        *act("act1", "c1", "a1"),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], name="dw", pads=[1, 1, 1, 1], group=8),
        *act("act2", "c2", "a2"),
        helper.make_node("Conv", ["a2", "w3", "b3"], ["c3"], name="pw"),
        helper.make_node("GlobalAveragePool", ["c3"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def make_samples(n: int, *, seed: int = 1, shape=(1, 4, 8, 8)) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def outputs(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]]) -> np.ndarray:
    session = make_session(model)
    return np.stack([run(session, s)[0] for s in samples])


@pytest.fixture(autouse=True)
def _empty_memos():
    """Each test starts from empty in-process memos (``npukit.quant.memo``): one that counts what a calibration runs
    sees it run, whatever an earlier test calibrated on the same model and samples."""
    from npukit.quant import memo

    memo.clear()
    yield
    memo.clear()


@pytest.fixture
def relu_model() -> onnx.ModelProto:
    return tiny_cnn(activation="Relu")


@pytest.fixture
def clip_model() -> onnx.ModelProto:
    return tiny_cnn(activation="Clip")
