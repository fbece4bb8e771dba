from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.runtime.ort import make_session, random_feeds, run
from npukit.targets import analyze, apply_fixes, get_target
from npukit.targets.fix import (
    BLEND,
    DecomposeGroupNormPass,
    GeluTanhDecomposePass,
    GeluToErfPass,
    GlobalAveragePoolToReduceMeanPass,
    GlobalPoolToPoolPass,
    GroupNormToInstanceNormPass,
    HardSigmoidToClipPass,
    HardSwishToClipPass,
    HardSwishToHardSigmoidPass,
    HardSwishToRelu6Pass,
    fix_for,
    substitute,
)
from tests.targets._models import make, single, vi


def _apply(model, pass_):
    ir_model = ir.serde.deserialize_model(model)
    result = pass_(ir_model)
    assert result.modified
    fixed = ir.serde.serialize_model(result.model)
    onnx.checker.check_model(fixed)
    return fixed


def _max_rel(a, b):
    s_a, s_b = make_session(a, optimization="disable"), make_session(b, optimization="disable")
    feeds = random_feeds(s_a, seed=3)
    feeds = {k: v * 4 for k, v in feeds.items()}  # reach the kinks of HardSwish/HardSigmoid
    ra, rb = run(s_a, feeds)[0], run(s_b, feeds)[0]
    return float(np.max(np.abs(ra - rb)) / np.max(np.abs(ra)))


def _groupnorm(opset, per_group):
    scale = np.linspace(0.5, 1.5, 2 if per_group else 4).astype(np.float32)
    bias = np.linspace(-1, 1, 2 if per_group else 4).astype(np.float32)
    inits = [numpy_helper.from_array(scale, "sc"), numpy_helper.from_array(bias, "b")]
    return single("GroupNormalization", shape=(2, 4, 3, 3), opset=opset, inits=inits, extra_inputs=["sc", "b"],
                  out_shape=[2, 4, 3, 3], num_groups=2, epsilon=1e-5)


@pytest.mark.parametrize("model, pass_, ops", [
    (single("HardSwish", opset=14), HardSwishToHardSigmoidPass(), {"Mul", "HardSigmoid"}),
    (single("HardSwish", opset=14), HardSwishToClipPass(), {"Add", "Clip", "Mul", "Div"}),
    (single("HardSigmoid", alpha=0.3, beta=0.4), HardSigmoidToClipPass(), {"Mul", "Add", "Clip"}),
    (_groupnorm(21, per_group=False), DecomposeGroupNormPass(), {"Reshape", "InstanceNormalization", "Mul", "Add"}),
    (_groupnorm(18, per_group=True), DecomposeGroupNormPass(), {"Reshape", "InstanceNormalization", "Mul", "Add"}),
    (single("GlobalAveragePool"), GlobalAveragePoolToReduceMeanPass(), {"ReduceMean"}),
    (single("GlobalAveragePool", opset=18), GlobalAveragePoolToReduceMeanPass(), {"ReduceMean"}),
    (single("GlobalAveragePool"), GlobalPoolToPoolPass(), {"AveragePool"}),
    (single("GlobalMaxPool"), GlobalPoolToPoolPass(), {"MaxPool"}),
    (single("Gelu", opset=20), GeluToErfPass(), {"Div", "Erf", "Mul", "Add"}),
    (single("Gelu", opset=20, approximate="tanh"), GeluTanhDecomposePass(), {"Mul", "Add", "Tanh"}),
])
def test_fix_numerics_and_ops(model, pass_, ops):
    fixed = _apply(model, pass_)
    assert {n.op_type for n in fixed.graph.node} == ops
    assert fixed.graph.output[0].name == "y"
    assert _max_rel(model, fixed) < 2e-6


def test_exact_gelu_is_not_replaced_by_the_tanh_form():
    pass_ = GeluTanhDecomposePass()
    result = pass_(ir.serde.deserialize_model(single("Gelu", opset=20)))
    assert not result.modified and "exact Gelu" in pass_.notes[0]


def test_groupnorm_needs_static_channels():
    pass_ = DecomposeGroupNormPass()
    model = _groupnorm(21, per_group=False)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    assert not pass_(ir.serde.deserialize_model(model)).modified
    assert "static" in pass_.notes[0]


def test_apply_fixes_picks_what_the_target_lacks_and_verifies():
    model = single("HardSigmoid", shape=("N", 3, 8, 8))
    result = apply_fixes(model, get_target("litert"), input_shape=(1, 3, 8, 8))
    assert [a["fix"] for a in result.applied] == ["fix_input_shape", "hardsigmoid_to_clip"]
    assert result.errors is not None and result.errors.max_rel < 1e-5
    assert analyze(result.model, get_target("litert")).delegated_nodes == 3
    # QNN takes HardSigmoid: nothing to substitute, only the shape is fixed, and checked against the original
    qnn = apply_fixes(model, get_target("qnn-htp"), input_shape=(1, 3, 8, 8))
    assert [a["fix"] for a in qnn.applied] == ["fix_input_shape"] and qnn.errors.max_abs < 1e-6
    dims = qnn.model.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, 3, 8, 8]


def test_apply_fixes_hardswish_form_follows_the_target():
    model = single("HardSwish", opset=14)
    nnapi = apply_fixes(model, get_target("nnapi"))
    assert [a["fix"] for a in nnapi.applied] == ["hardswish_to_clip"]
    assert analyze(nnapi.model, get_target("nnapi")).delegated_nodes == len(nnapi.model.graph.node)
    xnn = apply_fixes(helper_model_gap(), get_target("xnnpack"))
    assert {n.op_type for n in xnn.model.graph.node} == {"AveragePool"}


def helper_model_gap():
    return make([helper.make_node("GlobalAveragePool", ["x"], ["y"])], [vi("x", [1, 3, 8, 8])],
                [vi("y", [1, 3, 1, 1])])


def _outputs(model, x):
    return run(make_session(model, optimization="disable"), {"x": x})[0]


def test_hardswish_to_relu6_is_relu6_and_not_hardswish():
    model = single("HardSwish", opset=14)
    fixed = _apply(model, HardSwishToRelu6Pass())
    assert [n.op_type for n in fixed.graph.node] == ["Clip"]
    x = np.linspace(-8, 8, 3 * 64, dtype=np.float32).reshape(1, 3, 8, 8)
    np.testing.assert_array_equal(_outputs(fixed, x), np.clip(x, 0, 6))
    assert np.max(np.abs(_outputs(fixed, x) - _outputs(model, x))) > 1.0  # a different function


def test_groupnorm_to_instancenorm_is_exact_only_with_a_group_per_channel():
    inexact = _apply(_groupnorm(21, per_group=False), GroupNormToInstanceNormPass())
    assert [n.op_type for n in inexact.graph.node] == ["InstanceNormalization"]
    assert _max_rel(_groupnorm(21, per_group=False), inexact) > 1e-2
    per_channel = _groupnorm(21, per_group=False)
    next(a for a in per_channel.graph.node[0].attribute if a.name == "num_groups").i = 4
    assert _max_rel(per_channel, _apply(per_channel, GroupNormToInstanceNormPass())) < 2e-6
    per_group = _groupnorm(18, per_group=True)  # opset 18: a scale per group, repeated over its channels
    fixed = _apply(per_group, GroupNormToInstanceNormPass())
    scale = next(numpy_helper.to_array(i) for i in fixed.graph.initializer if i.name == fixed.graph.node[0].input[1])
    assert scale.tolist() == pytest.approx([0.5, 0.5, 1.5, 1.5])


def test_inexact_fixes_are_named_by_analyze_never_applied_by_a_target():
    nnapi27 = get_target("nnapi@27")  # no HARD_SWISH, no DIV: no exact form of HardSwish it takes
    assert fix_for("HardSwish", nnapi27) is None
    assert fix_for("HardSwish", nnapi27, exact=False).name == "hardswish_to_relu6"
    model = single("HardSwish", opset=14)
    verdict = next(v for v in analyze(model, nnapi27).nodes if v.op_type == "HardSwish")
    assert verdict.fix.startswith("hardswish_to_relu6 (inexact") and "npukit substitute" in verdict.fix
    assert "npukit substitute --rule hardswish_to_relu6" in analyze(model, nnapi27).hint()
    assert apply_fixes(model, nnapi27).model.graph.node[0].op_type == "HardSwish"  # --fix leaves it
    assert [a["fix"] for a in apply_fixes(model, get_target("nnapi")).applied] == ["hardswish_to_clip"]


def test_substitute_applies_what_is_asked_and_refuses_what_it_cannot():
    model = single("HardSwish", opset=14)
    changed = substitute(model, ["hardswish_to_relu6"])
    assert changed.errors is None and [(a["fix"], a["exact"], a["rewrites"]) for a in changed.applied] == [
        ("hardswish_to_relu6", False, 1)]
    exact = substitute(model, ["hardswish_to_clip"])  # exact ones alone are verified
    assert exact.errors is not None and exact.errors.max_rel < 1e-5
    with pytest.raises(InputError, match="unknown substitution nope"):
        substitute(model, ["nope"])
    with pytest.raises(InputError, match="two substitutions given for HardSwish"):
        substitute(model, ["hardswish_to_relu6", "hardswish_to_clip"])
    with pytest.raises(InputError, match="nothing to substitute for groupnorm_to_instancenorm: the model has no node "
                                         "GroupNormalization"):
        substitute(model, ["groupnorm_to_instancenorm"])
    with pytest.raises(InputError, match="nothing to substitute for groupnorm_to_instancenorm:"):  # beside one that
        substitute(model, ["hardswish_to_relu6", "groupnorm_to_instancenorm"])  # does rewrite: still said, exit 2


def test_substitute_finds_a_hardswish_written_out_below_opset_14():
    """x * Clip(x + 3, 0, 6) / 6, as an opset-11 export writes HardSwish: converted to opset 14 (verified), made one
    HardSwish node (exact), then substituted; the steps are listed before the rule."""
    nodes = [helper.make_node("Add", ["x", "three"], ["s"]), helper.make_node("Clip", ["s", "zero", "six"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Div", ["m", "six"], ["y"])]
    consts = [helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("three", 3.0), ("zero", 0.0),
                                                                              ("six", 6.0))]
    graph = helper.make_graph(nodes, "hs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    changed = substitute(model, ["hardswish_to_relu6"])
    assert [(a["fix"], a["rewrites"]) for a in changed.applied] == [
        ("opset", 1), ("canonicalize_activation", 1), ("hardswish_to_relu6", 1)]
    ops = [n.op_type for n in changed.model.graph.node]
    assert "HardSwish" not in ops and "Div" not in ops and changed.model.opset_import[0].version == 14
    x = np.linspace(-8, 8, 4, dtype=np.float32).reshape(1, 4)
    relu6 = run(make_session(changed.model), {"x": x})[0]
    np.testing.assert_allclose(relu6, np.clip(x, 0, 6))


def _with_shares(model, original, substituted):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        if init.name in BLEND:
            value = original if init.name == BLEND[0] else substituted
            init.CopyFrom(numpy_helper.from_array(np.asarray(value, np.float32), init.name))
    return out


@pytest.mark.parametrize("rule, model", [("hardswish_to_relu6", single("HardSwish", opset=14)),
                                         ("groupnorm_to_instancenorm", _groupnorm(21, per_group=False))])
def test_a_blended_substitution_is_the_original_then_the_substitute(rule, model):
    """blend=True keeps each rewritten node beside its substitute, their outputs added in two shared shares: at
    (1, 0) the original exactly (verified), at (0, 1) the substituted model exactly, between them the mix."""
    blended = substitute(model, [rule], blend=True)
    assert blended.errors is not None and blended.errors.max_abs == 0.0
    assert {i.name for i in blended.model.graph.initializer} >= set(BLEND)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.linspace(-8, 8, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    original, substituted = _outputs(model, x), _outputs(substitute(model, [rule]).model, x)
    np.testing.assert_array_equal(_outputs(_with_shares(blended.model, 1.0, 0.0), x), original)
    np.testing.assert_array_equal(_outputs(_with_shares(blended.model, 0.0, 1.0), x), substituted)
    np.testing.assert_allclose(_outputs(_with_shares(blended.model, 0.5, 0.5), x), (original + substituted) / 2,
                               rtol=1e-6, atol=1e-6)


def test_sizes_computed_from_the_fixed_shape_are_folded_for_a_static_shape_target() -> None:
    """A detector head's form: a Reshape whose target is computed from the feature map's Shape (through int32
    Casts and a Concat on axis -1, which shape inference does not follow). With the input shape fixed the analysis
    used to ask for fix_input_shape again; ONNX Runtime folds the computation at its basic level before the NNAPI EP
    partitions the graph, so nothing is left to the CPU; --fix folds it into the model (checked)."""
    from tests.targets._models import shape_computed_flatten

    model = shape_computed_flatten("N")
    nnapi = get_target("nnapi")
    as_given = analyze(model, nnapi, input_shape=(1, 3, 4, 4))
    assert as_given.unsupported == () and len(as_given.partitions) == 1
    result = apply_fixes(model, nnapi, input_shape=(1, 3, 4, 4))
    assert [a["fix"] for a in result.applied] == ["fix_input_shape", "fold_constants"]
    assert result.errors is not None and result.errors.max_abs < 1e-6
    after = analyze(result.model, nnapi)
    assert not [v for v in after.unsupported if any("static shapes" in r for r in v.reasons)]


def test_groupnorm_to_instancenorm_rewrites_a_groupnorm_written_out_by_torchs_exporter(tmp_path):
    """torch's exporter writes GroupNorm(2, 8) at opset 18 as Reshape(N, 2, -1) -> InstanceNormalization(ones,
    zeros) -> Reshape -> Mul -> Add: the three nodes become one InstanceNormalization per channel, which computes what
    torch's GroupNorm(8, 8) with the same affine computes; nothing of the group statistics is left behind."""
    import onnxruntime as ort
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.norm = torch.nn.GroupNorm(2, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.conv(x))

    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.norm.weight.uniform_(0.5, 1.5)
        net.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(1, 3, 6, 6)
    path = tmp_path / "gn.onnx"
    torch.onnx.export(net, (x,), str(path), input_names=["x"], dynamo=True, external_data=False, opset_version=18)
    model = onnx.load(str(path))
    assert "GroupNormalization" not in {n.op_type for n in model.graph.node}  # written out: what the rule now reads
    result = substitute(model, ["groupnorm_to_instancenorm"])
    assert [(a["fix"], a["rewrites"]) for a in result.applied] == [("groupnorm_to_instancenorm", 1)]
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("InstanceNormalization") == 1 and "Reshape" not in ops
    used = {i for n in result.model.graph.node for i in n.input}
    assert all(t.name in used for t in result.model.graph.initializer)
    per_channel = torch.nn.GroupNorm(8, 8)
    per_channel.load_state_dict(net.norm.state_dict())
    with torch.no_grad():
        want = per_channel(net.conv(x)).numpy()
    got = ort.InferenceSession(result.model.SerializeToString()).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _conv_bn_weights_as_inputs(ir_version: int, batch: int | str = 1) -> onnx.ModelProto:
    """Conv -> BatchNormalization with every initializer also listed as a graph input (CenterFace's IR-4 form)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             *(numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), n)
               for n in ("scale", "bias", "mean", "var"))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["a", "scale", "bias", "mean", "var"], ["y"], name="bn")]
    model = make(nodes, [vi("x", [batch, 3, 8, 8]), *(vi(t.name, list(t.dims)) for t in inits)],
                 [vi("y", [batch, 4, 8, 8])], inits)
    model.ir_version = ir_version
    return model


def test_initializers_listed_as_inputs_are_not_constants_to_onnx_runtimes_execution_providers():
    """From IR version 4 ORT lets a caller override an initializer the graph also lists as an input, and its EPs
    do not take it for a constant: on the HTP emulator CenterFace's 3 BatchNorms ran on the CPU ("QNN BatchNorm
    doesn't support dynamic scale") where analyze had predicted 122/122. Below IR 4 every initializer had to be
    listed and none is overridable. --fix makes them constants (checked), and ORT then folds the BatchNorm."""
    qnn = get_target("qnn-htp")
    before = analyze(_conv_bn_weights_as_inputs(4), qnn)
    (bn,) = [v for v in before.nodes if v.op_type == "BatchNormalization"]
    assert bn.partition is None and bn.fix == "initializers_as_constants"
    assert any("scale must be constant" in r and "also a graph input" in r for r in bn.reasons)
    assert any("initializers are also graph inputs" in n for n in before.notes)
    conv = next(v for v in before.nodes if v.op_type == "Conv")
    assert conv.partition is not None  # the HTP takes a Conv with dynamic weights; their rank is not checked
    assert analyze(_conv_bn_weights_as_inputs(3), qnn).unsupported == ()
    xnnpack = analyze(_conv_bn_weights_as_inputs(4), get_target("xnnpack"))
    assert any("weight must be constant" in r for v in xnnpack.unsupported for r in v.reasons)
    result = apply_fixes(_conv_bn_weights_as_inputs(4), qnn)
    assert [a["fix"] for a in result.applied] == ["initializers_as_constants"] and result.applied[0]["rewrites"] == 5
    assert result.changed and not {i.name for i in result.model.graph.input} & {"w", "scale"}
    after = analyze(result.model, qnn)
    assert after.unsupported == () and "BatchNormalization" not in {v.op_type for v in after.nodes}


def test_a_fix_on_a_model_declaring_other_static_sizes_is_checked_at_the_given_shape():
    """CenterFace declares 10x3x32x32; analyze --fix --input-shape 1,3,480,640 ran the original at the new shape
    ("Got invalid dimensions for input") and stopped with an internal error. The fixed model is checked against the
    model with the shape fixed in (run at it once when fixed)."""
    model = _conv_bn_weights_as_inputs(4, batch=10)
    result = apply_fixes(model, get_target("qnn-htp"), input_shape=(1, 3, 16, 16))
    assert [a["fix"] for a in result.applied] == ["fix_input_shape", "initializers_as_constants"]
    assert result.errors is not None and result.errors.max_abs < 1e-4
    dims = result.model.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, 3, 16, 16]
