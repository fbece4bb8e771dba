"""Rules that read a rank, a size or a constant input the model as given leaves unknown (a Reshape whose shape is
computed by Shape/Gather/Concat nodes, symbolic dims): the refusal names the open shapes and the shape fix that
clears them, not the rule the node may well satisfy once the sizes are folded; and the mobile profiles' MAC and
fusion accounting."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npukit.targets import analyze, get_target
from npukit.targets.fix import apply_fixes
from npukit.targets.profile import NodeInfo, TensorInfo
from tests.targets._models import make, vi


def _constant(name, values):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64)))


def _computed_reshape(batch, then: list) -> object:
    """x -> Relu -> Reshape(to [Shape(x)[0], Shape(x)[1], -1], computed by Shape -> Gather -> Concat) -> ``then``
    (nodes reading "r", writing "y"): ONNX's shape inference leaves r's rank unknown until the constants are
    folded."""
    nodes = [_constant("first_two", [0, 1]), _constant("rest", [-1]),
             helper.make_node("Relu", ["x"], ["p"], name="relu"),
             helper.make_node("Shape", ["p"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "first_two"], ["g"], name="gather", axis=0),
             helper.make_node("Concat", ["g", "rest"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["p", "target"], ["r"], name="reshape"), *then]
    graph = helper.make_graph(nodes, "g", [vi("x", [batch, 4, 8, 2])], [vi("y", None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _softmax(batch=1):
    return _computed_reshape(batch, [helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=2)])


def _verdict(model, target, name):
    return next(v for v in analyze(model, get_target(target)).nodes if v.name == name)


@pytest.mark.parametrize("batch, fix", [(1, "fold_constants"), ("N", "fix_input_shape")])
def test_softmax_on_an_unknown_rank_says_so_and_names_the_shape_fix(batch, fix):
    """Softmax(axis=2) on a rank the model leaves unknown: not 'only over the last axis' (it is, on the rank-3
    tensor the folded model has) but the open rank, with the shape fix that clears it."""
    v = _verdict(_softmax(batch), "executorch-xnnpack", "softmax")
    assert not v.supported
    assert v.reasons and all("rank is unknown" in r and "needs static shapes" in r for r in v.reasons), v.reasons
    assert not any(r.startswith("Softmax: only over the last axis") for r in v.reasons), v.reasons
    assert v.fix == fix
    fixed = apply_fixes(_softmax(batch), get_target("executorch-xnnpack"),
                        input_shape=(1, 4, 8, 2) if batch == "N" else None).model
    assert _verdict(fixed, "executorch-xnnpack", "softmax").supported


def test_softmax_off_the_last_axis_of_a_known_rank_is_still_refused_as_such():
    model = make([helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=1)], [vi("x", [1, 4, 8])],
                 [vi("y", None)])
    v = _verdict(model, "executorch-xnnpack", "softmax")
    assert not v.supported and v.reasons == ("Softmax: only over the last axis",) and v.fix is None


def test_a_target_needing_static_shapes_gives_its_own_reason_once():
    """On NNAPI (static shapes required) a Conv on an unknown rank has the static-shapes reason alone: the rank rule
    that cannot be checked is covered by it, as before."""
    w = numpy_helper.from_array(np.ones((2, 4, 1, 1), np.float32), "w")
    nodes = [_constant("first_two", [0, 1]), _constant("rest", [8, 2]),
             helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "first_two"], ["g"], name="gather", axis=0),
             helper.make_node("Concat", ["g", "rest"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
             helper.make_node("Conv", ["r", "w"], ["y"], name="conv")]
    graph = helper.make_graph(nodes, "g", [vi("x", ["N", 4, 16])], [vi("y", None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    v = _verdict(model, "nnapi", "conv")
    assert not v.supported and len(v.reasons) == 1 and "needs static shapes (shape of 'r'" in v.reasons[0], v.reasons
    assert v.fix == "fix_input_shape"


def _t(shape, *, constant=False, values=None, dtype="float32"):
    return TensorInfo(dtype, shape, constant=constant, values=values)


def _reasons(target, op, inputs, attrs=None, outputs=(None,)):
    profile = get_target(target)
    info = NodeInfo(op, "", attrs or {}, tuple(inputs), tuple(_t(s) for s in outputs))
    return profile.rule_for(op).failures(info, default_dtypes=profile.dtypes, max_rank=profile.max_rank)


_AXES = _t((2,), constant=True, values=(2, 3), dtype="int64")
_COMPUTED = _t((2,), dtype="int64")  # an int64 input computed in the graph: not a constant here


@pytest.mark.parametrize("target, op, inputs, attrs, expected", [
    # ExecuTorch: what cannot be told on an unknown rank (or a computed axes/pads/steps input) says so ...
    ("executorch-xnnpack", "Softmax", [_t(None)], {"axis": 2}, "the input's rank is unknown here"),
    ("executorch-xnnpack", "MatMul", [_t(None), _t(None)], {}, "an operand's rank is unknown here"),
    ("executorch-xnnpack", "ReduceMean", [_t(None), _AXES], {}, "the input's rank or the axes are unknown here"),
    ("executorch-xnnpack", "ReduceMean", [_t((1, 3, 8, 8)), _COMPUTED], {}, "the axes are unknown here"),
    ("executorch-xnnpack", "Unsqueeze", [_t(None), _t((1,), constant=True, values=(2,), dtype="int64")], {},
     "the input's rank or the axes are unknown here"),
    ("executorch-xnnpack", "Pad", [_t((1, 3, 8, 8)), _COMPUTED], {}, "its pads are not a constant here"),
    ("executorch-xnnpack", "Slice", [_t((1, 8)), *[_t((1,), constant=True, values=(v,), dtype="int64")
                                                    for v in (0, 4, 1)], _COMPUTED], {},
     "its steps are not a constant here"),
    ("executorch-xnnpack", "Conv", [_t(None), _t((4, 3, 1, 1), constant=True)], {},
     "the input's rank is unknown here, so rank 3..4 cannot be checked"),
    ("litert-xnnpack", "MaxPool", [_t((1, 3, "h", "w"))], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                           "pads": [1, 1, 1, 1]},
     "the input's spatial size is unknown here"),
    # ... what can be told without it is answered
    ("executorch-xnnpack", "Softmax", [_t(None)], {"axis": -1}, None),
    ("executorch-xnnpack", "MatMul", [_t((16, 8)), _t(None)], {}, "two activations of rank 2"),
    ("executorch-xnnpack", "ReduceMean", [_t(None)], {"axes": [-1]}, "only the mean of a 4D tensor over H and W"),
    ("executorch-xnnpack", "Unsqueeze", [_t(None)], {"axes": [-1]}, None),
    ("executorch-xnnpack", "Pad", [_t((1, 3, 8, 8))], {"pads": [0, 0, 1, 1, 0, 0, 1, 1]}, None),  # opset < 11
    ("executorch-xnnpack", "Pad", [_t((1, 3, 8, 8))], {"pads": [0, 0, -1, 0, 0, 0, 0, 0]}, "cropping"),
    ("litert-xnnpack", "MaxPool", [_t((1, 3, "h", "w"))], {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}, None),
    ("litert-xnnpack", "MaxPool", [_t((1, 3, 8, 8))], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                       "pads": [1, 1, 1, 1]}, "padding other than TFLite's SAME"),
])
def test_rules_say_what_they_cannot_tell(target, op, inputs, attrs, expected):
    reasons = _reasons(target, op, inputs, attrs)
    if expected is None:
        assert reasons == [], reasons
        return
    assert any(expected in r for r in reasons), reasons
    unknown = "unknown here" in expected or "not a constant here" in expected
    assert all(("needs static shapes" in r) == unknown for r in reasons if expected in r), reasons


def test_coreml_prelu_slope_per_channel_needs_no_rank_and_a_single_one_does():
    from npukit.targets.coreml import _channel_slope

    def node(slope_shape, x_shape):
        return NodeInfo("PRelu", "", {}, (_t(x_shape), _t(slope_shape, constant=True)), (_t(x_shape),))

    assert _channel_slope(node((4, 1, 1), None)) is True
    assert _channel_slope(node((1,), None)) is None
    assert _channel_slope(node((1,), (1, 4, 8, 8))) is True
    assert _channel_slope(node((4,), (1, 4, 8, 8))) is False


def test_qnn_resize_nearest_pair_on_an_unknown_rank():
    from npukit.targets.qnn_htp import _resize_nearest_ok

    def node(nearest, coord, shape):
        return NodeInfo("Resize", "", {"mode": "nearest", "nearest_mode": nearest,
                                       "coordinate_transformation_mode": coord}, (_t(shape),), (_t(shape),))

    assert _resize_nearest_ok(node("round_prefer_floor", "half_pixel", None)) is None  # 4-D yes, other ranks no
    assert _resize_nearest_ok(node("round_prefer_floor", "asymmetric", None)) is False  # no at any rank
    assert _resize_nearest_ok(node("round_prefer_ceil", "align_corners", None)) is True  # yes at any rank
    assert _resize_nearest_ok(node("round_prefer_floor", "half_pixel", (1, 3, 8, 8))) is True


def _convtranspose_bn(rank, *, relu=True):
    """x -> ConvTranspose 2/2 -> BatchNormalization (-> Relu) -> Sigmoid on a rank-``rank`` input (4: 2-D, 3: 1-D)."""
    rng = np.random.default_rng(0)

    def tensor(shape, name):
        return numpy_helper.from_array(rng.uniform(0.5, 1.5, shape).astype(np.float32), name)

    spatial = [2] * (rank - 2)
    inits = [tensor((8, 4, *spatial), "w"), tensor((4,), "b"), *(tensor((4,), n) for n in ("g", "be", "m", "v"))]
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], name="convt", kernel_shape=spatial,
                              strides=spatial),
             helper.make_node("BatchNormalization", ["t", "g", "be", "m", "v"], ["n"], name="bn")]
    last = "n"
    if relu:
        nodes.append(helper.make_node("Relu", ["n"], ["r"], name="relu"))
        last = "r"
    nodes.append(helper.make_node("Sigmoid", [last], ["y"], name="sigmoid"))
    return make(nodes, [vi("x", [1, 8, *[8] * (rank - 2)])], [vi("y", None)], inits)


def test_litert_folds_a_batchnorm_into_the_2d_transposed_conv_before_it():
    """LiteRT's converter writes ConvTranspose2d -> BatchNorm2d -> ReLU as one TRANSPOSE_CONV (measured): the
    builtins profile checks them as one unit, as litert-xnnpack does (which then leaves the unit out: 4-D bias)."""
    from npukit.frontend.graph_index import GraphIndex
    from npukit.targets.partition import _fusion_groups

    for target in ("litert", "litert-xnnpack"):
        fusions = get_target(target).fusions
        fused = _fusion_groups(GraphIndex(_convtranspose_bn(4).graph), fusions)
        assert [(f.into, members) for f, members, _ in fused] == [("ConvTranspose+BatchNormalization", [0, 1, 2])]
        assert _fusion_groups(GraphIndex(_convtranspose_bn(3).graph), fusions) == []  # 1-D: the BN stays MUL, ADD
    a = analyze(_convtranspose_bn(4), get_target("litert"))
    assert all(v.supported for v in a.nodes) and len(a.partitions) == 1
    rule = get_target("litert").rule_for("ConvTranspose+BatchNormalization")
    assert rule is not None and "TRANSPOSE_CONV" in rule.notes


@pytest.mark.parametrize("target", ["litert", "litert-xnnpack"])
def test_litert_takes_a_1d_transposed_conv_and_the_batchnorm_after_it(target):
    """ConvTranspose1d -> BatchNorm1d -> ReLU: TRANSPOSE_CONV between RESHAPEs, then MUL and ADD, all inside the
    XNNPACK delegate (measured, litert-torch 0.10)."""
    a = analyze(_convtranspose_bn(3), get_target(target))
    assert [(v.name, v.supported) for v in a.nodes] == [(n, True) for n in ("convt", "bn", "relu", "sigmoid")]


def test_litert_clip_note_names_relu_0_to_1():
    assert "RELU_0_TO_1" in get_target("litert").rule_for("Clip").notes
    assert get_target("litert-xnnpack").rule_for("Clip").notes == get_target("litert").rule_for("Clip").notes


def test_executorch_rank4_matmul_macs_are_not_counted_as_delegated():
    """The split rank-4 MatMul of two activations whose batch dims broadcast (an expand_copy left out) counts as
    left, MACs and all; the linear MatMul's are delegated."""
    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="linear"),
             helper.make_node("MatMul", ["a", "k"], ["s"], name="qk"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    a = analyze(make(nodes, [vi("x", [1, 4, 16, 8]), vi("k", [1, 1, 8, 16])], [vi("y", None)], [w]),
                get_target("executorch-xnnpack"))
    by_name = {v.name: v for v in a.nodes}
    assert not by_name["qk"].supported and by_name["qk"].macs == 4 * 16 * 16 * 8
    assert a.macs_delegated == by_name["linear"].macs == 4 * 16 * 8 * 8
    assert a.macs_total == a.macs_delegated + by_name["qk"].macs
    assert sum(p.macs for p in a.partitions) == a.macs_delegated


@pytest.mark.parametrize("batch, fix", [(1, "fold_constants"), ("N", "fix_input_shape")])
def test_a_reshape_whose_shape_is_computed_from_shapes_names_the_shape_fix(batch, fix):
    """Reshape's shape computed by Shape -> Gather -> Concat: not a constant in the model as given, one once the
    shapes are folded; the refusal says so and names the fix (it read 'shape must be constant' with no fix)."""
    model = _computed_reshape(batch, [helper.make_node("Relu", ["r"], ["y"], name="after")])
    v = _verdict(model, "executorch-xnnpack", "reshape")
    assert not v.supported and v.fix == fix, (v.reasons, v.fix)
    assert all("computed from the input's shapes" in r and "needs static shapes" in r for r in v.reasons), v.reasons
    fixed = apply_fixes(model, get_target("executorch-xnnpack"),
                        input_shape=(1, 4, 8, 2) if batch == "N" else None).model
    assert _verdict(fixed, "executorch-xnnpack", "reshape").supported
