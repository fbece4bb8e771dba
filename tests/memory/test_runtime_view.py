from __future__ import annotations

import pytest

from npukit.errors import InputError
from npukit.memory.lifetimes import analyze_lifetimes
from npukit.memory.runtime_view import VIEWS, ExecutionModel, build_view, get_view

from .tiny import conv_add, conv_relu_add, qdq_conv


def test_cpu_view_fuses_runs_in_place_and_aliases():
    graph = build_view(conv_relu_add(), view="cpu")
    assert [n.op for n in graph.nodes] == ["Conv+Relu", "MaxPool", "Add", "Reshape"]
    lt = analyze_lifetimes(graph, view="cpu")
    buffers = {t.name: (t.size, t.start, t.end, t.tensors) for t in lt.tensors}
    # Relu fused: c never exists. Add writes into r (dies there, same size); Reshape is a view of that buffer,
    # which therefore lives to the end as the graph output s.
    assert buffers == {
        "x": (128, 0, 2, ("x",)),
        "r": (128, 0, 3, ("r", "a", "s")),
        "m": (32, 1, 3, ("m",)),
        "idx": (64, 1, 1, ("idx",)),
    }
    assert [s.live_bytes for s in lt.steps] == [256, 352, 288, 160]
    assert lt.peak_bytes == 352 < analyze_lifetimes(conv_relu_add()).peak_bytes == 416


def test_int8_views_shrink_float_activations_only():
    lt = analyze_lifetimes(conv_relu_add(), view="cpu-int8")
    sizes = {t.name: t.size for t in lt.tensors}
    assert sizes == {"x": 32, "r": 32, "m": 8, "idx": 64}  # the int64 indices keep their width
    assert lt.peak_bytes == 32 + 32 + 8 + 64


def test_conv_add_relu_becomes_one_fused_conv_with_z():
    graph = build_view(conv_add(relu=True), view="cpu")
    assert [(n.op, n.inputs, n.outputs) for n in graph.nodes] == [("Conv+Add+Relu", ("x",), ("y",))]
    # x is a graph input: ORT never writes into it, so y gets its own buffer.
    assert analyze_lifetimes(graph).peak_bytes == 256
    assert analyze_lifetimes(conv_add(relu=True)).peak_bytes == 384
    assert [n.op for n in build_view(conv_add(relu=False), view="unfused").nodes] == ["Conv", "Add"]


def test_qdq_model_keeps_its_quantized_tensors():
    graph = build_view(qdq_conv(), view="qnn-htp")
    assert [n.op for n in graph.nodes] == ["QuantizeLinear", "DequantizeLinear", "Conv+QuantizeLinear",
                                           "DequantizeLinear"]
    lt = analyze_lifetimes(graph)
    assert {t.name: (t.size, t.start, t.end) for t in lt.tensors} == {
        "x": (128, 0, 0), "xq": (32, 0, 2), "yq": (32, 2, 3)}
    assert lt.peak_bytes == 160
    # As exported, every float tensor between the Q/DQ pairs is a buffer of its own: xd and y meet at the Conv.
    assert analyze_lifetimes(qdq_conv()).peak_bytes == 128 + 128


def test_unknown_view_lists_the_valid_ones():
    with pytest.raises(InputError) as info:
        get_view("tpu")
    assert all(name in info.value.hint for name in VIEWS)
    with pytest.raises(InputError, match="activation_bytes"):
        ExecutionModel("odd", "three-byte activations", activation_bytes=3)
