"""The float head chosen by accuracy (``float_head_macs``): the MAC share, the pick among scored prefixes, and
quantize's use of it."""

from __future__ import annotations


import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.measure.summary import summarize
from npukit.quant.config import FloatHead, Precision, QuantConfig, Recipe, Scheme, from_flat
from npukit.quant.precision.scored_head import TIE_DB, affordable, choose_scored_heads, pick
from npukit.quant.qdq import SCORED_HEAD, decided_floats, keep_decided_floats, quantize


def _stem_model():
    """x[1,3,16,16] -> stem 3x3 (3 -> 8) -> Clip -> dw 3x3 (8) -> Clip -> pw (8 -> 16) -> Relu -> pw (16 -> 16) ->
    GAP -> Flatten -> Gemm (16 -> 10). The stem's weights on very different scales per channel and its input range
    wide, so that 8-bit rounding there costs the outputs."""
    rng = np.random.default_rng(0)
    stem = rng.normal(size=(8, 3, 3, 3)) * (10.0 ** rng.uniform(-1.5, 1.5, 8))[:, None, None, None]
    arrays = {"w0": stem, "b0": rng.normal(size=8), "w1": rng.normal(size=(8, 1, 3, 3)), "b1": rng.normal(size=8),
              "w2": rng.normal(size=(16, 8, 1, 1)) * 0.3, "b2": rng.normal(size=16) * 0.1,
              "w3": rng.normal(size=(16, 16, 1, 1)) * 0.3, "b3": rng.normal(size=16) * 0.1,
              "wf": rng.normal(size=(10, 16)) * 0.3, "bf": rng.normal(size=10) * 0.1, "lo": np.float32(0.0),
              "hi": np.float32(6.0)}
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="stem", pads=[1] * 4),
             helper.make_node("Clip", ["c0", "lo", "hi"], ["a0"], name="clip0"),
             helper.make_node("Conv", ["a0", "w1", "b1"], ["c1"], name="dw", pads=[1] * 4, group=8),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"], name="clip1"),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], name="pw2"),
             helper.make_node("Relu", ["c2"], ["a2"], name="relu2"),
             helper.make_node("Conv", ["a2", "w3", "b3"], ["c3"], name="pw3"),
             helper.make_node("GlobalAveragePool", ["c3"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _samples(n: int = 12) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": (rng.standard_normal((1, 3, 16, 16)) * 3.0).astype(np.float32)} for _ in range(n)]


def test_the_affordable_prefix_stops_at_the_share_and_at_unknown_macs() -> None:
    macs = {"a": 10, "b": 20, "c": 30, "d": None}
    assert affordable(("a", "b", "c"), macs, 100, 0.3) == ("a", "b")
    assert affordable(("a", "b", "c"), macs, 100, 0.6) == ("a", "b", "c")
    assert affordable(("a", "b", "c"), macs, 100, 0.05) == ()
    assert affordable(("a", "d", "c"), macs, 100, 1.0) == ("a",)  # unknown MACs: not counted as free


def test_the_shortest_prefix_within_the_tie_of_the_best_wins() -> None:
    assert pick({0: 18.0, 1: 19.0, 2: 20.0, 3: 20.05}) == 2  # the third conv buys less than TIE_DB
    assert pick({0: 18.0, 1: 19.0, 2: 20.0, 3: 20.0 + 2 * TIE_DB}) == 3
    assert pick({0: 25.0, 1: 24.0}) == 0  # nothing pays: all quantized
    assert pick({0: 18.0}) == 0


def test_choose_scores_every_affordable_prefix_and_spends_the_share_once() -> None:
    model = _stem_model()
    macs = {row.name: row.macs for row in summarize(model).layers}
    total = sum(m or 0 for m in macs.values())
    built: list[tuple[str, ...]] = []

    def build(prefix):
        built.append(prefix)
        return model

    def score(models):  # more float, more accurate: each conv adds 1 dB
        return {k: 10.0 + k for k in models}

    share = (macs["stem"] + macs["dw"]) / total
    (head,) = choose_scored_heads(model, ["stem"], macs=macs, total=total, share=share, build=build, score=score)
    assert head.chain == ("stem", "dw") and head.nodes == ("stem", "dw")  # pw2 would exceed the share
    assert built == [(), ("stem",), ("stem", "dw")]
    assert head.mac_share[2] == pytest.approx(share)
    assert head.summary()["sqnr_db"] == {"0": 10.0, "1": 11.0, "2": 12.0}


def test_quantize_keeps_the_scored_head_float_with_its_decision() -> None:
    model, samples = _stem_model(), _samples()
    config = QuantConfig(scheme=Scheme(activation_dtype="int8"),
                         recipe=Recipe(score_on="reference"),
                         precision=Precision(float_head=FloatHead("accuracy", 0.5)))
    result = quantize(model, samples, config=config)
    record = result.steps.float_head_scored
    assert record is not None and record["score_on"] == "reference"
    (head,) = record["heads"]
    assert head["stem"] == "stem" and set(head["sqnr_db"]) == {str(k) for k in range(len(head["chain"]) + 1)}
    best = max(head["sqnr_db"].values())
    chosen = len(head["nodes"])
    assert head["sqnr_db"][str(chosen)] >= best - TIE_DB
    assert all(head["sqnr_db"][str(k)] < best - TIE_DB for k in range(chosen))  # nothing shorter was as good
    assert head["mac_share"][str(len(head["chain"]))] <= 0.5
    assert tuple(record["nodes"]) == tuple(head["nodes"]) == result.steps.float_head_nodes
    for node in head["nodes"]:
        assert result.plan.float_nodes[node][-1] == SCORED_HEAD
    assert set(head["nodes"]) <= set(decided_floats(result))
    # the planners' rebuild without deciding anew gives the model quantize built
    again = quantize(model, samples, config=keep_decided_floats(config, result))
    assert again.model.SerializeToString() == result.model.SerializeToString()
    assert again.steps.float_head_scored is None


def test_on_this_model_the_stem_pays_for_its_macs() -> None:
    """The stem's channels span three decades and its input is wide: rounding there costs most, so the head keeps
    at least the stem in float, and the model with it is closer to the float model than the one without."""
    config = QuantConfig(scheme=Scheme(activation_dtype="int8"), recipe=Recipe(score_on="reference"),
                         precision=Precision(float_head=FloatHead("accuracy", 0.5)))
    result = quantize(_stem_model(), _samples(), config=config)
    head = result.steps.float_head_scored["heads"][0]
    assert head["nodes"][:1] == ["stem"]
    assert head["sqnr_db"][str(len(head["nodes"]))] > head["sqnr_db"]["0"] + TIE_DB


def test_a_share_too_small_for_the_stem_leaves_everything_quantized() -> None:
    model, samples = _stem_model(), _samples()
    base = QuantConfig(scheme=Scheme(activation_dtype="int8"), recipe=Recipe(score_on="reference"))
    small = quantize(model, samples, config=base.with_precision(float_head=FloatHead("accuracy", 0.001)))
    assert small.steps.float_head_scored["nodes"] == []
    assert small.steps.float_head_scored["heads"][0]["chain"] == []
    assert small.model.SerializeToString() == quantize(model, samples, config=base).model.SerializeToString()


def test_the_timed_and_the_scored_head_are_not_both_given() -> None:
    with pytest.raises(InputError, match="float_head_macs"):  # one FloatHead in the parts; the flat names refuse both
        from_flat(float_stem=True, float_head_macs=0.1)
    with pytest.raises(InputError, match="must be in"):
        QuantConfig(precision=Precision(float_head=FloatHead("accuracy", 1.5)))
