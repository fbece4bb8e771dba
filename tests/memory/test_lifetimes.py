from __future__ import annotations

import pytest

from npukit.errors import InputError
from npukit.memory.lifetimes import GRAPH_INPUT, Lifetimes, analyze_lifetimes

from .tiny import conv_relu_add


def _by_name(lifetimes: Lifetimes) -> dict[str, tuple[int, int, int]]:
    return {t.name: (t.size, t.start, t.end) for t in lifetimes.tensors}


def test_hand_computed_lifetimes_on_the_exported_graph():
    lt = analyze_lifetimes(conv_relu_add())
    assert lt.order == ("conv", "relu", "pool", "add", "reshape")  # the Constant node is a weight, not a step
    assert _by_name(lt) == {
        "x": (128, 0, 3),    # graph input: from step 0 to its last reader, add
        "c": (128, 0, 1),
        "r": (128, 1, 3),
        "m": (32, 2, 4),     # graph output: to the end
        "idx": (64, 2, 2),   # nobody reads it: dies at birth
        "a": (128, 3, 4),
        "s": (128, 4, 4),
    }
    assert [s.live_bytes for s in lt.steps] == [256, 384, 352, 416, 288]
    assert [s.new_bytes for s in lt.steps] == [128, 128, 96, 128, 128]
    assert lt.peak_bytes == 416
    assert {t.name for t in lt.live_at(3)} == {"x", "r", "m", "a"}
    assert next(t for t in lt.tensors if t.name == "x").producer == GRAPH_INPUT


def test_a_given_order_is_used_and_checked():
    lt = analyze_lifetimes(conv_relu_add(), order=["conv", "relu", "add", "pool", "reshape"])
    assert _by_name(lt)["x"] == (128, 0, 2)
    with pytest.raises(InputError, match="before one of its inputs"):
        analyze_lifetimes(conv_relu_add(), order=["relu", "conv", "pool", "add", "reshape"])
    with pytest.raises(InputError, match="unknown node 'nope'"):
        analyze_lifetimes(conv_relu_add(), order=["nope", "conv", "pool", "add", "reshape"])


def test_input_shape_resolves_symbolic_dims_and_unresolved_ones_ask_for_it():
    model = conv_relu_add(input_dims=("N", 2, "H", "W"))
    with pytest.raises(InputError) as info:
        analyze_lifetimes(model)
    assert "--input-shape" in info.value.one_line()
    lt = analyze_lifetimes(model, input_shape=(1, 2, 4, 4))
    assert lt.peak_bytes == 416
    assert analyze_lifetimes(model, input_shape=(1, 2, 8, 8)).peak_bytes == 4 * 416


def test_from_intervals_rejects_bad_ranges():
    assert Lifetimes.from_intervals([("a", 8, 0, 1), ("b", 4, 1, 2)]).live_bytes() == [8, 12, 4]
    with pytest.raises(InputError, match="invalid"):
        Lifetimes.from_intervals([("a", 8, 2, 1)])
