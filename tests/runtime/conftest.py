"""Skip QNN tests cleanly when the onnxruntime-qnn plugin is not installed; the XNNPACK graphs ExecuTorch's
lowering serializes, for the tests of npukit's edge passes."""

from __future__ import annotations

import importlib.util

import pytest

HAVE_QNN = importlib.util.find_spec("onnxruntime_qnn") is not None

requires_qnn = pytest.mark.skipif(not HAVE_QNN, reason="onnxruntime_qnn is not importable (pip install onnxruntime-qnn)")


@pytest.fixture
def xnn_graphs(monkeypatch):
    """The XNNPACK graphs the next lowerings serialize, as (node kind, its output's datatype) lists."""
    import executorch.backends.xnnpack.xnnpack_preprocess as preprocess

    graphs: list[list[tuple[str, str]]] = []
    serialize = preprocess.serialize_xnnpack_binary

    def spy(graph, *args, **kwargs):
        values = {}
        for value in graph.xvalues:
            tensor = getattr(value.xvalue_union, "tensor_value", value.xvalue_union)
            values[tensor.id_out] = tensor.datatype.name.removeprefix("xnn_datatype_")
        graphs.append([(type(n.xnode_union).__name__.removeprefix("XNN"),
                        values.get(getattr(n.xnode_union, "output_id", None))) for n in graph.xnodes])
        return serialize(graph, *args, **kwargs)

    monkeypatch.setattr(preprocess, "serialize_xnnpack_binary", spy)
    return graphs
