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


def test_a_floor_stretches_the_head_past_the_share_only_as_far_as_it_must() -> None:
    """Summed over outputs, a small output below the check's floor hides behind a good score: with a floor the head
    may take a larger share, the shortest prefix whose every output reaches it (MTCNN's RNet: a 24% stem)."""
    from npukit.quant.precision.scored_head import Floor

    model = _stem_model()
    macs = {row.name: row.macs for row in summarize(model).layers}
    total = sum(m or 0 for m in macs.values())
    share = 0.5 * macs["stem"] / total  # not even the stem within the share
    worst_of = {(): 17.0, ("stem",): 19.0, ("stem", "dw"): 21.0, ("stem", "dw", "pw2"): 23.0,
                ("stem", "dw", "pw2", "pw3"): 24.0}
    built: list[tuple[str, ...]] = []

    def build(prefix):
        built.append(prefix)
        return prefix  # the "model" is its prefix, for worst() to read

    def worst(models):
        return {k: worst_of[m] for k, m in models.items()}

    def choose(floor_db, floor_share):
        built.clear()
        floor = Floor(floor_db, floor_share, worst)
        (head,) = choose_scored_heads(model, ["stem"], macs=macs, total=total, share=share, build=build,
                                      score=lambda ms: {k: 30.0 for k in ms}, floor=floor)
        return head

    head = choose(20.0, 1.0)
    assert head.nodes == ("stem", "dw") and head.stretched and head.worst_db[2] == 21.0
    assert head.mac_share[2] == pytest.approx((macs["stem"] + macs["dw"]) / total)
    assert head.summary()["stretched_to_floor"] and head.summary()["worst_output_db"]["0"] == 17.0
    head = choose(16.0, 1.0)  # reached quantized whole: nothing stretched, nothing longer built
    assert head.nodes == () and not head.stretched and built == [()]
    head = choose(30.0, 1.0)  # no prefix reaches it: the choice stands (the check then says what failed)
    assert head.nodes == () and not head.stretched
    head = choose(20.0, (macs["stem"] + 1) / total)  # the stem alone fits the larger share, but reaches 19 dB only
    assert head.nodes == () and head.worst_db == {0: 17.0, 1: 19.0}


def test_quantize_records_the_floor_and_the_worst_outputs() -> None:
    model, samples = _stem_model(), _samples()
    head = FloatHead("accuracy", 0.001, floor_db=200.0, floor_share=0.5, floor_outputs=("y",))  # none reaches it
    result = quantize(model, samples, config=QuantConfig(scheme=Scheme(activation_dtype="int8"),
                                                         recipe=Recipe(score_on="reference"),
                                                         precision=Precision(float_head=head)))
    record = result.steps.float_head_scored
    assert record["floor_db"] == 200.0 and record["floor_share"] == 0.5 and record["nodes"] == []
    assert record["floor_outputs"] == ["y"]
    worst = record["heads"][0]["worst_output_db"]
    assert {"0", "1"} <= set(worst)  # the whole model and the longer prefixes within 50% of the MACs, all scored
    assert all(v < 200.0 for v in worst.values())
    with pytest.raises(InputError, match="floor share"):
        FloatHead("accuracy", 0.1, floor_db=20.0, floor_share=0.05, floor_outputs=("y",))
    with pytest.raises(InputError, match="names the outputs"):
        FloatHead("accuracy", 0.1, floor_db=20.0, floor_share=0.3)
    with pytest.raises(InputError, match="must be finite"):
        FloatHead("accuracy", 0.1, floor_db=float("nan"), floor_share=0.3, floor_outputs=("y",))
    with pytest.raises(InputError, match="no MAC share or floor"):
        FloatHead("latency", floor_db=20.0)
