"""The float head: the stem's chain of convolutions, the choice among its timed prefixes, and quantize's use of it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.quant.config import FloatHead, Precision, QuantConfig, Scheme
from npukit.quant.cpu.float_head import HeadChoice, choose_float_head, pick_prefix, slower_rounds, stem_chain


def _chain_model(*, branch_after: int = 3, tail_output: bool = False):
    """x -> stem 3x3 (3 -> 8) -> Clip -> dw 3x3 (8) -> Relu -> pw (8 -> 8) -> pw (8 -> 8) -> ... where the output of
    conv number ``branch_after`` (1-based) also feeds an Add with itself's successor."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.normal(size=(8, 1, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(size=(8, 8, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(size=(8, 8, 1, 1)).astype(np.float32), "w3"),
             numpy_helper.from_array(rng.normal(size=(8, 8, 1, 1)).astype(np.float32), "w4"),
             numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(6.0), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="stem", pads=[1] * 4),
             helper.make_node("Clip", ["c0", "lo", "hi"], ["a0"], name="clip0"),
             helper.make_node("Conv", ["a0", "w1"], ["c1"], name="dw", pads=[1] * 4, group=8),
             helper.make_node("Relu", ["c1"], ["a1"], name="relu1"),
             helper.make_node("Conv", ["a1", "w2"], ["c2"], name="pw2"),
             helper.make_node("Conv", ["c2", "w3"], ["c3"], name="pw3"),
             helper.make_node("Conv", ["c3", "w4"], ["c4"], name="pw4")]
    source = {1: "a0", 2: "c1", 3: "c2", 4: "c3"}[branch_after]
    nodes.append(helper.make_node("Add", [source, "c4"], ["y"], name="add"))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])]
    if tail_output:
        outputs.append(helper.make_tensor_value_info("c2", TensorProto.FLOAT, [1, 8, 8, 8]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_chain_follows_sole_consumers_through_activations_and_stops_at_a_branch() -> None:
    assert stem_chain(_chain_model(branch_after=4), "stem") == ["stem", "dw", "pw2", "pw3"]  # MAX_CONVS
    assert stem_chain(_chain_model(branch_after=4), "stem", max_convs=2) == ["stem", "dw"]
    assert stem_chain(_chain_model(branch_after=3), "stem") == ["stem", "dw", "pw2"]  # c2 feeds pw3 and the Add
    assert stem_chain(_chain_model(branch_after=2), "stem") == ["stem", "dw"]
    assert stem_chain(_chain_model(branch_after=1), "stem") == ["stem"]  # the Clip's output branches
    assert stem_chain(_chain_model(branch_after=4, tail_output=True), "stem") == ["stem", "dw"]  # c2 is an output


def _rounds(*medians: float, spread: float = 0.0, n: int = 20) -> list[float]:
    """``n`` round ratios around ``medians[0]``: half at +spread, half at -spread."""
    return [medians[0] * (1.0 + (spread if i % 2 else -spread)) for i in range(n)]


def test_the_longest_prefix_not_clearly_slower_than_the_fastest_wins() -> None:
    assert pick_prefix({1: _rounds(1.0), 2: _rounds(0.97), 3: _rounds(0.95), 4: _rounds(1.2)}) == 3
    assert pick_prefix({1: _rounds(1.0), 2: _rounds(0.97), 3: _rounds(0.975), 4: _rounds(1.2)}) == 3  # the longer
    assert pick_prefix({1: _rounds(1.0), 2: _rounds(1.05), 3: _rounds(1.1)}) == 1
    assert pick_prefix({1: _rounds(1.0)}) == 1
    # 2.1% slower by the median, but over the noise in only half the rounds: not clearly slower, the longer wins
    # (the median rule's bound sat right at such a cost, and the choice flipped between runs)
    assert pick_prefix({1: _rounds(1.0), 2: _rounds(0.964), 3: _rounds(0.964 * 1.021, spread=0.01)}) == 3
    assert slower_rounds({1: _rounds(1.0), 2: _rounds(0.964), 3: _rounds(0.964 * 1.021, spread=0.01)}) == \
        {1: 20, 2: 0, 3: 10}
    # slower in 15 of 20 rounds: clearly slower
    mostly = [0.964 * (1.03 if i < 15 else 1.0) for i in range(20)]
    assert pick_prefix({1: _rounds(1.0), 2: _rounds(0.964), 3: mostly}) == 2


def test_choose_times_every_prefix_and_stops_before_kept_nodes() -> None:
    from npukit.quant.qdq import build_qdq

    model = _chain_model(branch_after=4)
    feeds = {"x": np.random.default_rng(1).normal(size=(1, 3, 8, 8)).astype(np.float32)}
    ranges = {t: (-8.0, 8.0) for t in ("x", "c0", "a0", "c1", "a1", "c2", "c3", "c4", "y")}
    built: list[tuple[str, ...]] = []

    def build(prefix: tuple[str, ...]):
        built.append(prefix)
        return build_qdq(model, feeds, QuantConfig(scheme=Scheme(exclude=prefix)), ranges, {})

    choice = choose_float_head(model, "stem", feeds, build)
    assert built == [("stem",), ("stem", "dw"), ("stem", "dw", "pw2"), ("stem", "dw", "pw2", "pw3")]
    assert set(choice.ratios) == {1, 2, 3, 4} and choice.ratios[1] == pytest.approx(1.0)
    assert set(choice.slower_rounds) == {1, 2, 3, 4} and min(choice.slower_rounds.values()) == 0  # the fastest
    assert choice.nodes == choice.chain[:max(k for k, n in choice.slower_rounds.items() if n < 15)]
    built.clear()
    kept = choose_float_head(model, "stem", feeds, build, keep=frozenset({"pw2"}))
    assert kept.chain == ("stem", "dw") and len(built) == 2
    alone = choose_float_head(model, "stem", feeds, build, keep=frozenset({"dw"}))
    assert alone == HeadChoice(nodes=("stem",), chain=("stem",), ratios={})


def test_quantize_leaves_the_chosen_head_in_float_and_reports_its_timings() -> None:
    from npukit.quant.qdq import quantize

    model = _chain_model(branch_after=4)
    rng = np.random.default_rng(2)
    samples = [{"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    result = quantize(model, samples, config=QuantConfig(precision=Precision(float_head=FloatHead())))
    step = result.steps.float_stem
    (head,) = step["heads"]
    assert head["chain"] == ["stem", "dw", "pw2", "pw3"] and set(head["latency_ratio_to_stem_only"]) == {"1", "2",
                                                                                                       "3", "4"}
    assert step["nodes"] == head["nodes"] and step["nodes"][0] == "stem"
    rows = {r["node"]: r for r in result.per_layer}
    for node in ("stem", "dw", "pw2", "pw3", "pw4"):
        assert rows[node]["quantized"] == (node not in step["nodes"]), node


def test_quantize_names_unnamed_nodes_so_the_head_excludes_only_itself() -> None:
    from npukit.quant.qdq import integer_kernel_report, quantize

    model = _chain_model(branch_after=4)
    for node in model.graph.node:
        node.name = ""  # an exclusion of "" would otherwise leave every Conv in float
    rng = np.random.default_rng(2)
    samples = [{"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    result = quantize(model, samples, config=QuantConfig(precision=Precision(float_head=FloatHead())))
    head = result.steps.float_stem["nodes"]
    assert head and head[0] == "Conv_0" and "" not in head
    rows = {r["node"]: r for r in result.per_layer}
    assert rows["Conv_6"]["quantized"]  # the fifth conv is past the chain's limit of four: never in the head
    assert integer_kernel_report(result.model)["integer_fraction"] > 0
