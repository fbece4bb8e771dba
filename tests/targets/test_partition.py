from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from npukit.report.analyze import target_tables
from npukit.targets import analyze, get_target
from tests.targets._models import conv_relu_erf_conv, make, vi


def test_one_unsupported_op_in_the_middle_gives_two_partitions_and_two_transitions():
    a = analyze(conv_relu_erf_conv(), get_target("qnn-htp"), input_shape=(1, 3, 8, 8))
    assert [p.ops for p in a.partitions] == [{"Conv": 1}, {"Conv": 1}]
    assert a.transitions == 2
    assert a.delegated_nodes == 2 and [v.name for v in a.unsupported] == ["erf"]
    conv1 = 1 * 4 * 8 * 8 * 3 * 3 * 3
    conv2 = 1 * 4 * 8 * 8 * 4
    assert a.macs_total == conv1 + conv2 and a.macs_delegated == conv1 + conv2 and a.mac_share == 1.0
    cpu = analyze(conv_relu_erf_conv(), get_target("cpu"))
    assert len(cpu.partitions) == 1 and cpu.transitions == 0


def test_mac_share_counts_only_delegated_layers():
    # litert lacks Erf too, xnnpack takes Conv but not Erf: both 2 partitions; nnapi@27 has Conv.
    a = analyze(conv_relu_erf_conv(), get_target("xnnpack"), input_shape=(1, 3, 8, 8))
    assert a.mac_share == 1.0 and len(a.partitions) == 2
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3, 3), np.float32), "w")  # 3D conv: XNNPACK is 2D only
    model = make([helper.make_node("Conv", ["x", "w"], ["y"])], [vi("x", [1, 3, 4, 8, 8])], [vi("y", None)], [w])
    b = analyze(model, get_target("xnnpack"))
    assert b.mac_share == 0.0 and b.problem() is not None


def test_independent_branches_join_one_partition_like_ort():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Sigmoid", ["x"], ["b"], name="s"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    model = make(nodes, [vi("x", [1, 4])], [vi("y", None)])
    a = analyze(model, get_target("qnn-htp"))
    assert len(a.partitions) == 1 and a.transitions == 0


def _qdq_relu_model(*, float_ends: bool = True):
    """[Erf ->] Q -> DQ -> Erf -> Q -> DQ [-> Erf]: the float Erfs keep the lone Q and DQ off the graph's edges."""
    s = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    z = numpy_helper.from_array(np.array(128, np.uint8), "z")
    first, last = ("x0", "y0") if float_ends else ("x", "y")
    nodes = [helper.make_node("QuantizeLinear", [first, "s", "z"], ["xq"], name="q0"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq0"),
             helper.make_node("Erf", ["xd"], ["e"], name="erf"),
             helper.make_node("QuantizeLinear", ["e", "s", "z"], ["eq"], name="q1"),
             helper.make_node("DequantizeLinear", ["eq", "s", "z"], [last], name="dq1")]
    if float_ends:
        nodes = [helper.make_node("Erf", ["x"], ["x0"], name="erf_in"), *nodes,
                 helper.make_node("Erf", ["y0"], ["y"], name="erf_out")]
    return make(nodes, [vi("x", [1, 4])], [vi("y", None)], [s, z], opset=13)


def test_qdq_units_and_lone_qdq_partitions():
    a = analyze(_qdq_relu_model(), get_target("qnn-htp"))
    by_name = {v.name: v for v in a.nodes}
    # DQ -> Erf -> Q is one unit, unsupported as a whole; q0 and dq1 alone are dropped partitions
    assert not by_name["dq0"].supported and not by_name["q1"].supported
    assert any("single Q/DQ node stays on the CPU" in r for r in by_name["q0"].reasons)
    assert any("single Q/DQ node stays on the CPU" in r for r in by_name["dq1"].reasons)
    assert a.delegated_nodes == 0
    cpu = analyze(_qdq_relu_model(), get_target("cpu"))
    assert cpu.delegated_nodes == 7


def test_graph_input_quantization_and_output_dequantization_stay_on_the_cpu():
    # onnxruntime-qnn's default offload_graph_io_quantization: the QNN EP does not take them (seen on the emulator)
    a = analyze(_qdq_relu_model(float_ends=False), get_target("qnn-htp"))
    by_name = {v.name: v for v in a.nodes}
    assert by_name["q0"].reasons == ("QuantizeLinear: quantizing a graph input is left to the CPU",)
    assert by_name["dq1"].reasons == ("DequantizeLinear: dequantizing a graph output is left to the CPU",)
    assert not get_target("nnapi").graph_io_qdq_on_cpu


def test_side_by_side_target_tables():
    model = conv_relu_erf_conv(batch=1)
    tables = target_tables([analyze(model, get_target(t)) for t in ("qnn-htp", "coreml")])
    ops, summary = tables
    assert ops.columns == ["op", "count", "qnn-htp", "coreml"]
    rows = {r[0]: r for r in ops.rows}
    assert rows["Conv"][1:] == [2, "yes", "yes"]
    assert rows["Erf"][2].startswith("no: Erf: not supported") and rows["Erf"][3] == "yes"
    assert [r[0] for r in summary.rows] == ["qnn-htp", "coreml"]
    assert summary.rows[0][1:4] == ["2/3", 2, 2] and summary.rows[1][1:4] == ["3/3", 1, 0]
    # each target's own model (--fix): an op one target's model lacks is said to be absent from it, not to be
    # removed by its runtime; a count that differs is given per target
    fixed = make([helper.make_node("Conv", ["x", "w"], ["y"], name="c")], [vi("x", [1, 3, 8, 8])], [vi("y", None)],
                 inits=[numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")])
    ops, _ = target_tables([analyze(model, get_target("qnn-htp")), analyze(fixed, get_target("coreml"))], fixed=True)
    rows = {r[0]: r for r in ops.rows}
    assert rows["Erf"][3].startswith("none in the model analysed for this target")
    assert rows["Conv"][1:] == [2, "x2: yes", "x1: yes"]


def test_unsupported_node_gets_its_fix():
    model = make([helper.make_node("HardSigmoid", ["x"], ["y"], name="hs")], [vi("x", [1, 4])], [vi("y", None)],
                 opset=17)
    a = analyze(model, get_target("litert"))
    assert a.nodes[0].fix == "hardsigmoid_to_clip"
    assert TensorProto.FLOAT  # model stays float: litert accepts float
    assert not a.needs_quantization


def test_a_weight_read_through_identity_is_a_constant():
    """RetinaFace's exporter shares its SSH weights through Identity nodes, which ORT removes before any EP
    partitions: CoreML's profile left those convs to the CPU ("weight must be constant")."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")]
    nodes = [helper.make_node("Identity", ["w"], ["w_shared"]), helper.make_node("Identity", ["b"], ["b_shared"]),
             helper.make_node("Conv", ["x", "w_shared", "b_shared"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    model = make(nodes, [vi("x", (1, 3, 8, 8))], [vi("y", (1, 4, 8, 8))], inits)
    for target in ("coreml", "qnn-htp"):
        a = analyze(model, get_target(target))
        assert "conv" not in {v.name for v in a.unsupported} and a.mac_share == 1.0, target


def test_a_mac_share_is_not_given_where_some_macs_are_unknown() -> None:
    """PP-OCRv4's detector without --input-shape: 44 convs' MACs unknown, and analyze said "MACs delegated 100.0%"
    of the 111,744 it could count (575,567,744 at 320x320)."""
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    a = analyze(model, get_target("cpu"))
    assert a.macs_unknown == 1 and a.mac_share is None and "pass --input-shape" in " ".join(a.notes)
    fixed = analyze(model, get_target("cpu"), input_shape=(1, 3, 8, 8))
    assert fixed.macs_unknown == 0 and fixed.mac_share == 1.0
