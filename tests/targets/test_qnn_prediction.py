"""What the QNN EP does to a model before it checks nodes: ORT's basic optimizations, and the EP's own fusions."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper, numpy_helper

from npukit.targets import analyze, get_target
from tests.targets._models import make, vi


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def test_nodes_ort_folds_or_eliminates_are_reported_removed_not_placed():
    nodes = [helper.make_node("Identity", ["x"], ["a"], name="id"),
             helper.make_node("Neg", ["c"], ["nc"], name="neg"),  # constant input: folded
             helper.make_node("Add", ["a", "nc"], ["y"], name="add")]
    model = make(nodes, [vi("x", [1, 4])], [vi("y", None)], [_const("c", np.ones(4))])
    a = analyze(model, get_target("qnn-htp"))
    assert sorted(a.removed) == ["id", "neg"]
    assert [v.name for v in a.nodes] == ["add"] and a.delegated_nodes == 1
    assert any("remove 2 nodes" in n for n in a.notes)
    cpu = analyze(model, get_target("cpu"))  # the profile does not ask for ORT's optimizations: analysed as given
    assert cpu.removed == () and len(cpu.nodes) == 3


def test_function_op_the_target_takes_is_not_inlined():
    # ORT's CPU EP has no HardSwish kernel and inlines it; behind the QNN EP, which takes HardSwish, it stays.
    nodes = [helper.make_node("HardSwish", ["x"], ["h"], name="hs"), helper.make_node("Relu", ["h"], ["y"], name="r")]
    model = make(nodes, [vi("x", [1, 3, 4, 4])], [vi("y", None)], opset=17)
    a = analyze(model, get_target("qnn-htp"))
    assert a.removed == () and [(v.name, v.supported) for v in a.nodes] == [("hs", True), ("r", True)]
    assert len(a.partitions) == 1


def _erf_gelu(*, leak: bool):
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["p"], name="add"),
             helper.make_node("Mul", ["p", "half"], ["h"], name="mul_half"),
             helper.make_node("Mul", ["x", "h"], ["y"], name="mul_x")]
    outputs = [vi("y", None)]
    if leak:  # the Erf result is used outside the pattern: the EP cannot fuse it
        nodes.append(helper.make_node("Neg", ["e"], ["z"], name="neg"))
        outputs.append(vi("z", None))
    inits = [_const("sqrt2", math.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5)]
    return make(nodes, [vi("x", [1, 8])], outputs, inits)


def test_erf_gelu_pattern_is_checked_as_the_fused_gelu():
    a = analyze(_erf_gelu(leak=False), get_target("qnn-htp"))
    assert all(v.supported and not v.reasons for v in a.nodes) and len(a.partitions) == 1
    leaked = analyze(_erf_gelu(leak=True), get_target("qnn-htp"))
    by_name = {v.name: v for v in leaked.nodes}
    assert not by_name["erf"].supported and by_name["erf"].reasons == ("Erf: not supported by Qualcomm HTP (QNN EP)",)
    assert by_name["div"].supported and by_name["mul_x"].supported


def test_hardsigmoid_mul_fuses_only_with_the_hardswish_constants():
    def model(alpha):
        nodes = [helper.make_node("HardSigmoid", ["x"], ["s"], name="hsig", alpha=alpha, beta=0.5),
                 helper.make_node("Mul", ["x", "s"], ["y"], name="mul")]
        return make(nodes, [vi("x", [1, 8])], [vi("y", None)])

    from npukit.frontend.graph_index import GraphIndex
    from npukit.targets.partition import _fusion_groups
    from npukit.targets.qnn_htp import FUSIONS

    fused = _fusion_groups(GraphIndex(model(1 / 6).graph), FUSIONS)
    assert [(f.into, members, root) for f, members, root in fused] == [("HardSwish", [0, 1], "x")]
    assert _fusion_groups(GraphIndex(model(0.2).graph), FUSIONS) == []


def test_model_ort_cannot_load_is_analysed_as_given_with_a_note():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Frobnicate", ["a"], ["y"], name="custom", domain="example.custom")]
    graph = helper.make_graph(nodes, "g", [vi("x", [1, 4])], [vi("y", [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("example.custom", 1)])
    a = analyze(model, get_target("qnn-htp"))
    assert any(n.startswith("analysed as given: ONNX Runtime's basic graph optimizations failed") for n in a.notes)
    assert [(v.name, v.supported) for v in a.nodes] == [("relu", True), ("custom", False)]


def _conv_qdq_output(last_op: str):
    s, z = _const("s", 0.1), numpy_helper.from_array(np.array(128, np.uint8), "z")
    w = _const("w", np.ones((2, 3, 1, 1)))
    tail = (helper.make_node("Conv", ["xd", "w"], ["t"], name="conv") if last_op == "Conv" else
            helper.make_node("Flatten", ["xd"], ["t"], name="flat"))
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_in"), tail,
             helper.make_node("QuantizeLinear", ["t", "s", "z"], ["tq"], name="q_out"),
             helper.make_node("DequantizeLinear", ["tq", "s", "z"], ["y"], name="dq_out")]
    return make(nodes, [vi("x", [1, 3, 4, 4])], [vi("y", None)], [s, z, w], opset=13)


def test_graph_output_dq_after_an_nhwc_op_goes_with_the_inserted_transpose():
    # Seen on the emulator (lraspp): Resize -> Q -> DQ -> output becomes ... -> DQ -> Transpose -> Q -> DQ -> output
    # and the original DQ is taken with the Transpose; after a layout-agnostic op it stays on the CPU.
    conv = {v.name: v for v in analyze(_conv_qdq_output("Conv"), get_target("qnn-htp")).nodes}
    flat = {v.name: v for v in analyze(_conv_qdq_output("Flatten"), get_target("qnn-htp")).nodes}
    assert conv["dq_out"].supported and not flat["dq_out"].supported


def test_transpose_to_nhwc_after_a_conv_is_cancelled_by_the_layout_transform():
    # Seen on the emulator (swin_t): Conv -> Transpose(0,2,3,1) leaves no Transpose; another perm stays.
    w = _const("w", np.ones((2, 3, 1, 1)))

    def model(perm):
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                 helper.make_node("Transpose", ["c"], ["t"], name="tr", perm=perm),
                 helper.make_node("Relu", ["t"], ["y"], name="relu")]
        return make(nodes, [vi("x", [1, 3, 4, 4])], [vi("y", None)], [w])

    a = analyze(model([0, 2, 3, 1]), get_target("qnn-htp"))
    assert a.removed == ("tr",) and [v.name for v in a.nodes] == ["conv", "relu"] and a.transitions == 0
    b = analyze(model([0, 1, 3, 2]), get_target("qnn-htp"))
    assert b.removed == () and len(b.nodes) == 3


def test_quantized_layernorm_with_int32_bias_is_predicted_rejected():
    # Seen on the emulator (swin_t): the same int8-weight LayerNorm passes with a uint8 bias, fails with int32.
    from npukit.targets.profile import NodeInfo, TensorInfo
    from npukit.targets.qnn_htp import OPS

    def node(bias_dtype):
        act = TensorInfo("uint8", (1, 4, 8))
        weight, bias = TensorInfo("int8", (8,), True), TensorInfo(bias_dtype, (8,), True)
        return NodeInfo("LayerNormalization", "", {}, (act, weight, bias), (act,), quantized=True)

    rule, dtypes = OPS["LayerNormalization"], frozenset({"uint8", "int8", "int32"})
    assert any("error 3110" in r for r in rule.failures(node("int32"), default_dtypes=dtypes, max_rank=5))
    assert rule.failures(node("uint8"), default_dtypes=dtypes, max_rank=5) == []


def test_weight_dq_shared_by_two_quantized_ops_counts_for_both():
    # ORT gives each op its own copy of a shared weight DQ (EnsureUniqueDQForNodeUnit); the original goes with the
    # first. Both quantized LayerNorms therefore see the int32 bias (seen on the emulator: vit_b_16's shared LN biases).
    s, z = _const("s", 0.1), numpy_helper.from_array(np.array(128, np.uint8), "z")
    ws, wz = _const("ws", 0.01), numpy_helper.from_array(np.array(0, np.int8), "wz")
    wq = numpy_helper.from_array(np.ones(8, np.int8), "wq")
    bq, bz = numpy_helper.from_array(np.zeros(8, np.int32), "bq"), numpy_helper.from_array(np.array(0, np.int32), "bz")
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="dq_w"),
             helper.make_node("DequantizeLinear", ["bq", "ws", "bz"], ["b"], name="dq_b")]
    for k, src in enumerate(["x", "y0"]):
        nodes += [helper.make_node("QuantizeLinear", [src, "s", "z"], [f"q{k}"], name=f"q_in{k}"),
                  helper.make_node("DequantizeLinear", [f"q{k}", "s", "z"], [f"d{k}"], name=f"dq_in{k}"),
                  helper.make_node("LayerNormalization", [f"d{k}", "w", "b"], [f"l{k}"], name=f"ln{k}"),
                  helper.make_node("QuantizeLinear", [f"l{k}", "s", "z"], [f"lq{k}"], name=f"q_out{k}"),
                  helper.make_node("DequantizeLinear", [f"lq{k}", "s", "z"], [f"y{k}"], name=f"dq_out{k}")]
    model = make(nodes, [vi("x", [1, 4, 8])], [vi("y1", None)], [s, z, ws, wz, wq, bq, bz])
    by_name = {v.name: v for v in analyze(model, get_target("qnn-htp")).nodes}
    assert not by_name["ln0"].supported and not by_name["ln1"].supported
    assert by_name["dq_b"].reasons == by_name["ln0"].reasons
